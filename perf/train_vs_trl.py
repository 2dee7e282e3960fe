"""`arle train --algo grpo` vs a minimal script calling TRL's GRPOTrainer directly.

What is measured: seconds per GRPO step (generation + reward + update), generated tokens
per step, seconds per generated token, start-up time and peak RSS, for

  arle   `arle train examples/cpu_grpo_demo/sums.yaml --recipe examples/cpu_grpo_demo/recipe.yaml
          --max-steps N --seed S --max-tokens M --eval-limit 0 --output DIR --model MODEL`
          (its metrics.jsonl);
  trl    this file re-run as `--trl-child SPEC`: a plain `GRPOTrainer(model=MODEL,
          reward_funcs=number_reward, args=GRPOConfig(...), train_dataset=..., peft_config=LoraConfig(...))`
          with a TrainerCallback timing each step.

Same model (the embedded SmolLM2-135M-Instruct; `--quick`: the tiny test model), same
prompts (the card's chat messages, rendered once here with arle's own
`arlecli.cards.render_prompt` and handed to the plain script as data), same dataset
length and seed (so TRL's sampler draws the same tasks each step: checked from both runs'
task indices; repeat r uses seed 1234 + r in both tools), same reward logic (the `number`
reward re-implemented as a plain function), same GRPOConfig (checked field by field
against arle's resolved config in meta.json) and LoRA r16/alpha 32 on all linear layers, as
the demo recipe sets.

Who generates: since issue 11, arle's GRPO hands TRL its own rollouts (TRL's `rollout_func`:
`envs.episodes.collect` on arle's hf engine over the live policy, continuous batching: a row
leaves the batch at its EOS and a waiting one takes its slot), while the plain script lets
TRL generate (`model.generate` on the whole batch of 16, which runs until its longest row
ends). The rest of the step (loss forward, backward, optimizer) is TRL's in both, on
completions padded to the step's longest, so it costs the same whoever generated.
`--max-completion-length 128` makes completions ragged (most end within ~30 tokens, a few
ramble to the budget): the regime continuous batching is for.

A step's time is the interval between consecutive per-step logs (the first from the start
of training), the way arle's metrics.jsonl measures it; the first step is warm-up and left
out. Within it, both children time TRL's `GRPOTrainer._generate` (the same boundary on both
sides: TRL's own generation, or arle's rollout_func) and count the model tokens it returned,
so the table splits a step into generation and the rest and gives tokens per second of
each. Runs are interleaved (arle, trl, arle, trl ...) and the medians over repeats are
reported. GRPO samples at temperature 1 and the two tools draw their samples from different
random streams, so the completions (and their lengths) differ between the tools: compare
tokens per second, not only seconds per step. Token counts are honest on both sides: the
demo card has no stop strings, so arle stops a row exactly where TRL does (EOS or
max_completion_length; the EOS token counts on both sides); with a card that has stop
strings arle would stop at them and generate fewer tokens than TRL (the table reports the
card's stop strings and arle's finish reasons). "static-batch token slots" is what a
static batch computes (rows x its longest row): TRL's cost model, shown next to the tokens
both tools actually kept. Peak RSS comes from wait4() on each subprocess.

    python perf/train_vs_trl.py            # SmolLM2-135M, 5 steps x 2 repeats each, 1 thread (~10-30 min)
    python perf/train_vs_trl.py --max-completion-length 128 --out perf/results/train_vs_trl_ragged.json
    python perf/train_vs_trl.py --quick    # tiny model, 3 steps x 1 repeat (~30 s)

Writes perf/results/train_vs_trl.json (quick runs: train_vs_trl_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

from machine_info import cpu_model, perf_model, write_result

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "examples" / "cpu_grpo_demo" / "sums.yaml"
RECIPE = ROOT / "examples" / "cpu_grpo_demo" / "recipe.yaml"
RESULTS = ROOT / "perf" / "results"
# Issue 11: with arle's engine generating, a step should take <= 0.8x plain TRL's (continuous
# batching wins on ragged completions) and never more than 1.0x (issue 7's bar was 1.05x).
TARGET_RATIO = 0.8
CEILING_RATIO = 1.0

# Keys of the recipe that are arle's own, not GRPOConfig fields (see arlecli.train.config).
ARLE_RECIPE_KEYS = {
    "algo",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "eval_split",
    "eval_limit",
    "eval_every",
    "eval_max_tokens",
    "eval_batch_size",
    "limit",
    "split",
}
# GRPOConfig fields whose values name this run's directory, so they differ by design.
PER_RUN_FIELDS = {"output_dir", "logging_dir", "run_name"}


# --------------------------------------------------------------------------------------
# The plain-TRL side: what a user would write without arle.
# --------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_TAGGED = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def number_score(text: str, gold: str) -> float:
    """The `number` reward's rule: the last number (inside the last <answer> tag if any) equals gold."""
    tags = _TAGGED.findall(text)
    found = _NUMBER.findall(tags[-1] if tags else text)
    if not found:
        return 0.0
    try:
        return float(Fraction(found[-1].replace(",", "")) == Fraction(str(gold).strip().replace(",", "")))
    except (ValueError, ZeroDivisionError):
        return 0.0


