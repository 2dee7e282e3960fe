"""The BFCL env: one BFCL entry's conversation and function docs, one answer (single-turn).

What the model sees is what bfcl-eval's own handlers send for the entry, built with
bfcl-eval's functions (the card's prompt template is not used; BFCL's messages are the prompt):

    native   the model's chat template has a tool format (Qwen2.5, Llama 3.1, ...): the
             entry's messages as they are, and its function docs (with bfcl-eval's language
             hint, as its local function-calling handlers send them) as the template's
             tools, each `{"type": "function", "function": doc}`; no system prompt is added.
    text     otherwise: bfcl-eval's system prompt for prompting models (its default format:
             "[func_name1(params_name1=params_value1, ...), func_name2(params)]" and the docs
             as JSON) before the entry's messages (`system_prompt_pre_processing_chat_model`).

`mode: auto` (the default) picks native where the template has a tool format, as the tools
env does; `mode: text` always uses BFCL's prompt (its "prompting" column), and `mode: native`
refuses a model without one. The reward (rewards/bfcl.py) decodes the answer the same way:
as tool calls when the episode had native tools, else as BFCL's text format.

    env: {name: bfcl, params: {mode: auto}}
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from arlecli.envs import Step, register_env
from arlecli.errors import ParamError, UserError
from arlecli.rewards.bfcl import bfcl
from arlecli.types import Task

MODES = ("auto", "native", "text")


def model_functions(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The entry's function docs as bfcl-eval shows them to the model: with its language hint
    (" Note that the provided function is in Python 3 syntax.", Java and JavaScript types as
    strings), on a copy (the row keeps the docs the checker reads)."""
    b = bfcl()
    functions = copy.deepcopy(entry["function"])
    return b.utils._func_doc_language_specific_pre_processing(
        functions, b.utils.extract_test_category_from_id(entry["id"])
    )


def bfcl_messages(entry: dict[str, Any], native: bool) -> list[dict[str, Any]]:
    """The entry's first turn of messages, behind bfcl-eval's system prompt in text mode."""
    messages = copy.deepcopy(entry["question"][0])
    if native:
        return messages
    return bfcl().handler_utils.system_prompt_pre_processing_chat_model(messages, model_functions(entry), entry["id"])


class BfclEnv:
    """One BFCL entry: its prompt (and tools, natively), one answer, done."""

    max_turns = 1

    def __init__(self, task: Task, native: bool) -> None:
        self.task, self.native = task, native
        self.tools = [{"type": "function", "function": f} for f in model_functions(task.fields)] if native else None

    def reset(self) -> list[dict[str, Any]]:
        return bfcl_messages(self.task.fields, self.native)

    def step(self, completion: str) -> Step:
        return Step(done=True, reason="answered")

    def info(self) -> dict[str, Any]:
        return {"mode": "native" if self.native else "text"}


def check_params(params: dict[str, Any], base: Path | None = None) -> None:
    """`mode` is one of MODES; no other param."""
    for key in params:
        if key != "mode":
            raise ParamError(key, "is not a param of env 'bfcl'; it takes: mode")
    if params.get("mode", "auto") not in MODES:
        raise ParamError("mode", f"must be one of {', '.join(MODES)}, got {params['mode']!r}")


@register_env("bfcl", check=check_params)
def bfcl_env(card: Any, task: Task, exemplars: list[Task], native_tools: bool, mode: str = "auto") -> BfclEnv:
    """Env factory for `env: {name: bfcl, params: {mode: auto|native|text}}`."""
    if mode == "native" and not native_tools:
        raise UserError(f"{card.name}: env 'bfcl' mode native needs a model whose chat template has a tool format")
    return BfclEnv(task, native_tools and mode != "text")
