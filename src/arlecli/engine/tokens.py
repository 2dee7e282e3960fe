"""Prompt token ids shared by the in-process backends (hf, vllm).

Both backends must feed a model the very same ids for the same request, or their
samples (and an eval's scores) would differ for reasons that have nothing to do with
the engine. So the encoding lives here once: the chat template for messages, plain
tokenisation (with the tokenizer's own special tokens) for raw prompts.

`template_kwargs` (`--chat-template-kwargs`, e.g. Qwen3's `enable_thinking=false`) are the
chat template's own switches: every render of one model passes the same ones (the engines
hold them; see `check_template_kwargs`).
"""

from __future__ import annotations

from typing import Any

from arlecli.engine.base import GenerationRequest
from arlecli.errors import UserError


def encode_request(
    tokenizer: Any, request: GenerationRequest, template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """Prompt token ids for `request` with a transformers tokenizer.

    Messages go through the chat template (with the generation prompt and `template_kwargs`)
    and are then tokenised without adding special tokens again (the template already holds
    them); a raw prompt is tokenised as `tokenizer(prompt)` would, BOS included where the
    tokenizer adds one. A request that carries `prompt_token_ids` is taken as is.
    """
    if request.prompt_token_ids is not None:
        return list(request.prompt_token_ids)
    if request.messages is not None:
        return list(
            tokenizer(
                render_chat(tokenizer, request.messages, request.tools, template_kwargs=template_kwargs),
                add_special_tokens=False,
            )["input_ids"]
        )
    return list(tokenizer(request.prompt or "")["input_ids"])


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The chat template's text for `messages` (and `tools`, where the template takes them),
    with the template's own switches `template_kwargs`."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "this model's tokenizer has no chat template; use a card with "
            "`prompt.format: completion` or an instruct model"
        )
    kwargs = {**(template_kwargs or {}), **({"tools": tools} if tools else {})}
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False, **kwargs)


# What apply_chat_template itself passes to every template: never a user's switch.
_TEMPLATE_BUILTINS = {
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "continue_final_message",
    "raise_exception",
    "strftime_now",
    "range",
    "loop",
    "namespace",
    "true",
    "false",
    "none",
}


def template_variables(template: str) -> set[str]:
    """The variables a chat template reads from outside (jinja2's undeclared variables), minus
    what transformers passes to every template (messages, tools, special tokens ...)."""
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    return set(meta.find_undeclared_variables(env.parse(template))) - _TEMPLATE_BUILTINS


def check_template_kwargs(tokenizer: Any, template_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`template_kwargs` if the model's chat template reads every one of them; a UserError naming
    the unknown key and the template's own variables otherwise (a misspelt `enable_thinking`
    would otherwise change nothing, silently)."""
    if not template_kwargs:
        return {}
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: any of them may read the key
        template = "\n".join(t for t in template.values() if isinstance(t, str))
    if not isinstance(template, str) or not template:
        raise UserError(
            f"--chat-template-kwargs {', '.join(sorted(template_kwargs))}: this model has no chat "
            "template to pass them to"
        )
    from jinja2 import TemplateSyntaxError

    try:
        known = template_variables(template)
    except TemplateSyntaxError:  # rendering will say what is wrong with the template itself
        return dict(template_kwargs)
    for key in template_kwargs:
        if key not in known:
            names = ", ".join(sorted(known)) or "none"
            raise UserError(
                f"--chat-template-kwargs {key}: this model's chat template never reads {key!r} "
                f"(the variables it reads: {names})"
            )
    return dict(template_kwargs)


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template has a tool format of its own (Qwen2.5, Llama 3.1 ...)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template and "tool" in template.replace("tools", "")


def continue_ids(
    tokenizer: Any,
    ids_so_far: list[int],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[int], bool]:
    """Prompt ids for the next turn: `ids_so_far` (the last prompt + the model's own
    completion ids, exactly as generated) followed by the tokens of whatever the chat
    template adds after them for `messages` (which end with the environment's reply).

    Returns (ids, continued). When the template's text does not extend the decoded ids
    (it rewrote history, or a stop string cut the text short of the ids), the whole
    conversation is encoded afresh and `continued` is False (the episode's token record
    then has a seam, which training must not mask over)."""
    full = render_chat(tokenizer, messages, tools, template_kwargs=template_kwargs)
    so_far = tokenizer.decode(ids_so_far, skip_special_tokens=False)
    if full.startswith(so_far):
        delta = tokenizer(full[len(so_far) :], add_special_tokens=False)["input_ids"]
        return [*ids_so_far, *delta], True
    return list(tokenizer(full, add_special_tokens=False)["input_ids"]), False
