"""`arle train BENCH --algo grpo|rloo|ppo|sft|dpo|rft`: train a model on a benchmark (RL on its reward, or SFT/DPO
on recorded trajectories). The flags become a TrainConfig; train.run.run_train does the rest (its refusals
included), so a Python caller gets what this command does."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from arlecli.cli import options
from arlecli.cli.output import console, err_console, print_json, stat_text
from arlecli.cli.report import report_hint
from arlecli.errors import UserError


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def step_line(row: dict[str, Any], eta: float | None = None) -> str:
    """One logged step as a line: what a person watches (the full row is in metrics.jsonl)."""
    parts = [
        f"step {row['step']}/{row.get('max_steps', '?')}",
        *_learning(row),
        f"loss {_fmt(row.get('loss', row.get('policy_loss')), '.4f')}",
        f"{_fmt(row.get('seconds_per_step'), '.2f')} s/step",
        f"{_fmt(row.get('tokens_per_second'), '.0f')} tok/s",
    ]
    if eta is not None:
        parts.append(f"eta {clock(eta)}")
    return "  ".join(parts)


def clock(seconds: float) -> str:
    """H:MM:SS, as Rich's bars write a time."""
    whole = max(0, int(round(seconds)))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class StepClock:
    """The time left, from the steps logged so far this session: their mean seconds per step
    (metrics.jsonl's seconds_per_step, which leaves held-out evaluations out) times the steps
    to go. Known from the first step on; Rich's own estimate needs two updates within its
    30 s window, so a CPU run's steps of a minute never got one (`-:--:--`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps = 0
        self.last_step: int | None = None

    def eta(self, row: dict[str, Any]) -> float | None:
        """Seconds left after the logged step `row` (None: unknown, e.g. no max_steps)."""
        step, per_step, total = row.get("step"), row.get("seconds_per_step"), row.get("max_steps")
        if isinstance(step, int) and isinstance(per_step, (int, float)):
            done = step - self.last_step if self.last_step is not None and step > self.last_step else 1
            self.seconds += per_step * done
            self.steps += done
        if isinstance(step, int):
            self.last_step = step
        if not self.steps or not isinstance(total, int) or not isinstance(step, int):
            return None
        return max(0, total - step) * self.seconds / self.steps


def _learning(row: dict[str, Any]) -> list[str]:
    # What says the model is learning: RL's reward, accuracy and KL; DPO's preference accuracy
    # and margin; SFT's next-token accuracy on the trained tokens.
    if "rewards/margins" in row:
        return [f"pref acc {_fmt(row.get('rewards/accuracies'))}", f"margin {_fmt(row.get('rewards/margins'), '.4f')}"]
    if "reward" not in row and "mean_token_accuracy" in row:
        return [f"token acc {_fmt(row.get('mean_token_accuracy'))}"]
    return [f"reward {_fmt(row.get('reward'))}", f"acc {_fmt(row.get('accuracy'))}", f"kl {_fmt(row.get('kl'), '.4f')}"]


class ProgressView:
    """A Rich progress view on a terminal (training bar + held-out eval bar); plain lines in logs."""

    def __init__(self) -> None:
        self.tty = err_console().is_terminal
        self.progress = None
        self.train_task = None
        self.eval_task = None
        self.eval_label = ""
        self.eval_correct = self.eval_new = self.eval_done_n = self.eval_total = 0
        self.clock = StepClock()

    def _bars(self):
        if self.progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            # The time left is ours (StepClock): Rich's estimate of it stays blank for steps
            # slower than its 30 s window.
            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TextColumn("{task.fields[eta]}"),
                TextColumn("{task.fields[info]}"),
                console=err_console(),
            )
            self.progress.start()
        return self.progress

    def message(self, text: str) -> None:
        _say(text)

    def log(self, row: dict[str, Any]) -> None:
        eta = self.clock.eta(row)
        if not self.tty:
            err_console().print(step_line(row, eta), highlight=False, soft_wrap=True)
            return
        bars = self._bars()
        info = " ".join([*_learning(row), f"{_fmt(row.get('seconds_per_step'), '.1f')} s/step"])
        if self.train_task is None:
            self.train_task = bars.add_task("train", total=row.get("max_steps"), info="", eta="")
        bars.update(
            self.train_task,
            completed=row["step"],
            info=info,
            eta=f"eta {clock(eta)}" if eta is not None else "eta -:--:--",
        )

    def eval_start(self, label: str, total: int, done: int) -> None:
        self.eval_label, self.eval_total, self.eval_done_n = label, total, done
        self.eval_correct = self.eval_new = 0
        if self.tty:
            self.eval_task = self._bars().add_task(f"eval {label}", total=total, completed=done, info="", eta="")
        else:
            err_console().print(
                f"eval {label}: {total} held-out tasks" + (f" ({done} done)" if done else ""), highlight=False
            )

    def eval_sample(self, sample: dict[str, Any]) -> None:
        self.eval_new += 1
        self.eval_correct += bool(sample["correct"])
        if self.tty and self.eval_task is not None:
            self.progress.update(self.eval_task, advance=1, info=f"acc {self.eval_correct / self.eval_new:.3f}")

    def eval_done(self, label: str, results: dict[str, Any]) -> None:
        acc = results["metrics"]["accuracy"]
        if self.tty and self.eval_task is not None:
            self.progress.remove_task(self.eval_task)
            self.eval_task = None
        err_console().print(
            f"eval {label}: accuracy {stat_text(acc['value'])} ± {stat_text(acc['stderr'])}"
            f" ({results['n_tasks']} tasks)",
            highlight=False,
        )

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def train_command(
    ctx: typer.Context,
    bench: Optional[str] = typer.Argument(
        None, metavar="BENCH", help="Benchmark name or card file (or `benchmark:` in the recipe)."
    ),
    algo: Optional[str] = typer.Option(
        None,
        "--algo",
        help="grpo (default), rloo or ppo (RL on the card's "
        "reward); sft or dpo (on recorded trajectories: --data); rft (rounds of "
        "sampling, keeping what the reward accepts, SFT on it).",
    ),
    data: Optional[str] = typer.Option(
        None,
        "--data",
        help="sft/dpo: a JSONL file of SFT rows (dpo: preference "
        "pairs), from `arle data from-eval RUN [--pairs] -o FILE.jsonl`.",
    ),
    rows: Optional[str] = typer.Option(
        None,
        "--rows",
        help="grpo/rloo/ppo/rft: the benchmark's rows from a local "
        "file in the dataset's own schema (jsonl, json, parquet, csv) instead of "
        "the card's source, read as `arle eval --rows` reads them.",
    ),
    eval_rows: Optional[str] = typer.Option(
        None,
        "--eval-rows",
        help="Held-out evaluations on the rows of this "
        "file (default: the card's eval split; with --rows and no "
        "--eval-split, the --rows file).",
    ),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="Profile name, local folder or hub id. "
        "Default: the default profile, else the embedded SmolLM2-135M-Instruct.",
    ),
    recipe: Optional[str] = typer.Option(
        None,
        "--recipe",
        help="Recipe YAML (a file, or a packaged recipe name such as countdown-grpo-cpu): arle and trainer fields.",
    ),
    sets: Optional[list[str]] = typer.Option(
        None,
        "--set",
        help="KEY=VALUE: any arle field or trainer config "
        "field (GRPOConfig/RLOOConfig, PPO params); repeatable; wins over "
        "the recipe and the flags.",
    ),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, help="Optimizer steps (default 100)."),
    num_generations: Optional[int] = typer.Option(
        None, "--num-generations", min=1, help="Completions per prompt (default: the trainer's)."
    ),
    learning_rate: Optional[float] = typer.Option(
        None,
        "--learning-rate",
        "--lr",
        # > 0, checked with --set learning_rate and the recipe's (train.config): one message for all three.
        help="Must be > 0. Default: 1e-6 (full fine-tune), 1e-5 (LoRA); sft 2e-5 / 2e-4, dpo 1e-6 / 1e-5.",
    ),
    lora_rank: Optional[int] = typer.Option(
        None, "--lora-rank", min=0, help="LoRA rank on all linear layers; 0 (default) = full fine-tune."
    ),
    backend: Optional[str] = typer.Option(
        None,
        "--backend",
        help="Rollouts and held-out evals: hf (default: the "
        "eval's engine over the live policy) or vllm (in-process vLLM, synced "
        "to the policy before each rollout).",
    ),
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens", min=1, help="Tokens per model turn, as in `arle eval` (default: the card's)."
    ),
    max_staleness: Optional[int] = typer.Option(
        None,
        "--max-staleness",
        help="grpo, rloo, ppo: sample the next N steps' rollouts while a step updates (asynchronous RL; "
        "default 0: synchronous). The loss corrects for the lag (truncated importance sampling: is_cap, "
        "is_correction).",
    ),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", min=0.0, help="Rollout sampling temperature (default 1.0)."
    ),
    max_thinking_tokens: Optional[int] = options.MAX_THINKING_TOKENS,
    think_tags: Optional[str] = options.THINK_TAGS,
    chat_template_kwargs: Optional[list[str]] = options.CHAT_TEMPLATE_KWARGS,
    quantization: Optional[str] = options.QUANTIZATION,
    kv_cache_dtype: Optional[str] = options.KV_CACHE_DTYPE,
    vllm_server: Optional[str] = typer.Option(
        None,
        "--vllm-server",
        help="URL of a `trl vllm-serve` server: "
        "grpo/rloo rollouts run there, weights synced by TRL over NCCL "
        "(multi-node; needs CUDA).",
    ),
    opponent: Optional[str] = typer.Option(
        None,
        "--opponent",
        help="Two-player game cards: who plays the other "
        "seat in rollouts: self (default: self-play, each seat trained with "
        "its own outcome), random or scripted. Held-out evals play the "
        "card's opponent.",
    ),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Run directory (default: a new folder in runs/ named train-BENCH-MODEL-TIMESTAMP)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue from the run's last checkpoint (the latest matching run when --output is not given).",
    ),
    eval_every: Optional[int] = typer.Option(
        None, "--eval-every", min=0, help="Held-out eval every N steps too (default: before and after only)."
    ),
    eval_split: Optional[str] = typer.Option(None, "--eval-split", help="Held-out split (default: the card's)."),
    eval_limit: Optional[int] = typer.Option(
        None, "--eval-limit", min=0, help="Held-out tasks per eval (default 50; 0 = no held-out eval)."
    ),
    report_to: Optional[str] = typer.Option(None, "--report-to", help="none (default), tensorboard, trackio or wandb."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Default 1234."),
    split: Optional[str] = typer.Option(
        None, "--split", help="Train split (default: train if the card has one, else its default split)."
    ),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Train on the first N rows only."),
    save_steps: Optional[int] = typer.Option(
        None, "--save-steps", min=1, help="Checkpoint every N steps (default 50)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json to stdout."),
    sandbox: str = typer.Option(
        "require",
        "--sandbox",
        help="require (default) refuses to run model-written "
        "code where the code sandbox cannot isolate it; auto warns and runs it with "
        "rlimits only. RL training rewards whatever passes the tests: keep require.",
    ),
    num_processes: Optional[int] = typer.Option(
        None,
        "--num-processes",
        min=1,
        help="Training processes per "
        "machine (data parallel through accelerate; gloo on CPU, NCCL on "
        "GPU). Per-device batch x processes must be a multiple of "
        "--num-generations.",
    ),
    deepspeed: Optional[str] = typer.Option(
        None,
        "--deepspeed",
        help="zero2 or zero3: DeepSpeed ZeRO through accelerate (needs CUDA and `pip install deepspeed`).",
    ),
    fsdp: bool = typer.Option(False, "--fsdp", help="FSDP full shard through accelerate (needs CUDA)."),
    accelerate_config: Optional[Path] = typer.Option(
        None, "--accelerate-config", help="Launch with this accelerate config file (from `accelerate config`) instead."
    ),
    num_machines: Optional[int] = typer.Option(
        None,
        "--num-machines",
        min=1,
        help="Machines (multi-node); run the same command on each with its --machine-rank.",
    ),
    machine_rank: Optional[int] = typer.Option(None, "--machine-rank", min=0, help="This machine's rank (0 = main)."),
    main_process_ip: Optional[str] = typer.Option(None, "--main-process-ip", help="Address of machine rank 0."),
    main_process_port: Optional[int] = typer.Option(
        None,
        "--main-process-port",
        min=0,
        help="Port on machine rank 0 (default: a free port on one machine, 29500 across machines).",
    ),
) -> None:
    """Train a model on a benchmark: RL on its reward, or SFT/DPO on recorded trajectories (--data);
    writes checkpoints, metrics, held-out evals and the final model."""
    from arlecli import rundir
    from arlecli.models import resolve_model
    from arlecli.catalog import load_card, resolve_references
    from arlecli.config import parse_template_kwargs
    from arlecli.train.config import load_recipe, parse_set, resolve
    from arlecli.train import launch
    from arlecli.train.run import TrainView, refuse, run_train

    launch_opts = launch.LaunchOptions(
        num_processes,
        num_machines,
        machine_rank,
        main_process_ip,
        main_process_port,
        deepspeed,
        fsdp,
        accelerate_config,
    )
    launch.check_ranks(launch_opts)  # before a single-machine run would take the rank for nothing
    recipe_data: dict[str, Any] = {}
    recipe_name = None
    if recipe:
        path, recipe_data = load_recipe(recipe)
        recipe_name = str(path)
    flags = {
        "benchmark": bench,
        "algo": algo,
        "model": model,
        "backend": backend,
        "split": split,
        "limit": limit,
        "lora_rank": lora_rank,
        "eval_every": eval_every,
        "eval_split": eval_split,
        "eval_limit": eval_limit,
        "max_steps": max_steps,
        "num_generations": num_generations,
        "data": data,
        "rows": rows,
        "eval_rows": eval_rows,
        "learning_rate": learning_rate,
        "report_to": report_to,
        "seed": seed,
        "save_steps": save_steps,
        "max_completion_length": max_tokens,
        "max_staleness": max_staleness,
        "temperature": temperature,
        "quantization": quantization,
        "kv_cache_dtype": kv_cache_dtype,
        "vllm_server": vllm_server,
        "opponent": opponent,
        "think_tags": think_tags,
        "chat_template_kwargs": parse_template_kwargs(chat_template_kwargs) or None,
        "max_thinking_tokens": max_thinking_tokens,
    }
    cfg = resolve(recipe_data, flags, parse_set(sets or []), recipe_name=recipe_name)
    if not cfg.options.benchmark:
        raise UserError("which benchmark? `arle train BENCH ...`, or `benchmark:` in the recipe")
    card = load_card(cfg.options.benchmark)
    resolve_references(card)
    # Before resolving the model (the embedded one unpacks): nothing loads. A launcher leaves the
    # warnings to its main rank, which says them here.
    warn = None if launch_opts.wanted() or launch.rank() != 0 else _say
    refuse(card, cfg, sandbox=sandbox, message=warn)
    spec = resolve_model(
        cfg.options.model, think_tags=cfg.options.think_tags, chat_template_kwargs=cfg.options.chat_template_kwargs
    )
    run_dir = rundir.choose_dir(output, f"train-{card.name}", spec.name, resume)
    command = launch.original_command() or ["arle", *sys.argv[1:]]
    if launch_opts.wanted():
        refuse(card, cfg, spec, sandbox=sandbox)  # the model's checks too, before any process starts
        launch.check(launch_opts, cfg.options.algo)
        if (num_machines or 1) > 1 and output is None:
            raise UserError(
                "--num-machines needs --output: the same run directory (on a shared filesystem) on every machine"
            )
        if not machine_rank:
            rundir.check_fresh(run_dir, resume)
        child = ["train", *child_args(ctx), "--output", str(run_dir)]
        rc = launch.launch(launch_opts, child, command, message=lambda text: err_console().print(text, highlight=False))
        raise typer.Exit(rc)
    if launch.rank() != 0:  # a launched rank other than the main one: the main process speaks for the run
        try:
            run_train(
                card,
                cfg,
                spec,
                run_dir,
                resume=resume,
                command=command,
                view=TrainView(message=_quiet),
                sandbox=sandbox,
            )
        except UserError:
            raise typer.Exit(2) from None  # the main process prints the error once
        return
    rundir.check_fresh(run_dir, resume)  # before any model loads: a resume of a folder that never ran is refused
    view = ProgressView()
    try:  # run_train refuses what cannot train, says what it trains, then trains
        summary = run_train(
            card,
            cfg,
            spec,
            run_dir,
            resume=resume,
            command=command,
            sandbox=sandbox,
            refused=True,
            view=TrainView(
                log=view.log,
                eval_start=view.eval_start,
                eval_sample=view.eval_sample,
                eval_done=view.eval_done,
                message=view.message,
            ),
        )
    finally:
        view.stop()
    if as_json:
        print_json(summary)
    else:
        print_summary(summary, run_dir)
    # What to do next with the run; on stderr under --json, so stdout stays one JSON document.
    (err_console() if as_json else console()).print(report_hint(run_dir), highlight=False, soft_wrap=True)


_LAUNCH_PARAMS = {
    "num_processes",
    "deepspeed",
    "fsdp",
    "accelerate_config",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "output",
}


def _say(text: str) -> None:
    err_console().print(text, highlight=False, soft_wrap=True)  # one line in a log, however long


def _quiet(text: str) -> None:
    pass


def child_args(ctx: typer.Context) -> list[str]:
    """This command's parsed arguments as a command line again, minus the launch flags and --output."""
    args: list[str] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.name in _LAUNCH_PARAMS or value is None:
            continue
        if param.param_type_name == "argument":
            args.append(str(value))
        elif param.param_type_name == "option":
            opt = max(param.opts, key=len)  # the long name
            if getattr(param, "is_flag", False):
                if value:
                    args.append(opt)
            elif param.multiple:
                for v in value:
                    args += [opt, str(v)]
            else:
                args += [opt, str(value)]
    return args


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    """Before/after held-out accuracy, where the model is, how to evaluate it."""
    out = console()
    before, after = summary.get("before"), summary.get("after")
    if before and after:
        delta = (after["accuracy"] or 0.0) - (before["accuracy"] or 0.0)
        out.print(
            f"held-out accuracy: {before['accuracy']:.4f} ({before['label']}) -> {after['accuracy']:.4f} "
            f"({after['label']}), {delta:+.4f}",
            highlight=False,
        )
    from arlecli.train.algorithm import recorded  # here, not at the top: `arle --help` stays fast

    declared = recorded(summary.get("algo"))
    unit = declared.unit if declared else "steps"
    out.print(f"{summary['global_step']} {unit}; final model: {summary['final_model']}", highlight=False)
    out.print(
        f"run directory: {run_dir}  (evaluate: arle eval {summary['benchmark']} --model {summary['final_model']})",
        highlight=False,
    )
