"""`arle train --algo grpo` vs a minimal script calling TRL's GRPOTrainer directly.

What is measured: seconds per GRPO step (generation + reward + update), generated tokens
per step, seconds per generated token, start-up time and peak RSS, for

  arle   `arle train examples/cpu_grpo_demo/sums.yaml --recipe examples/cpu_grpo_demo/recipe.yaml
          --max-steps N --eval-limit 0 --output DIR --model MODEL` (its metrics.jsonl);
  trl    this file re-run as `--trl-child SPEC`: a plain `GRPOTrainer(model=MODEL,
          reward_funcs=number_reward, args=GRPOConfig(...), train_dataset=..., peft_config=LoraConfig(...))`
          with a TrainerCallback timing each step.

Same model (the embedded SmolLM2-135M-Instruct; `--quick`: the tiny test model), same
prompts (the card's chat messages, rendered once here with arle's own
`arlecli.envs.single_turn.reset` and handed to the plain script as data), same dataset
length and seed (so TRL's sampler draws the same tasks each step: checked from both runs'
task indices), same reward logic (the `number` reward re-implemented as a plain function),
same GRPOConfig (checked field by field against arle's resolved config in meta.json) and
LoRA r16/alpha 32 on all linear layers, as the demo recipe sets.

A step's time is the interval between consecutive per-step logs (the first from the start
of training), the way arle's metrics.jsonl measures it; the first step is warm-up and left
out. Runs are interleaved (arle, trl, arle, trl ...) and the medians over repeats are
reported. GRPO samples at temperature 1, so completion lengths differ between runs: hence
seconds per generated token too. Peak RSS comes from wait4() on each subprocess.

    python perf/train_vs_trl.py            # SmolLM2-135M, 5 steps x 2 repeats each, 1 thread (~15-30 min)
    python perf/train_vs_trl.py --quick    # tiny model, 3 steps x 1 repeat (~1-2 min)

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
from typing import Any

from machine_info import cpu_model

ROOT = Path(__file__).resolve().parents[1]
CARD = ROOT / "examples" / "cpu_grpo_demo" / "sums.yaml"
RECIPE = ROOT / "examples" / "cpu_grpo_demo" / "recipe.yaml"
RESULTS = ROOT / "perf" / "results"
TARGET_RATIO = 1.05  # issue 7: arle train within 5% of plain TRL's seconds per step

# Keys of the recipe that are arle's own, not GRPOConfig fields (see arlecli.train.config).
ARLE_RECIPE_KEYS = {"algo", "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules", "eval_split",
                    "eval_limit", "eval_every", "eval_max_tokens", "eval_batch_size", "limit", "split"}
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


def trl_child(spec_path: Path) -> None:
    """Run plain TRL GRPO as described by `spec_path` (written by the parent) and record each step."""
    spec = json.loads(spec_path.read_text())
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = json.loads(Path(spec["prompts"]).read_text())
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"], "index": i}
                                 for i, r in enumerate(rows)])
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
            steps.append({"step": state.global_step, "seconds_per_step": now - self.last,
                          "cpu_seconds_per_step": cpu - self.last_cpu,
                          **{k: v for k, v in logs.items() if isinstance(v, (int, float))}})
            self.last, self.last_cpu = now, cpu

    lora = spec["lora"]
    trainer = GRPOTrainer(
        model=spec["model"], reward_funcs=number, args=GRPOConfig(**spec["config"]), train_dataset=dataset,
        peft_config=LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=0.0,
                               target_modules="all-linear", task_type="CAUSAL_LM"),
        callbacks=[StepTimer()])
    trainer.train()
    trainer.save_model(str(Path(spec["config"]["output_dir"]) / "final"))  # arle saves final/ too
    out = {"steps": steps, "indices": seen, "config": trainer.args.to_dict()}
    Path(spec["result"]).write_text(json.dumps(out, default=str))


def arle_child(argv: list[str]) -> None:
    """`arle ARGV` in this process, unchanged except that each metrics.jsonl line also gets
    `cpu_seconds_per_step` (process CPU time, all threads), which shared-machine load barely
    moves, unlike wall time. With ARLE_PERF_PROFILE=FILE the run is profiled (cProfile)."""
    from arlecli.cli.main import main as arle_main
    from arlecli.train.metrics import MetricsLog

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
    repeat: int
    wall_s: float
    peak_rss_mb: float
    steps: list[dict[str, Any]]            # per logged step: seconds_per_step, completion lengths ...
    indices: list[int] = field(default_factory=list)   # task indices in scoring order
    config: dict[str, Any] = field(default_factory=dict)

    def timed(self) -> list[dict[str, Any]]:
        """The steps after the warm-up first one."""
        return [s for s in self.steps if s["step"] > 1]

    def seconds_per_step(self) -> float:
        return statistics.median(s["seconds_per_step"] for s in self.timed())

    def cpu_seconds_per_step(self) -> float:
        return statistics.median(s["cpu_seconds_per_step"] for s in self.timed())

    def tokens_per_step(self) -> float:
        # TRL logs the mean completion length; a step generates batch-size completions.
        return statistics.mean(s["completions/mean_length"] * s["_batch"] for s in self.timed())

    def seconds_per_token(self) -> float:
        timed = self.timed()
        return sum(s["seconds_per_step"] for s in timed) / sum(s["completions/mean_length"] * s["_batch"]
                                                              for s in timed)

    def startup_s(self) -> float:
        """Wall time outside the steps: imports, model load, dataset, final save."""
        return self.wall_s - sum(s["seconds_per_step"] for s in self.steps)


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


def trainer_fields(recipe: dict[str, Any], steps: int) -> dict[str, Any]:
    """The GRPOConfig fields arle sets for this recipe (recipe + arle's trainer defaults + CPU settings)."""
    from arlecli.train.config import TRAINER_DEFAULTS

    fields = {**TRAINER_DEFAULTS, **{k: v for k, v in recipe.items() if k not in ARLE_RECIPE_KEYS}}
    fields["max_steps"] = steps
    if fields.get("save_steps", 0) <= steps:
        raise SystemExit(f"--steps {steps} reaches the recipe's save_steps ({fields['save_steps']}): keep checkpoints "
                         "out of the timed steps")
    fields.update(disable_tqdm=True, use_cpu=True, bf16=False)  # what arle adds on a CPU without CUDA
    return fields


def render_prompts(path: Path) -> int:
    """The train split's chat prompts exactly as `arle train` builds them, with their targets."""
    from arlecli.envs import single_turn
    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.registry import load_card
    from arlecli.train.run import train_split

    card = load_card(str(CARD))
    tasks, exemplars = load_tasks(card, EvalOptions(split=train_split(card, None), limit=None, num_fewshot=None))
    rows = [{"prompt": single_turn.reset(card.prompt, t, exemplars), "answer": t.target} for t in tasks]
    path.write_text(json.dumps(rows))
    return len(rows)


def arle_command(out: Path, model: str, steps: int) -> list[str]:
    """`arle train` on the demo card and recipe (through arle_child, which only adds CPU time to metrics)."""
    return [sys.executable, __file__, "--arle-child", "train", str(CARD), "--recipe", str(RECIPE),
            "--max-steps", str(steps), "--eval-limit", "0", "--output", str(out), "--model", model]


def run_arle(work: Path, repeat: int, model: str, steps: int, batch: int, env: dict[str, str]) -> Run:
    out = work / f"arle-{repeat}"
    wall, rss = run_measured(arle_command(out, model, steps), work / f"arle-{repeat}.log", env)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    indices = [json.loads(line)["task_index"] for line in (out / "rewards.jsonl").read_text().splitlines()]
    meta = json.loads((out / "meta.json").read_text())
    return Run("arle", repeat, wall, rss, [{**r, "_batch": batch} for r in rows], indices,
               meta["trainer_resolved"])


def run_trl(work: Path, repeat: int, model: str, prompts: Path, config: dict[str, Any], lora: dict[str, int],
            batch: int, env: dict[str, str]) -> Run:
    out = work / f"trl-{repeat}"
    spec = {"model": model, "prompts": str(prompts), "lora": lora, "result": str(work / f"trl-{repeat}.json"),
            "config": {**config, "output_dir": str(out)}}
    spec_path = work / f"trl-{repeat}.spec.json"
    spec_path.write_text(json.dumps(spec))
    wall, rss = run_measured([sys.executable, __file__, "--trl-child", str(spec_path)], work / f"trl-{repeat}.log",
                             env)
    res = json.loads(Path(spec["result"]).read_text())
    return Run("trl", repeat, wall, rss, [{**s, "_batch": batch} for s in res["steps"]],
               [i for call in res["indices"] for i in call], res["config"])


# arle's own code on the per-step path of a GRPO run (file suffix, function): everything else
# in a step is TRL/transformers/torch, the same calls the plain script makes.
ARLE_STEP_HOOKS = {
    "reward adapter (CardReward.__call__: score + rewards.jsonl)": ("arlecli/train/reward.py", "__call__"),
    "step log callback (metrics.jsonl + live view)": ("arlecli/train/grpo.py", "on_log"),
    "  of which metrics.jsonl (MetricsLog.record)": ("arlecli/train/metrics.py", "record"),
    "  of which live view line (_View.log)": ("arlecli/cli/train.py", "log"),
    "step-end callback (held-out eval check)": ("arlecli/train/grpo.py", "on_step_end"),
}


def profile_arle(work: Path, model: str, steps: int, env: dict[str, str]) -> dict[str, Any]:
    """One more arle run under cProfile: seconds per step spent in arle's own per-step hooks,
    next to the trainer's whole step (TRL's training_step) for scale."""
    import pstats

    prof = work / "arle.prof"
    run_measured(arle_command(work / "arle-profiled", model, steps), work / "arle-profiled.log",
                 {**env, "ARLE_PERF_PROFILE": str(prof)})
    stats = pstats.Stats(str(prof)).stats  # {(file, line, func): (cc, nc, tt, ct, callers)}

    def cumulative(suffix: str, func: str) -> tuple[float, int]:
        found = [(v[3], v[1]) for (f, _, name), v in stats.items() if f.endswith(suffix) and name == func]
        return (sum(c for c, _ in found), sum(n for _, n in found)) if found else (0.0, 0)

    per_step: dict[str, Any] = {}
    for label, (suffix, func) in ARLE_STEP_HOOKS.items():
        seconds, calls = cumulative(suffix, func)
        per_step[label] = {"seconds_per_step": round(seconds / steps, 5), "calls": calls}
    train_s, _ = cumulative("transformers/trainer.py", "training_step")
    own = sum(v["seconds_per_step"] for k, v in per_step.items() if not k.startswith("  "))
    return {"hooks": per_step, "arle_own_seconds_per_step": round(own, 5),
            "trainer_training_step_seconds_per_step": round(train_s / steps, 3),
            "note": "cProfile inflates Python-heavy code; the hooks' share is an upper bound"}


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[Any]]:
    """Resolved GRPOConfig fields that differ between the two tools (per-run paths aside)."""
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b))
            if k not in PER_RUN_FIELDS and str(a.get(k)) != str(b.get(k))}


