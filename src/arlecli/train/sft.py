"""Supervised fine-tuning on chat trajectories through TRL 1.16's SFTTrainer.

A row is a conversation (the SFT rows `arle data from-eval` writes): `messages` (system?, user,
assistant, tool ... ending with an assistant message) and, for episodes that used native
tools, `tools` (their JSON schemas). Every assistant message carries loss; system, user and
tool messages (the prompt and the environment) do not, exactly as GRPO's env_mask keeps the
environment's tokens out of its loss (train.batches.flatten_episode):

    render messages[:i] with the generation prompt   -> not trained (prompt, env replies,
                                                         the "<|im_start|>assistant\\n" header)
    assistant message i, through its end-of-turn token -> trained
    template text after that token ("\\n" ...)         -> not trained (the model stops at it)

Each piece is tokenised on its own and the ids concatenated, the way a rollout's sequence is
built (prompt ids, the model's ids, then the env's delta ids: engine.tokens.continue_ids).
Where the chat template rewrites history (a later render does not extend the text so far), the
conversation stops before it. A row that carries its tokens as generated (`sequences`, rft's
rows: one sequence per segment between such seams, see train.batches) trains on those instead.

A prompt/completion row (TRL's format; what from-eval writes for a completion-format card:
HumanEval, gsm8k) is plain text: the prompt is tokenised as the engine tokenised it for
generation (`tokenizer(prompt)`, BOS where the tokenizer adds one), the completion on its own
after it, and EOS appended, as TRL's SFTTrainer appends it: the prompt carries no loss, the
completion and its EOS do (the model learns to stop where the card's stop sequence cut it).
A conversational prompt/completion row (lists of messages) is the conversation prompt +
completion.

SFTTrainer gets the rows pre-tokenised (`input_ids` and `labels`, -100 on untrained tokens),
which it uses as they are (truncated to `max_length`; rows left with no trained token dropped).

Stable entry points (other trainers, e.g. rejection-sampling fine-tuning, build on them):

    tokenize_conversation(tokenizer, messages, tools=None) -> (input_ids, completion_mask)
    tokenize_text(tokenizer, prompt, completion) -> (input_ids, completion_mask)
    sft_dataset(tokenizer, rows) -> datasets.Dataset           # input_ids, labels
    trainer_args(cfg, run_dir) -> trl.SFTConfig | trl.DPOConfig   # for cfg.options.algo
    build_sft_trainer(cfg, args, model, tokenizer, rows, callbacks=()) -> trl.SFTTrainer
    train_sft(cfg, args, model, tokenizer, rows, *, callbacks=(), checkpoint=None) -> trl.SFTTrainer

`model` is a path (or hub id) or a loaded model (a peft model keeps its adapter and gets no
new one); `rows` are dicts with `messages` (and optionally `tools`). train_sft returns the
trainer after training (its `.model`, `.state.global_step`); saving is the caller's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from arlecli.errors import UserError
from arlecli.train.config import TrainConfig
from arlecli.train.trl_glue import common_fields, import_trl, lora_config

IGNORE = -100  # the label of a token that carries no loss (what transformers' loss skips)


def _end_markers(tokenizer: Any) -> tuple[list[str], list[str]]:
    """(the EOS token, every other special added token): where an assistant turn ends."""
    eos = [tokenizer.eos_token] if isinstance(getattr(tokenizer, "eos_token", None), str) else []
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    specials = [tok.content for tok in decoder.values() if getattr(tok, "special", False) and tok.content not in eos]
    return eos, specials


def _turn_end(turn: str, message: dict[str, Any], markers: tuple[list[str], list[str]]) -> int:
    """Where the trained part of an assistant turn's rendered text ends: just after the
    end-of-turn token that follows the message's content (EOS preferred, else the first special
    token: <end_of_turn>, <|eot_id|> ...); the whole text if the template writes none."""
    content = message.get("content")
    start = 0
    if isinstance(content, str) and content:
        found = turn.find(content)
        start = found + len(content) if found >= 0 else 0
    for group in markers:
        hits = [(turn.find(m, start), m) for m in group if m and turn.find(m, start) >= 0]
        if hits:
            at, marker = min(hits)
            return at + len(marker)
    return len(turn)


def tokenize_conversation(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[int], list[int]]:
    """(input_ids, completion_mask) of a conversation: mask 1 on every assistant message's own
    tokens (through its end-of-turn token), 0 on everything else (see the module docstring).
    An assistant message's thinking (`reasoning_content`) is trained too: rendered by a
    template that renders it, else written inline between think tags (trajectories.for_template).
    `template_kwargs`: the chat template's switches (--chat-template-kwargs), in every render."""
    from arlecli.engine.tokens import render_chat
    from arlecli.trajectories import for_template

    messages = for_template(tokenizer, messages)

    markers = _end_markers(tokenizer)
    ids: list[int] = []
    mask: list[int] = []
    text = ""  # the rendered conversation so far, exactly as the pieces were tokenised

    def add(piece: str, loss: int) -> None:
        if piece:
            new = tokenizer(piece, add_special_tokens=False)["input_ids"]
            ids.extend(new)
            mask.extend([loss] * len(new))

    for i, message in enumerate(messages):
        if message.get("role") != "assistant" or i == 0:
            continue
        head = render_chat(tokenizer, messages[:i], tools, generation_prompt=True, template_kwargs=template_kwargs)
        full = render_chat(
            tokenizer, messages[: i + 1], tools, generation_prompt=False, template_kwargs=template_kwargs
        )
        if not head.startswith(text) or not full.startswith(head):
            break  # a seam: the template rewrote what came before
        turn = full[len(head) :]
        end = _turn_end(turn, message, markers)
        add(head[len(text) :], 0)
        add(turn[:end], 1)
        text = head + turn[:end]
    return ids, mask


