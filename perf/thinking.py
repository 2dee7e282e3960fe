"""What thinking costs an eval: thinking-aware scoring and budget forcing vs thinking off, same tokens.

One arle eval (`run_eval`, the code `arle eval` runs) on the hf engine, three ways, on the same
rows (countdown, generated offline and seeded: a chat card, so the model's template renders the
prompt) and the same number of sampled tokens per sample, T + A:

- off:     `--think-tags none`, `--max-tokens T+A`: no splitting, one generation phase;
- scoring: the model's own think tags, `--max-tokens T+A`: every turn split into thinking and
           answer (thinking.split, the thinking-token count), a thought cut at the budget scored
           without an answer; still one phase;
- forcing: `--max-thinking-tokens T --max-tokens A`: the thought closed by arle at T tokens
           (two forced tokens, not sampled), then an answer of up to A tokens: two phases
           (engine.phases), the second prefilling prompt + thought again.

The model is the tests' tiny thinking model by default (built here, offline: its template opens
the thought and its random weights never close it or end the turn, so every sample samples
exactly T + A tokens in every variant); `--model DIR` runs another one (a model that thinks).
Variants run interleaved in one process on one loaded engine (its load is not timed), greedy,
on `--threads` torch threads (default 1) with OMP_WAIT_POLICY=PASSIVE (on a CPU shared with
other jobs, spinning OpenMP barriers measure the neighbours: see perf/backends.py); the median
of the repeats is reported, with each variant's overhead over `off`, the CPU time of the
process beside the wall time, and the token positions the model computed (forward passes'
rows x new tokens: what budget forcing adds, the forced end tag fed through the model, shows
there exactly, however loaded the machine). The issue's target: thinking-aware scoring and budget forcing
cost < 2% of eval wall time.

    python perf/thinking.py            # 64 rows, T=96, A=32, batch 16, 3 repeats
    python perf/thinking.py --quick    # 16 rows, T=24, A=8, 1 repeat
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_info import cpu_model, package_versions, write_result

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "perf" / "results" / "thinking.json"
VARIANTS = ("off", "scoring", "forcing")


def tiny_thinking_model(work: Path) -> Path:
    """The tests' tiny thinking model (tests/helpers/tiny_model.py), built into `work`."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.tiny_model import build_tiny_model

    return build_tiny_model(work / "tiny-thinking", thinking=True)


def count_positions(engine: Any) -> dict[str, int]:
    """Count the token positions the engine's model computes (every forward pass's batch rows x
    new tokens, padding included): a cost measure that the machine's load does not blur."""
    counter = {"positions": 0}
    forward = engine.forward  # every forward the engine runs (its fused one or the model's)

    def counted(ids: Any, *args: Any, **kwargs: Any) -> Any:
        counter["positions"] += int(ids.shape[0] * ids.shape[1])
        return forward(ids, *args, **kwargs)

    engine.forward = counted
    return counter


def one_eval(
    engine: Any, variant: str, args: argparse.Namespace, run_dir: Path, counter: dict[str, int]
) -> dict[str, Any]:
    """Run the eval one way; its wall and CPU time, what it generated and what it computed."""
    from arlecli import thinking
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.catalog import load_card
    from arlecli.results import read_samples

    thinking.configure(engine, thinking.parse_option("none" if variant == "off" else None))
    budget = (
        {"max_tokens": args.answer, "max_thinking_tokens": args.thinking}
        if variant == "forcing"
        else {"max_tokens": args.thinking + args.answer}
    )
    opts = EvalOptions(limit=args.rows, num_fewshot=0, seed=1234, **budget)
    counter["positions"] = 0
    started, cpu = time.perf_counter(), time.process_time()
    run_eval(load_card("countdown"), engine, opts, model="perf", run_dir=run_dir)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    samples = read_samples(run_dir)
    generated = sum(s["completion_tokens"] for s in samples)
    forced = 2 * len(samples) if variant == "forcing" else 0  # "\n</think>": written, not sampled
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "sampled_tokens": generated - forced,
        "samples": len(samples),
        "thinking_cut": sum(bool(s.get("thinking_cut")) for s in samples),
        "tokens_per_s": (generated - forced) / wall,
        "model_positions": counter["positions"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a thinking model's folder (default: the tiny thinking model)")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--thinking", type=int, default=96, help="T: the thought's tokens")
    ap.add_argument("--answer", type=int, default=32, help="A: the answer's tokens")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.thinking, args.answer, args.repeats = 16, 24, 8, 1
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("ARLE_HOME", tempfile.mkdtemp(prefix="arle-perf-home-"))
    work = Path(tempfile.mkdtemp(prefix="arle-perf-thinking-"))
    model = args.model or tiny_thinking_model(work)

    import torch

    from arlecli.engine.hf import HFEngine

    torch.set_num_threads(args.threads)
    engine = HFEngine(str(model), batch_size=args.batch)
    counter = count_positions(engine)
    warmup = argparse.Namespace(**{**vars(args), "rows": 2})
    one_eval(engine, "forcing", warmup, work / "warmup", counter)  # first-call costs
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
        for variant in order:
            runs[variant].append(one_eval(engine, variant, args, work / f"{variant}-{r}", counter))
            print(f"repeat {r + 1} {variant}: {runs[variant][-1]['wall_s']:.2f} s", flush=True)
    engine.close()

    med = {v: {k: statistics.median(run[k] for run in runs[v]) for k in runs[v][0]} for v in VARIANTS}
    base = med["off"]["wall_s"]
    print(
        f"\n{args.rows} rows of countdown, T={args.thinking} thinking + A={args.answer} answer tokens, greedy, "
        f"hf batch {args.batch}, median of {args.repeats}; {cpu_model()}; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print("| | off | scoring | forcing |\n|---|---|---|---|")
    rows = [
        ("wall time (s)", "wall_s", ".2f"),
        ("CPU time (s)", "cpu_s", ".2f"),
        ("sampled tokens", "sampled_tokens", ".0f"),
        ("model positions computed", "model_positions", ".0f"),
        ("tokens/s", "tokens_per_s", ".1f"),
        ("thoughts cut (no answer)", "thinking_cut", ".0f"),
    ]
    for label, key, fmt in rows:
        print(f"| {label} | " + " | ".join(format(med[v][key], fmt) for v in VARIANTS) + " |")
    for label, key in (
        ("wall vs off", "wall_s"),
        ("CPU time vs off", "cpu_s"),
        ("positions vs off", "model_positions"),
    ):
        print(
            f"| {label} | - | "
            + " | ".join(f"{(med[v][key] / med['off'][key] - 1) * 100:+.1f}%" for v in VARIANTS[1:])
            + " |"
        )
    result = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "model": str(args.model or "tiny thinking model"),
        "cpu": cpu_model(),
        "load_average": os.getloadavg()[0],
        "versions": package_versions(("torch", "transformers")),
        "median": med,
        "runs": runs,
        "overhead_vs_off": {v: med[v]["wall_s"] / base - 1 for v in VARIANTS[1:]},
        "cpu_overhead_vs_off": {v: med[v]["cpu_s"] / med["off"]["cpu_s"] - 1 for v in VARIANTS[1:]},
    }
    write_result(result, args.out, work, args.keep)


if __name__ == "__main__":
    main()
