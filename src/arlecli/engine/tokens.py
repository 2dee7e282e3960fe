"""Prompt token ids shared by the in-process backends (hf, vllm).

Both backends must feed a model the very same ids for the same request, or their
samples (and an eval's scores) would differ for reasons that have nothing to do with
the engine. So the encoding lives here once: the chat template for messages, plain
tokenisation (with the tokenizer's own special tokens) for raw prompts.
"""

from __future__ import annotations

from typing import Any

from arlecli.engine.base import GenerationRequest
from arlecli.errors import UserError


def encode_request(tokenizer: Any, request: GenerationRequest) -> list[int]:
    """Prompt token ids for `request` with a transformers tokenizer.

    Messages go through the chat template (with the generation prompt) and are then
    tokenised without adding special tokens again (the template already holds them);
    a raw prompt is tokenised as `tokenizer(prompt)` would, BOS included where the
    tokenizer adds one.
    """
    if request.messages is not None:
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("this model's tokenizer has no chat template; use a card with "
                            "`prompt.format: completion` or an instruct model")
        text = tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(request.prompt or "")["input_ids"])
