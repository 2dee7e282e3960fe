"""Token continuity for recorded sessions: a chat request that continues an earlier reply.

Agents re-send the whole conversation on every call. Encoding it afresh would re-tokenise
the model's own earlier replies, which need not give back the ids the model sampled (BPE
merges differ, special tokens vanish from the text), so a recorded trajectory would not be
the sequence the model actually produced, and training on it would be subtly wrong.

So, per session, the app remembers each recent reply with its exact ids (the prompt ids +
the completion ids the engine generated). When a new chat request's messages start with
an earlier request's messages + that reply, its prompt ids are those ids followed by
whatever the chat template adds after them (`engine.tokens.continue_ids`), exactly as the
multi-turn episode driver does (envs.episodes). Where the template's text does not extend
the decoded ids (it rewrote history, or a stop string cut the text short of the ids) the
request is encoded afresh, and its record says so (a seam).

A thinking model's reply reaches the client as its answer (`content`) with its thinking apart
(`reasoning_content`, reasoning.py), and that is what the agent sends back: an assistant message
continues a reply when its content is the reply's answer (or its whole text, for a client that
asked for it raw) and any reasoning_content it carries is the reply's thinking. The ids continued
are still the generated ones, thought included; whether the template's render of the history
extends them (Qwen3's drops earlier turns' thinking) decides seamless, as above.

A reply that called tools (serve/tools.py) is sent back as an assistant message with its
`tool_calls` (the calls' ids are the client's business: the functions and arguments must be the
reply's) and `content` the text outside them; the template renders the calls back (with the
request's `tools`), and where its render extends the generated ids the tool results that follow
are the only new tokens.

Memory is bounded in bytes, not replies: all sessions together hold at most `max_bytes`
(`arle serve --record-memory-mb`), counted as Python holds them (ids as 4-byte arrays, text and
messages at their `sys.getsizeof`). Past it, the least recently used session's oldest requests
are dropped first, so the sessions agents are working in keep theirs; a call that continues a
dropped reply is encoded afresh (a seam in the record, never an error). A reply bigger than the
whole budget is not kept at all.
"""

from __future__ import annotations

import array
import collections
import sys
import threading
from dataclasses import dataclass
from typing import Any

# Bounds besides the byte budget: the most sessions remembered, and per session the most recent
# requests (an agent continues one of its last few calls; older ones are re-encoded, which is
# correct, just not id-exact).
MAX_SESSIONS = 4096
PER_SESSION = 16
DEFAULT_MAX_BYTES = 1024 * 2**20
# What a remembered request costs beyond its strings and id arrays: its record, list and tuples.
_OVERHEAD = 512


@dataclass
class _Call:
    """One remembered chat request: its messages and prompt ids, shared by all its choices, and
    each choice's reply text and completion ids (as generated)."""

    rid: str
    messages: list[dict[str, Any]]
    prompt_ids: array.array
    replies: list[tuple[int, str, array.array, str | None, str | None, tuple[dict[str, Any], ...]]]
    # (choice, text, completion ids, answer, thinking: None unless it thought or called tools, tool calls)
    size: int  # bytes, as counted against the budget

    def ids(self, choice: int) -> list[int]:
        """The prompt ids + choice `choice`'s completion ids: the sequence a continuation extends."""
        reply = next(r for r in self.replies if r[0] == choice)
        return [*self.prompt_ids, *reply[2]]


