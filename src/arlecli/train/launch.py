"""Scale-out: `arle train` re-launches itself under `accelerate launch` (DDP, DeepSpeed ZeRO, FSDP).

We do not write a distributed runtime. With `--num-processes N` (N > 1), `--num-machines`,
`--deepspeed zero2|zero3`, `--fsdp` or `--accelerate-config FILE`, the `arle train` process
becomes a launcher: it runs `python -m accelerate.commands.launch ... -m arlecli train ARGS`,
where ARGS is the same command line minus the launch flags, plus `--output RUN_DIR` (so every
process, on every node, agrees on the run directory). `ARLE_LAUNCHED=1` in the children's
environment keeps them from launching again. On a machine without CUDA the processes talk
over gloo (`ACCELERATE_USE_CPU`), on GPUs over NCCL; DeepSpeed and FSDP get a minimal
accelerate config file written for the launch.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlecli.errors import UserError
from arlecli.train.algorithm import algorithm

LAUNCHED_ENV = "ARLE_LAUNCHED"  # set in every process accelerate starts
COMMAND_ENV = "ARLE_COMMAND"  # the user's original command line (JSON), for meta.json
DEEPSPEED_MODES = ("zero2", "zero3")


@dataclass
class LaunchOptions:
    """The launch flags of `arle train` (None / False = not given)."""

    num_processes: int | None = None
    num_machines: int | None = None
    machine_rank: int | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    deepspeed: str | None = None
    fsdp: bool = False
    accelerate_config: Path | None = None

    def wanted(self) -> bool:
        """Whether this command line asks for a launch (always False inside a launched process)."""
        if in_launched_process():
            return False
        return bool(
            (self.num_processes or 1) > 1
            or (self.num_machines or 1) > 1
            or self.deepspeed
            or self.fsdp
            or self.accelerate_config
        )

    def describe(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items() if v not in (None, False)}


def in_launched_process() -> bool:
    """Whether this is one of several training processes (arle's launch, or the user's own
    `accelerate launch -m arlecli train ...`)."""
    return os.environ.get(LAUNCHED_ENV) == "1" or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def rank() -> int:
    """This process's global rank (0 outside a launch)."""
    return int(os.environ.get("RANK", "0") or 0) if in_launched_process() else 0


def original_command() -> list[str] | None:
    """The command line the user typed, inside a launched process."""
    raw = os.environ.get(COMMAND_ENV)
    return json.loads(raw) if raw and in_launched_process() else None


def check_ranks(opts: LaunchOptions) -> None:
    """--machine-rank must name one of the run's machines. A rank with no --num-machines (and no
    --accelerate-config, whose file may give the count) launches nothing: the machine would train
    alone as if it were the whole run, its rank ignored. Checked whether or not a launch is wanted."""
    rank = opts.machine_rank
    if rank is None:
        return
    if opts.num_machines is not None and rank >= opts.num_machines:
        raise UserError(
            f"--machine-rank {rank} is not one of --num-machines {opts.num_machines}'s ranks "
            f"(0 to {opts.num_machines - 1}): give each machine its own rank in that range"
        )
    if opts.num_machines is None and opts.accelerate_config is None and rank > 0:
        raise UserError(
            f"--machine-rank {rank} needs --num-machines N (N > {rank}, the same on every machine) and "
            f"--main-process-ip; on one machine drop --machine-rank"
        )


def check(opts: LaunchOptions, algo: str) -> None:
    """User mistakes in the launch flags for --algo `algo`, before anything starts."""
    check_ranks(opts)
    modes = [
        m
        for m, on in (
            ("--deepspeed", opts.deepspeed),
            ("--fsdp", opts.fsdp),
            ("--accelerate-config", opts.accelerate_config),
        )
        if on
    ]
    if len(modes) > 1:
        raise UserError(f"{' and '.join(modes)} cannot be combined: pick one")
    if opts.deepspeed is not None and opts.deepspeed not in DEEPSPEED_MODES:
        raise UserError(f"--deepspeed takes zero2 or zero3, not {opts.deepspeed!r}")
    if not algorithm(algo).distributed:
        raise UserError(
            f"--algo {algo} runs in one process; multi-process training (--num-processes, --deepspeed, "
            "--fsdp, --accelerate-config) supports --algo grpo and rloo"
        )
    if opts.accelerate_config is not None and not Path(opts.accelerate_config).is_file():
        raise UserError(f"--accelerate-config {opts.accelerate_config}: no such file")
    if opts.deepspeed and not _installed("deepspeed"):
        raise UserError("--deepspeed needs the deepspeed package: pip install deepspeed")
    if (opts.num_machines or 1) > 1 and not opts.main_process_ip and opts.accelerate_config is None:
        raise UserError(
            "--num-machines > 1 needs --main-process-ip (the rank-0 machine's address) "
            "and --machine-rank on each machine"
        )


def _installed(package: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(package)
    except PackageNotFoundError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accelerate_config(opts: LaunchOptions, num_processes: int, port: int | None) -> dict[str, Any] | None:
    """The minimal accelerate config file for DeepSpeed ZeRO-2/3 or FSDP full shard (None for DDP)."""
    if not opts.deepspeed and not opts.fsdp:
        return None
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "num_machines": opts.num_machines or 1,
        "machine_rank": opts.machine_rank or 0,
        "num_processes": num_processes,
        "main_process_ip": opts.main_process_ip,
        "main_process_port": port,
        "rdzv_backend": "static",
        "same_network": True,
        "mixed_precision": "no",  # the trainer's bf16/fp16 settings decide
        "use_cpu": False,
    }
    if opts.deepspeed:
        stage = int(opts.deepspeed[-1])
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {
            "zero_stage": stage,
            "offload_optimizer_device": "none",
            "offload_param_device": "none",
            **({"zero3_init_flag": True, "zero3_save_16bit_model": True} if stage == 3 else {}),
        }
    else:
        config["distributed_type"] = "FSDP"
        config["fsdp_config"] = {
            "fsdp_version": 1,
            "fsdp_sharding_strategy": "FULL_SHARD",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_state_dict_type": "FULL_STATE_DICT",  # final/ is one ordinary model folder
            "fsdp_offload_params": False,
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_sync_module_states": True,
            "fsdp_use_orig_params": True,  # LoRA needs the original params
        }
    return {k: v for k, v in config.items() if v is not None}