def time_generation(trainer_cls: type, calls: list[dict[str, Any]]) -> None:
    """Make `trainer_cls._generate` (TRL's generation step, arle's rollout_func inside it) append
    one record per call to `calls`: wall and CPU seconds, and the model tokens it returned
    (environment tokens, masked out by env_mask, are not counted)."""
    original = trainer_cls._generate

    def _generate(self: Any, prompts: list[Any]) -> Any:
        started, cpu = time.monotonic(), time.process_time()
        out = original(self, prompts)
        completion_ids, env_mask = out[1], out[2]
        lengths = [sum(m) for m in env_mask] if env_mask is not None else [len(ids) for ids in completion_ids]
        calls.append(
            {
                "seconds": time.monotonic() - started,
                "cpu_seconds": time.process_time() - cpu,
                "rows": len(lengths),
                "tokens": int(sum(lengths)),
                "longest": int(max(lengths, default=0)),
            }
        )
        return out

    trainer_cls._generate = _generate


def trl_child(spec_path: Path) -> None:
    """Run plain TRL GRPO as described by `spec_path` (written by the parent) and record each step."""
    spec = json.loads(spec_path.read_text())
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    generate_calls: list[dict[str, Any]] = []
    time_generation(GRPOTrainer, generate_calls)
    rows = json.loads(Path(spec["prompts"]).read_text())
    dataset = Dataset.from_list(
        [{"prompt": r["prompt"], "answer": r["answer"], "index": i} for i, r in enumerate(rows)]
    )
    seen: list[list[int]] = []  # task indices scored per reward call (checks both tools drew the same)

    def number(completions: list[Any], answer: list[str], index: list[int], **_: Any) -> list[float]:
        seen.append([int(i) for i in index])
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [number_score(t, g) for t, g in zip(texts, answer)]

    steps: list[dict[str, Any]] = []

    class StepTimer(TrainerCallback):
        """Seconds between consecutive step logs, as arle's MetricsLog measures them."""

        def on_train_begin(self, args, state, control, **kwargs):
            self.last, self.last_cpu = time.monotonic(), time.process_time()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "train_runtime" in logs:
                return
            now, cpu = time.monotonic(), time.process_time()
            steps.append(
                {
                    "step": state.global_step,
                    "seconds_per_step": now - self.last,
                    "cpu_seconds_per_step": cpu - self.last_cpu,
                    **{k: v for k, v in logs.items() if isinstance(v, (int, float))},
                }
            )
            self.last, self.last_cpu = now, cpu

    lora = spec["lora"]
    profile_to = os.environ.get("ARLE_PERF_PROFILE")
    profiler = None
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=number,
        args=GRPOConfig(**spec["config"]),
        train_dataset=dataset,
        peft_config=LoraConfig(
            r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
        ),
        callbacks=[StepTimer()],
    )
    trainer.train()
    trainer.save_model(str(Path(spec["config"]["output_dir"]) / "final"))  # arle saves final/ too
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile_to)
    out = {"steps": steps, "indices": seen, "config": trainer.args.to_dict(), "generate_calls": generate_calls}
    Path(spec["result"]).write_text(json.dumps(out, default=str))


