"""`arle train --num-processes N` and friends: arle re-launches itself under accelerate.

A real 2-process DDP run on CPU (gloo) on the tiny model, then a resume of it with the same
launch; the DeepSpeed/FSDP launch is checked as generated config and command (it needs CUDA
and deepspeed, neither of which is here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ARLE = [sys.executable, "-m", "arlecli"]
TINY = [
    "--limit",
    "8",
    "--num-generations",
    "2",
    "--set",
    "max_completion_length=8",
    "--set",
    "per_device_train_batch_size=2",
]


def arle(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ARLE_LAUNCHED"}
    return subprocess.run([*ARLE, *args], capture_output=True, text=True, timeout=timeout, env=env)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_processes_on_cpu_then_resume(tmp_path, tiny_model):
    run = tmp_path / "run"
    common = [
        "train",
        "countdown",
        "--model",
        str(tiny_model),
        *TINY,
        "--eval-limit",
        "1",
        "--set",
        "eval_max_tokens=4",
        "--eval-every",
        "1",
        "--save-steps",
        "1",
        "--num-processes",
        "2",
        "--output",
        str(run),
    ]
    t0 = time.monotonic()
    out = arle(*common, "--max-steps", "2", "--json")
    first_s = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-4000:]
    assert "Traceback" not in out.stderr and "error" not in out.stderr.lower(), out.stderr[-4000:]

    # The main process speaks for the run: one summary on stdout, one header line.
    summary = json.loads(out.stdout)
    assert summary["global_step"] == 2 and summary["before"]["label"] == "step-0"
    assert out.stderr.count("training ") == 1, out.stderr
    state = json.loads((run / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    # Both ranks saved their RNG state: there were two of them.
    assert (run / "checkpoint-2" / "rng_state_0.pth").exists() and (run / "checkpoint-2" / "rng_state_1.pth").exists()
    assert (run / "final" / "model.safetensors").exists() and not list(run.glob("final*/final"))
    meta = json.loads((run / "meta.json").read_text())
    assert meta["num_processes"] == 2 and "resumed" not in meta
    assert meta["command"][:2] == ["arle", "train"] and "--num-processes" in meta["command"]
    assert [r["step"] for r in lines(run / "metrics.jsonl")] == [1, 2]
    # 2 ranks x 1 prompt x 2 completions per step, each line once, from the main process.
    rewards = lines(run / "rewards.jsonl")
    assert [r["step"] for r in rewards] == [1] * 4 + [2] * 4
    for label in ("step-0", "step-1", "step-2"):  # step-1: --eval-every, the other rank waiting
        assert len((run / "eval" / label / "samples.jsonl").read_text().splitlines()) == 1
    assert json.loads((run / "summary.json").read_text())["global_step"] == 2

    # Resume the same run, same launch, one step further.
    t0 = time.monotonic()
    out = arle(*common, "--max-steps", "3", "--resume")
    resume_s = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stderr.count("resuming from checkpoint-2") == 1, out.stderr
    assert json.loads((run / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
    assert [r["step"] for r in lines(run / "metrics.jsonl")] == [1, 2, 3]
    assert [r["step"] for r in lines(run / "rewards.jsonl")] == [1] * 4 + [2] * 4 + [3] * 4
    meta = json.loads((run / "meta.json").read_text())
    assert len(meta["resumed"]) == 1 and meta["trainer"]["max_steps"] == 3
    assert json.loads((run / "summary.json").read_text())["global_step"] == 3
    assert len((run / "eval" / "step-0" / "samples.jsonl").read_text().splitlines()) == 1  # not redone
    print(f"2 processes: 2 steps {first_s:.1f} s, resume +1 step {resume_s:.1f} s")


@pytest.mark.parametrize("mode", ["zero2", "zero3", "fsdp"])
def test_deepspeed_and_fsdp_launch(tmp_path, mode):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    from arlecli.train.launch import LaunchOptions, accelerate_config, launch_command

    opts = LaunchOptions(
        num_processes=4,
        num_machines=2,
        machine_rank=1,
        main_process_ip="10.0.0.1",
        main_process_port=29501,
        deepspeed=None if mode == "fsdp" else mode,
        fsdp=mode == "fsdp",
    )
    assert opts.wanted()
    config = accelerate_config(opts, 8, 29501)
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config_from_file(str(path))  # accelerate's own reader accepts it
    assert loaded.num_processes == 8 and loaded.num_machines == 2 and loaded.machine_rank == 1
    assert loaded.main_process_ip == "10.0.0.1" and loaded.main_process_port == 29501
    if mode == "fsdp":
        assert config["distributed_type"] == "FSDP"
        assert config["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD"
        assert config["fsdp_config"]["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    else:
        stage = int(mode[-1])
        assert config["distributed_type"] == "DEEPSPEED" and config["deepspeed_config"]["zero_stage"] == stage
        assert config["deepspeed_config"].get("zero3_save_16bit_model", False) == (stage == 3)

    child = ["train", "countdown", "--max-steps", "5", "--output", "runs/x"]
    cmd = launch_command(opts, child, cuda=True, config_file=path)
    assert cmd[:3] == [sys.executable, "-m", "arlecli.train.launch"]
    assert cmd[-len(child) - 2 :] == ["-m", "arlecli", *child]
    args = launch_command_parser().parse_args(cmd[3:])
    assert args.config_file == str(path) and args.num_processes == 8 and args.num_machines == 2
    assert args.machine_rank == 1 and args.main_process_ip == "10.0.0.1" and args.main_process_port == 29501
    assert args.module and args.training_script == "arlecli" and args.training_script_args == child
    if mode == "fsdp":
        assert args.use_fsdp and args.fsdp_sharding_strategy == "FULL_SHARD" and not args.use_deepspeed
    else:
        assert args.use_deepspeed and args.zero_stage == int(mode[-1]) and not args.use_fsdp


def test_ddp_launch_command_on_cpu():
    from accelerate.commands.launch import launch_command_parser

    from arlecli.train.launch import LaunchOptions, launch_command

    cmd = launch_command(LaunchOptions(num_processes=2, main_process_port=1234), ["train", "countdown"], cuda=False)
    args = launch_command_parser().parse_args(cmd[3:])
    assert args.multi_gpu and args.num_processes == 2 and args.num_machines == 1 and args.main_process_port == 1234
    assert not args.use_deepspeed and not args.use_fsdp and args.config_file is None
    assert LaunchOptions(num_processes=1).wanted() is False


def test_launch_flag_mistakes_are_one_line_errors(tiny_model):
    from arlecli.errors import UserError
    from arlecli.train.launch import LaunchOptions, check

    out = arle("train", "countdown", "--model", str(tiny_model), "--max-steps", "1", "--deepspeed", "zero3")
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "pip install deepspeed" in out.stderr, out.stderr
    cases = [
        (LaunchOptions(deepspeed="zero2", fsdp=True), "grpo", "cannot be combined"),
        (LaunchOptions(num_processes=2), "ppo", "one process"),
        (LaunchOptions(deepspeed="zero4"), "grpo", "zero2 or zero3"),
        (LaunchOptions(num_machines=2), "grpo", "--main-process-ip"),
        (LaunchOptions(accelerate_config=Path("nope.yaml")), "rloo", "no such file"),
    ]
    for opts, algo, message in cases:
        with pytest.raises(UserError, match=message):
            check(opts, algo)
    check(LaunchOptions(num_processes=2), "rloo")


def test_child_command_line_drops_launch_flags(tiny_model, tmp_path):
    import typer

    from arlecli.cli import train as train_cli

    seen = {}
    earlier = tmp_path / "somewhere"  # --resume needs a run there (an empty folder is refused)
    earlier.mkdir()
    (earlier / "meta.json").write_text('{"benchmark": "countdown"}\n')

    def spy(ctx: typer.Context) -> list[str]:
        seen["args"] = real(ctx)
        raise typer.Exit(0)

    real = train_cli.child_args
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(train_cli.train_command)
    train_cli.child_args = spy
    try:
        app(
            args=[
                "countdown",
                "--model",
                str(tiny_model),
                "--num-processes",
                "2",
                "--main-process-port",
                "1",
                "--set",
                "beta=0.1",
                "--set",
                "seed=3",
                "--lr",
                "0.001",
                "--resume",
                "--output",
                str(earlier),
                "--json",
            ],
            standalone_mode=False,
        )
    finally:
        train_cli.child_args = real
    args = seen["args"]
    assert args[0] == "countdown" and "--num-processes" not in args and "--main-process-port" not in args
    assert "--output" not in args and "--resume" in args and "--json" in args
    assert args[args.index("--learning-rate") + 1] == "0.001"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--set"] == ["beta=0.1", "seed=3"]


def test_two_processes_at_staleness_one_killed_and_resumed_equal_an_uninterrupted_run(tmp_path, tiny_model):
    """`--max-staleness 1` under a 2-process launch: each rank queues its own rollouts and
    writes its own file of them into a checkpoint, so a launch killed whole (every process at
    once, as a lost machine) after checkpoint-1 resumes with the rollouts and losses of an
    uninterrupted 2-process run. Rank 1 writes its RNG state 3 s late: the checkpoint is
    complete (trainer_state.json, where the kill lands) only once every rank has written its
    share; a kill before that left rank 1's file missing or empty (an empty one made rank 1's
    resume exit 130 on an EOFError in torch.load)."""
    from helpers.train import kill_after_first_checkpoint, slow_rank_env

    from arlecli.train.overlap import STATE_FILE

    common = [
        "train",
        "countdown",
        "--model",
        str(tiny_model),
        *TINY,
        "--learning-rate",
        "1e-3",
        "--eval-limit",
        "0",
        "--max-steps",
        "3",
        "--save-steps",
        "1",
        "--max-staleness",
        "1",
        "--num-processes",
        "2",
    ]
    run = tmp_path / "run"
    env = {k: v for k, v in slow_rank_env(tmp_path / "site", rank=1, seconds=3).items() if k != "ARLE_LAUNCHED"}
    kill_after_first_checkpoint([*common, "--output", str(run)], run, steps=3, env=env)
    ahead = run / "checkpoint-1"
    shares = [STATE_FILE, "arle_rollouts_ahead_rank1.json", "rng_state_0.pth", "rng_state_1.pth"]
    assert all((ahead / name).is_file() for name in shares), sorted(p.name for p in ahead.iterdir())
    rank0, rank1 = (json.loads((ahead / name).read_text()) for name in (STATE_FILE, "arle_rollouts_ahead_rank1.json"))
    assert rank0["jobs"] and rank0 != rank1  # each rank queued its own prompts

    out = arle(*common, "--output", str(run), "--resume")
    assert out.returncode == 0, out.stderr[-4000:]
    straight = tmp_path / "straight"
    out = arle(*common, "--output", str(straight))
    assert out.returncode == 0, out.stderr[-4000:]

    def sampled(r: Path) -> list[tuple]:
        return [(x["step"], x["task_id"], x["completion"], x["policy_version"]) for x in lines(r / "rewards.jsonl")]

    assert len(sampled(straight)) == 3 * 4  # 2 ranks x 1 prompt x 2 completions a step
    assert sampled(run) == sampled(straight)
    resumed, plain = lines(run / "metrics.jsonl"), lines(straight / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert [r["staleness/max"] for r in plain] == [0.0, 1.0, 1.0]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in plain], rel=1e-5, abs=1e-7)