def tokenize_text(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """(input_ids, completion_mask) of a plain-text prompt/completion row: the prompt's ids as the
    engine encodes a raw prompt (engine.tokens.encode_request), then the completion's and EOS,
    mask 1 on those (see the module docstring)."""
    prompt_ids = list(tokenizer(prompt)["input_ids"])
    own = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None and (not own or own[-1] != eos):
        own.append(eos)
    return prompt_ids + own, [0] * len(prompt_ids) + [1] * len(own)


def row_tokens(
    tokenizer: Any, row: dict[str, Any], template_kwargs: dict[str, Any] | None = None
) -> list[tuple[list[int], list[int]]]:
    """The (input_ids, completion_mask) sequences an SFT row trains on: its `sequences` as
    generated, a text prompt/completion, or its conversation (`messages`, or conversational
    prompt + completion) through the chat template."""
    if row.get("sequences"):
        return [(s["input_ids"], s["completion_mask"]) for s in row["sequences"]]
    if isinstance(row.get("completion"), str):
        return [tokenize_text(tokenizer, row["prompt"], row["completion"])]
    messages = row["messages"] if "messages" in row else [*row["prompt"], *row["completion"]]
    return [tokenize_conversation(tokenizer, messages, row.get("tools") or None, template_kwargs)]


def sft_dataset(tokenizer: Any, rows: Iterable[dict[str, Any]], template_kwargs: dict[str, Any] | None = None) -> Any:
    """A pre-tokenised `datasets.Dataset` (input_ids, labels) of SFT rows; rows with no trained
    token (a seam before the first assistant turn) are left out. A row that carries the tokens
    it was generated as (`sequences`: [{"input_ids", "completion_mask"}], rft's rows) trains on
    those, each sequence an example, rather than on a render of its messages."""
    from datasets import Dataset

    out = []
    for row in rows:
        for ids, mask in row_tokens(tokenizer, row, template_kwargs):
            if any(mask):
                out.append({"input_ids": ids, "labels": [t if m else IGNORE for t, m in zip(ids, mask)]})
    if not out:
        raise UserError(
            "no row has an assistant turn the chat template can render after its prompt; nothing to train on"
        )
    return Dataset.from_list(out)


def trainer_args(cfg: TrainConfig, run_dir: Path) -> Any:
    """The SFTConfig (--algo sft) or DPOConfig (--algo dpo) for this run."""
    opts = cfg.options
    trl = import_trl(False)
    dpo = opts.algo == "dpo"
    # TRL's defaults for a full fine-tune (SFT 2e-5, DPO 1e-6); LoRA adapters start at zero and
    # take a larger step.
    full_lr = 1e-6 if dpo else 2e-5
    fields = common_fields(cfg, run_dir, full_lr * 10 if opts.lora_rank > 0 else full_lr)
    cls = trl.DPOConfig if dpo else trl.SFTConfig
    try:
        return cls(**fields)
    except (ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"invalid {opts.algo} settings: {first}") from None


def load_tokenizer(path: str) -> Any:
    """The tokenizer of a model folder or hub id (an adapter folder holds its own copy)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:  # TRL's collators pad; EOS is what its trainers fall back to
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _peft_config(cfg: TrainConfig, model: Any) -> Any:
    # A model that already carries an adapter keeps training it; otherwise the run's LoRA, if any.
    return None if hasattr(model, "peft_config") else lora_config(cfg)


def build_sft_trainer(
    cfg: TrainConfig,
    args: Any,
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    callbacks: Iterable[Any] = (),
    template_kwargs: dict[str, Any] | None = None,
) -> Any:
    """A ready SFTTrainer over `rows` (SFT rows) with `args` (from trainer_args); the rows are
    rendered with the chat template's switches `template_kwargs`."""
    import datasets
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()  # TRL's dataset preparation bars: noise in the live view
    trl = import_trl(False)
    trainer = trl.SFTTrainer(
        model=model,
        args=args,
        train_dataset=sft_dataset(tokenizer, rows, template_kwargs),
        processing_class=tokenizer,
        peft_config=_peft_config(cfg, model),
        callbacks=list(callbacks),
    )
    trainer.remove_callback(PrinterCallback)  # the live view shows the logs
    return trainer


def train_sft(
    cfg: TrainConfig,
    args: Any,
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    *,
    callbacks: Iterable[Any] = (),
    checkpoint: Path | None = None,
) -> Any:
    """Train on `rows` (from `checkpoint` when given) and return the trainer."""
    trainer = build_sft_trainer(cfg, args, model, tokenizer, rows, callbacks)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    return trainer
