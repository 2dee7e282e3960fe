"""Interactive text worlds (issue 28): what one step of the world costs, and the share of a
multi-turn eval's wall time the world takes next to the engine.

Target (issue 28): the world never more than 20% of the wall time of an eval on the hf engine
at 16 concurrent episodes.

    python perf/world_steps.py scienceworld            # SmolLM2-135M-Instruct (embedded), 16 episodes
    python perf/world_steps.py scienceworld --quick    # the tests' tiny model, fewer turns
    python perf/world_steps.py textworld               # the same for TextWorld (textworld_cooking)
    python perf/world_steps.py textworld --card alfworld_style   # ... on arle's household games

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

## textworld

1. Steps alone: the fixture games of the textworld cards (benchmarks/fixtures/textworld_*.jsonl
   and alfworld_style.jsonl), each card's first generated and compiled afresh (timed: generation
   + Inform 7 compile), then their walkthroughs played on fresh worlds `--repeats` times: start seconds per world (the
   z-machine loading the compiled game, reading the cache) and world steps per second (only
   `World.act`: the interpreter and TextWorld's state tracking).
2. Eval share: `envs.episodes.collect` (what `arle eval` and every trainer run) of the
   `--card` (default `textworld_cooking`) on `--episodes` rows of its test split, all concurrent, on one hf
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
from typing import Any, Callable

from machine_info import cpu_model, package_versions, perf_model, write_result

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf" / "results"
TARGET_SHARE = 0.20
TEXTWORLD_CARDS = ("textworld_coin", "textworld_treasure", "textworld_cooking", "alfworld_style")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The script's options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("world", choices=["scienceworld", "textworld"], help="which world to measure")
    p.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct; quick: the tiny model)")
    p.add_argument("--quick", action="store_true", help="tiny model, 4 turns, 1 repeat")
    p.add_argument(
        "--card", default="textworld_cooking", choices=TEXTWORLD_CARDS, help="textworld: the card of the eval share"
    )
    p.add_argument("--episodes", type=int, default=16, help="concurrent episodes of the eval")
    p.add_argument("--turns", type=int, default=None, help="model turns per episode (default 8; quick 4)")
    p.add_argument("--max-tokens", type=int, default=None, help="per-turn token budget (default 32; quick 8)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--repeats", type=int, default=None, help="passes over the gold paths / walkthroughs (default 3; quick 1)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.turns = args.turns or (4 if args.quick else 8)
    args.max_tokens = args.max_tokens or (8 if args.quick else 32)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


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


def eval_share(
    args: argparse.Namespace,
    model: str,
    card_name: str,
    env_class: Any,
    params: dict[str, Any],
    prepare: Callable[[list[Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Wall time of one collect over `episodes` concurrent episodes of `card_name` (its env
    params updated with `params`), and the part of it spent in `env_class`'s reset and step.
    `prepare(tasks)` runs first, untimed (a JVM start, games compiled), and returns extra figures."""
    from dataclasses import replace

    from arlecli.catalog import load_card
    from arlecli.engine.base import GenerationRequest, SamplingParams
    from arlecli.engine.hf import HFEngine
    from arlecli.envs.episodes import Sampling, collect
    from arlecli.eval import EvalOptions, load_tasks

    card = load_card(card_name)
    card = replace(card, env_params={**card.env_params, **params})
    tasks, exemplars = load_tasks(card, EvalOptions(limit=args.episodes, num_fewshot=0))
    extra = prepare(tasks)
    engine = HFEngine(model, batch_size=args.batch_size)
    list(engine.generate([GenerationRequest(prompt="Warm up.", params=SamplingParams(max_tokens=4))]))

    world_s = {"reset": 0.0, "step": 0.0}
    calls = {"reset": 0, "step": 0}
    originals = {name: getattr(env_class, name) for name in world_s}

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
        setattr(env_class, name, timed(name))
    try:
        t0 = time.perf_counter()
        draws = [(i, 0) for i in range(len(tasks))]
        sampling = Sampling(temperature=1.0, max_tokens=args.max_tokens, seed=0)
        episodes = [e for _, e in collect(card, engine, tasks, exemplars, draws, sampling)]
        wall = time.perf_counter() - t0
    finally:
        for name, fn in originals.items():
            setattr(env_class, name, fn)
    world = sum(world_s.values())
    return {
        "card": card_name,
        "episodes": len(episodes),
        "turns": sum(len(e.turns) for e in episodes),
        "end_reasons": sorted(e.end_reason for e in episodes),
        "wall_s": wall,
        "world_s": world,
        "world_reset_s": world_s["reset"],
        "world_step_s": world_s["step"],
        "world_share": world / wall,
        "engine_and_driver_share": 1 - world / wall,
        "world_steps_per_s_in_eval": calls["step"] / world_s["step"] if world_s["step"] else None,
        "target_share": TARGET_SHARE,
        **extra,
    }