def machine() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "load_avg_at_start": os.getloadavg()}


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
    metrics = {"seconds_per_step": "seconds_per_step", "cpu_seconds_per_step": "cpu_seconds_per_step",
               "generated_tokens_per_step": "tokens_per_step",
               "seconds_per_generated_token": "seconds_per_token", "peak_rss_mb": "peak_rss_mb",
               "startup_s": "startup_s", "wall_s": "wall_s"}
    table: dict[str, Any] = {}
    for name, fn in metrics.items():
        arle = median_of([r for r in runs if r.tool == "arle"], fn)
        trl = median_of([r for r in runs if r.tool == "trl"], fn)
        table[name] = {"arle": round(arle, 4), "trl": round(trl, 4), "ratio": round(arle / trl, 3) if trl else None}
    return table


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['title']}\n{result['date']}  {result['machine']['cpu']} ({result['machine']['cores']} cores)")
    print("  ".join(f"{k} {v}" for k, v in result["versions"].items()))
    print(f"model {result['model']}; {result['steps']} steps (first = warm-up, not timed) x {result['repeats']} "
          f"repeats per tool, interleaved; threads: {result['threads'] or 'torch default'}")
    print(f"\n{'metric':30s} {'arle':>12s} {'trl':>12s} {'arle/trl':>9s}")
    for name, row in result["table"].items():
        ratio = "-" if row["ratio"] is None else row["ratio"]
        print(f"{name:30s} {row['arle']:12.4f} {row['trl']:12.4f} {ratio:>9}")
    print("\nper run (seconds per timed step):")
    for r in result["runs"]:
        print(f"  {r['tool']:5s} #{r['repeat']}: {r['seconds_per_step']}  cpu {r['cpu_seconds_per_step']}  "
              f"tokens/step {r['tokens_per_step']}  "
              f"rss {r['peak_rss_mb']:.0f} MB  wall {r['wall_s']:.1f} s")
    ok = result["target_met"]
    print(f"\ntarget (arle <= {TARGET_RATIO:.2f} x trl seconds/step): {'met' if ok else 'MISSED'} "
          f"(ratio {result['table']['seconds_per_step']['ratio']})")
    print(f"same comparison in CPU seconds per step: {'met' if result['target_met_cpu_time'] else 'MISSED'} "
          f"(ratio {result['table']['cpu_seconds_per_step']['ratio']}); per interleaved pair, wall: "
          f"{result['pair_ratios']}")
    print(f"same GRPOConfig: {not result['config_diff']}  {result['config_diff'] or ''}")
    print(f"same tasks drawn each step: {result['same_tasks']}")
    prof = result.get("arle_profile")
    if prof:
        print(f"\nprofile of one more arle run (cProfile; seconds per step in arle's own code):")
        for label, row in prof["hooks"].items():
            print(f"  {label:62s} {row['seconds_per_step']:9.5f}  ({row['calls']} calls)")
        print(f"  {'arle own code, total':62s} {prof['arle_own_seconds_per_step']:9.5f}")
        print(f"  {'for scale: Trainer.training_step (TRL generation + update)':62s} "
              f"{prof['trainer_training_step_seconds_per_step']:9.3f}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny test model, 3 steps, 1 repeat per tool")
    p.add_argument("--steps", type=int, help="steps per run, the first is warm-up (default 5; quick 3)")
    p.add_argument("--repeats", type=int, help="runs per tool, interleaved (default 2; quick 1)")
    # One thread by default: on a shared machine, multithreaded torch spin-waits for busy cores,
    # so identical steps measured 3 to 24 CPU seconds; one thread per run keeps time tied to work.
    p.add_argument("--threads", type=int, default=1,
                   help="OMP/torch threads in both subprocesses (default 1; 0: torch's default, all cores)")
    p.add_argument("--out", type=Path, help="result JSON (default perf/results/train_vs_trl[_quick].json)")
    p.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    p.add_argument("--profile", action="store_true",
                   help="one more arle run under cProfile: time in arle's own per-step code")
    p.add_argument("--trl-child", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def model_path(quick: bool, work: Path) -> tuple[str, str]:
    """(path, display name): the tiny test model for --quick, else the embedded SmolLM2-135M-Instruct."""
    if quick:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny_model import build_tiny_model

        return str(build_tiny_model(work / "tiny-model")), "tiny Qwen2 test model (random weights)"
    from arlecli.models import EMBEDDED_NAME, embedded_default_model

    return str(embedded_default_model()), EMBEDDED_NAME


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
    config = trainer_fields(recipe, steps)
    lora = {"r": int(recipe["lora_rank"]), "alpha": int(recipe.get("lora_alpha") or 2 * recipe["lora_rank"])}
    batch = int(config["per_device_train_batch_size"])
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))

    work = Path(tempfile.mkdtemp(prefix="arle-perf-train-"))
    model, model_name = model_path(args.quick, work)
    prompts = work / "prompts.json"
    n_rows = render_prompts(prompts)
    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    mach = machine()
    runs: list[Run] = []
    for repeat in range(repeats):  # interleaved, so load on the shared machine hits both alike
        runs.append(run_arle(work, repeat, model, steps, batch, env))
        print(f"arle #{repeat}: {runs[-1].seconds_per_step():.2f} s/step", file=sys.stderr, flush=True)
        runs.append(run_trl(work, repeat, model, prompts, config, lora, batch, env))
        print(f"trl  #{repeat}: {runs[-1].seconds_per_step():.2f} s/step", file=sys.stderr, flush=True)

    arle_runs = [r for r in runs if r.tool == "arle"]
    trl_runs = [r for r in runs if r.tool == "trl"]
    table = summarize(runs)
    result = {
        "title": "arle train --algo grpo vs plain TRL GRPOTrainer (seconds per step, LoRA r16, CPU)",
        "date": started, "machine": mach, "versions": versions(), "model": model_name,
        "card": str(CARD.relative_to(ROOT)),
        "recipe": str(RECIPE.relative_to(ROOT)), "train_rows": n_rows, "steps": steps, "repeats": repeats,
        "threads": args.threads, "trainer_config": config, "lora": lora,
        "command": " ".join(["python", "perf/train_vs_trl.py", *argv]),
        "table": table,
        "target_met": table["seconds_per_step"]["ratio"] <= TARGET_RATIO,
        # Process CPU seconds per step: the same comparison with shared-machine load taken out.
        "target_met_cpu_time": table["cpu_seconds_per_step"]["ratio"] <= TARGET_RATIO,
        # arle/trl seconds per step within each interleaved pair (both ran under the same load).
        "pair_ratios": [round(a.seconds_per_step() / t.seconds_per_step(), 3) for a, t in zip(arle_runs, trl_runs)],
        "config_diff": config_diff(arle_runs[0].config, trl_runs[0].config),
        "same_tasks": all(a.indices == t.indices for a, t in zip(arle_runs, trl_runs)),
        "runs": [{"tool": r.tool, "repeat": r.repeat, "wall_s": round(r.wall_s, 2),
                  "peak_rss_mb": round(r.peak_rss_mb, 1), "startup_s": round(r.startup_s(), 2),
                  "seconds_per_step": [round(s["seconds_per_step"], 3) for s in r.steps],
                  "cpu_seconds_per_step": [round(s["cpu_seconds_per_step"], 3) for s in r.steps],
                  "tokens_per_step": [round(s["completions/mean_length"] * s["_batch"]) for s in r.steps]}
                 for r in runs],
        "load_avg_at_end": os.getloadavg(),
    }
    if args.profile or not result["target_met"]:
        result["arle_profile"] = profile_arle(work, model, min(steps, 3), env)  # hooks cost the same every step
    print_table(result)
    out = args.out or RESULTS / ("train_vs_trl_quick.json" if args.quick else "train_vs_trl.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwrote {out}" + (f"; run directories in {work}" if args.keep else ""))
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return result


if __name__ == "__main__":
    main()
