"""Decode against the machine's limit (issue 29): arle's hf engine, and plain transformers
`generate` beside it, as tokens/s and as a fraction of the roofline bound at batch 1, 16, 64.

    python perf/roofline.py                 # SmolLM2-135M-Instruct (embedded), 1 thread
    python perf/roofline.py --threads 2 --batches 1,16
    python perf/roofline.py --quick         # the tests' tiny model, batch 1 and 4, few tokens

The bound (perf/machine_info.roofline): a decode step runs the model's linears at `batch`
rows; it cannot take less than max(FLOPs / the best GEMM rate measured at those shapes, the
fp32 weights / the measured read bandwidth). Decode tokens/s is measured without prefill: the
same prompts are generated to `--tokens` and to `--tokens` + `--extra` tokens, and the extra
tokens are divided by the extra time (end of text is switched off, so every row runs its whole
budget; the prefix cache is off, so the second call prefills as the first did).

Target (issue 29): batch 16 on one core >= 40% of the bound, batch 1 >= 60%.
Writes perf/results/roofline.json (quick runs: roofline_quick.json).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from machine_info import bound_fraction, decode_result, perf_model, roofline, roofline_lines, write_result

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf" / "results"
TARGETS = {1: 0.60, 16: 0.40}


def prompts(n: int) -> list[str]:
    """`n` distinct short prompts of about the same length (a batch decodes them together)."""
    subjects = ["rivers", "stars", "bread", "trains", "birds", "clocks", "music", "salt"]
    return [f"Write a long essay about {subjects[i % len(subjects)]}, part {i + 1}:" for i in range(n)]


def decode_rate(generate: Callable[[int], int], tokens: int, extra: int) -> float:
    """Decode tokens/s of `generate(max_new_tokens) -> tokens generated`, without prefill:
    the extra tokens of a longer call over its extra seconds (best of two pairs). A pair whose
    longer call was no slower (a few extra tokens of a tiny model, inside the timer's jitter)
    measures nothing and is run again, up to six pairs."""
    rates: list[float] = []
    for _ in range(6):
        start = time.perf_counter()
        short = generate(tokens)
        mid = time.perf_counter()
        long = generate(tokens + extra)
        end = time.perf_counter()
        seconds = (end - mid) - (mid - start)
        if seconds > 0:
            rates.append((long - short) / seconds)
        if len(rates) == 2:
            break
    if not rates:
        raise RuntimeError(f"{extra} extra tokens took no measurable time: pass a larger --extra")
    return max(rates)


def arle_generate(model: str, batch: int) -> Callable[[int], int]:
    """arle's hf engine on `batch` prompts, greedy, end of text off, prefix cache and prompt lookup off."""
    from arlecli.engine.base import GenerationRequest, SamplingParams
    from arlecli.engine.hf import HFEngine

    # Prompt lookup off: this measures the decode step itself (perf/prompt_lookup.py the lever).
    engine = HFEngine(model, batch_size=batch, prefix_cache_tokens=0, draft_tokens=0)
    engine.eos_ids = set()  # every row runs its budget: the batch stays full

    def run(max_tokens: int) -> int:
        reqs = [GenerationRequest(prompt=p, params=SamplingParams(max_tokens=max_tokens)) for p in prompts(batch)]
        outs = [c for _, c in engine.generate(reqs)]
        assert all(len(c.token_ids) == max_tokens for c in outs), "a row stopped early"
        return sum(len(c.token_ids) for c in outs)

    return run


def hf_generate(model: str, batch: int) -> Callable[[int], int]:
    """Plain transformers: `model.generate` on the same prompts, greedy, left-padded, SDPA."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    enc = tok(prompts(batch), return_tensors="pt", padding=True)

    def run(max_tokens: int) -> int:
        with torch.inference_mode():
            out = lm.generate(
                **enc,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
        return int((out.shape[1] - enc["input_ids"].shape[1]) * batch)

    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tests' tiny model, batch 1 and 4, few tokens")
    p.add_argument("--model", default=None, help="a local model folder (default: the embedded SmolLM2)")
    p.add_argument("--batches", default=None, help="comma-separated (default 1,16,64; quick 1,4)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the issue's figures are one core)")
    p.add_argument("--tokens", type=int, default=None, help="the short call's tokens (default 8; quick 4)")
    p.add_argument("--extra", type=int, default=None, help="the long call's extra tokens (default 32; quick 8)")
    p.add_argument("--no-peer", action="store_true", help="leave out plain transformers generate")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default perf/results/roofline[_quick].json)")
    args = p.parse_args(argv)
    batches = [int(b) for b in (args.batches or ("1,4" if args.quick else "1,16,64")).split(",")]
    tokens = args.tokens or (4 if args.quick else 8)
    extra = args.extra or (8 if args.quick else 32)

    import torch

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="arle-perf-roofline-"))
    model, model_name = perf_model(args.quick, work, args.model)
    load = [round(x, 2) for x in os.getloadavg()]
    roof = roofline(model, rows=tuple(batches))
    rows = []
    for b in batches:
        row: dict[str, Any] = {"batch": b, "arle_tok_s": round(decode_rate(arle_generate(model, b), tokens, extra), 1)}
        if not args.no_peer:
            row["transformers_tok_s"] = round(decode_rate(hf_generate(model, b), tokens, extra), 1)
        row["arle_fraction"] = round(bound_fraction(roof, b, row["arle_tok_s"]), 3)
        if "transformers_tok_s" in row:
            row["transformers_fraction"] = round(bound_fraction(roof, b, row["transformers_tok_s"]), 3)
            row["arle_over_transformers"] = round(row["arle_tok_s"] / row["transformers_tok_s"], 2)
        if b in TARGETS:
            row["target"] = TARGETS[b]
            row["target_met"] = row["arle_fraction"] >= TARGETS[b]
        print(f"batch {b}: {row}", file=sys.stderr, flush=True)
        rows.append(row)

    print(f"\ndecode vs the roofline · {time.strftime('%Y-%m-%d %H:%M:%S %z')} · {model_name} · load {load[0]}")
    print("\n".join(roofline_lines(roof)))
    head = ("batch", "bound tok/s", "arle tok/s", "of bound", "transformers", "of bound", "arle/tf")
    print("\n" + " ".join(f"{h:>{w}}" for h, w in zip(head, (5, 12, 11, 9, 13, 9, 8))))
    for r in rows:
        peer = (
            f"{r['transformers_tok_s']:>13} {r['transformers_fraction']:>9.0%} {r['arle_over_transformers']:>8}"
            if "transformers_tok_s" in r
            else f"{'-':>13} {'-':>9} {'-':>8}"
        )
        target = f"  target >= {r['target']:.0%}: {'met' if r['target_met'] else 'MISSED'}" if "target" in r else ""
        bound = roof["bound_tok_s"][r["batch"]]
        print(f"{r['batch']:>5} {bound:>12} {r['arle_tok_s']:>11} {r['arle_fraction']:>9.0%} {peer}{target}")
    result = decode_result(model_name, args.threads, load, tokens, extra, roofline=roof, rows=rows)
    out = args.out or RESULTS / ("roofline_quick.json" if args.quick else "roofline.json")
    write_result(result, out, work, args.keep)
    return result


if __name__ == "__main__":
    main()
