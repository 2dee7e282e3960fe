"""TextWorld (issue 28): what one step of a generated game costs, and the share of a multi-turn
eval's wall time the world takes next to the engine.

Target (issue 28): the world never more than 20% of the wall time of an eval on the hf engine
at 16 concurrent episodes.

    python perf/textworld_steps.py            # SmolLM2-135M-Instruct (embedded), 16 episodes
    python perf/textworld_steps.py --quick    # the tests' tiny model, fewer turns

Writes perf/results/textworld_steps.json (quick runs: textworld_steps_quick.json).

1. Steps alone: the fixture games of the textworld cards (benchmarks/fixtures/textworld_*.jsonl),
   two of them generated and compiled afresh (timed: generation + Inform 7 compile), then their
   walkthroughs played on fresh worlds `--repeats` times: start seconds per world (the
   z-machine loading the compiled game, reading the cache) and world steps per second (only
   `World.act`: the interpreter and TextWorld's state tracking).
2. Eval share: `envs.episodes.collect` (what `arle eval` and every trainer run) of the
   `textworld_cooking` card on `--episodes` rows of its test split, all concurrent, on one hf
   engine, the games compiled beforehand (a cache that is warm, as on any rerun); the env's
   reset and step are timed apart from the whole wall time (the rest is the engine and the
   driver). Every episode runs `--turns` turns (a random model rarely ends one early).
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
CARDS = ("textworld_coin", "textworld_treasure", "textworld_cooking")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The script's options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct; quick: the tiny model)")
    p.add_argument("--quick", action="store_true", help="tiny model, 4 turns, 1 repeat")
    p.add_argument("--episodes", type=int, default=16, help="concurrent episodes of the eval")
    p.add_argument("--turns", type=int, default=None, help="model turns per episode (default 8; quick 4)")
    p.add_argument("--max-tokens", type=int, default=None, help="per-turn token budget (default 32; quick 8)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=None, help="passes over the walkthroughs (default 3; quick 1)")
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


def steps_alone(repeats: int) -> dict[str, Any]:
    """Build, start and step costs on the fixture games' walkthroughs."""
    from arlecli.envs.textworld_env import GameSpec, World, game_file

    specs = []
    for card in CARDS:
        for line in (ROOT / "benchmarks" / "fixtures" / f"{card}.jsonl").read_text().splitlines():
            row = json.loads(line)
            specs.append(GameSpec.of(row["game"], row["settings"], row["seed"]))
    builds = {}
    fresh = Path(tempfile.mkdtemp(prefix="arle-textworld-build-"))
    for spec in (specs[0], specs[-1]):  # a coin collector and a cooking game, generated and compiled
        t = time.perf_counter()
        game_file(spec, fresh, use_prebuilt=False)
        builds[spec.key()] = time.perf_counter() - t
    for spec in specs:  # the rest unpacked from the shipped fixture games
        game_file(spec)
    starts, steps, step_s = [], 0, 0.0
    per_game: dict[str, int] = {}
    for _ in range(repeats):
        for spec in specs:
            t = time.perf_counter()
            world = World(spec)
            starts.append(time.perf_counter() - t)
            t = time.perf_counter()
            for command in world.walkthrough:
                world.act(command)
            step_s += time.perf_counter() - t
            assert world.won, spec
            steps += len(world.walkthrough)
            per_game[f"{spec.game}-{spec.seed}"] = len(world.walkthrough)
            world.close()
    return {
        "build_s": builds,
        "build_s_median": statistics.median(builds.values()),
        "start_s_median": statistics.median(starts),
        "steps": steps,
        "step_s_total": step_s,
        "steps_per_s": steps / step_s,
        "walkthroughs": per_game,
    }


