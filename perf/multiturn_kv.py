"""Multi-turn rollouts on the hf engine with KV reuse across turns vs without (issue 27, item 4).

What is measured: wall seconds of `envs.episodes.collect` (the driver `arle eval` and every
trainer run) on the `math_tool` card, 16 episodes (the card's 4 fixture rows x 4 samples,
offline) of 4 model turns each, temperature 1 with per-sample seeds (what a GRPO rollout
samples), on one hf engine whose prefix cache (engine.prefix_cache) is on or off. Everything
else is the same: model, weights, batch size, seeds, tasks, per-turn token budget.

The model writes no tool call on its own (SmolLM2-135M: 0 of 16), so a reply without one
before the last turn gets perf/train_rollouts.py's nudge back instead of ending the episode
(its `tools_nudged` env): every episode runs its 4 turns, each prompt the whole conversation
so far, as an agent episode's are once the model uses tools.

Each repeat runs both sides (order alternating: on, off, off, on ...); the cache starts empty
at every run, as it does for a training rollout (the engine is made per rollout call). The
script checks that every episode's ids (prompts and completions, every turn) are identical on
both sides and prints the median seconds and the off/on ratio, with the prompt tokens sent,
the tokens served from the cache and the cache's peak size.

    python perf/multiturn_kv.py             # SmolLM2-135M-Instruct (embedded), 48-token turns, 3 repeats
    python perf/multiturn_kv.py --quick     # the tests' tiny model, 8-token turns, 1 repeat

Writes perf/results/multiturn_kv.json (quick runs: multiturn_kv_quick.json).
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

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf" / "results"
ROWS = ROOT / "benchmarks" / "fixtures" / "gsm8k.jsonl"
TARGET = 1.5  # issue 27 item 4: rollouts with KV reuse >= 1.5x faster than without


def add_episode_options(p: argparse.ArgumentParser, samples: int, samples_help: str) -> None:
    """The options of a side-by-side run of math_tool episodes (this script and perf/shared_prompts.py)."""
    p.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct; quick: the tiny model)")
    p.add_argument("--quick", action="store_true", help="tiny model, 8-token turns, 1 repeat")
    p.add_argument("--samples", type=int, default=samples, help=samples_help)
    p.add_argument("--max-tokens", type=int, default=None, help="per-turn token budget (default 48; quick 8)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=None, help="runs per side (default 3; quick 1)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (both sides; 0: torch's default)")
    p.add_argument("--out", type=Path, default=None)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The script's options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_episode_options(p, 4, "samples per fixture row (4 rows): episodes = 4 x this")
    return with_defaults(p.parse_args(argv))


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The defaults that depend on --quick."""
    args.max_tokens = args.max_tokens or (8 if args.quick else 48)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def run_side(engine: Any, card: Any, tasks: list[Any], exemplars: Any, args: argparse.Namespace, on: bool) -> dict:
    """One run of every episode with the prefix cache on or off: seconds, ids, cache figures."""
    from arlecli.engine.prefix_cache import DEFAULT_MAX_TOKENS, PrefixCache
    from arlecli.envs.episodes import Sampling, collect

    engine.prefix_cache = PrefixCache(DEFAULT_MAX_TOKENS if on else 0)  # empty, as a fresh rollout engine's
    peak = 0
    put = engine.prefix_cache.put

    def tracked_put(ids: list[int], layers: list[Any]) -> None:
        nonlocal peak
        put(ids, layers)
        peak = max(peak, engine.prefix_cache.tokens)

    engine.prefix_cache.put = tracked_put  # type: ignore[method-assign]
    prefill = {"seconds": 0.0, "tokens": 0}
    run_prefill = type(engine)._prefill

    def timed_prefill(rows: list[Any]) -> Any:
        # The prompt positions actually run (kept ones are not) and the time they took.
        start = time.perf_counter()
        out = run_prefill(engine, rows)
        prefill["seconds"] += time.perf_counter() - start
        prefill["tokens"] += sum(len(r.prompt_ids) - r.cached for r in rows)
        return out

    engine._prefill = timed_prefill
    draws = [(i, k) for i in range(len(tasks)) for k in range(args.samples)]
    sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens, seed=1234)
    start = time.perf_counter()
    episodes = dict(collect(card, engine, tasks, exemplars, draws, sampling))
    seconds = time.perf_counter() - start
    del engine._prefill
    turns = [episodes[j].turns for j in range(len(draws))]
    return {
        "seconds": seconds,
        "ids": [[(t.prompt_token_ids, t.token_ids) for t in ts] for ts in turns],
        "turns": [len(ts) for ts in turns],
        "prompt_tokens": sum(len(t.prompt_token_ids or []) for ts in turns for t in ts),
        "completion_tokens": sum(len(t.token_ids or []) for ts in turns for t in ts),
        "reused_tokens": engine.prefix_cache.reused_tokens,
        "prefill_seconds": prefill["seconds"],
        "prefilled_tokens": prefill["tokens"],
        "cache_peak_tokens": peak,
        "cache_cap_tokens": engine.prefix_cache.max_tokens,
    }


