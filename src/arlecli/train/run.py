"""A training run from start to finish: run directory, data, reward, trainer, evaluations.

    <run>/meta.json          command, versions, card hash, model, algo, every setting
    <run>/metrics.jsonl      one line per logged step (reward, accuracy, kl, loss, throughput)
    <run>/rewards.jsonl      one line per scored completion (the same verdicts the eval writes)
    <run>/checkpoint-N/      the trainer's checkpoints (weights or adapter, optimizer, RNG, data position)
    <run>/eval/step-N/       held-out evaluations: ordinary eval run directories
    <run>/final/             the trained model (full weights, or the LoRA adapter) + tokenizer
    <run>/summary.json       before/after accuracy, steps, time

`--resume` continues from the newest checkpoint: steps after it are dropped from
metrics.jsonl and rewards.jsonl (they run again), finished evaluations are kept.

Under `accelerate launch` (see launch.py) every rank runs this same function. Only the main
process writes meta.json, metrics.jsonl, summary.json and the held-out evaluations; rewards.jsonl
is written by the main process too, from every rank's verdicts gathered at each reward call (one
line per completion, in rank order); the trainer saves checkpoints and final/ as it does for any
accelerate run. The other ranks wait at a barrier while the main process evaluates.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from arlecli import rundir
from arlecli.cards import Card
from arlecli.data.sources import split_names
from arlecli.envs import single_turn
from arlecli.envs.episodes import Sampling
from arlecli.errors import UserError
from arlecli.eval import EvalOptions, load_tasks
from arlecli.models import ModelSpec
from arlecli.results import read_json, write_json
from arlecli.train.config import TrainConfig
from arlecli.train.heldout import HeldOut, accuracy
from arlecli.train.launch import in_launched_process
from arlecli.train.metrics import MetricsLog, open_reporter
from arlecli.train.reward import CardReward, truncate_rewards
from arlecli.train.rollout import PolicyEngine, Rollouts

SUMMARY = "summary.json"
FINAL = "final"
# Settings a resumed run may change: they do not alter what the steps already taken mean.
RESUMABLE = {"max_steps", "save_steps", "save_total_limit", "eval_every", "report_to", "logging_steps"}
# What a resume must keep (options and trainer field by field, all but RESUMABLE).
COMPARED = ("benchmark", "card_hash", "model", "algo", "train_split", "eval_split", "options", "trainer")


@dataclass
class TrainView:
    """Where progress goes (the CLI's live view); every hook is optional."""

    log: Callable[[dict[str, Any]], None] | None = None               # one logged step
    eval_start: Callable[[str, int, int], None] | None = None         # (label, total, done)
    eval_sample: Callable[[dict[str, Any]], None] | None = None
    eval_done: Callable[[str, dict[str, Any]], None] | None = None
    message: Callable[[str], None] = field(default=lambda text: print(text, file=sys.stderr, flush=True))


@dataclass
class Ranks:
    """This process among the training processes: one (the default), or a rank under accelerate."""

    main: bool = True
    world: int = 1

    @classmethod
    def current(cls) -> "Ranks":
        if not in_launched_process():
            return cls()
        from accelerate import PartialState  # set up already by the trainer's config (same settings)

        state = PartialState()
        return cls(main=state.is_main_process, world=state.num_processes)

    def barrier(self) -> None:
        if self.world > 1:
            from accelerate import PartialState

            PartialState().wait_for_everyone()

    def gather(self, items: list[Any]) -> list[Any]:
        """Every rank's `items`, concatenated in rank order, on every rank."""
        if self.world == 1:
            return items
        from accelerate.utils import gather_object

        return gather_object(items)

    def on_main(self, fn: Callable[[], Any]) -> None:
        """Run `fn` on the main process only; the others wait, and fail too if it fails."""
        if self.world == 1:
            fn()
            return
        from accelerate.utils import broadcast_object_list

        error: list[Any] = [None]
        failure: BaseException | None = None
        if self.main:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001  (re-raised below, after the others know)
                failure, error[0] = exc, str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        broadcast_object_list(error, from_process=0)
        if failure is not None:
            raise failure
        if error[0] is not None:
            raise UserError(error[0])


def sharded() -> bool:
    """Whether the weights are split over the ranks (ZeRO-3, FSDP): then no rank can generate alone."""
    env = os.environ
    on = lambda name: env.get(name, "").lower() in ("1", "true", "yes")  # noqa: E731
    return on("ACCELERATE_USE_FSDP") or (on("ACCELERATE_USE_DEEPSPEED")
                                         and env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3")


def train_split(card: Card, requested: str | None) -> str:
    """The split to train on: the one asked for, else "train" if the card has it, else its default."""
    if requested:
        return requested
    return "train" if "train" in split_names(card) else card.source.default_split


def run_train(card: Card, cfg: TrainConfig, spec: ModelSpec, run_dir: Path, *, resume: bool = False,
              command: list[str] | None = None, view: TrainView | None = None) -> dict[str, Any]:
    """Train `spec`'s model on `card` with cfg's algorithm; return (and write) summary.json's content."""
    view = view or TrainView()
    opts = cfg.options
    if spec.kind != "hf" or not spec.path_or_id:
        raise UserError("training needs model weights (a profile with a path or hub id, a folder, or a hub id), "
                        "not an endpoint")
    split = train_split(card, opts.split)
    eval_split = opts.eval_split or card.source.default_split
    meta = {
        "command": command or sys.argv, "kind": "train", "benchmark": card.name, "card_version": card.version,
        "card_hash": card.hash, "card_path": str(card.path), "model": spec.name, "model_path": spec.path_or_id,
        "algo": opts.algo, "train_split": split, "eval_split": eval_split, "recipe": cfg.recipe,
        "options": asdict(opts), "trainer": cfg.trainer, "versions": rundir.versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    # Settings errors surface before the run directory exists, so a fixed rerun needs no new --output.
    if opts.algo == "ppo":
        trainer_args = None
        _ppo_params(cfg)
    else:
        from arlecli.train.grpo import trainer_args as make_args

        trainer_args = make_args(cfg, run_dir, card.prompt.max_tokens)
        # Every field the trainer ran with, defaults included (resume compares only "trainer").
        meta["trainer_resolved"] = trainer_args.to_dict()
    # After trainer_args: its config set up the processes' shared state. PPO runs in one process.
    ranks = Ranks.current() if opts.algo != "ppo" else Ranks()
    if ranks.world > 1:
        meta["num_processes"] = ranks.world
    if not ranks.main:
        view = TrainView(message=lambda text: None)  # the main process reports for the run
    checkpoint = rundir.latest_checkpoint(run_dir) if resume else None
    start_step = rundir.checkpoint_step(checkpoint) if checkpoint else 0
    ranks.on_main(lambda: rundir.prepare(run_dir, meta, resume, compare=COMPARED, may_change=RESUMABLE))

    tasks, exemplars = load_tasks(card, EvalOptions(split=split, limit=opts.limit, num_fewshot=opts.num_fewshot))
    if not tasks:
        raise UserError(f"no tasks to train on in {card.name}:{split} (check --split and --limit)")
    prompts = [single_turn.reset(card.prompt, t, exemplars) for t in tasks]  # what TRL logs; rollouts render their own
    if split == eval_split and opts.eval_limit:
        view.message(f"warning: training and held-out evaluation both use split '{split}' of {card.name}; "
                     f"pass --eval-split or --split to keep them apart")

    if resume:
        view.message(f"resuming from {checkpoint.name}" if checkpoint else "resuming: no checkpoint yet, "
                     "starting from step 0")
    if ranks.main:
        truncate_rewards(run_dir, start_step)
    metrics = MetricsLog(run_dir, start_step, truncate=ranks.main)
    ranks.barrier()
    reward = CardReward(card, tasks, run_dir if ranks.main else None,
                        gather=ranks.gather if ranks.world > 1 else None)
    engine = PolicyEngine(opts.backend, spec.path_or_id or "", batch_size=opts.eval_batch_size,
                          vllm_options=vllm_options(opts, int(cfg.trainer.get("seed", 1234))))
    # With --vllm-server the rollouts run on TRL's server; held-out evals stay in this process.
    rollout_engine = PolicyEngine("vllm-server", spec.path_or_id or "") if opts.vllm_server else engine
    rollouts = Rollouts(card, tasks, exemplars, rollout_sampling(cfg, card), rollout_engine)
    heldout = None
    if opts.eval_limit:
        eval_opts = EvalOptions(split=eval_split, limit=opts.eval_limit, temperature=0.0,
                                max_tokens=opts.eval_max_tokens, num_fewshot=opts.num_fewshot,
                                seed=int(cfg.trainer.get("seed", 1234)))
        heldout = HeldOut(card, eval_opts, run_dir, spec.name, engine, view.eval_start, view.eval_sample,
                          view.eval_done)

    started = time.monotonic()
    try:
        if opts.algo == "ppo":
            evals, global_step = _run_ppo(card, cfg, spec, len(tasks), rollouts, reward, run_dir, checkpoint,
                                          metrics, heldout, view)
        else:
            evals, global_step = _run_trl(cfg, trainer_args, spec, prompts, rollouts, reward, run_dir, checkpoint,
                                          metrics, heldout, view, ranks)
    finally:
        engine.close()

    labels = sorted(evals, key=lambda s: int(s.split("-")[1]))
    summary = {
        "benchmark": card.name, "model": spec.name, "algo": opts.algo, "global_step": global_step,
        "final_model": str(run_dir / FINAL), "train_seconds_this_session": round(time.monotonic() - started, 1),
        "before": {"label": labels[0], "accuracy": accuracy(evals[labels[0]])} if labels else None,
        "after": {"label": labels[-1], "accuracy": accuracy(evals[labels[-1]])} if len(labels) > 1 else None,
        "evals": {label: {"accuracy": accuracy(evals[label]), "dir": str(heldout.dir_for(label))}
                  for label in labels} if heldout else {},
    }
    if ranks.main:
        write_json(run_dir / SUMMARY, summary)
    return summary


def rollout_sampling(cfg: TrainConfig, card: Card) -> Sampling:
    """How rollouts sample: the trainer's temperature, top_p, per-turn budget and seed (the
    fields `arle eval` takes as --temperature, --top-p, --max-tokens, --seed)."""
    t = cfg.trainer
    return Sampling(temperature=float(t.get("temperature", 1.0)), top_p=float(t.get("top_p", 1.0)),
                    max_tokens=t.get("max_completion_length") or card.prompt.max_tokens,
                    seed=int(t.get("seed", 1234)), logprobs=True)


def vllm_options(opts: Any, seed: int) -> dict[str, Any]:
    """The colocated vLLM engine's settings (a share of the GPU: the policy and its optimizer
    state live there too)."""
    out: dict[str, Any] = {"gpu_memory_utilization": opts.vllm_gpu_memory_utilization,
                           "max_model_len": opts.vllm_max_model_len, "seed": seed}
    for key in ("quantization", "kv_cache_dtype"):
        if getattr(opts, key, None):
            out[key] = getattr(opts, key)
    return out


def _run_trl(cfg: TrainConfig, args: Any, spec: ModelSpec, prompts: list[Any], rollouts: Rollouts,
             reward: CardReward, run_dir: Path, checkpoint: Path | None, metrics: MetricsLog,
             heldout: HeldOut | None, view: TrainView,
             ranks: Ranks | None = None) -> tuple[dict[str, dict[str, Any]], int]:
    from arlecli.train.grpo import build_trainer, load_model, make_callback

    ranks = ranks or Ranks()
    # With the weights split over the ranks (ZeRO-3, FSDP) the main process cannot generate
    # alone: it evaluates the saved weights instead (before: the start model, after: final/).
    from_disk = ranks.world > 1 and sharded()
    every = cfg.options.eval_every
    if from_disk and every and heldout is not None:
        view.message("warning: --eval-every is not supported with ZeRO-3/FSDP; evaluating before and after only")
        every = 0
    callbacks = [make_callback(metrics, view.log, heldout, every)]
    if ranks.world > 1 and heldout is not None and every:
        callbacks.append(_barrier_callback(ranks, every))  # runs after the main process's evaluation
    trainer = build_trainer(cfg, args, load_model(spec.path_or_id or "", spec.is_adapter), prompts, reward,
                            rollouts, callbacks)
    evals: dict[str, dict[str, Any]] = {}

    def evaluate(label: str, path: str) -> None:
        if from_disk:
            evals[label] = heldout.evaluate_saved(label, path)
        else:
            evals[label] = heldout.evaluate(trainer.model, trainer.processing_class, label, trainer.state.global_step)

    if heldout is not None:
        if ranks.main:
            evaluate("step-0", spec.path_or_id or "")
        ranks.barrier()
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    step = trainer.state.global_step
    # Every rank takes part (ZeRO-3/FSDP gather the weights); the trainer writes on the main one.
    trainer.save_model(str(run_dir / FINAL))  # adapter only for LoRA; `arle eval` merges it on load
    if heldout is not None:
        if ranks.main:
            for label in _existing_labels(heldout):
                evals.setdefault(label, read_json(heldout.dir_for(label) / "results.json"))
            if f"step-{step}" not in evals:
                evaluate(f"step-{step}", str(run_dir / FINAL))
        ranks.barrier()
    return evals, step


def _barrier_callback(ranks: Ranks, every: int) -> Any:
    """The other ranks wait while the main process runs an every-N held-out evaluation."""
    from transformers import TrainerCallback

    class Barrier(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % every == 0 and state.global_step < state.max_steps:
                ranks.barrier()

    return Barrier()


def _existing_labels(heldout: HeldOut) -> list[str]:
    # Evaluations finished before a resume (or by the every-N callback) count in the summary.
    root = heldout.run_dir / "eval"
    return sorted(p.name for p in root.glob("step-*") if (p / "results.json").exists()) if root.exists() else []


def _import_train_ppo() -> Any:
    try:
        from arlecli.train.ppo import train_ppo
    except ModuleNotFoundError as exc:
        if exc.name != "arlecli.train.ppo":
            raise
        raise UserError("--algo ppo is not available in this build yet; use --algo grpo or --algo rloo") from None
    return train_ppo


def _ppo_params(cfg: TrainConfig) -> dict[str, Any]:
    """What goes to train_ppo's `params`: the trainer keys it does not take as arguments."""
    _import_train_ppo()
    opts = cfg.options
    params = {k: v for k, v in cfg.trainer.items() if k not in _PPO_ARGS}
    if opts.lora_alpha is not None:
        params["lora_alpha"] = opts.lora_alpha
    if opts.lora_target_modules != "all-linear":
        params["lora_target_modules"] = opts.lora_target_modules
    from arlecli.train import ppo

    check = getattr(ppo, "parse_params", None)
    if check is not None:
        try:
            check(params)
        except ValueError as exc:
            raise UserError(f"invalid ppo settings: {exc}") from None
    return params


def _run_ppo(card: Card, cfg: TrainConfig, spec: ModelSpec, num_tasks: int, rollouts: Rollouts,
             reward: CardReward, run_dir: Path, checkpoint: Path | None, metrics: MetricsLog,
             heldout: HeldOut | None, view: TrainView) -> tuple[dict[str, dict[str, Any]], int]:
    train_ppo = _import_train_ppo()
    if spec.is_adapter:
        raise UserError("--algo ppo trains from full weights: pass the base model, not a LoRA adapter folder")
    opts, t = cfg.options, dict(cfg.trainer)
    max_steps = t["max_steps"]
    evals: dict[str, dict[str, Any]] = {}
    reporter = open_reporter(t.get("report_to"), run_dir, {"benchmark": card.name, "algo": "ppo", **t})

    def on_log(logs: dict[str, Any]) -> None:
        step = int(logs.get("step", 0))
        reward.step = step + 1  # completions scored from now on belong to the next step
        acc = reward.pop_accuracy()
        row = metrics.record(step, {"accuracy": acc, **{k: v for k, v in logs.items() if k != "step"}})
        if reporter is not None:
            reporter.log(step, row)
        if view.log:
            view.log({**row, "max_steps": max_steps})

    def on_step_end(step: int, policy: Any) -> None:
        # Before the first step (step 0), every N steps, and after the last, on the rollout engine.
        every = opts.eval_every
        due = step in (0, max_steps) or (every and step % every == 0)
        if heldout is None or not due:
            return
        started = time.monotonic()
        evals[f"step-{step}"] = heldout.evaluate(policy.model, policy.tokenizer, f"step-{step}", step)
        metrics.exclude(time.monotonic() - started)

    def rollout(policy: Any, indices: list[int], step: int) -> list[Any]:
        return rollouts.episodes(indices, step, policy.model, policy.tokenizer)

    reward.step = 1
    metrics.restart_clock()
    params = _ppo_params(cfg)
    try:
        final = train_ppo(
            spec.path_or_id or "", num_tasks, rollout, reward.score, output_dir=run_dir, max_steps=max_steps,
            learning_rate=t.get("learning_rate", 1e-5 if opts.lora_rank > 0 else 1e-6), lora_rank=opts.lora_rank,
            num_generations=t.get("num_generations", 1), temperature=rollouts.sampling.temperature, seed=t["seed"],
            save_steps=t["save_steps"], resume=checkpoint is not None, params=params, on_log=on_log,
            save_total_limit=t.get("save_total_limit"), on_step_end=on_step_end)
    except ValueError as exc:  # train_ppo's checks on params and arguments
        raise UserError(f"invalid ppo settings: {exc}") from None
    finally:
        if reporter is not None:
            reporter.close()
    if Path(final).resolve() != (run_dir / FINAL).resolve():
        shutil.copytree(final, run_dir / FINAL, dirs_exist_ok=True)
    if heldout is not None:
        for label in _existing_labels(heldout):  # evaluations from before a resume
            evals.setdefault(label, read_json(heldout.dir_for(label) / "results.json"))
        if f"step-{max_steps}" not in evals:  # resumed after the last step: nothing trained this session
            evals[f"step-{max_steps}"] = heldout.evaluate_saved(f"step-{max_steps}", str(run_dir / FINAL))
    return evals, max_steps


# Trainer keys `train_ppo` takes as arguments; everything else goes in `params`.
# max_completion_length and temperature reach PPO through the rollouts' sampling.
_PPO_ARGS = {"max_steps", "learning_rate", "num_generations", "max_completion_length", "temperature", "seed",
             "save_steps", "report_to", "logging_steps", "save_total_limit"}
