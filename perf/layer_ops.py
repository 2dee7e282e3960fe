"""arle's C RMSNorm and rotary (engine/cpu_ops.py) against torch's ops in the same engine: decode
tokens/s of one hf engine with each, interleaved, and whether their tokens are the same (issue 29).

    python perf/layer_ops.py                # SmolLM2-135M-Instruct (embedded), 1 thread, batch 1 and 16
    python perf/layer_ops.py --quick        # the tests' tiny model, batch 1 and 4, few tokens

Decode tokens/s as perf/roofline.py measures it (the extra tokens of a longer call over its extra
time, end of text off, prefix cache and prompt lookup off); best of `--repeats` for each, the two
taking turns so that both see the same machine. Writes perf/results/layer_ops.json.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_info import decode_result, isa_line, perf_model, write_result
from roofline import decode_rate, prompts

RESULTS = Path(__file__).resolve().parents[1] / "perf" / "results"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tests' tiny model, batch 1 and 4, few tokens")
    p.add_argument("--model", default=None, help="a local model folder (default: the embedded SmolLM2)")
    p.add_argument("--batches", default=None, help="comma-separated (default 1,16; quick 1,4)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=None, help="timed runs of each (default 4; quick 1)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default perf/results/layer_ops[_quick].json)")
    args = p.parse_args(argv)
    batches = [int(b) for b in (args.batches or ("1,4" if args.quick else "1,16")).split(",")]
    tokens, extra = (4, 8) if args.quick else (8, 32)
    repeats = args.repeats or (1 if args.quick else 4)

    import torch

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="arle-perf-layer-ops-"))
    model, model_name = perf_model(args.quick, work, args.model)
    load = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for b in batches:
        row = compare(model, b, tokens, extra, repeats)
        print(f"batch {b}: {row}", file=sys.stderr, flush=True)
        rows.append(row)

    print(f"\nC RMSNorm and rotary vs torch's ops · {time.strftime('%Y-%m-%d %H:%M:%S %z')} · {model_name}")
    print(f"{isa_line()} · {args.threads} thread(s) · load {load[0]} · best of {repeats}")
    print(f"\n{'batch':>5} {'C tok/s':>9} {'torch tok/s':>12} {'C/torch':>8} {'step ms C':>10} {'torch':>7}  tokens")
    for r in rows:
        ms = r["step_ms"]
        same = "identical" if r["same_tokens"] else "DIFFERENT"
        print(
            f"{r['batch']:>5} {r['c_tok_s']:>9} {r['torch_tok_s']:>12} {r['c_over_torch']:>8}"
            f" {ms['c']:>10} {ms['torch']:>7}  {same}"
        )
    result = decode_result(model_name, args.threads, load, tokens, extra, rows=rows)
    out = args.out or RESULTS / ("layer_ops_quick.json" if args.quick else "layer_ops.json")
    write_result(result, out, work, args.keep)
    return result


def compare(model: str, batch: int, tokens: int, extra: int, repeats: int) -> dict[str, Any]:
    """One engine at `batch` rows, its fused forward switched between the C ops and torch's."""
    from arlecli.engine import cpu_ops, fused
    from arlecli.engine.base import GenerationRequest, SamplingParams
    from arlecli.engine.hf import HFEngine

    engine = HFEngine(model, batch_size=batch, prefix_cache_tokens=0, draft_tokens=0)
    engine.eos_ids = set()  # every row runs its budget
    forward = engine._fused
    if forward is None or not all(f.__module__ == cpu_ops.__name__ for f in (forward.norm, forward.rotary)):
        raise SystemExit(
            "the C ops are not in use here (another CPU, no compiler, ARLE_CPU_GEMM=0): nothing to compare"
        )
    torch_ops = (functools.partial(fused._add_norm, fused._rms_norm), functools.partial(fused.qk_rotary, forward.heads))
    ways = {"c": (forward.norm, forward.rotary), "torch": torch_ops}

    def generate(way: str, max_tokens: int) -> list[list[int]]:
        forward.norm, forward.rotary = ways[way]
        reqs = [GenerationRequest(prompt=t, params=SamplingParams(max_tokens=max_tokens)) for t in prompts(batch)]
        return [c.token_ids for _, c in engine.generate(reqs)]

    same = generate("c", tokens + extra) == generate("torch", tokens + extra)
    rates: dict[str, list[float]] = {"c": [], "torch": []}
    for _ in range(repeats):
        for way in rates:
            rates[way].append(decode_rate(lambda n, w=way: sum(map(len, generate(w, n))), tokens, extra))
    best = {w: max(r) for w, r in rates.items()}
    return {
        "batch": batch,
        "c_tok_s": round(best["c"], 1),
        "torch_tok_s": round(best["torch"], 1),
        "c_over_torch": round(best["c"] / best["torch"], 3),
        "step_ms": {w: round(1000 * batch / r, 2) for w, r in best.items()},
        "runs_tok_s": {w: [round(x, 1) for x in r] for w, r in rates.items()},
        "same_tokens": same,
    }


if __name__ == "__main__":
    main()