def scienceworld_eval_share(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """The eval share on the `scienceworld` card (one row per task type), the JVM started first."""
    from arlecli.envs import scienceworld as sw

    def start_jvm(tasks: list[Any]) -> dict[str, Any]:
        sw.variation_count(sw.task_type(tasks[0].fields["task_type"]))  # its start is not the eval's
        return {}

    # max_invalid past the turn limit: every episode runs its turns.
    share = eval_share(
        args, model, "scienceworld", sw.ScienceWorldTextEnv,
        {"max_turns": args.turns, "max_invalid": args.turns + 1}, start_jvm,
    )  # fmt: skip
    return {**share, "jvms_started": sw.POOL.started}


# textworld -----------------------------------------------------------------------------------


def textworld_steps_alone(repeats: int) -> dict[str, Any]:
    """Build, start and step costs on the fixture games' walkthroughs."""
    from arlecli.envs.textworld_env import GameSpec, World, game_file

    specs, firsts = [], []
    for card in TEXTWORLD_CARDS:
        for i, line in enumerate((ROOT / "benchmarks" / "fixtures" / f"{card}.jsonl").read_text().splitlines()):
            row = json.loads(line)
            specs.append(GameSpec.of(row["game"], row["settings"], row["seed"]))
            if i == 0:
                firsts.append(specs[-1])
    builds = {}
    fresh = Path(tempfile.mkdtemp(prefix="arle-textworld-build-"))
    for spec in firsts:  # each card's first game, generated and compiled
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


def textworld_eval_share(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """The eval share on `args.card` (default textworld_cooking), its games compiled beforehand
    (a warm cache, as on any rerun)."""
    import arlecli.envs.textworld_env as tw

    def prebuild(tasks: list[Any]) -> dict[str, Any]:
        t = time.perf_counter()
        for task in tasks:
            tw.game_file(tw.GameSpec.from_task(task))
        return {"prebuild_s": time.perf_counter() - t}

    return eval_share(args, model, args.card, tw.TextWorldEnv, {"max_turns": args.turns}, prebuild)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure the chosen world, print the figures and write them."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # perf/README.md: busy-waiting threads swing timings
    if args.threads:
        os.environ.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    work = Path(tempfile.mkdtemp(prefix="arle-world-steps-"))
    if args.world == "textworld":
        os.environ.setdefault("ARLE_HOME", str(work / "arle_home"))  # a cold game cache of its own
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    path, name = perf_model(args.quick, work, args.model)
    if args.world == "scienceworld":
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
        note = f"JVMs started: {share['jvms_started']}"
        versions = ("torch", "transformers", "scienceworld", "py4j")
    else:
        alone = textworld_steps_alone(args.repeats)
        print(
            f"textworld alone: build (generate + compile) {alone['build_s_median']:.2f} s a game "
            f"(median of {len(alone['build_s'])}), "
            f"start {alone['start_s_median'] * 1000:.0f} ms a world, {alone['steps_per_s']:.0f} steps/s "
            f"({alone['steps']} walkthrough steps of {len(alone['walkthroughs'])} games x {args.repeats})",
            flush=True,
        )
        share = textworld_eval_share(args, path)
        note = f"games compiled beforehand in {share['prebuild_s']:.1f} s"
        versions = ("torch", "transformers", "textworld", "jericho")
    print(
        f"{share['card']} eval: {share['episodes']} concurrent episodes x {args.turns} turns on {name} (hf, "
        f"{args.max_tokens} tokens a turn): wall {share['wall_s']:.1f} s, world {share['world_s']:.2f} s "
        f"= {share['world_share']:.1%} (reset {share['world_reset_s']:.2f} s, steps {share['world_step_s']:.2f} s), "
        f"engine and driver {share['engine_and_driver_share']:.1%}; target: world <= {TARGET_SHARE:.0%}; {note}"
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
        "versions": package_versions(versions),
    }
    which = args.world if args.world == "scienceworld" or args.card == "textworld_cooking" else args.card
    out = args.out or RESULTS / f"world_steps_{which}{'_quick' if args.quick else ''}.json"
    write_result(result, out, work, keep=False)
    return result


if __name__ == "__main__":
    main()
