"""PPO on a card: arle's rollouts, the card's reward and held-out evals around `ppo.train_ppo`.

`train_ppo` is plain PyTorch over callables; this is where a run's pieces meet it: the
rollouts (train.rollout.Rollouts, the eval's episode producer), the reward adapter (whose
verdicts go to rewards.jsonl), metrics.jsonl and reporters, and held-out evaluations before the
first step, every --eval-every steps and after the last, on the rollout engine.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from arlecli.cards import Card
from arlecli.errors import UserError
from arlecli.train.config import TrainConfig
from arlecli.train.heldout import HeldOut
from arlecli.train.metrics import MetricsLog, open_reporter
from arlecli.train.ppo import parse_params, train_ppo
from arlecli.train.reward import CardReward
from arlecli.train.rollout import Rollouts


def ppo_params(cfg: TrainConfig) -> dict[str, Any]:
    """What goes to train_ppo's `params`: the trainer keys it does not take as arguments
    (checked now, so a bad setting fails before the run directory exists)."""
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


def run_ppo(card: Card, cfg: TrainConfig, spec: Any, num_tasks: int, rollouts: Rollouts, reward: CardReward,
            run_dir: Path, checkpoint: Path | None, metrics: MetricsLog, heldout: HeldOut | None,
            view: Any) -> tuple[dict[str, dict[str, Any]], int]:
    """Train with PPO on the card's rollouts and reward, held-out evals on the rollout engine;
    returns (every evaluation's results by label, the last step)."""
    from arlecli.train.run import FINAL

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
    params = ppo_params(cfg)
    try:
        final = train_ppo(
            spec.path_or_id or "", num_tasks, rollout, reward.score, output_dir=run_dir, max_steps=max_steps,
            learning_rate=t.get("learning_rate", 1e-5 if opts.lora_rank > 0 else 1e-6), lora_rank=opts.lora_rank,
            num_generations=t.get("num_generations", 1), temperature=rollouts.sampling.temperature, seed=t["seed"],
            save_steps=t["save_steps"], resume=checkpoint is not None, params=params, on_log=on_log,
            save_total_limit=t.get("save_total_limit"), on_step_end=on_step_end,
            no_loss=rollouts.no_loss if rollouts.dapo.overlong_filter else None)
    except ValueError as exc:  # train_ppo's checks on params and arguments
        raise UserError(f"invalid ppo settings: {exc}") from None
    finally:
        if reporter is not None:
            reporter.close()
    if Path(final).resolve() != (run_dir / FINAL).resolve():
        shutil.copytree(final, run_dir / FINAL, dirs_exist_ok=True)
    if heldout is not None:
        evals = {**heldout.finished(), **evals}  # evaluations from before a resume
        if f"step-{max_steps}" not in evals:  # resumed after the last step: nothing trained this session
            evals[f"step-{max_steps}"] = heldout.evaluate_saved(f"step-{max_steps}", str(run_dir / FINAL))
    return evals, max_steps


# Trainer keys `train_ppo` takes as arguments; everything else goes in `params`.
# max_completion_length and temperature reach PPO through the rollouts' sampling.
_PPO_ARGS = {"max_steps", "learning_rate", "num_generations", "max_completion_length", "temperature", "seed",
             "save_steps", "report_to", "logging_steps", "save_total_limit"}
