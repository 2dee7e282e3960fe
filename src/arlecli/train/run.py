"""A training run from start to finish: refusals, run directory, data, reward, the algorithm, evaluations.

    <run>/meta.json          command, versions, card hash, model, algo, every setting
    <run>/metrics.jsonl      one line per logged step (reward, accuracy, kl, loss, throughput)
    <run>/rewards.jsonl      one line per scored completion (the same verdicts the eval writes)
    <run>/checkpoint-N/      the trainer's checkpoints (weights or adapter, optimizer, RNG, data position)
    <run>/eval/step-N/       held-out evaluations: ordinary eval run directories
    <run>/final/             the trained model (full weights, or the LoRA adapter) + tokenizer
    <run>/summary.json       before/after accuracy, steps, time

`--resume` continues from the newest checkpoint: steps after it are dropped from
metrics.jsonl and rewards.jsonl (they run again), finished evaluations are kept. A finished
run (summary.json at its max_steps) trains nothing on resume. A fresh run that fails before
anything worth keeping (a step, a checkpoint, a held-out sample) removes what it wrote.

Under `accelerate launch` (see launch.py) every rank runs this same function. Only the main
process writes meta.json, metrics.jsonl, summary.json and the held-out evaluations; rewards.jsonl
is written by the main process too, from every rank's verdicts gathered at each reward call (one
line per completion, in rank order); the trainer saves checkpoints and final/ as it does for any
accelerate run. The other ranks wait at a barrier while the main process evaluates (train.ranks).

The run directory itself (naming, meta.json, resume checks, checkpoints) is arlecli.rundir's;
the algorithm is a registered plugin (train.algorithm): its `check` runs before the run
directory exists, its `run` gets one TrainContext per stage. An RL algorithm's context carries
the rollouts and the reward; a `--data` one's (sft, dpo) the checked rows, with the same run
directory.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from arlecli import rundir, thinking
from arlecli.cards import Card, render_prompt
from arlecli.data.sources import split_names
from arlecli.envs.episodes import Sampling
from arlecli.envs.textarena import BUILTIN_OPPONENTS, SELF, is_multiplayer, with_opponent
from arlecli.errors import UserError
from arlecli.eval import EvalOptions, load_tasks
from arlecli.fewshot import exemplars_for
from arlecli.models import ModelSpec
from arlecli.records import SCHEMA, RunDir, TrainSummary
from arlecli.results import read_json, write_json
from arlecli.catalog import card_forgeable, card_runs_code
from arlecli.sandbox import ensure_isolation, set_policy
from arlecli.train.algorithm import Algorithm, TrainContext, TrainView, algorithm, names
from arlecli.train.config import TrainConfig
from arlecli.train.heldout import HeldOut, accuracy
from arlecli.train.ranks import Ranks
from arlecli.train.metrics import MetricsLog
from arlecli.train.model_card import write_model_card
from arlecli.train.reward import CardReward, truncate_rewards
from arlecli.train.batches import PolicyBackend, Rollouts
from arlecli.train.overlap import MAX_STALENESS

# Settings a resumed run may change: they do not alter what the steps already taken mean.
RESUMABLE = {"max_steps", "save_steps", "save_total_limit", "eval_every", "report_to", "logging_steps", "rounds"}
# What a resume must keep (options and trainer field by field, all but RESUMABLE).
COMPARED = (
    "benchmark",
    "card_hash",
    "model",
    "algo",
    "train_split",
    "eval_split",
    "options",
    "trainer",
    "dapo",
    "stages",
    "rows_hash",
    "eval_rows_hash",
)


def train_split(card: Card, requested: str | None) -> str:
    """The split to train on: the one asked for, else "train" if the card has it, else its default."""
    if requested:
        return requested
    return "train" if "train" in split_names(card) else card.source.default_split


def run_train(
    card: Card,
    cfg: TrainConfig,
    spec: ModelSpec,
    run_dir: Path,
    *,
    resume: bool = False,
    command: list[str] | None = None,
    view: TrainView | None = None,
    sandbox: str = "require",
    refused: bool = False,
) -> dict[str, Any]:
    """Train `spec`'s model on `card` with cfg's algorithm; return (and write) summary.json's content.

    Everything `arle train` refuses is refused here, before the run directory exists (`refuse`,
    then the algorithm's check of each stage); `sandbox` is the code sandbox's policy (require:
    model-written code runs only where it can be isolated). A staged run (cfg.stages) trains its
    stages one after the other in the same run directory, each resuming the trainer's
    checkpoint at the end of the one before (so steps and weights continue), with the stage's
    own settings; a resumed staged run starts in the stage its checkpoint falls in. `refused`:
    the caller ran `refuse(card, cfg)` before it resolved the model (the CLI does), so its
    warnings are not repeated."""
    view = view or TrainView()
    opts = cfg.options
    algo = algorithm(opts.algo)
    refuse(card, cfg, spec, sandbox=sandbox, message=None if refused else view.message)
    split = train_split(card, opts.split) if not (opts.rows or algo.data) else None
    eval_split = (opts.eval_split or card.source.default_split) if not heldout_rows(opts) else None
    # Settings errors surface before the run directory exists, so a fixed rerun needs no new --output.
    sessions = cfg.sessions()
    prepared = [algo.check(stage.config, card, run_dir) for stage in sessions]
    meta = run_meta(card, cfg, spec, algo, command, split, eval_split, prepared[0])
    # After the checks: a trainer's config sets up the processes' shared state.
    ranks = Ranks.current() if algo.distributed else Ranks()
    if not ranks.main:
        view = TrainView(message=lambda text: None)  # the main process reports for the run
    compare = (*COMPARED, "data_hash") if algo.data else COMPARED
    done = finished(run_dir, cfg, algo) if resume else None
    if done is not None:
        # As `arle eval --resume` of a finished eval: the settings are checked as for any resume
        # (and the resume recorded in meta.json); nothing trains, nothing else is written. The
        # trainer would otherwise resume the last checkpoint and train past max_steps, replacing
        # final/ and pruning the checkpoints.
        record_start(run_dir, meta, resume, ranks, compare)
        rundir.release(run_dir)  # nothing more is written
        more = "--max-steps" if algo.length == "max_steps" else f"--set {algo.length}=N"
        view.message(
            f"{run_dir} is already complete ({done['global_step']} {algo.unit}; final model {done['final_model']}): "
            f"nothing to train; to train on, resume with a higher {more}"
        )
        return done
    played = None if algo.data else rollout_card(card, cfg, ranks)  # before the run directory, like every refusal
    check_dynamic_sampling(cfg, card, ranks)
    # The tasks too: a bad row (a --rows file's, a generator's) is refused before the run
    # directory exists, so the fixed rerun needs no new --output.
    data = None if played is None else train_data(card, played, cfg, split, eval_split, view)
    view.message(
        f"training {spec.name} on {card.name} with {opts.algo}"
        f"{' + LoRA r=' + str(opts.lora_rank) if opts.lora_rank else ''} for {_length(cfg.trainer)} -> "
        f"{run_dir}"
    )
    there = _names_in(run_dir)  # what a fresh run that fails before its first step leaves alone
    checkpoint, start_step = open_run(run_dir, meta, resume, view, ranks, compare=compare)
    try:
        if ranks.main and data is not None:
            truncate_rewards(run_dir, start_step)
        metrics = MetricsLog(run_dir, start_step, truncate=ranks.main)
        ranks.barrier()

        started = time.monotonic()
        heldout: HeldOut | None = None
        evals: dict[str, dict[str, Any]] = {}
        global_step = start_step
        for n, (stage, ready) in enumerate(zip(sessions, prepared, strict=True)):
            if cfg.stages and start_step >= stage.end and n < len(sessions) - 1:
                continue  # finished before this resume
            if cfg.stages:
                view.message(
                    f"stage {stage.name} ({n + 1}/{len(sessions)}): steps {stage.end - stage.steps + 1}-"
                    f"{stage.end}{_stage_changes(stage)}"
                )
                metrics.tags = {"stage": stage.name}
            evals, global_step, heldout = train_session(
                algo, card, stage.config, spec, run_dir, ready, data, checkpoint, metrics, view, ranks
            )
            checkpoint = rundir.latest_checkpoint(run_dir)
            start_step = global_step
    except BaseException as exc:
        if isinstance(exc, Exception) and not resume and ranks.main:  # a stopped run stays resumable as it is
            undo_start(run_dir, there, view)
        rundir.release(run_dir)  # a process that goes on (a notebook, a test) gives the run back
        raise
    try:
        return write_summary(
            card, spec, opts.algo, global_step, run_dir, evals, heldout, time.monotonic() - started, ranks
        )
    finally:
        rundir.release(run_dir)


def finished(run_dir: Path, cfg: TrainConfig, algo: Algorithm) -> dict[str, Any] | None:
    """summary.json's content when the run in `run_dir` already trained every step `cfg` asks
    for (its max_steps, rft's rounds: the algorithm's `length`); None when there is more to train
    (no summary.json yet: interrupted; or a resume that raises max_steps)."""
    path = RunDir(run_dir).summary
    if not path.is_file():
        return None
    data = read_json(path)  # unreadable: one line naming the file, rather than training over it
    if not isinstance(data, dict):
        return None
    step = TrainSummary.from_json(data).global_step
    target = cfg.trainer.get(algo.length)
    if step is None or not isinstance(target, int) or step < target:
        return None
    return {**data, "final_model": data.get("final_model") or str(RunDir(run_dir).final)}


def _names_in(run_dir: Path) -> set[str] | None:
    # None: no such folder yet (the run creates it).
    return set(os.listdir(run_dir)) if run_dir.is_dir() else None


def holds_work(run_dir: Path) -> bool:
    """Whether a run directory holds anything a resume would keep: a checkpoint (complete or
    not), a logged step, or a held-out evaluation's sample."""
    folder = RunDir(run_dir)
    if any(run_dir.glob("checkpoint-*")):
        return True
    if folder.metrics.is_file() and folder.metrics.stat().st_size > 0:
        return True
    return any(
        (step / RunDir.SAMPLES).is_file() and (step / RunDir.SAMPLES).stat().st_size > 0
        for step in rundir.held_out_dirs(run_dir)
    )


def undo_start(run_dir: Path, there: set[str] | None, view: TrainView) -> None:
    """After a fresh run failed before anything worth keeping (`holds_work`): remove what it wrote
    (`there`: the names that were in `run_dir` before it started; None: it created the folder).
    Its meta.json would make a plain rerun "already hold a run" and its resume refuse the fixed
    settings, so the fix would need a new --output. A failure later keeps the run, resumable."""
    try:
        if holds_work(run_dir):
            return
        rundir.release(run_dir)  # its lock file goes with the rest
        for path in run_dir.iterdir():
            if there is None or path.name not in there:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        if there is None:
            run_dir.rmdir()
    except OSError:
        return  # the error that stopped the run matters more; the folder stays as it is
    view.message(f"nothing was trained: removed what this run wrote in {run_dir}, so the same command can run again")


def run_meta(
    card: Card,
    cfg: TrainConfig,
    spec: ModelSpec,
    algo: Algorithm,
    command: list[str] | None,
    split: str | None,
    eval_split: str | None,
    prepared: Any,
) -> dict[str, Any]:
    """meta.json's content: the command, versions, card, model, algorithm and every setting,
    with the identity of the files trained on (a file whose content changed since is refused on
    resume) and the trainer's resolved config when the algorithm's check made one."""
    opts = cfg.options
    meta = {
        "command": command or sys.argv,
        "kind": "train",
        "benchmark": card.name,
        "card_version": card.version,
        "card_hash": card.hash,
        "card_path": str(card.path),
        "model": spec.name,
        "model_path": spec.path_or_id,
        "algo": opts.algo,
        "train_split": None if algo.data else opts.rows or split,
        "eval_split": heldout_rows(opts) or eval_split,
        "recipe": cfg.recipe,
        "options": asdict(opts),
        "trainer": cfg.trainer,
        "dapo": asdict(cfg.dapo),
        "versions": rundir.versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # What a step is called and the trainer field counting them (rundir reads them back).
        "unit": algo.unit,
        "length": algo.length,
        "schema": SCHEMA,
    }
    if cfg.stages:
        meta["stages"] = cfg.stage_plan
    for key in ("rows", "eval_rows"):
        if getattr(opts, key):
            meta[f"{key}_hash"] = rundir.file_hash(getattr(opts, key))
    if algo.data:
        meta.update(data_hash=rundir.file_hash(opts.data or ""), data_rows=len(prepared.rows))
    if hasattr(prepared, "to_dict"):
        # Every field the trainer ran with, defaults included (resume compares only "trainer").
        meta["trainer_resolved"] = prepared.to_dict()
    return meta


def refuse(
    card: Card, cfg: TrainConfig, spec: ModelSpec | None = None, *, sandbox: str = "require", message: Any = None
) -> None:
    """What no algorithm can train, refused before any model loads (one line each): a card that
    scores by loglikelihood, model-written code where the sandbox cannot isolate it (under
    `sandbox` require) and, given the model's `spec`, an endpoint for a model or a thinking
    budget for a model that does not think. Sets the sandbox's policy, and warns (`message`)
    of a reward whose verdict the model's own code could forge. Cheap to repeat: the CLI calls
    it before it resolves the model (which may unpack one), run_train again with it. Without a
    `spec` (that first pass) a data algorithm's --data rows are read and checked too
    (Algorithm.read_data), so a bad file is refused before any model is prepared."""
    check_staleness(cfg)
    if card.default_scoring == "loglikelihood":  # no sampled answer to reward: nothing to train on
        raise UserError(
            f"{card.name} scores by loglikelihood (its loglikelihood: block says default: true), which "
            f"only evaluates; train on generated answers: set `default: false` in a copy of the card"
        )
    set_policy(sandbox)
    if card_runs_code(card):
        ensure_isolation()  # refuse before loading a model, not at the first reward
    if card_forgeable(card) and message is not None:
        message(
            f"warning: {card.name}'s reward ({card.reward}) decides its verdict inside the model's own "
            "interpreter: code written to cheat can forge a pass there, and RL rewards it for that. Read the "
            "high-reward completions in rewards.jsonl."
        )
    if spec is None:
        read_data = algorithm(cfg.options.algo).read_data
        if read_data is not None:
            read_data(cfg)
        return
    if spec.kind != "hf" or not spec.path_or_id:
        raise UserError(
            "training needs model weights (a profile with a path or hub id, a folder, or a hub id), not an endpoint"
        )
    if cfg.options.max_thinking_tokens is not None:
        thinking.check_budget_before_load(spec, cfg.options.max_thinking_tokens)


def check_staleness(cfg: TrainConfig) -> None:
    """--max-staleness (train.overlap) where it can run: an asynchronous algorithm, 0 to
    MAX_STALENESS steps, rollouts in this process, one stage, no dynamic sampling (its refills
    sample within the step they fill), and a positive importance-weight cap."""
    opts = cfg.options
    n = opts.max_staleness
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise UserError(f"--max-staleness must be a whole number of steps >= 0 (got {n!r}); 0 trains synchronously")
    if n == 0:
        return
    algo = algorithm(opts.algo)
    if not algo.asynchronous:
        able = ", ".join(names(lambda a: a.asynchronous))
        raise UserError(
            f"--max-staleness is for the RL algorithms that sample while they update ({able}); "
            f"--algo {opts.algo} does not sample rollouts step by step: drop --max-staleness"
        )
    if n > MAX_STALENESS:
        raise UserError(
            f"--max-staleness {n}: the rollout queue holds at most {MAX_STALENESS} steps (each one a copy of "
            f"the policy's weights): use {MAX_STALENESS} or less"
        )
    if opts.vllm_server:
        raise UserError("--max-staleness samples on arle's own engines: use --backend hf or vllm, not --vllm-server")
    if cfg.stages:
        raise UserError("--max-staleness trains one stage: drop the recipe's stages: or --max-staleness")
    if cfg.dapo.dynamic_sampling:
        raise UserError("dynamic_sampling refills a step's groups as it trains them: drop it or --max-staleness")
    if not (isinstance(opts.is_cap, (int, float)) and opts.is_cap > 0):
        raise UserError(
            f"is_cap must be > 0 (got {opts.is_cap!r}); to train without the correction set is_correction=false"
        )


def _length(trainer: dict[str, Any]) -> str:
    # rft counts rounds (each: sampling, then up to max_steps SFT steps); the others optimizer steps.
    if "rounds" in trainer:
        return f"{trainer['rounds']} rounds of up to {trainer['max_steps']} SFT steps"
    return f"{trainer['max_steps']} steps"


@dataclass
class TrainData:
    """What every stage of an RL run trains on: the card rollouts play, its tasks, exemplars and
    the prompts TRL logs (row i: task i's)."""

    card: Card
    tasks: list[Any]
    exemplars: Any
    prompts: list[Any]


def train_data(
    card: Card, played: Card, cfg: TrainConfig, split: str | None, eval_split: str | None, view: TrainView
) -> TrainData:
    """The rows `arle eval` scores, for the card's split or a --rows file (the same loader)."""
    opts = cfg.options
    tasks, exemplars = load_tasks(
        card, EvalOptions(split=split, limit=opts.limit, num_fewshot=opts.num_fewshot, data=opts.rows)
    )
    if not tasks:
        raise UserError(
            f"no tasks to train on in {opts.rows or f'{card.name}:{split}'} (check --split, --rows and --limit)"
        )
    prompts = [
        render_prompt(card.prompt, t, exemplars_for(exemplars, t)) for t in tasks
    ]  # what TRL logs; rollouts render their own
    if opts.eval_limit and (split, opts.rows) == (eval_split, heldout_rows(opts)):
        where = f"the rows of {opts.rows}" if opts.rows else f"split '{split}' of {card.name}"
        view.message(
            f"warning: training and held-out evaluation both use {where}; pass "
            f"{'--eval-rows FILE or --eval-split' if opts.rows else '--eval-split or --split'} to keep "
            f"them apart"
        )
    return TrainData(played, tasks, exemplars, prompts)


def check_dynamic_sampling(cfg: TrainConfig, card: Card, ranks: Ranks) -> None:
    """Dynamic sampling refills groups in the process that sampled them: one process, and
    groups of one task's completions (a self-play game's seats have baselines of their own)."""
    if not any(stage.config.dapo.dynamic_sampling for stage in cfg.sessions()):
        return
    if ranks.world > 1:
        raise UserError(
            "dynamic_sampling refills each process's own groups: train in one process "
            "(drop --num-processes) or drop dynamic_sampling"
        )
    if is_multiplayer(card):
        raise UserError(
            f"dynamic_sampling is for groups of one task's completions; {card.name}'s self-play "
            "groups hold two seats with baselines of their own: drop dynamic_sampling"
        )


def _stage_changes(stage: Any) -> str:
    shown = ", ".join(f"{k} {v}" for k, v in stage.settings.items())
    return f" ({shown})" if shown else ""


def train_session(
    algo: Algorithm,
    card: Card,
    cfg: TrainConfig,
    spec: ModelSpec,
    run_dir: Path,
    prepared: Any,
    data: TrainData | None,
    checkpoint: Path | None,
    metrics: MetricsLog,
    view: TrainView,
    ranks: Ranks,
) -> tuple[dict[str, dict[str, Any]], int, HeldOut | None]:
    """Train with one stage's settings up to its max_steps, from `checkpoint` when given; returns
    (every evaluation's results by label, the last step, the held-out evaluations). `data`
    (None for a --data algorithm) is what the rollouts sample."""
    opts = cfg.options
    engine = PolicyBackend(
        opts.backend,
        spec.path_or_id or "",
        batch_size=opts.eval_batch_size,
        vllm_options=vllm_options(opts, cfg.seed),
        think_tags=spec.think_tags,
        chat_template_kwargs=spec.chat_template_kwargs,
    )
    ctx = TrainContext(
        card,
        cfg,
        spec,
        run_dir,
        checkpoint,
        metrics,
        view,
        ranks,
        engine,
        held_out(card, cfg, spec, run_dir, engine, view),
        prepared,
    )
    if data is not None:
        sampling = rollout_sampling(cfg, card)
        ctx.reward = CardReward(
            card,
            data.tasks,
            run_dir if ranks.main else None,
            gather=ranks.gather if ranks.world > 1 else None,
            shaping=cfg.dapo,
            max_tokens=sampling.max_tokens,
        )
        # With --vllm-server the rollouts run on TRL's server; held-out evals stay in this process.
        rollout_engine = (
            PolicyBackend(
                "vllm-server",
                spec.path_or_id or "",
                think_tags=spec.think_tags,
                chat_template_kwargs=spec.chat_template_kwargs,
            )
            if opts.vllm_server
            else engine
        )
        ctx.rollouts = Rollouts(data.card, data.tasks, data.exemplars, sampling, rollout_engine, dapo=cfg.dapo)
        ctx.prompts = data.prompts
    try:
        evals, global_step = algo.run(ctx)
    finally:
        if ctx.rollouts is not None and ctx.rollouts.ahead is not None:
            ctx.rollouts.ahead.close()
            ctx.rollouts.ahead = None
        engine.close()
        if ctx.reward is not None:
            ctx.reward.close()
    return evals, global_step, ctx.heldout


def open_run(
    run_dir: Path,
    meta: dict[str, Any],
    resume: bool,
    view: TrainView,
    ranks: Ranks,
    *,
    compare: tuple[str, ...] = COMPARED,
) -> tuple[Path | None, int]:
    """Start (or resume) a training run in `run_dir` for every algorithm: meta.json written by
    the main process (a resume whose settings differ, beyond RESUMABLE, is refused). Returns the
    checkpoint to resume from and its step."""
    checkpoint = rundir.latest_checkpoint(run_dir) if resume else None
    start_step = rundir.checkpoint_step(checkpoint) if checkpoint else 0
    record_start(run_dir, meta, resume, ranks, compare)
    if resume:
        view.message(
            f"resuming from {checkpoint.name}" if checkpoint else "resuming: no checkpoint yet, starting from step 0"
        )
    return checkpoint, start_step


def record_start(run_dir: Path, meta: dict[str, Any], resume: bool, ranks: Ranks, compare: tuple[str, ...]) -> None:
    """meta.json written by the main process: a new run's, or a resume's checked against it."""
    if ranks.world > 1:
        meta["num_processes"] = ranks.world
    ranks.on_main(lambda: rundir.prepare(run_dir, meta, resume, compare=compare, may_change=RESUMABLE))


def held_out(
    card: Card, cfg: TrainConfig, spec: ModelSpec, run_dir: Path, engine: PolicyBackend, view: TrainView
) -> HeldOut | None:
    """The run's held-out evaluations on `engine` (None with --eval-limit 0): greedy, on the
    eval split, as `arle eval` would score the weights."""
    opts = cfg.options
    if not opts.eval_limit:
        return None
    eval_opts = EvalOptions(
        split=opts.eval_split or card.source.default_split,
        limit=opts.eval_limit,
        data=heldout_rows(opts),
        temperature=0.0,
        max_tokens=opts.eval_max_tokens,
        num_fewshot=opts.num_fewshot,
        max_thinking_tokens=opts.max_thinking_tokens,
        seed=cfg.seed,
    )
    return HeldOut(card, eval_opts, run_dir, spec.name, engine, view.eval_start, view.eval_sample, view.eval_done)


def heldout_rows(opts: Any) -> str | None:
    """The file of rows the held-out evaluations score: --eval-rows, else with --rows and no
    --eval-split the same file (the card's source may be out of reach: a hub dataset offline),
    else None (the card's eval split)."""
    return opts.eval_rows or (opts.rows if opts.rows and not opts.eval_split else None)


def write_summary(
    card: Card,
    spec: ModelSpec,
    algo: str,
    global_step: int,
    run_dir: Path,
    evals: dict[str, dict[str, Any]],
    heldout: HeldOut | None,
    seconds: float,
    ranks: Ranks,
) -> dict[str, Any]:
    """summary.json (written by the main process) and its content: before/after held-out
    accuracy, steps, where the final model is."""
    labels = sorted(evals, key=lambda s: int(s.split("-")[1]))
    summary = {
        "benchmark": card.name,
        "model": spec.name,
        "algo": algo,
        "global_step": global_step,
        "final_model": str(RunDir(run_dir).final),
        "train_seconds_this_session": round(seconds, 1),
        "before": {"label": labels[0], "accuracy": accuracy(evals[labels[0]])} if labels else None,
        "after": {"label": labels[-1], "accuracy": accuracy(evals[labels[-1]])} if len(labels) > 1 else None,
        "evals": {label: {"accuracy": accuracy(evals[label]), "dir": str(heldout.dir_for(label))} for label in labels}
        if heldout
        else {},
    }
    if ranks.main:
        write_json(RunDir(run_dir).summary, summary)
        write_model_card(run_dir, spec, summary)  # over TRL's, which names a local base model None
    return summary


def rollout_card(card: Card, cfg: TrainConfig, ranks: Ranks) -> Card:
    """The card rollouts play: for a two-player game, with the other seat played by
    `--opponent` (default self: self-play, each seat trained with its own outcome)."""
    opponent = cfg.options.opponent
    if not is_multiplayer(card):
        return card if opponent is None else with_opponent(card, opponent)  # refused: not a game for two
    opponent = opponent or SELF
    if opponent not in (*BUILTIN_OPPONENTS, SELF):
        raise UserError(
            f"--opponent {opponent}: training plays {SELF}, {' or '.join(BUILTIN_OPPONENTS)} "
            "(a model opponent plays in `arle eval --opponent`)"
        )
    if opponent == SELF and ranks.world > 1:
        raise UserError(
            "self-play training runs in one process (each seat's advantages are computed over "
            "the whole batch): drop --num-processes"
        )
    return with_opponent(card, opponent)


def rollout_sampling(cfg: TrainConfig, card: Card) -> Sampling:
    """How rollouts sample: the trainer's temperature, top_p, per-turn budget and seed (the
    fields `arle eval` takes as --temperature, --top-p, --max-tokens, --seed)."""
    t = cfg.trainer
    return Sampling(
        temperature=float(t.get("temperature", 1.0)),
        top_p=float(t.get("top_p", 1.0)),
        max_tokens=t.get("max_completion_length") or card.prompt.max_tokens,
        seed=cfg.seed,
        logprobs=True,
        max_thinking_tokens=cfg.options.max_thinking_tokens,
    )


def vllm_options(opts: Any, seed: int) -> dict[str, Any]:
    """The colocated vLLM engine's settings (a share of the GPU: the policy and its optimizer
    state live there too)."""
    out: dict[str, Any] = {
        "gpu_memory_utilization": opts.vllm_gpu_memory_utilization,
        "max_model_len": opts.vllm_max_model_len,
        "seed": seed,
    }
    for key in ("quantization", "kv_cache_dtype"):
        if getattr(opts, key, None):
            out[key] = getattr(opts, key)
    return out