def arle_child(argv: list[str]) -> None:
    """`arle ARGV` in this process, unchanged except that each metrics.jsonl line also gets
    `cpu_seconds_per_step` (process CPU time, all threads), which shared-machine load barely
    moves, unlike wall time, and TRL's `_generate` (arle's rollouts) is timed into the JSON
    file ARLE_PERF_GENERATE_LOG names. With ARLE_PERF_PROFILE=FILE the run is profiled (cProfile)."""
    from arlecli.cli.main import main as arle_main
    from arlecli.train.grpo import import_trl
    from arlecli.train.metrics import MetricsLog

    generate_calls: list[dict[str, Any]] = []
    # As arle imports trl (without vllm), so the timer sits on the class arle's trainer subclasses.
    time_generation(import_trl(False).GRPOTrainer, generate_calls)
    log_to = os.environ.get("ARLE_PERF_GENERATE_LOG")
    if log_to:
        import atexit

        atexit.register(lambda: Path(log_to).write_text(json.dumps(generate_calls)))

    restart, record = MetricsLog.restart_clock, MetricsLog.record
    clock = {"cpu": time.process_time()}

    def restart_clock(self: MetricsLog) -> None:
        clock["cpu"] = time.process_time()
        restart(self)

    def record_with_cpu(self: MetricsLog, step: int, logs: dict[str, Any]) -> dict[str, Any]:
        now = time.process_time()
        logs = {**logs, "cpu_seconds_per_step": now - clock["cpu"]}
        clock["cpu"] = now
        return record(self, step, logs)

    MetricsLog.restart_clock, MetricsLog.record = restart_clock, record_with_cpu
    sys.argv = ["arle", *argv]
    profile_to = os.environ.get("ARLE_PERF_PROFILE")
    if not profile_to:
        arle_main()
        return
    import cProfile

    profiler = cProfile.Profile()
    try:
        profiler.runcall(arle_main)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        profiler.dump_stats(profile_to)


# --------------------------------------------------------------------------------------
# The harness.
# --------------------------------------------------------------------------------------


@dataclass
class Run:
    """One subprocess run of either tool."""

    tool: str
    repeat: int | str
    wall_s: float
    peak_rss_mb: float
    steps: list[dict[str, Any]]  # per logged step: seconds_per_step, completion lengths ...
    indices: list[int] = field(default_factory=list)  # task indices in scoring order
    config: dict[str, Any] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)  # arle's rewards.jsonl (trl: none logged)

    def __post_init__(self) -> None:
        for s in self.steps:  # TRL logs the mean completion length; a step generates batch-size completions
            s.setdefault("generate_tokens", round(s["completions/mean_length"] * s["_batch"]))

    def timed(self) -> list[dict[str, Any]]:
        """The steps after the warm-up first one."""
        return [s for s in self.steps if s["step"] > 1]

    def seconds_per_step(self) -> float:
        return statistics.median(s["seconds_per_step"] for s in self.timed())

    def cpu_seconds_per_step(self) -> float:
        return statistics.median(s["cpu_seconds_per_step"] for s in self.timed())

    def tokens_per_step(self) -> float:
        return statistics.mean(s["generate_tokens"] for s in self.timed())

    def seconds_per_token(self) -> float:
        timed = self.timed()
        return sum(s["seconds_per_step"] for s in timed) / sum(s["generate_tokens"] for s in timed)

    def generate_seconds_per_step(self) -> float:
        """TRL's `_generate` (TRL's generation, or arle's rollouts) per step."""
        return statistics.median(s["generate_s"] for s in self.timed())

    def rest_seconds_per_step(self) -> float:
        """The step without generation: reward, loss forward, backward, optimizer."""
        return statistics.median(s["seconds_per_step"] - s["generate_s"] for s in self.timed())

    def generate_tokens_per_second(self) -> float:
        timed = self.timed()
        return sum(s["generate_tokens"] for s in timed) / sum(s["generate_s"] for s in timed)

    def step_tokens_per_second(self) -> float:
        return 1 / self.seconds_per_token()

    def static_slots_per_step(self) -> float:
        """Token slots a static batch computes (rows x longest row), whoever generated."""
        return statistics.mean(s["generate_rows"] * s["generate_longest"] for s in self.timed())

    def kept_share_of_static_slots(self) -> float:
        timed = self.timed()
        return sum(s["generate_tokens"] for s in timed) / sum(s["generate_rows"] * s["generate_longest"] for s in timed)

    def startup_s(self) -> float:
        """Wall time outside the steps: imports, model load, dataset, final save."""
        return self.wall_s - sum(s["seconds_per_step"] for s in self.steps)


