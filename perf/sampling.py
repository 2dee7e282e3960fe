"""Seeded sampling on the hf engine: arle's `draw` vs `torch.multinomial`, the same tokens.

What is measured, in one process, each side alternating:
1. One draw from a softmax over a vocabulary (SmolLM2's 49,152 entries and Qwen's 151,936):
   milliseconds a draw, `engine.hf.draw` against `torch.multinomial(probs, 1)`, and that both
   give the same token.
2. A sampled generate call (16 rows of the same prompt, temperature 1, per-row seeds, end of
   text off so every row runs its budget) on the embedded SmolLM2-135M-Instruct: seconds with
   the engine's `draw` and with `torch.multinomial` in its place, and that the ids are identical.

    python perf/sampling.py            # 3 repeats, 48 tokens
    python perf/sampling.py --quick    # the tests' tiny model, 8 tokens, 1 repeat

Writes perf/results/sampling.json (quick runs: sampling_quick.json).
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

from machine_info import cpu_model, package_versions, perf_model, write_result

RESULTS = Path(__file__).resolve().parent / "results"


def multinomial(probs: Any, generator: Any) -> Any:
    """The peer: what `engine.hf.draw` replaces."""
    import torch

    return torch.multinomial(probs, 1, generator=generator)[0]


def per_draw_ms(vocab: int, draws: int) -> dict[str, Any]:
    """Milliseconds a draw on each side, and whether every draw agreed."""
    import torch

    from arlecli.engine.hf import draw

    probs = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(vocab)), -1)
    sides = {"multinomial": lambda g: multinomial(probs, g), "draw": lambda g: draw(probs, g)}
    tokens: dict[str, list[int]] = {}
    ms: dict[str, float] = {}
    for name, pick in sides.items():
        g = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        tokens[name] = [int(pick(g)) for _ in range(draws)]
        ms[name] = (time.perf_counter() - start) / draws * 1e3
    return {"vocab": vocab, "ms": ms, "same_tokens": tokens["draw"] == tokens["multinomial"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both comparisons, print them and write the result."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny model, 8 tokens, 1 repeat")
    p.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct; quick: the tiny model)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens a row (default 48; quick 8)")
    p.add_argument("--repeats", type=int, default=None, help="generate calls a side (default 3; quick 1)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    max_tokens = args.max_tokens or (8 if args.quick else 48)
    repeats = args.repeats or (1 if args.quick else 3)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    import torch

    from arlecli.engine import hf
    from arlecli.engine.base import GenerationRequest, SamplingParams

    torch.set_num_threads(1)
    draws = [per_draw_ms(vocab, 20 if args.quick else 300) for vocab in (49152, 151936)]
    work = Path(tempfile.mkdtemp(prefix="arle-sampling-"))
    path, name = perf_model(args.quick, work, args.model)
    engine = hf.HFEngine(path, batch_size=16, prefix_cache_tokens=0, draft_tokens=0)
    engine.eos_ids = set()  # every row runs its budget
    reqs = [
        GenerationRequest(
            prompt="Write a short story about a lighthouse.",
            params=SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, logprobs=True),
        )
        for i in range(16)
    ]
    list(engine.generate(reqs[:1]))  # first-call kernel set-up
    fast = hf.draw
    seconds: dict[str, list[float]] = {"draw": [], "multinomial": []}
    ids: dict[str, list[list[int]]] = {}
    for rep in range(repeats):
        for side in ("draw", "multinomial") if rep % 2 == 0 else ("multinomial", "draw"):
            hf.draw = fast if side == "draw" else multinomial  # _pick looks the name up per call
            start = time.perf_counter()
            out = dict(engine.generate(reqs))
            seconds[side].append(time.perf_counter() - start)
            ids.setdefault(side, [out[i].token_ids for i in range(len(reqs))])
    hf.draw = fast
    median = {side: statistics.median(s) for side, s in seconds.items()}
    result = {
        "model": name,
        "rows": len(reqs),
        "max_tokens": max_tokens,
        "repeats": repeats,
        "per_draw": draws,
        "generate_seconds": seconds,
        "median_generate_seconds": median,
        "speedup_generate": median["multinomial"] / median["draw"],
        "identical_ids": ids["draw"] == ids["multinomial"],
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": 1, "load_average": os.getloadavg()},
        "versions": package_versions(("torch",)),
    }
    for d in draws:
        ratio = d["ms"]["multinomial"] / d["ms"]["draw"]
        print(
            f"vocab {d['vocab']:>6}: multinomial {d['ms']['multinomial']:.3f} ms, draw {d['ms']['draw']:.3f} ms "
            f"({ratio:.2f}x), same tokens: {d['same_tokens']}"
        )
    print(
        f"{name}, 16 sampled rows x {max_tokens} tokens: multinomial {median['multinomial']:.2f} s, "
        f"draw {median['draw']:.2f} s ({result['speedup_generate']:.3f}x); identical ids: {result['identical_ids']}"
    )
    write_result(
        result, args.out or RESULTS / ("sampling_quick.json" if args.quick else "sampling.json"), work, keep=False
    )
    if not (result["identical_ids"] and all(d["same_tokens"] for d in draws)):
        raise SystemExit("draw and torch.multinomial disagree")
    return result


if __name__ == "__main__":
    main()
