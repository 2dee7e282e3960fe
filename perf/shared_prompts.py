"""A prompt shared by several rows prefilled once vs once per row, on the hf engine.

What is measured: wall seconds of `envs.episodes.collect` (the rollout driver of `arle eval`
and every trainer) on the `math_tool` card: 2 of its fixture rows x 8 samples, the grouping of
a GRPO step with 8 generations (perf/train_rollouts.py's multi-turn step), 4 model turns of 48
tokens, temperature 1 with per-sample seeds, KV reuse across turns on, batch 16. The one
difference between the sides is `HFEngine.share_prompts`: on, the rows of a group with the same
prompt are prefilled once and their KV copied; off, every row runs its own prefill. The first
turn's prompts (the tool instructions and the question, ~400 tokens) are the shared ones;
later turns differ per sample.

Each repeat runs both sides (order alternating); the script checks that every episode's ids are
identical on both sides, and prints the median seconds, their ratio and the prefill seconds.

    python perf/shared_prompts.py            # SmolLM2-135M-Instruct (embedded), 3 repeats
    python perf/shared_prompts.py --quick    # the tests' tiny model, 8-token turns, 1 repeat

Writes perf/results/shared_prompts.json (quick runs: shared_prompts_quick.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from machine_info import cpu_model, package_versions, write_result
from multiturn_kv import add_episode_options, prepare, run_side, with_defaults

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The script's options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_episode_options(p, 8, "samples per prompt (a GRPO group's size)")
    p.add_argument("--prompts", type=int, default=2, help="fixture rows (distinct prompts), at most 4")
    return with_defaults(p.parse_args(argv))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both sides `repeats` times, check their ids match, print and write the comparison."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch, engine, card, tasks, exemplars, name, work = prepare(args)
    tasks = tasks[: args.prompts]
    runs: dict[str, list[dict]] = {"shared": [], "per_row": []}
    for rep in range(args.repeats):
        for side in ("shared", "per_row") if rep % 2 == 0 else ("per_row", "shared"):
            engine.share_prompts = side == "shared"
            runs[side].append(run_side(engine, card, tasks, exemplars, args, True))
            print(f"repeat {rep + 1} {side:>8}: {runs[side][-1]['seconds']:.2f} s", flush=True)
    reference = runs["per_row"][0]["ids"]
    identical = all(r["ids"] == reference for side in runs.values() for r in side)
    median = {side: statistics.median(r["seconds"] for r in rs) for side, rs in runs.items()}
    prefill = {side: statistics.median(r["prefill_seconds"] for r in rs) for side, rs in runs.items()}
    ratio = median["per_row"] / median["shared"]
    result = {
        "model": name,
        "prompts": len(tasks),
        "samples_per_prompt": args.samples,
        "turns_per_episode": runs["shared"][0]["turns"],
        "max_tokens_per_turn": args.max_tokens,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "seconds": {side: [r["seconds"] for r in rs] for side, rs in runs.items()},
        "median_seconds": median,
        "median_prefill_seconds": prefill,
        "speedup_per_row_over_shared": ratio,
        "identical_ids": identical,
        "prompt_tokens": runs["shared"][0]["prompt_tokens"],
        "completion_tokens": runs["shared"][0]["completion_tokens"],
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
        },
        "versions": package_versions(("torch", "transformers")),
    }
    episodes = f"{len(reference)} episodes ({len(tasks)} prompts x {args.samples})"
    print(f"\n{name}: {episodes}, {args.max_tokens} tokens a turn")
    print("| prefill | median s | of which prefill s |")
    print("|---|---|---|")
    for side in ("per_row", "shared"):
        print(f"| {side.replace('_', ' ')} | {median[side]:.2f} | {prefill[side]:.2f} |")
    print(f"speedup (per row / shared): {ratio:.2f}x; identical ids on both sides: {identical}")
    default = RESULTS / ("shared_prompts_quick.json" if args.quick else "shared_prompts.json")
    write_result(result, args.out or default, work, keep=False)
    if not identical:
        raise SystemExit("the ids differ with and without shared prefill")
    return result


if __name__ == "__main__":
    main()