def snapshot_source(work: Path) -> tuple[Path, dict[str, Any]]:
    """A copy of src/ under `work` for the children's PYTHONPATH, and what it was copied from.

    Why: the checkout is shared with people editing it; a child that imports arle after an
    edit would measure other code than its peer did. Every child of one invocation imports
    this copy (ahead of the editable install), and the result records the commit and any
    uncommitted changes under src/ it was taken with."""
    import hashlib
    import shutil

    snap = work / "src"
    shutil.copytree(ROOT / "src", snap, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    digest = hashlib.sha256()
    for path in sorted(snap.rglob("*.py")):
        digest.update(str(path.relative_to(snap)).encode() + path.read_bytes())

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return snap, {
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted_in_src": git("status", "--porcelain", "--", "src").splitlines(),
        "src_sha256": digest.hexdigest()[:16],
    }


def run_measured(cmd: list[str], log: Path, env: dict[str, str]) -> tuple[float, float]:
    """Run `cmd`; return (wall seconds, peak RSS in MB) from wait4 (this child only)."""
    started = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{cmd[:4]}... failed with exit code {proc.returncode}; log {log}:\n{tail}")
    return wall, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def trainer_fields(recipe: dict[str, Any], steps: int, max_completion_length: int | None = None) -> dict[str, Any]:
    """The GRPOConfig fields arle sets for this recipe (recipe + arle's trainer defaults + CPU
    settings), with `max_completion_length` overridden when given (arle's --max-tokens)."""
    from arlecli.train.config import TRAINER_DEFAULTS

    fields = {**TRAINER_DEFAULTS, **{k: v for k, v in recipe.items() if k not in ARLE_RECIPE_KEYS}}
    fields["max_steps"] = steps
    if max_completion_length:
        fields["max_completion_length"] = max_completion_length
    if fields.get("save_steps", 0) <= steps:
        raise SystemExit(
            f"--steps {steps} reaches the recipe's save_steps ({fields['save_steps']}): keep checkpoints "
            "out of the timed steps"
        )
    fields.update(disable_tqdm=True, use_cpu=True, bf16=False)  # what arle adds on a CPU without CUDA
    return fields


def render_prompts(path: Path) -> tuple[int, list[str]]:
    """The train split's chat prompts exactly as `arle train` builds them, with their targets;
    returns (rows, the card's stop strings)."""
    from arlecli.cards import render_prompt
    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.catalog import load_card
    from arlecli.train.run import train_split

    card = load_card(str(CARD))
    tasks, exemplars = load_tasks(card, EvalOptions(split=train_split(card, None), limit=None, num_fewshot=None))
    rows = [{"prompt": render_prompt(card.prompt, t, exemplars), "answer": t.target} for t in tasks]
    path.write_text(json.dumps(rows))
    return len(rows), list(card.prompt.stop)


def arle_command(out: Path, model: str, config: dict[str, Any]) -> list[str]:
    """`arle train` on the demo card and recipe, with the steps, seed and token budget of
    `config` as flags (through arle_child, which only adds timers)."""
    return [
        sys.executable,
        __file__,
        "--arle-child",
        "train",
        str(CARD),
        "--recipe",
        str(RECIPE),
        "--max-steps",
        str(config["max_steps"]),
        "--seed",
        str(config["seed"]),
        "--max-tokens",
        str(config["max_completion_length"]),
        "--eval-limit",
        "0",
        "--output",
        str(out),
        "--model",
        model,
    ]


def with_generation(steps: list[dict[str, Any]], calls: list[dict[str, Any]], batch: int) -> list[dict[str, Any]]:
    """Each logged step with its `_generate` call (one per optimizer step: steps_per_generation
    is 1 in this config, so call k belongs to step k+1)."""
    if len(calls) != len(steps):
        raise SystemExit(f"expected one generation per step, got {len(calls)} for {len(steps)} steps")
    return [
        {
            **s,
            "_batch": batch,
            "generate_s": c["seconds"],
            "generate_cpu_s": c["cpu_seconds"],
            "generate_tokens": c["tokens"],
            "generate_rows": c["rows"],
            "generate_longest": c["longest"],
        }
        for s, c in zip(steps, calls)
    ]


def run_arle(work: Path, repeat: int | str, model: str, config: dict[str, Any], batch: int, env: dict[str, str]) -> Run:
    out = work / f"arle-{repeat}"
    calls_log = work / f"arle-{repeat}.generate.json"
    wall, rss = run_measured(
        arle_command(out, model, config), work / f"arle-{repeat}.log", {**env, "ARLE_PERF_GENERATE_LOG": str(calls_log)}
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [json.loads(line) for line in (out / "rewards.jsonl").read_text().splitlines()]
    reasons: dict[str, int] = {}
    for r in rewards:
        reasons[str(r.get("finish_reason"))] = reasons.get(str(r.get("finish_reason")), 0) + 1
    meta = json.loads((out / "meta.json").read_text())
    return Run(
        "arle",
        repeat,
        wall,
        rss,
        with_generation(rows, json.loads(calls_log.read_text()), batch),
        [r["task_index"] for r in rewards],
        meta["trainer_resolved"],
        reasons,
    )


def run_trl(
    work: Path,
    repeat: int | str,
    model: str,
    prompts: Path,
    config: dict[str, Any],
    lora: dict[str, int],
    batch: int,
    env: dict[str, str],
) -> Run:
    out = work / f"trl-{repeat}"
    spec = {
        "model": model,
        "prompts": str(prompts),
        "lora": lora,
        "result": str(work / f"trl-{repeat}.json"),
        "config": {**config, "output_dir": str(out)},
    }
    spec_path = work / f"trl-{repeat}.spec.json"
    spec_path.write_text(json.dumps(spec))
    wall, rss = run_measured([sys.executable, __file__, "--trl-child", str(spec_path)], work / f"trl-{repeat}.log", env)
    res = json.loads(Path(spec["result"]).read_text())
    return Run(
        "trl",
        repeat,
        wall,
        rss,
        with_generation(res["steps"], res["generate_calls"], batch),
        [i for call in res["indices"] for i in call],
        res["config"],
    )


# Where a step's time goes, by (file suffix, function), read from cProfile. arle's side: its
# rollouts (the generation TRL no longer does) and its own bookkeeping hooks; TRL's side: its
# generation. Everything else is TRL/transformers/torch, the same calls on both sides.
PROFILE_HOOKS = {
    "arle": {
        "rollouts (Rollouts.sequences: envs.episodes.collect on the hf engine)": (
            "arlecli/train/batches.py",
            "sequences",
        ),
        "  of which prompt encoding (HFEngine.encode: chat template)": ("arlecli/engine/hf.py", "encode"),
        "  of which prefill (HFEngine._prefill)": ("arlecli/engine/hf.py", "_prefill"),
        "  of which sampling (HFEngine._pick)": ("arlecli/engine/hf.py", "_pick"),
        "  of which EOS/stop/budget checks (HFEngine._finished)": ("arlecli/engine/hf.py", "_finished"),
        "  of which KV merges (engine.hf._merge)": ("arlecli/engine/hf.py", "_merge"),
        "reward adapter (CardReward.__call__: score + rewards.jsonl)": ("arlecli/train/reward.py", "__call__"),
        "step log callback (metrics.jsonl + live view)": ("arlecli/train/grpo.py", "on_log"),
        "step-end callback (held-out eval check)": ("arlecli/train/grpo.py", "on_step_end"),
    },
    "trl": {
        "generation (GRPOTrainer._generate_single_turn)": ("trl/trainer/grpo_trainer.py", "_generate_single_turn"),
        "  of which model.generate (GenerationMixin.generate)": ("transformers/generation/utils.py", "generate"),
        "  of which the decode loop (GenerationMixin._sample)": ("transformers/generation/utils.py", "_sample"),
        "  of which logits processors": ("transformers/generation/logits_process.py", "__call__"),
        "  of which stopping criteria": ("transformers/generation/stopping_criteria.py", "__call__"),
    },
}
BOOKKEEPING = ("reward adapter", "step log callback", "step-end callback")  # arle's own per-step code


def profile_run(
    tool: str, run: Callable[[dict[str, str]], None], work: Path, steps: int, env: dict[str, str]
) -> dict[str, Any]:
    """One more run of `tool` under cProfile: seconds per step in the PROFILE_HOOKS functions and
    in the TRL step (for scale), and the functions with the most cumulative time."""
    import pstats

    prof = work / f"{tool}.prof"
    run({**env, "ARLE_PERF_PROFILE": str(prof)})
    stats = pstats.Stats(str(prof)).stats  # {(file, line, func): (cc, nc, tt, ct, callers)}

    def cumulative(suffix: str, func: str) -> tuple[float, int]:
        found = [(v[3], v[1]) for (f, _, name), v in stats.items() if f.endswith(suffix) and name == func]
        return (sum(c for c, _ in found), sum(n for _, n in found)) if found else (0.0, 0)

    per_step: dict[str, Any] = {}
    for label, (suffix, func) in PROFILE_HOOKS[tool].items():
        seconds, calls = cumulative(suffix, func)
        per_step[label] = {"seconds_per_step": round(seconds / steps, 5), "calls": calls}
    train_s, _ = cumulative("transformers/trainer.py", "training_step")
    out = {
        "hooks": per_step,
        "trainer_training_step_seconds_per_step": round(train_s / steps, 3),
        "top": top_functions(prof, steps),
        "top_own": top_functions(prof, steps, by="own"),
        "note": "cProfile inflates Python-heavy code; the hooks' shares are upper bounds",
    }
    if tool == "arle":
        out["arle_bookkeeping_seconds_per_step"] = round(
            sum(v["seconds_per_step"] for k, v in per_step.items() if k.startswith(BOOKKEEPING)), 5
        )
    return out


def top_functions(prof: Path, steps: int, n: int = 25, by: str = "cumulative") -> list[dict[str, Any]]:
    """The `n` functions with the most time per step in a cProfile dump, by cumulative time or
    by their own time (`by="own"`: where torch's kernels show up, as the builtins that call
    them); the CLI's and the profiler's own frames are left out."""
    import pstats

    stats = pstats.Stats(str(prof)).stats
    skip = ("<module>", "runcall", "<built-in method builtins.exec>")
    column = 2 if by == "own" else 3
    out = []
    for (file, line, func), (_, calls, tottime, cumtime, _) in sorted(stats.items(), key=lambda kv: -kv[1][column]):
        if func in skip or any(x in file for x in ("/click/", "/typer/", "arlecli/cli/")):
            continue
        short = "/".join(Path(file).parts[-3:]) if file.startswith("/") else file
        out.append(
            {
                "function": f"{short}:{line}({func})",
                "cumulative_s_per_step": round(cumtime / steps, 3),
                "own_s_per_step": round(tottime / steps, 3),
                "calls": calls,
            }
        )
        if len(out) == n:
            break
    return out


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[Any]]:
    """Resolved GRPOConfig fields that differ between the two tools (per-run paths aside)."""
    return {
        k: [a.get(k), b.get(k)]
        for k in sorted(set(a) | set(b))
        if k not in PER_RUN_FIELDS and str(a.get(k)) != str(b.get(k))
    }


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "load_avg_at_start": os.getloadavg(),
    }


