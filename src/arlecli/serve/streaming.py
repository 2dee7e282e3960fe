"""A streamed choice's text as it is generated: which new characters may go out now.

An engine that streams (hf) hands the server each row's ids after every decode step; this turns
them into deltas (`content`, and a thinking model's `reasoning_content` before it) that always
add up to the finished reply's fields (reasoning.Reply), so a client that joins the deltas gets
exactly the non-streamed message. What could still change is held back, as vLLM's server holds
it back:

    a tail that may be the start of a stop string (a stop is cut, never sent)
    a tail that may be the start of a think tag, and text that may yet open a thought
    a trailing U+FFFD (a character whose UTF-8 bytes are split across tokens)

The thinking and the answer are taken apart by `thinking.split`, the same rule the finished
reply uses, on the text so far. A field's target that no longer extends what was sent (a text
that only turned out to be a thought at its end tag, without a start tag) is not streamed
further; `finish` then sends what is left of each field as the reply has it.
"""

from __future__ import annotations

from typing import Any

from arlecli.engine.base import cut_at_stop
from arlecli.serve.reasoning import Reply
from arlecli.thinking import ThinkTags, split

REASONING, CONTENT = "reasoning_content", "content"


class TextStream:
    """One choice's streamed text. `parse` says whether its thinking goes apart
    (a chat reply not asked for raw); otherwise everything is `content` (the raw text)."""

    def __init__(self, tokenizer: Any, *, stop: list[str], tags: ThinkTags | None, opened: bool, parse: bool) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.tags = tags if parse else None
        self.opened = opened
        self.sent = {REASONING: "", CONTENT: ""}
        self._ids_seen = 0

    def update(self, ids: list[int]) -> list[tuple[str, str]]:
        """The (field, new text) deltas that `ids`, the ids generated so far, allow out now."""
        if len(ids) <= self._ids_seen:
            return []
        self._ids_seen = len(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return self._advance(self._targets(self._safe(text)))

    def finish(self, reply: Reply, parsed: bool) -> list[tuple[str, str]]:
        """What is left of each field of the finished `reply` (`parsed`: sent apart)."""
        if parsed:
            targets = {REASONING: reply.thinking or "", CONTENT: reply.answer or ""}
        else:
            targets = {REASONING: "", CONTENT: reply.completion.text}
        return self._advance(targets)

    def _safe(self, text: str) -> str:
        text = cut_at_stop(text, self.stop)
        text = text.rstrip("\ufffd")
        holds = list(self.stop)
        if self.tags is not None:
            holds += [self.tags.start, self.tags.end]
        cut = 0
        for s in holds:  # the longest tail that is a proper prefix of something held back
            for k in range(min(len(s) - 1, len(text)), cut, -1):
                if text.endswith(s[:k]):
                    cut = k
                    break
        return text[: len(text) - cut] if cut else text

    def _targets(self, text: str) -> dict[str, str]:
        if self.tags is None:
            return {REASONING: "", CONTENT: text}
        body = text.lstrip()
        if not self.opened and self.tags.start.startswith(body):
            return {REASONING: "", CONTENT: ""}  # nothing yet, or what may still open a thought
        part = split(text, self.tags, opened=self.opened)
        return {REASONING: part.thinking or "", CONTENT: part.answer}

    def _advance(self, targets: dict[str, str]) -> list[tuple[str, str]]:
        out = []
        for key in (REASONING, CONTENT):
            want, sent = targets[key], self.sent[key]
            if len(want) > len(sent) and want.startswith(sent):
                out.append((key, want[len(sent) :]))
                self.sent[key] = want
        return out
