"""`arle train` from tests: in this process or as a subprocess with the tests' rewards registered,
the `test_varied` reward and its countdown card, and checks on what a training run wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from arlecli.rewards import register
from helpers.tool_model import GSM8K_ROWS
from arlecli.types import Score

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
# The real `arle` entry point, in a process that also registers this module's test rewards.
ARLE = [
    sys.executable,
    "-c",
    f"import sys; sys.path.insert(0, {str(TESTS)!r}); import helpers.train; helpers.train.cli_main()",
]
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


def cli_main() -> None:
    """`arle` as its console script runs it, with this module's test rewards registered."""
    import arlecli.cli.main as main

    main.main()


def arle(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`arle ARGS` in a subprocess (ARLE: with the `test_varied` reward registered)."""
    return subprocess.run([*ARLE, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy())


def train_in_process(*args: str) -> None:
    """Run `arle train ARGS` in this process (saves the ~7 s import of torch/transformers/trl)."""
    import typer

    from arlecli.cli.train import train_command

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(train_command)
    app(args=list(args), standalone_mode=False)


@register("test_varied")
def _varied_reward():
    """A reward that varies on a random model's gibberish, so advantages (and gradients) are not zero.

    The countdown reward is 0 for every completion of a random model: zero advantages, zero
    gradient, and unchanged weights would prove nothing about the update."""

    def score(task, episode) -> Score:
        value = len(set(episode.completion)) / 20
        return Score(reward=value, correct=value > 0.5, extracted=None, details={})

    return score


def varied_card(tmp_path: Path) -> Path:
    """The countdown card (same generator, prompt, splits) scored by `test_varied`."""
    data = yaml.safe_load((ROOT / "benchmarks" / "countdown.yaml").read_text())
    data["name"] = "countdown_varied"
    data["reward"] = {"name": "test_varied"}
    data["metrics"] = ["accuracy"]
    path = tmp_path / "countdown_varied.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def math_tool_card(tmp_path: Path) -> Path:
    """The math_tool card on the fixture rows (offline), its reward the tests' varied one so the
    weights move."""
    data = yaml.safe_load((ROOT / "benchmarks" / "math_tool.yaml").read_text())
    data["source"] = {"kind": "files", "path": GSM8K_ROWS}
    data["reward"] = {"name": "test_varied"}
    data.pop("metrics", None)
    path = tmp_path / "math_tool.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def steps_in(path: Path) -> list[int]:
    """The `step` of every line of a metrics.jsonl or rewards.jsonl."""
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def assert_trained(final: Path, base_model: Path, lora: int) -> None:
    """`final` holds weights training moved: a LoRA adapter alone with a non-zero B (it starts
    at zero), or full weights that differ from `base_model`'s and are all finite."""
    from safetensors.torch import load_file

    if lora:
        assert (final / "adapter_config.json").exists() and not (final / "config.json").exists()
        adapter = load_file(str(final / "adapter_model.safetensors"))
        lora_b = [t for k, t in adapter.items() if "lora_B" in k]
        assert lora_b and any(t.abs().max() > 0 for t in lora_b), "LoRA B starts at zero; training must move it"
    else:
        base = load_file(str(base_model / "model.safetensors"))
        trained = load_file(str(final / "model.safetensors"))
        key = "model.layers.0.self_attn.q_proj.weight"
        assert not trained[key].equal(base[key]) and all(t.isfinite().all() for t in trained.values())


SLOW_SAVE = """
import importlib.machinery, os, sys, time

class _SlowSave:
    # Wraps transformers.trainer.Trainer._save_rng_state when the module is first imported: this
    # rank writes its RNG state into a checkpoint {seconds} s late (a rank descheduled, or slower).
    def find_spec(self, name, path, target=None):
        if name != "transformers.trainer":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            save = module.Trainer._save_rng_state

            def late_save(trainer, output_dir):
                time.sleep({seconds})
                save(trainer, output_dir)

            module.Trainer._save_rng_state = late_save

        spec.loader.exec_module = exec_module
        return spec

if os.environ.get("RANK") == "{rank}":
    sys.meta_path.insert(0, _SlowSave())
"""


def slow_rank_env(folder: Path, rank: int, seconds: float) -> dict[str, str]:
    """The environment for an `arle train` launch whose rank `rank` writes its RNG state (its last
    file before the main process's trainer_state.json) into each checkpoint `seconds` late: a
    sitecustomize module in `folder`, on PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SLOW_SAVE.format(rank=rank, seconds=seconds))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    return env


def kill_after_first_checkpoint(args: list[str], run: Path, steps: int, env: dict[str, str] | None = None) -> None:
    """Start `arle *args` (a training run into `run`), SIGKILL it once checkpoint-1 is whole,
    and check the kill landed mid-run: no final/, fewer than `steps` steps logged. The whole
    process tree is killed at once (the run and any process it started: accelerate's ranks,
    which torch's launcher puts in sessions of their own), as when a machine goes down: a rank
    left running would go on writing into the run."""
    import psutil  # accelerate's dependency

    proc = subprocess.Popen([*ARLE, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        # TRL's trainers write trainer_state.json last; PPO's checkpoint appears whole (renamed).
        if any((run / "checkpoint-1" / name).exists() for name in ("trainer_state.json", "trainer_state.pt")):
            break
        time.sleep(0.02)
    try:
        root = psutil.Process(proc.pid)
        root.send_signal(signal.SIGSTOP)  # stopped, it starts no process while its tree is listed
        tree = [root, *root.children(recursive=True)]
        for process in tree:
            process.send_signal(signal.SIGSTOP)
        for process in tree:
            process.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass  # it ended on its own: the asserts below say so
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before the kill: {err[-3000:]}"
    assert not (run / "final").exists(), "the kill must land mid-run"
    assert 1 <= max(steps_in(run / "metrics.jsonl")) < steps