def versions() -> dict[str, str]:
    from importlib import metadata

    from arlecli import __version__

    out = {"arle": __version__, "python": platform.python_version()}
    for pkg in ("torch", "transformers", "trl", "peft", "datasets"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "-"
    return out


def median_of(runs: list[Run], fn: str) -> float:
    return statistics.median(getattr(r, fn)() if callable(getattr(r, fn)) else getattr(r, fn) for r in runs)


def summarize(runs: list[Run]) -> dict[str, Any]:
    """The table: per tool medians over repeats, and arle/trl ratios."""
    metrics = {
        "seconds_per_step": "seconds_per_step",
        "cpu_seconds_per_step": "cpu_seconds_per_step",
        "generation_seconds_per_step": "generate_seconds_per_step",
        "rest_of_step_seconds": "rest_seconds_per_step",
        "generated_tokens_per_step": "tokens_per_step",
        "generation_tokens_per_s": "generate_tokens_per_second",
        "step_tokens_per_s": "step_tokens_per_second",
        "seconds_per_generated_token": "seconds_per_token",
        "static_batch_token_slots_per_step": "static_slots_per_step",
        "kept_share_of_static_slots": "kept_share_of_static_slots",
        "peak_rss_mb": "peak_rss_mb",
        "startup_s": "startup_s",
        "wall_s": "wall_s",
    }
    table: dict[str, Any] = {}
    for name, fn in metrics.items():
        arle = median_of([r for r in runs if r.tool == "arle"], fn)
        trl = median_of([r for r in runs if r.tool == "trl"], fn)
        table[name] = {"arle": round(arle, 4), "trl": round(trl, 4), "ratio": round(arle / trl, 3) if trl else None}
    return table


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['title']}\n{result['date']}  {result['machine']['cpu']} ({result['machine']['cores']} cores)")
    print("  ".join(f"{k} {v}" for k, v in result["versions"].items()))
    src = result["source"]
    print(f"arle source: commit {src['commit']}, uncommitted in src/: {src['uncommitted_in_src'] or 'none'}")
    print(
        f"model {result['model']}; {result['steps']} steps (first = warm-up, not timed) x {result['repeats']} "
        f"repeats per tool (seeds {result['seeds']}), interleaved; max_completion_length "
        f"{result['trainer_config']['max_completion_length']}; threads: {result['threads'] or 'torch default'}"
    )
    print(f"\n{'metric':30s} {'arle':>12s} {'trl':>12s} {'arle/trl':>9s}")
    for name, row in result["table"].items():
        ratio = "-" if row["ratio"] is None else row["ratio"]
        print(f"{name:30s} {row['arle']:12.4f} {row['trl']:12.4f} {ratio:>9}")
    print("\nper run (seconds per timed step):")
    for r in result["runs"]:
        print(
            f"  {r['tool']:5s} #{r['repeat']}: {r['seconds_per_step']}  cpu {r['cpu_seconds_per_step']}  "
            f"generation {r['generate_seconds_per_step']}  tokens/step {r['tokens_per_step']}  "
            f"longest {r['longest_completion_per_step']}  rss {r['peak_rss_mb']:.0f} MB  wall {r['wall_s']:.1f} s"
        )
    print(
        f"\ncard stop strings: {result['card_stop'] or 'none'}; arle finish reasons: "
        f"{[r['finish_reasons'] for r in result['runs'] if r['tool'] == 'arle']}"
    )
    ok, ceiling = result["target_met"], result["ceiling_met"]
    print(
        f"target (arle <= {TARGET_RATIO:.2f} x trl seconds/step): {'met' if ok else 'MISSED'}; "
        f"never worse than {CEILING_RATIO:.1f}x: {'met' if ceiling else 'MISSED'} "
        f"(ratio {result['table']['seconds_per_step']['ratio']})"
    )
    print(
        f"same comparison in CPU seconds per step: ratio {result['table']['cpu_seconds_per_step']['ratio']}; "
        f"per interleaved pair, wall: {result['pair_ratios']}"
    )
    print(f"same GRPOConfig: {not result['config_diff']}  {result['config_diff'] or ''}")
    print(f"same tasks drawn each step: {result['same_tasks']}")
    for tool, prof in result.get("profiles", {}).items():
        print(f"\nprofile of one more {tool} run (cProfile; seconds per step):")
        for label, row in prof["hooks"].items():
            print(f"  {label:66s} {row['seconds_per_step']:9.4f}  ({row['calls']} calls)")
        if "arle_bookkeeping_seconds_per_step" in prof:
            print(
                f"  {'arle bookkeeping (reward adapter + callbacks), total':66s} "
                f"{prof['arle_bookkeeping_seconds_per_step']:9.4f}"
            )
        print(
            f"  {'for scale: Trainer.training_step (generation + loss + backward)':66s} "
            f"{prof['trainer_training_step_seconds_per_step']:9.3f}"
        )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny test model, 3 steps, 1 repeat per tool")
    p.add_argument("--steps", type=int, help="steps per run, the first is warm-up (default 5; quick 3)")
    p.add_argument("--repeats", type=int, help="runs per tool, interleaved (default 2; quick 1)")
    # One thread by default: on a shared machine, multithreaded torch spin-waits for busy cores,
    # so identical steps measured 3 to 24 CPU seconds; one thread per run keeps time tied to work.
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP/torch threads in both subprocesses (default 1; 0: torch's default, all cores)",
    )
    p.add_argument(
        "--max-completion-length",
        type=int,
        help="token budget per completion in both tools (default: the demo recipe's 24); a longer "
        "one makes completions more ragged",
    )
    p.add_argument("--out", type=Path, help="result JSON (default perf/results/train_vs_trl[_quick].json)")
    p.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="one more run per tool under cProfile: where a step goes (automatic when the target is missed)",
    )
    p.add_argument("--no-profile", action="store_true", help="no profile runs, even when the target is missed")
    p.add_argument("--trl-child", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--arle-child"]:  # before argparse: the rest is arle's own command line
        arle_child(argv[1:])
        return {}
    args = parse_args(argv)
    if args.trl_child:
        trl_child(args.trl_child)
        return {}
    import yaml

    steps = args.steps or (3 if args.quick else 5)
    repeats = args.repeats or (1 if args.quick else 2)
    recipe = yaml.safe_load(RECIPE.read_text())
    config = trainer_fields(recipe, steps, args.max_completion_length)
    lora = {"r": int(recipe["lora_rank"]), "alpha": int(recipe.get("lora_alpha") or 2 * recipe["lora_rank"])}
    batch = int(config["per_device_train_batch_size"])
    work = Path(tempfile.mkdtemp(prefix="arle-perf-train-"))
    src, source = snapshot_source(work)
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))

    model, model_name = perf_model(args.quick, work)
    prompts = work / "prompts.json"
    n_rows, card_stop = render_prompts(prompts)
    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    mach = machine()
    runs: list[Run] = []
    for repeat in range(repeats):
        # Each repeat samples with another seed (the same for both tools): the tools draw from
        # different random streams, so one seed alone can hand one of them longer completions.
        cfg = {**config, "seed": int(config["seed"]) + repeat}
        # Interleaved, the order alternating, so load on the shared machine hits both alike.
        for tool in ("arle", "trl") if repeat % 2 == 0 else ("trl", "arle"):
            runs.append(
                run_arle(work, repeat, model, cfg, batch, env)
                if tool == "arle"
                else run_trl(work, repeat, model, prompts, cfg, lora, batch, env)
            )
            print(f"{tool:4s} #{repeat}: {runs[-1].seconds_per_step():.2f} s/step", file=sys.stderr, flush=True)

    arle_runs = [r for r in runs if r.tool == "arle"]
    trl_runs = [r for r in runs if r.tool == "trl"]
    table = summarize(runs)
    result = {
        "title": "arle train --algo grpo vs plain TRL GRPOTrainer (seconds per step, LoRA r16, CPU)",
        "date": started,
        "machine": mach,
        "versions": versions(),
        "model": model_name,
        "card": str(CARD.relative_to(ROOT)),
        "recipe": str(RECIPE.relative_to(ROOT)),
        "train_rows": n_rows,
        "steps": steps,
        "repeats": repeats,
        "threads": args.threads,
        "trainer_config": config,
        "lora": lora,
        "command": " ".join(["python", "perf/train_vs_trl.py", *argv]),
        "source": source,
        "table": table,
        "target_ratio": TARGET_RATIO,
        "ceiling_ratio": CEILING_RATIO,
        "target_met": table["seconds_per_step"]["ratio"] <= TARGET_RATIO,
        "ceiling_met": table["seconds_per_step"]["ratio"] <= CEILING_RATIO,
        # Process CPU seconds per step: the same comparison with shared-machine load taken out.
        "target_met_cpu_time": table["cpu_seconds_per_step"]["ratio"] <= TARGET_RATIO,
        "card_stop": card_stop,
        # arle/trl seconds per step within each interleaved pair (both ran under the same load).
        "pair_ratios": [round(a.seconds_per_step() / t.seconds_per_step(), 3) for a, t in zip(arle_runs, trl_runs)],
        "config_diff": {k: v for a, t in zip(arle_runs, trl_runs) for k, v in config_diff(a.config, t.config).items()},
        "same_tasks": all(a.indices == t.indices for a, t in zip(arle_runs, trl_runs)),
        "seeds": [int(config["seed"]) + r for r in range(repeats)],
        "runs": [
            {
                "tool": r.tool,
                "repeat": r.repeat,
                "wall_s": round(r.wall_s, 2),
                "peak_rss_mb": round(r.peak_rss_mb, 1),
                "startup_s": round(r.startup_s(), 2),
                "seconds_per_step": [round(s["seconds_per_step"], 3) for s in r.steps],
                "cpu_seconds_per_step": [round(s["cpu_seconds_per_step"], 3) for s in r.steps],
                "generate_seconds_per_step": [round(s["generate_s"], 3) for s in r.steps],
                "tokens_per_step": [s["generate_tokens"] for s in r.steps],
                "longest_completion_per_step": [s["generate_longest"] for s in r.steps],
                "clipped_ratio_per_step": [s.get("completions/clipped_ratio") for s in r.steps],
                "finish_reasons": r.finish_reasons,
            }
            for r in runs
        ],
        "load_avg_at_end": os.getloadavg(),
    }
    if args.profile or (not args.quick and not args.no_profile and not result["target_met"]):
        psteps = min(steps, 3)  # the hooks cost the same every step
        pconfig = {**config, "max_steps": psteps}
        result["profiles"] = {
            "arle": profile_run(
                "arle", lambda e: run_arle(work, "profiled", model, pconfig, batch, e), work, psteps, env
            ),
            "trl": profile_run(
                "trl", lambda e: run_trl(work, "profiled", model, prompts, pconfig, lora, batch, e), work, psteps, env
            ),
        }
    print_table(result)
    out = args.out or RESULTS / ("train_vs_trl_quick.json" if args.quick else "train_vs_trl.json")
    write_result(result, out, work, args.keep)
    return result


if __name__ == "__main__":
    main()