def eval_share(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """Wall time of one collect over `episodes` concurrent episodes, and the world's part of it."""
    from dataclasses import replace

    import arlecli.envs.textworld_env as tw
    from arlecli.catalog import load_card
    from arlecli.engine.base import GenerationRequest, SamplingParams
    from arlecli.engine.hf import HFEngine
    from arlecli.envs.episodes import Sampling, collect
    from arlecli.eval import EvalOptions, load_tasks

    card = load_card("textworld_cooking")
    card = replace(card, env_params={**card.env_params, "max_turns": args.turns})
    tasks, exemplars = load_tasks(card, EvalOptions(limit=args.episodes, num_fewshot=0))
    t = time.perf_counter()
    for task in tasks:  # compiled once per game; an eval rerun finds them in the cache
        tw.game_file(tw.GameSpec.from_task(task))
    prebuild = time.perf_counter() - t
    engine = HFEngine(model, batch_size=args.batch_size)
    list(engine.generate([GenerationRequest(prompt="Warm up.", params=SamplingParams(max_tokens=4))]))

    world_s = {"reset": 0.0, "step": 0.0}
    calls = {"reset": 0, "step": 0}
    originals = {name: getattr(tw.TextWorldEnv, name) for name in world_s}

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
        setattr(tw.TextWorldEnv, name, timed(name))
    try:
        t0 = time.perf_counter()
        draws = [(i, 0) for i in range(len(tasks))]
        sampling = Sampling(temperature=1.0, max_tokens=args.max_tokens, seed=0)
        episodes = [e for _, e in collect(card, engine, tasks, exemplars, draws, sampling)]
        wall = time.perf_counter() - t0
    finally:
        for name, fn in originals.items():
            setattr(tw.TextWorldEnv, name, fn)
    world = sum(world_s.values())
    return {
        "episodes": len(episodes),
        "turns": sum(len(e.turns) for e in episodes),
        "end_reasons": sorted(e.end_reason for e in episodes),
        "prebuild_s": prebuild,
        "wall_s": wall,
        "world_s": world,
        "world_reset_s": world_s["reset"],
        "world_step_s": world_s["step"],
        "world_share": world / wall,
        "engine_and_driver_share": 1 - world / wall,
        "world_steps_per_s_in_eval": calls["step"] / world_s["step"] if world_s["step"] else None,
        "target_share": TARGET_SHARE,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, print the figures and write them."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # perf/README.md: busy-waiting threads swing timings
    if args.threads:
        os.environ.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    work = Path(tempfile.mkdtemp(prefix="arle-textworld-steps-"))
    os.environ.setdefault("ARLE_HOME", str(work / "arle_home"))  # a cold game cache of its own
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    path, name = model_path(args, work)
    alone = steps_alone(args.repeats)
    print(
        f"textworld alone: build (generate + compile) {alone['build_s_median']:.2f} s a game (median of 2), start "
        f"{alone['start_s_median'] * 1000:.0f} ms a world, {alone['steps_per_s']:.0f} steps/s "
        f"({alone['steps']} walkthrough steps of {len(alone['walkthroughs'])} games x {args.repeats})",
        flush=True,
    )
    share = eval_share(args, path)
    print(
        f"textworld_cooking eval: {share['episodes']} concurrent episodes x {args.turns} turns on {name} (hf, "
        f"{args.max_tokens} tokens a turn): wall {share['wall_s']:.1f} s, world {share['world_s']:.2f} s "
        f"= {share['world_share']:.1%} (reset {share['world_reset_s']:.2f} s, steps {share['world_step_s']:.2f} s), "
        f"engine and driver {share['engine_and_driver_share']:.1%}; target: world <= {TARGET_SHARE:.0%} "
        f"(games compiled beforehand in {share['prebuild_s']:.1f} s)"
    )
    result = {
        "world": "textworld",
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
        "versions": package_versions(("torch", "transformers", "textworld", "jericho")),
    }
    out = args.out or RESULTS / f"textworld_steps{'_quick' if args.quick else ''}.json"
    write_result(result, out, work, keep=False)
    return result


if __name__ == "__main__":
    main()
