"""PPO on a card: arle's rollouts, the card's reward and held-out evals around `ppo.train_ppo`.

`train_ppo` is plain PyTorch over callables; this is where a run's pieces meet it: the
rollouts (train.batches.Rollouts, the eval's episode producer), the reward adapter (whose
verdicts go to rewards.jsonl), metrics.jsonl and reporters, and held-out evaluations before the
first step, every --eval-every steps and after the last, on the rollout engine. It registers
the algorithm ppo: its settings are `ppo.PPOParams` and `PPOArgs`.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from arlecli.cards import Card
from arlecli.errors import UserError
from arlecli.rundir import checkpoint_step
from arlecli.train.algorithm import TrainContext, register_algorithm
from arlecli.train.config import TRAINER_DEFAULTS, TrainConfig
from arlecli.train.metrics import open_reporter


@dataclass
class PPOArgs:
    """The settings `train_ppo` takes as arguments (beside `ppo.PPOParams`, its `params`); the
    defaults are the run's (train.config.TRAINER_DEFAULTS) where arle sets one."""

    max_steps: int = TRAINER_DEFAULTS["max_steps"]  # optimizer steps
    learning_rate: float | None = None  # None: 1e-6 for a full fine-tune, 1e-5 for LoRA
    num_generations: int = 1  # completions per prompt
    max_completion_length: int | None = None  # tokens per model turn (None: the card's max_tokens)
    temperature: float = 1.0  # rollout sampling temperature
    seed: int = TRAINER_DEFAULTS["seed"]
    save_steps: int = TRAINER_DEFAULTS["save_steps"]  # checkpoint every N steps
    save_total_limit: int | None = TRAINER_DEFAULTS["save_total_limit"]  # checkpoints kept (the newest)
    report_to: str = TRAINER_DEFAULTS["report_to"]  # none, tensorboard, trackio or wandb


def ppo_settings() -> Sequence[type]:
    """PPO's settings: PPOParams and PPOArgs."""
    from arlecli.train.ppo import PPOParams  # torch: imported only once a run is being set up

    return (PPOParams, PPOArgs)


def ppo_params(cfg: TrainConfig) -> dict[str, Any]:
    """What goes to train_ppo's `params`: the trainer keys it does not take as arguments
    (checked now, so a bad setting fails before the run directory exists)."""
    from arlecli.train.ppo import parse_params  # torch: imported only once a run is being set up

    opts = cfg.options
    params = {k: v for k, v in cfg.trainer.items() if k not in _PPO_ARGS}
    if opts.lora_alpha is not None:
        params["lora_alpha"] = opts.lora_alpha
    if opts.lora_target_modules != "all-linear":
        params["lora_target_modules"] = opts.lora_target_modules
    try:
        parse_params(params)
    except ValueError as exc:
        raise UserError(f"invalid ppo settings: {exc}") from None
    return params


def validate_ppo(cfg: TrainConfig) -> None:
    """PPO's rollouts run in this process: no TRL server."""
    if cfg.options.vllm_server:
        raise UserError(
            "--vllm-server is TRL's server mode, for --algo grpo and rloo; PPO's rollouts run "
            "in-process: use --backend vllm"
        )


def check_ppo(cfg: TrainConfig, card: Card, run_dir: Path) -> None:
    """PPO's params, checked before the run directory exists."""
    ppo_params(cfg)


@register_algorithm(
    "ppo", settings=ppo_settings, validate=validate_ppo, check=check_ppo, overlong_filter=True, asynchronous=True
)
def run_ppo(ctx: TrainContext) -> tuple[dict[str, dict[str, Any]], int]:
    """Train with PPO on the card's rollouts and reward, held-out evals on the rollout engine;
    returns (every evaluation's results by label, the last step)."""
    # torch: imported only once a run is being set up
    from arlecli.train.overlap import Ahead
    from arlecli.train.ppo import parse_params, step_indices, train_ppo

    card, cfg, spec, run_dir, metrics, heldout, view = (
        ctx.card,
        ctx.cfg,
        ctx.spec,
        ctx.run_dir,
        ctx.metrics,
        ctx.heldout,
        ctx.view,
    )
    assert ctx.rollouts is not None and ctx.reward is not None
    rollouts, reward = ctx.rollouts, ctx.reward
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
        logged = {k: v for k, v in logs.items() if k != "step"}
        if rollouts.ahead is not None:  # staleness and idle shares of the step
            logged.update(rollouts.ahead.metrics())
        row = metrics.record(step, {"accuracy": acc, **logged})
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

    # Completions are scored for the step after the last one done (a resumed run's too).
    reward.step = (checkpoint_step(ctx.checkpoint) if ctx.checkpoint is not None else 0) + 1
    metrics.restart_clock()
    params = ppo_params(cfg)
    ahead = None
    if opts.max_staleness:  # rollouts sampled ahead (train.overlap), PPO's task order foreseen
        per_step, group, tasks = parse_params(params).prompts_per_step, t.get("num_generations", 1), len(rollouts.tasks)
        ahead = Ahead(rollouts, opts.max_staleness, lambda k: step_indices(k, tasks, per_step, group), max_steps)
        rollouts.ahead = ahead
        ahead.restore(ctx.checkpoint)
    try:
        final = train_ppo(
            spec.path_or_id or "",
            len(rollouts.tasks),
            rollout,
            reward.score,
            output_dir=run_dir,
            max_steps=max_steps,
            learning_rate=_learning_rate(t, opts.lora_rank),
            lora_rank=opts.lora_rank,
            num_generations=t.get("num_generations", 1),
            temperature=rollouts.sampling.temperature,
            seed=t["seed"],
            save_steps=t["save_steps"],
            resume=ctx.checkpoint is not None,
            params=params,
            on_log=on_log,
            save_total_limit=t.get("save_total_limit"),
            on_step_end=on_step_end,
            no_loss=rollouts.no_loss if rollouts.dapo.overlong_filter else None,
            is_cap=opts.is_cap if ahead is not None and opts.is_correction else None,
            on_save=ahead.save if ahead is not None else None,
        )
    except ValueError as exc:  # train_ppo's checks on params and arguments
        raise UserError(f"invalid ppo settings: {exc}") from None
    finally:
        if reporter is not None:
            reporter.close()
    if Path(final).resolve() != ctx.final.resolve():
        shutil.copytree(final, ctx.final, dirs_exist_ok=True)
    if heldout is not None:
        evals = {**heldout.finished(), **evals}  # evaluations from before a resume
        if f"step-{max_steps}" not in evals:  # resumed after the last step: nothing trained this session
            evals[f"step-{max_steps}"] = heldout.evaluate_saved(f"step-{max_steps}", str(ctx.final))
    return evals, max_steps


def _learning_rate(trainer: dict[str, Any], lora_rank: int) -> float:
    # None (PPOArgs' default, or `learning_rate: null` in a recipe): the default for the run's kind.
    lr = trainer.get("learning_rate")
    return float(lr) if lr is not None else (1e-5 if lora_rank > 0 else 1e-6)


# Trainer keys `train_ppo` takes as arguments; everything else goes in `params`.
# max_completion_length and temperature reach PPO through the rollouts' sampling.
_PPO_ARGS = {
    "max_steps",
    "learning_rate",
    "num_generations",
    "max_completion_length",
    "temperature",
    "seed",
    "save_steps",
    "report_to",
    "logging_steps",
    "save_total_limit",
}
