"""DPO on preference pairs through TRL 1.16's DPOTrainer.

A pair (what `arle data from-eval --pairs` writes) is TRL's conversational preference row:
`prompt` (the messages before the first assistant turn), `chosen` and `rejected` (the
assistant's turns, with the environment's messages between them in a multi-turn episode) and,
for native tools, `tools`. Each side is tokenised as an SFT row is (`sft.tokenize_conversation`
over prompt + side), so the loss covers exactly the assistant's own tokens: TRL's own
tokenisation would count a multi-turn side's tool results as completion. The trainer gets the
ids (`prompt_ids`, `chosen_ids`, `rejected_ids`) with per-token masks (`chosen_mask`,
`rejected_mask`), which `MaskedPreferenceCollator` turns into DPO's `completion_mask`.

A plain-text pair (a completion-format card's, `{"prompt": str, "chosen": str, "rejected": str}`)
is tokenised as TRL does: the prompt as the engine encodes it, each side after it with EOS
appended (`sft.tokenize_text`).

The reference model is TRL's: under LoRA the policy with its adapter disabled, for a full
fine-tune a frozen copy of the starting weights.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterable

from arlecli.errors import UserError
from arlecli.train.config import TrainConfig
from arlecli.train.trl_glue import import_trl
from arlecli.train.sft import _peft_config, tokenize_conversation, tokenize_text


def tokenize_pair(
    tokenizer: Any, row: dict[str, Any], template_kwargs: dict[str, Any] | None = None
) -> dict[str, list[int]] | None:
    """A preference row's ids and loss masks, or None when a side has no trained token (the
    template rewrote history before its first assistant turn)."""
    if isinstance(row["prompt"], str):  # plain text, as TRL: prompt as the engine encodes it, each side + EOS
        chosen, chosen_mask = tokenize_text(tokenizer, row["prompt"], row["chosen"])
        rejected, rejected_mask = tokenize_text(tokenizer, row["prompt"], row["rejected"])
        n = chosen_mask.index(1)
        return {
            "prompt_ids": chosen[:n],
            "chosen_ids": chosen[n:],
            "chosen_mask": chosen_mask[n:],
            "rejected_ids": rejected[n:],
            "rejected_mask": rejected_mask[n:],
        }
    tools = row.get("tools") or None
    chosen, chosen_mask = tokenize_conversation(tokenizer, [*row["prompt"], *row["chosen"]], tools, template_kwargs)
    rejected, rejected_mask = tokenize_conversation(
        tokenizer, [*row["prompt"], *row["rejected"]], tools, template_kwargs
    )
    if 1 not in chosen_mask or 1 not in rejected_mask:
        return None
    # The prompt is everything before the first trained token; both sides render it alike.
    n = min(chosen_mask.index(1), rejected_mask.index(1))
    while n and chosen[:n] != rejected[:n]:
        n -= 1
    return {
        "prompt_ids": chosen[:n],
        "chosen_ids": chosen[n:],
        "chosen_mask": chosen_mask[n:],
        "rejected_ids": rejected[n:],
        "rejected_mask": rejected_mask[n:],
    }


def dpo_dataset(
    tokenizer: Any,
    rows: Iterable[dict[str, Any]],
    max_length: int | None,
    template_kwargs: dict[str, Any] | None = None,
) -> Any:
    """A pre-tokenised `datasets.Dataset` of preference rows. As TRL does, a pair whose prompt
    alone fills `max_length` is left out (truncation would leave it no completion)."""
    from datasets import Dataset

    out = [
        pair
        for row in rows
        if (pair := tokenize_pair(tokenizer, row, template_kwargs)) is not None
        and (max_length is None or len(pair["prompt_ids"]) < max_length)
    ]
    if not out:
        raise UserError(
            "no preference pair has an assistant turn on both sides within max_length; "
            "nothing to train on (raise --set max_length=...)"
        )
    return Dataset.from_list(out)


def _collator_class() -> type:
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    @dataclass
    class MaskedPreferenceCollator(DataCollatorForPreference):
        """TRL's preference collator, whose completion_mask is the rows' own loss masks (0 on
        the environment's tokens inside a completion) instead of all of the completion."""

        def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
            import torch

            out = super().torch_call(examples)
            masks = [
                [0] * len(e["prompt_ids"]) + list(e[f"{side}_mask"])
                for side in ("chosen", "rejected")
                for e in examples
            ]  # chosen rows first, as TRL stacks
            if self.max_length is not None:  # the same cut TRL applies to the ids
                masks = [
                    m[: self.max_length] if self.truncation_mode == "keep_start" else m[-self.max_length :]
                    for m in masks
                ]
            completion = torch.zeros_like(out["completion_mask"])
            for r, m in enumerate(masks):
                completion[r, : len(m)] = torch.tensor(m, dtype=completion.dtype)
            out["completion_mask"] = completion
            return out

    return MaskedPreferenceCollator


def _trainer_class(base: type) -> type:
    class ArleDPO(base):
        _signature_columns: list[str]  # Trainer's: the columns the model's forward takes

        def _prepare_dataset(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
            return dataset  # tokenised by dpo_dataset (TRL's would put env tokens in the loss)

        def _set_signature_columns_if_needed(self) -> None:
            super()._set_signature_columns_if_needed()
            self._signature_columns = [*self._signature_columns, "chosen_mask", "rejected_mask"]

    ArleDPO.__name__ = base.__name__
    return ArleDPO


def build_dpo_trainer(
    cfg: TrainConfig,
    args: Any,
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    callbacks: Iterable[Any] = (),
    template_kwargs: dict[str, Any] | None = None,
) -> Any:
    """A ready DPOTrainer over `rows` (preference rows) with `args` (a DPOConfig); the rows are
    rendered with the chat template's switches `template_kwargs`."""
    import datasets
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()  # TRL's dataset preparation bars: noise in the live view
    trl = import_trl(False)
    peft = _peft_config(cfg, model)
    ref = None
    if not isinstance(model, str) and peft is None and not hasattr(model, "peft_config"):
        # A full fine-tune of a model object (an adapter merged into its base): TRL would rebuild
        # the reference from the config's path, i.e. without the adapter.
        ref = copy.deepcopy(model).eval()
    collator = _collator_class()(
        pad_token_id=tokenizer.pad_token_id,
        max_length=args.max_length,
        truncation_mode=args.truncation_mode,
        pad_to_multiple_of=args.pad_to_multiple_of,
    )
    trainer = _trainer_class(trl.DPOTrainer)(
        model=model,
        ref_model=ref,
        args=args,
        data_collator=collator,
        train_dataset=dpo_dataset(tokenizer, rows, args.max_length, template_kwargs),
        processing_class=tokenizer,
        peft_config=peft,
        callbacks=list(callbacks),
    )
    trainer.remove_callback(PrinterCallback)
    return trainer
