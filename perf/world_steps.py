"""Interactive text worlds (issue 28): what one step of the world costs, and the share of a
multi-turn eval's wall time the world takes next to the engine.

Target (issue 28): the world never more than 20% of the wall time of an eval on the hf engine
at 16 concurrent episodes.

    python perf/world_steps.py scienceworld            # SmolLM2-135M-Instruct (embedded), 16 episodes
    python perf/world_steps.py scienceworld --quick    # the tests' tiny model, fewer turns

Writes perf/results/world_steps_<world>.json (quick runs: ..._quick.json).

## scienceworld

1. Steps alone: the recorded gold paths (tests/fixtures/scienceworld/paths.jsonl) played on
   fresh worlds in the one JVM, `--repeats` times: JVM start seconds, load seconds per world
   and world steps per second (only `World.step`, the py4j round trips and the simulation).
2. Eval share: `envs.episodes.collect` (what `arle eval` and every trainer run) of the
   `scienceworld` card on `--episodes` rows of its test split (round-robin: one per task
   type), all concurrent, on one hf engine; the env's reset and step are timed (the world:
   loading, acting, reading score and observations) apart from the whole wall time (the rest
   is the engine and the driver). Every episode runs `--turns` turns: a replies-free model
   rarely ends one early, and max_invalid is set past the turn limit.
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

from machine_info import cpu_model, package_versions, write_result

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf" / "results"
TARGET_SHARE = 0.20


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The script's options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("world", choices=["scienceworld"], help="which world to measure")
    p.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct; quick: the tiny model)")
    p.add_argument("--quick", action="store_true", help="tiny model, 4 turns, 1 repeat")
    p.add_argument("--episodes", type=int, default=16, help="concurrent episodes of the eval")
    p.add_argument("--turns", type=int, default=None, help="model turns per episode (default 8; quick 4)")
    p.add_argument("--max-tokens", type=int, default=None, help="per-turn token budget (default 32; quick 8)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=None, help="passes over the gold paths (default 3; quick 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.turns = args.turns or (4 if args.quick else 8)
    args.max_tokens = args.max_tokens or (8 if args.quick else 32)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def model_path(args: argparse.Namespace, work: Path) -> tuple[str, str]:
    """(path, display name) of the model the eval runs."""
    if args.model:
        return args.model, args.model
    if args.quick:
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers.tiny_model import build_tiny_model

        return str(build_tiny_model(work / "tiny-model")), "tiny Qwen2 test model (random weights)"
    from arlecli.models import EMBEDDED_NAME, embedded_default_model

    return str(embedded_default_model()), EMBEDDED_NAME


# scienceworld --------------------------------------------------------------------------------


def scienceworld_steps_alone(repeats: int) -> dict[str, Any]:
    """JVM start, world load and step costs on the recorded gold paths."""
    from arlecli.envs import scienceworld as sw

    paths = [
        json.loads(x) for x in (ROOT / "tests" / "fixtures" / "scienceworld" / "paths.jsonl").read_text().splitlines()
    ]
    gold = [p for p in paths if p["kind"] == "gold"]
    sw.shutdown()
    t0 = time.perf_counter()
    first = sw.World(sw.task_type(gold[0]["task_type"]), gold[0]["variation"], gold[0]["simplification"])
    jvm_and_load_s = time.perf_counter() - t0
    loads, steps, step_s = [], 0, 0.0
    try:
        for _ in range(repeats):
            for path in gold:
                t = time.perf_counter()
                world = sw.World(sw.task_type(path["task_type"]), path["variation"], path["simplification"])
                loads.append(time.perf_counter() - t)
                t = time.perf_counter()
                for action in path["actions"]:
                    world.step(action)
                step_s += time.perf_counter() - t
                steps += len(path["actions"])
                world.close()
    finally:
        first.close()
    return {
        "first_world_with_jvm_start_s": jvm_and_load_s,
        "load_s_median": statistics.median(loads),
        "steps": steps,
        "step_s_total": step_s,
        "steps_per_s": steps / step_s,
        "paths": [f"{p['task_type']}-{p['variation']} ({len(p['actions'])} actions)" for p in gold],
    }


def scienceworld_eval_share(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """Wall time of one collect over `episodes` concurrent episodes, and the world's part of it."""
    from dataclasses import replace

    from arlecli.catalog import load_card
    from arlecli.engine.base import GenerationRequest, SamplingParams
    from arlecli.engine.hf import HFEngine
    from arlecli.envs import scienceworld as sw
    from arlecli.envs.episodes import Sampling, collect
    from arlecli.eval import EvalOptions, load_tasks

    card = load_card("scienceworld")
    card = replace(card, env_params={**card.env_params, "max_turns": args.turns, "max_invalid": args.turns + 1})
    tasks, exemplars = load_tasks(card, EvalOptions(limit=args.episodes, num_fewshot=0))
    engine = HFEngine(model, batch_size=args.batch_size)
    list(engine.generate([GenerationRequest(prompt="Warm up.", params=SamplingParams(max_tokens=4))]))
    sw.variation_count(sw.task_type(tasks[0].fields["task_type"]))  # the JVM is up: its start is not the eval's

    world_s = {"reset": 0.0, "step": 0.0}
    calls = {"reset": 0, "step": 0}
    originals = {name: getattr(sw.ScienceWorldTextEnv, name) for name in world_s}

    def timed(name: str) -> Any:
        inner = originals[name]

        def run(self: Any, *a: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(self, *a)
            finally:
                world_s[name] += time.perf_counter() - t
                calls[name] += 1

        return run

    for name in world_s:
        setattr(sw.ScienceWorldTextEnv, name, timed(name))
    try:
        t0 = time.perf_counter()
        episodes = [e for _, e in collect(card, engine, tasks, exemplars, [(i, 0) for i in range(len(tasks))],
                                          Sampling(temperature=1.0, max_tokens=args.max_tokens, seed=0))]  # fmt: skip
        wall = time.perf_counter() - t0
    finally:
        for name, fn in originals.items():
            setattr(sw.ScienceWorldTextEnv, name, fn)
    world = sum(world_s.values())
    turns = sum(len(e.turns) for e in episodes)
    return {
        "episodes": len(episodes),
        "turns": turns,
        "end_reasons": sorted(e.end_reason for e in episodes),
        "wall_s": wall,
        "world_s": world,
        "world_reset_s": world_s["reset"],
        "world_step_s": world_s["step"],
        "world_share": world / wall,
        "engine_and_driver_share": 1 - world / wall,
        "world_steps_per_s_in_eval": calls["step"] / world_s["step"] if world_s["step"] else None,
        "target_share": TARGET_SHARE,
        "jvms_started": sw.POOL.started,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure the chosen world, print the figures and write them."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # perf/README.md: busy-waiting threads swing timings
    if args.threads:
        os.environ.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="arle-world-steps-"))
    path, name = model_path(args, work)
    from arlecli.envs import scienceworld as sw

    try:
        alone = scienceworld_steps_alone(args.repeats)
        print(
            f"scienceworld alone: JVM start + first load {alone['first_world_with_jvm_start_s']:.2f} s, "
            f"load {alone['load_s_median'] * 1000:.0f} ms a world, {alone['steps_per_s']:.0f} steps/s "
            f"({alone['steps']} steps of {len(alone['paths'])} gold paths x {args.repeats})",
            flush=True,
        )
        share = scienceworld_eval_share(args, path)
    finally:
        sw.shutdown()
    print(
        f"scienceworld eval: {share['episodes']} concurrent episodes x {args.turns} turns on {name} (hf, "
        f"{args.max_tokens} tokens a turn): wall {share['wall_s']:.1f} s, world {share['world_s']:.2f} s "
        f"= {share['world_share']:.1%} (reset {share['world_reset_s']:.2f} s, steps {share['world_step_s']:.2f} s), "
        f"engine and driver {share['engine_and_driver_share']:.1%}; target: world <= {TARGET_SHARE:.0%}; "
        f"JVMs started: {share['jvms_started']}"
    )
    result = {
        "world": args.world,
        "model": name,
        "alone": alone,
        "eval": share,
        "turns_per_episode": args.turns,
        "max_tokens_per_turn": args.max_tokens,
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
        },
        "versions": package_versions(("torch", "transformers", "scienceworld", "py4j")),
    }
    out = args.out or RESULTS / f"world_steps_{args.world}{'_quick' if args.quick else ''}.json"
    write_result(result, out, work, keep=False)
    return result


if __name__ == "__main__":
    main()
