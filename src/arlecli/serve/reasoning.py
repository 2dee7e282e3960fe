"""A served reply's thinking apart from its answer, as vLLM's reasoning parsers return it.

A chat reply of a model that thinks (`<think> ... </think>` then the answer, or a template
that opens the thought in its generation prompt) goes out as

    message.content            the answer (null when the model thought and gave none: its
                               token budget ran out inside the thought)
    message.reasoning_content  the thinking

and a stream sends the thinking as a `delta.reasoning_content` chunk before the answer's
`delta.content`. A reply without a thought has no `reasoning_content` at all, so clients of
a plain model see nothing new. /v1/completions returns the raw text, as vLLM does.

The split is the one eval and training make (envs.episodes.Transcript.record): the engine's
think tags (`thinking.tags_for`), whether the prompt's ids end inside an opened thought
(`thinking.prompt_opens`), or an endpoint's own reasoning field when the engine is one. So
an agent served by arle and the same agent's recorded episode (agent.py reads the records)
see the same thinking and the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arlecli.engine.base import Completion
from arlecli.thinking import prompt_opens, split, tags_for, thinking_token_count


@dataclass(frozen=True)
class Reply:
    """One generated choice taken apart: `answer` is what `content` carries; `thinking` is None
    when the model did not think; `cut` says it thought and gave no answer; `thinking_tokens`
    counts the ids through the end tag (None: unknown, e.g. an endpoint without counts);
    `tool_calls` are the calls a tool-call parser took out of the answer (serve/tools.py)."""

    completion: Completion
    answer: str
    thinking: str | None = None
    cut: bool = False
    thinking_tokens: int | None = None
    # Function calling (serve/tools.py): the calls taken out of the answer, in the response's
    # shape, and the answer as written before they were (None: no calls).
    tool_calls: tuple[dict[str, Any], ...] = ()
    written: str | None = None

    @property
    def thought(self) -> bool:
        """Whether the model thought in this reply."""
        return self.thinking is not None


class Reasoning:
    """Splits an engine's completions with that engine's tags and tokenizer."""

    def __init__(self, engine: Any) -> None:
        self.tags = tags_for(engine)
        self.tokenizer = getattr(engine, "tokenizer", None)

    def reply(self, comp: Completion) -> Reply:
        """`comp` taken apart into thinking and answer (see the module docstring)."""
        opened = prompt_opens(self.tokenizer, comp.prompt_token_ids, self.tags)
        part = split(comp.text, self.tags, reasoning=comp.reasoning, opened=opened)
        if part.thinking is None:
            return Reply(comp, comp.text)
        counted = (
            comp.reasoning_tokens
            if comp.reasoning is not None
            else thinking_token_count(self.tokenizer, comp.token_ids, self.tags, part.thinking, part.cut)
        )
        return Reply(comp, part.answer, part.thinking, part.cut, counted)


def reasoning_tokens(replies: list[Reply]) -> int | None:
    """The thinking tokens of all `replies` together (OpenAI's
    `usage.completion_tokens_details.reasoning_tokens`); None when none thought or a count is unknown."""
    thought = [r for r in replies if r.thought]
    if not thought or any(r.thinking_tokens is None for r in thought):
        return None
    return sum(r.thinking_tokens or 0 for r in thought)
