"""Dynamic sampling on the CPU reasoning recipe: what share of rollout compute goes to dropped
groups, and what a step gains (issue 24's performance item).

What is measured: `arle train --recipe reasoning-grpo-cpu` (GRPO + LoRA on the embedded
SmolLM2-135M-Instruct over one_digit_sums, 4 prompts x 4 completions a step, stage 1's 24-token
budget), once with `dynamic_sampling: false` and once with `true`, the same seed, tasks and
everything else, each a fresh subprocess importing a snapshot of src/ (perf/train_vs_trl.py's
harness). From each run's metrics.jsonl and rewards.jsonl, per step after the first (warm-up):

  seconds_per_step        arle's own clock (metrics.jsonl)
  generated_tokens        model tokens sampled in the step (every group, dropped ones included)
  signal_groups           groups of the trained batch whose card rewards differ (rewards.jsonl;
                          what dynamic sampling keeps: TRL's frac_reward_zero_std reads the
                          rewards with the soft overlong penalty, which differ by length alone)
  dropped_groups          groups dynamic sampling sampled and dropped (all-equal rewards)
  dropped_token_share     the share of the step's generated tokens spent on dropped groups
  zero_signal_token_share without dynamic sampling: the share spent on groups that train at
                          zero advantage (what dynamic sampling would drop)

and the gain: signal groups per step and per minute, on over off. Timing is never asserted
in tests (tests/test_perf_train.py runs `--quick` for the shape of the result only).

    python perf/train_dynamic_sampling.py             # SmolLM2, 6 steps per run (~5 min on 2 cores)
    python perf/train_dynamic_sampling.py --quick     # tiny random model, 3 steps (~1 min)

Writes perf/results/train_dynamic_sampling.json (quick runs: train_dynamic_sampling_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from machine_info import cpu_model, package_versions, perf_model, write_result
from train_vs_trl import run_measured, snapshot_source

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf" / "results"
RECIPE = ROOT / "recipes" / "reasoning-grpo-cpu.yaml"  # a path: the children import a src/ snapshot


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny test model, 3 steps (the shape of the result only)")
    p.add_argument("--steps", type=int, help="steps per run, the first is warm-up (default 6; quick 3)")
    p.add_argument("--threads", type=int, default=1, help="OMP/torch threads per run (default 1)")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument("--out", type=Path, help="result JSON (default perf/results/train_dynamic_sampling[_quick].json)")
    p.add_argument("--resummarize", type=Path, help=argparse.SUPPRESS)  # a result JSON: read its kept runs again
    return p.parse_args(argv)


def run(
    work: Path, name: str, model: str, steps: int, dynamic: bool, env: dict[str, str], extra: list[str]
) -> dict[str, Any]:
    """One `arle train` subprocess; its per-step figures."""
    out = work / name
    cmd = [
        sys.executable,
        "-m",
        "arlecli",
        "train",
        "--recipe",
        str(RECIPE),
        "--model",
        model,
        "--max-steps",
        str(steps),
        "--eval-limit",
        "0",
        "--set",
        f"dynamic_sampling={'true' if dynamic else 'false'}",
        "--set",
        "save_steps=1000",
        *extra,
        "--output",
        str(out),
    ]
    wall, rss = run_measured(cmd, work / f"{name}.log", env)
    return {
        "name": name,
        "dynamic_sampling": dynamic,
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(rss, 1),
        "steps": read_steps(out),
    }


def read_steps(out: Path) -> list[dict[str, Any]]:
    """The per-step figures of a finished run directory."""
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    verdicts = [json.loads(x) for x in (out / "rewards.jsonl").read_text().splitlines()]
    return [step_figures(m, [v for v in verdicts if v["step"] == m["step"]]) for m in metrics]


def step_figures(metrics: dict[str, Any], verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """One step's figures from its metrics line and its rewards.jsonl lines."""
    tokens = [int(v.get("completion_tokens") or 0) for v in verdicts]
    dropped = sum(t for t, v in zip(tokens, verdicts) if v.get("dropped"))
    # The trained batch's groups (a task's lines not dropped); with signal: card rewards that differ.
    by_task: dict[int, list[int]] = defaultdict(list)
    for i, v in enumerate(verdicts):
        if not v.get("dropped"):
            by_task[v["task_index"]].append(i)
    signal = sum(len({verdicts[i]["reward"] for i in idx}) > 1 for idx in by_task.values())
    # Without dynamic sampling: the tokens of groups whose rewards were all equal.
    flat = sum(tokens[i] for idx in by_task.values() if len({verdicts[i]["reward"] for i in idx}) == 1 for i in idx)
    total = sum(tokens) or 1
    return {
        "step": metrics["step"],
        "seconds_per_step": metrics.get("seconds_per_step"),
        "generated_tokens": sum(tokens),
        "samples": len(verdicts),
        "signal_groups": signal,
        "dropped_groups": metrics.get("dynamic_sampling/dropped_groups", 0.0),
        "refill_rounds": metrics.get("dynamic_sampling/refill_rounds", 0.0),
        "unfilled_groups": metrics.get("dynamic_sampling/unfilled_groups", 0.0),
        "dropped_token_share": round(dropped / total, 4),
        "zero_signal_token_share": round(flat / total, 4) if not any(v.get("dropped") for v in verdicts) else None,
        "accuracy": metrics.get("accuracy"),
        "reward": metrics.get("reward"),
    }


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Medians over the timed steps of each run, and on/off ratios."""
    table: dict[str, dict[str, Any]] = {}
    for r in result["runs"]:
        timed = [s for s in r["steps"] if s["step"] > 1] or r["steps"]
        side = "on" if r["dynamic_sampling"] else "off"
        seconds = sum(s["seconds_per_step"] or 0 for s in timed)
        signal = sum(s["signal_groups"] for s in timed)
        figures = {
            "seconds_per_step": statistics.median(s["seconds_per_step"] or 0 for s in timed),
            "generated_tokens_per_step": statistics.mean(s["generated_tokens"] for s in timed),
            "signal_groups_per_step": signal / len(timed),
            "signal_groups_per_minute": 60 * signal / seconds if seconds else None,
            "dropped_groups_per_step": statistics.mean(s["dropped_groups"] for s in timed),
            "dropped_token_share": (
                sum(s["dropped_token_share"] * s["generated_tokens"] for s in timed)
                / max(1, sum(s["generated_tokens"] for s in timed))
            ),
            "zero_signal_token_share": (
                statistics.mean(s["zero_signal_token_share"] for s in timed) if side == "off" else None
            ),
        }
        for key, value in figures.items():
            table.setdefault(key, {})[side] = None if value is None else round(value, 4)
    for _key, row in table.items():
        on, off = row.get("on"), row.get("off")
        row["on_over_off"] = round(on / off, 3) if on and off else None
    return table


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['title']}\n{result['model']}, {result['steps']} steps per run (first = warm-up)\n")
    print(f"{'':28s} {'off':>10s} {'on':>10s} {'on/off':>8s}")
    for key, row in result["table"].items():
        cells = ["-" if row.get(k) is None else f"{row[k]:.3f}" for k in ("off", "on", "on_over_off")]
        print(f"{key:28s} {cells[0]:>10s} {cells[1]:>10s} {cells[2]:>8s}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.resummarize:  # the figures of kept runs again (after a change to what is read from them)
        result = json.loads(args.resummarize.read_text())
        for r in result["runs"]:
            r["steps"] = read_steps(Path(result["work"]) / r["name"])
        result["table"] = summarize(result)
        print_table(result)
        args.resummarize.write_text(json.dumps(result, indent=2, default=str) + "\n")
        return result
    steps = args.steps or (3 if args.quick else 6)
    work = Path(tempfile.mkdtemp(prefix="arle-perf-dynamic-"))
    src, source = snapshot_source(work)
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "OMP_NUM_THREADS": str(args.threads),
        "MKL_NUM_THREADS": str(args.threads),
        "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    model, model_name = perf_model(args.quick, work)
    # The tiny model: LoRA off (its random weights have nothing to adapt), an 8-token budget and
    # no length penalty (which would tell its all-wrong samples apart by their lengths).
    extra = ["--lora-rank", "0", "--max-tokens", "8", "--set", "overlong_buffer_len=0"] if args.quick else []
    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    runs = []
    for name, dynamic in (("off", False), ("on", True)):
        runs.append(run(work, name, model, steps, dynamic, env, extra))
        print(f"{name}: {runs[-1]['wall_s']} s", file=sys.stderr, flush=True)
    result = {
        "title": "dynamic sampling on the CPU reasoning recipe (GRPO + LoRA, 4 prompts x 4 a step)",
        "date": started,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_avg_at_end": os.getloadavg()},
        "versions": package_versions(("torch", "transformers", "trl")),
        "model": model_name,
        "recipe": str(RECIPE.relative_to(ROOT)),
        "steps": steps,
        "threads": args.threads,
        "source": source,
        "command": " ".join(["python", "perf/train_dynamic_sampling.py", *(argv or [])]),
        "runs": runs,
        "work": str(work) if args.keep else None,
    }
    result["table"] = summarize(result)
    print_table(result)
    out = args.out or RESULTS / ("train_dynamic_sampling_quick.json" if args.quick else "train_dynamic_sampling.json")
    write_result(result, out, work, args.keep)
    return result


if __name__ == "__main__":
    main()