def launch_command(
    opts: LaunchOptions, child_args: list[str], *, cuda: bool, config_file: Path | None = None
) -> list[str]:
    """`python -m arlecli.train.launch FLAGS -m arlecli CHILD_ARGS`: accelerate's launcher
    (FLAGS are `accelerate launch`'s) in a process that turns a failed rank into one line.

    config_file: accelerate's config (the user's --accelerate-config, or the one written from
    accelerate_config()); DDP on one or more machines needs none."""
    nproc = opts.num_processes or 1
    machines = opts.num_machines or 1
    cmd = [sys.executable, "-m", "arlecli.train.launch"]
    if config_file is not None:
        cmd += ["--config_file", str(config_file)]
    if opts.deepspeed:
        cmd += ["--use_deepspeed", "--zero_stage", opts.deepspeed[-1]]
    elif opts.fsdp:
        cmd += ["--use_fsdp", "--fsdp_sharding_strategy", "FULL_SHARD"]
    elif opts.accelerate_config is None:
        # DDP. Without CUDA accelerate's multi-GPU launcher (torchrun) still starts the
        # processes; ACCELERATE_USE_CPU in their environment makes them CPU/gloo ranks.
        cmd += ["--multi_gpu"]
    if opts.num_processes is not None or opts.accelerate_config is None:
        cmd += ["--num_processes", str(nproc * machines)]  # accelerate counts processes over all machines
    if opts.num_machines is not None or opts.accelerate_config is None:
        cmd += ["--num_machines", str(machines)]
    if opts.machine_rank is not None:
        cmd += ["--machine_rank", str(opts.machine_rank)]
    if opts.main_process_ip:
        cmd += ["--main_process_ip", opts.main_process_ip]
    if opts.main_process_port is not None:
        cmd += ["--main_process_port", str(opts.main_process_port)]
    if opts.accelerate_config is None:
        cmd += ["--mixed_precision", "no", "--dynamo_backend", "no"]
    if not cuda and opts.accelerate_config is None:
        threads = max(1, (os.cpu_count() or 1) // nproc)
        cmd += ["--num_cpu_threads_per_process", str(threads)]
    return [*cmd, "-m", "arlecli", *child_args]


def launch(opts: LaunchOptions, child_args: list[str], command: list[str], message: Any = None) -> int:
    """Run `arle CHILD_ARGS` under accelerate; return the launcher's exit code."""
    import torch

    cuda = torch.cuda.is_available()
    if opts.main_process_port is None and (opts.num_machines or 1) == 1 and opts.accelerate_config is None:
        opts = LaunchOptions(**{**opts.__dict__, "main_process_port": free_port()})
    env = {**os.environ, LAUNCHED_ENV: "1", COMMAND_ENV: json.dumps(command)}
    if not cuda:
        if opts.deepspeed or opts.fsdp:
            raise UserError(
                f"--{'deepspeed' if opts.deepspeed else 'fsdp'} needs CUDA GPUs; on CPU use "
                f"--num-processes N (DDP over gloo)"
            )
        env["ACCELERATE_USE_CPU"] = "true"
        # Else every rank's device is "cpu:0", which the Trainer then passes to torch.load as
        # map_location when resuming, and torch cannot restore storages to "cpu:0".
        env.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
    with tempfile.TemporaryDirectory(prefix="arle-launch-") as tmp:
        config_file = opts.accelerate_config
        config = accelerate_config(opts, (opts.num_processes or 1) * (opts.num_machines or 1), opts.main_process_port)
        if config is not None:
            import yaml

            config_file = Path(tmp) / "accelerate_config.yaml"
            config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        cmd = launch_command(opts, child_args, cuda=cuda, config_file=config_file)
        if message is not None:
            message(
                f"launching {opts.num_processes or 'configured'} process(es) per machine through accelerate "
                f"({'gloo/CPU' if not cuda else 'NCCL/GPU'})"
            )
        return subprocess.run(cmd, env=env).returncode


def _launcher(argv: list[str]) -> int:
    """`accelerate launch ARGV`, programmatically; a failed rank becomes one line, not the
    launcher's traceback (the rank printed its own error or traceback already)."""
    from accelerate.commands.launch import launch_command as accelerate_launch
    from accelerate.commands.launch import launch_command_parser

    args = launch_command_parser().parse_args(argv)
    try:
        accelerate_launch(args)
    except subprocess.CalledProcessError as exc:  # accelerate's single-process and DeepSpeed launchers
        return 2 if exc.returncode == 2 else (exc.returncode or 1)
    except Exception as exc:  # noqa: BLE001  torchrun's ChildFailedError (imported lazily by accelerate)
        failures = getattr(exc, "failures", None)
        if not failures:
            raise
        codes = {int(f.exitcode) for f in failures.values()}
        if 2 in codes:
            return 2  # a user mistake: the main rank printed it as one line
        rank, failure = min(failures.items())
        print(
            f"error: training process rank {rank} failed (exit code {failure.exitcode}); its messages are above",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_launcher(sys.argv[1:]))