class Continuations:
    """Per session, recent chat replies with their exact ids; see the module docstring.

    Locked: the event loop reads and adds replies while the rollout driver's thread closes
    sessions. `bytes` is what the kept replies hold now, `evicted` how many requests were
    dropped to stay within `max_bytes`."""

    def __init__(
        self, tokenizer: Any, max_bytes: int = DEFAULT_MAX_BYTES, template_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.tokenizer = tokenizer
        # The engine's chat_template_kwargs: a continued turn renders as a fresh one.
        self.template_kwargs = template_kwargs
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted = 0
        self._sessions: collections.OrderedDict[str, collections.deque[_Call]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def prompt_ids(
        self, session: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> tuple[list[int] | None, dict[str, Any] | None]:
        """(prompt ids, what was continued) for a chat request in `session`; (None, None) when
        it continues no remembered reply (the engine encodes the messages as usual). `tools`
        are the request's, which the template renders too.

        What was continued is {"id", "choice", "seamless"}; `seamless` False means the ids
        could not be continued and the prompt was encoded afresh (ids None then too)."""
        from arlecli.engine.tokens import continue_ids

        with self._lock:
            found = self._find(session, messages)
            if found is None:
                return None, None
            call, choice = found
            so_far = call.ids(choice)
        # Outside the lock: tokenising a long conversation takes a while.
        ids, seamless = continue_ids(self.tokenizer, so_far, messages, tools, self.template_kwargs)
        info = {"id": call.rid, "choice": choice, "seamless": seamless}
        return (ids if seamless else None), info

    def remember(
        self,
        session: str,
        rid: str,
        messages: list[dict[str, Any]],
        completions: list[Any],
        split: list[Any] | None = None,
    ) -> None:
        """Keep each choice of a finished chat request as a reply later requests may continue;
        `split` holds each choice's reasoning.Reply (its answer, thinking and tool calls), if it was split."""
        with_ids = [(i, c) for i, c in enumerate(completions) if c.prompt_token_ids]
        if not with_ids:  # an engine without ids (a remote endpoint): nothing to continue
            return
        prompt_ids = _ids(with_ids[0][1].prompt_token_ids)  # every choice of a request has the same prompt

        def parts(i: int) -> tuple[str | None, str | None, tuple[dict[str, Any], ...]]:
            reply = split[i] if split is not None else None
            if reply is None or not (reply.thought or reply.tool_calls):
                return None, None, ()
            return reply.answer, reply.thinking, reply.tool_calls

        replies = [(i, c.text, _ids(c.token_ids), *parts(i)) for i, c in with_ids]
        call = _Call(rid, messages, prompt_ids, replies, _size(messages, prompt_ids, replies))
        with self._lock:
            calls = self._sessions.pop(session, None) or collections.deque()
            self._sessions[session] = calls  # most recently used last
            calls.append(call)
            self.bytes += call.size
            while len(calls) > PER_SESSION:
                self.bytes -= calls.popleft().size
            while len(self._sessions) > MAX_SESSIONS:
                self._drop(next(iter(self._sessions)))
            self._evict()

    def forget(self, session: str) -> None:
        """Drop what `session` holds (it was closed)."""
        with self._lock:
            self._drop(session)

    def __len__(self) -> int:
        """How many sessions hold replies."""
        return len(self._sessions)

    def _drop(self, session: str) -> None:
        for call in self._sessions.pop(session, ()):
            self.bytes -= call.size

    def _evict(self) -> None:
        # Oldest requests of the least recently used session first: whoever is mid-episode
        # (the most recent sessions) keeps the replies it is about to continue.
        while self.bytes > self.max_bytes and self._sessions:
            session, calls = next(iter(self._sessions.items()))
            self.bytes -= calls.popleft().size
            self.evicted += 1
            if not calls:
                del self._sessions[session]

    def _find(self, session: str, messages: list[dict[str, Any]]) -> tuple[_Call, int] | None:
        # The newest reply whose conversation the new messages extend (newest first: an agent
        # usually continues its last call).
        for call in reversed(self._sessions.get(session, ())):
            n = len(call.messages)
            if len(messages) <= n + 1 or messages[:n] != call.messages:
                continue
            for choice, text, _, answer, thinking, calls in reversed(call.replies):
                if _is_reply(messages[n], text, answer, thinking, calls):
                    return call, choice
        return None


def _is_reply(
    message: dict[str, Any], text: str, answer: str | None, thinking: str | None, calls: tuple[dict[str, Any], ...] = ()
) -> bool:
    """Whether `message` is the reply sent back: its raw text, or its answer with at most its
    own thinking beside it (see the module docstring); a reply that called tools, its answer
    (the text outside the calls) with those calls (same functions and arguments; ids aside)."""
    from arlecli.serve.tools import same_calls

    if message.get("role") != "assistant" or set(message) - {"role", "content", "reasoning_content", "tool_calls"}:
        return False
    content, sent = message.get("content"), message.get("reasoning_content")
    if calls or message.get("tool_calls"):
        return (
            bool(calls)
            and same_calls(message.get("tool_calls") or [], list(calls))
            and content == answer
            and sent in (None, thinking)
        )
    if content == text and sent is None:
        return True
    return answer is not None and content == answer and sent in (None, thinking)


def _ids(ids: Any) -> array.array:
    """Token ids as a compact array (4 bytes an id; a Python list of ints takes ~36)."""
    try:
        return array.array("i", ids)
    except OverflowError:  # an id past 2**31: no vocabulary has one, but don't fail a request over it
        return array.array("q", ids)


def _size(
    messages: list[dict[str, Any]],
    prompt_ids: array.array,
    replies: list[tuple[int, str, array.array, str | None, str | None, tuple[dict[str, Any], ...]]],
) -> int:
    """The bytes one remembered request holds, as Python stores them (an upper bound: strings
    shared with other requests are counted each time)."""
    size = _OVERHEAD + sys.getsizeof(messages) + sys.getsizeof(prompt_ids)
    for m in messages:
        size += sys.getsizeof(m) + sum(sys.getsizeof(v) for v in m.values())
    for _, text, ids, answer, thinking, calls in replies:
        size += 64 + sys.getsizeof(text) + sys.getsizeof(ids)
        if answer is not None:  # the split's strings are copies of parts of the text
            size += 48 + sys.getsizeof(answer) + sys.getsizeof(thinking)
        for call in calls:  # their arguments' JSON, a copy of part of the text too
            size += 256 + sys.getsizeof(call["function"]["arguments"])
    return size
