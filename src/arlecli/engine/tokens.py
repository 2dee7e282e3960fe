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
    tokenizer adds one. A request that carries `prompt_token_ids` is taken as is.
    """
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids)
    if request.messages is not None:
        return list(tokenizer(render_chat(tokenizer, request.messages, request.tools),
                              add_special_tokens=False)["input_ids"])
    return list(tokenizer(request.prompt or "")["input_ids"])


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                generation_prompt: bool = True) -> str:
    """The chat template's text for `messages` (and `tools`, where the template takes them)."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("this model's tokenizer has no chat template; use a card with "
                        "`prompt.format: completion` or an instruct model")
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False, **kwargs)


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template has a tool format of its own (Qwen2.5, Llama 3.1 ...)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template and "tool" in template.replace("tools", "")


def continue_ids(tokenizer: Any, ids_so_far: list[int], messages: list[dict[str, Any]],
                 tools: list[dict[str, Any]] | None = None) -> tuple[list[int], bool]:
    """Prompt ids for the next turn: `ids_so_far` (the last prompt + the model's own
    completion ids, exactly as generated) followed by the tokens of whatever the chat
    template adds after them for `messages` (which end with the environment's reply).

    Returns (ids, continued). When the template's text does not extend the decoded ids
    (it rewrote history, or a stop string cut the text short of the ids), the whole
    conversation is encoded afresh and `continued` is False (the episode's token record
    then has a seam, which training must not mask over)."""
    full = render_chat(tokenizer, messages, tools)
    so_far = tokenizer.decode(ids_so_far, skip_special_tokens=False)
    if full.startswith(so_far):
        delta = tokenizer(full[len(so_far):], add_special_tokens=False)["input_ids"]
        return [*ids_so_far, *delta], True
    return list(tokenizer(full, add_special_tokens=False)["input_ids"]), False