def prepare(args: argparse.Namespace) -> tuple[Any, Any, Any, list[Any], Any, str, Path]:
    """Offline, pinned threads, the model, the math_tool card with the nudging env, its
    fixture tasks and a warmed-up hf engine: (torch, engine, card, tasks, exemplars, model
    name, work folder)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    # On a shared machine OpenMP threads that busy-wait make timings swing 30x (perf/README.md's
    # notes): passive waiting, and one thread by default, as the eval and train comparisons pin.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.threads:
        os.environ.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    work = Path(tempfile.mkdtemp(prefix="arle-multiturn-"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_rollouts import register_nudged_env

    import torch

    from arlecli.catalog import load_card
    from arlecli.engine.base import GenerationRequest, SamplingParams
    from arlecli.engine.hf import HFEngine
    from arlecli.eval import EvalOptions, load_tasks

    if args.threads:
        torch.set_num_threads(args.threads)
    register_nudged_env()
    path, name = perf_model(args.quick, work, args.model)
    card = load_card("math_tool")
    card.env = "tools_nudged"
    tasks, exemplars = load_tasks(card, EvalOptions(data=str(ROWS), num_fewshot=0))
    engine = HFEngine(path, batch_size=args.batch_size)
    # Warm-up (first-call kernel set-up), so neither side's first run pays it.
    list(engine.generate([GenerationRequest(prompt="Warm up.", params=SamplingParams(max_tokens=4))]))
    return torch, engine, card, tasks, exemplars, name, work


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both sides `repeats` times, check their ids match, print and write the comparison."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch, engine, card, tasks, exemplars, name, work = prepare(args)
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for rep in range(args.repeats):
        for side in ("on", "off") if rep % 2 == 0 else ("off", "on"):
            runs[side].append(run_side(engine, card, tasks, exemplars, args, side == "on"))
            print(f"repeat {rep + 1} kv reuse {side:>3}: {runs[side][-1]['seconds']:.2f} s", flush=True)
    reference = runs["off"][0]["ids"]
    identical = all(r["ids"] == reference for side in runs.values() for r in side)
    median = {side: statistics.median(r["seconds"] for r in rs) for side, rs in runs.items()}
    prefill_median = {side: statistics.median(r["prefill_seconds"] for r in rs) for side, rs in runs.items()}
    ratio = median["off"] / median["on"]
    first_on, first_off = runs["on"][0], runs["off"][0]
    result = {
        "model": name,
        "episodes": len(reference),
        "turns_per_episode": first_off["turns"],
        "max_tokens_per_turn": args.max_tokens,
        "temperature": args.temperature,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "seconds": {side: [r["seconds"] for r in rs] for side, rs in runs.items()},
        "median_seconds": median,
        "prefill_seconds": {side: [r["prefill_seconds"] for r in rs] for side, rs in runs.items()},
        "median_prefill_seconds": prefill_median,
        "prefilled_tokens": {side: rs[0]["prefilled_tokens"] for side, rs in runs.items()},
        "speedup_off_over_on": ratio,
        "target": TARGET,
        "identical_ids": identical,
        "prompt_tokens": first_off["prompt_tokens"],
        "completion_tokens": first_off["completion_tokens"],
        "reused_tokens": first_on["reused_tokens"],
        "cache_peak_tokens": first_on["cache_peak_tokens"],
        "cache_cap_tokens": first_on["cache_cap_tokens"],
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
        },
        "versions": package_versions(("torch", "transformers")),
    }
    print(
        f"\n{name}: {len(reference)} episodes x turns {sorted(set(first_off['turns']))}, "
        f"{args.max_tokens} tokens a turn, batch {args.batch_size}"
    )
    print("| kv reuse | median s | of which prefill s | prompt tokens sent | prefilled | cache peak / cap (tokens) |")
    print("|---|---|---|---|---|---|")
    print(
        f"| off | {median['off']:.2f} | {prefill_median['off']:.2f} | {first_off['prompt_tokens']} | "
        f"{first_off['prefilled_tokens']} | - |"
    )
    print(
        f"| on | {median['on']:.2f} | {prefill_median['on']:.2f} | {first_on['prompt_tokens']} | "
        f"{first_on['prefilled_tokens']} | {first_on['cache_peak_tokens']} / {first_on['cache_cap_tokens']} |"
    )
    per_run = {side: [round(r["seconds"], 1) for r in rs] for side, rs in runs.items()}
    print(f"seconds per run: on {per_run['on']}, off {per_run['off']}")
    print(f"speedup (off / on): {ratio:.2f}x (target >= {TARGET}x); identical ids on both sides: {identical}")
    print(f"load average at the end: {os.getloadavg()}")
    default = RESULTS / ("multiturn_kv_quick.json" if args.quick else "multiturn_kv.json")
    write_result(result, args.out or default, work, keep=False)
    if not identical:
        raise SystemExit("the ids differ with and without KV reuse")
    return result


if __name__ == "__main__":
    main()
