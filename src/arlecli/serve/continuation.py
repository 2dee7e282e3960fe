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
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

# Bounds, so a long-running `arle serve --record` does not grow without limit: the most
# recent sessions, and per session the most recent replies (an agent continues one of its
# last few calls; older ones are re-encoded, which is correct, just not id-exact).
MAX_SESSIONS = 4096
PER_SESSION = 16


@dataclass
class _Reply:
    rid: str
    choice: int
    conversation: list[dict[str, Any]]   # the request's messages + {"role": "assistant", "content": text}
    ids: list[int]                       # its prompt ids + the completion ids, as generated


class Continuations:
    """Per session, recent chat replies with their exact ids; see the module docstring.

    Used from the event loop only (one thread), so it needs no lock."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._sessions: collections.OrderedDict[str, collections.deque[_Reply]] = collections.OrderedDict()

    def prompt_ids(self, session: str, messages: list[dict[str, Any]]
                   ) -> tuple[list[int] | None, dict[str, Any] | None]:
        """(prompt ids, what was continued) for a chat request in `session`; (None, None) when
        it continues no remembered reply (the engine encodes the messages as usual).

        What was continued is {"id", "choice", "seamless"}; `seamless` False means the ids
        could not be continued and the prompt was encoded afresh (ids None then too)."""
        from arlecli.engine.tokens import continue_ids

        reply = self._find(session, messages)
        if reply is None:
            return None, None
        ids, seamless = continue_ids(self.tokenizer, reply.ids, messages)
        info = {"id": reply.rid, "choice": reply.choice, "seamless": seamless}
        return (ids if seamless else None), info

    def remember(self, session: str, rid: str, messages: list[dict[str, Any]], completions: list[Any]) -> None:
        """Keep each choice of a finished chat request as a reply later requests may continue."""
        replies = self._sessions.pop(session, None) or collections.deque(maxlen=PER_SESSION)
        self._sessions[session] = replies  # most recently used last
        for i, comp in enumerate(completions):
            if not comp.prompt_token_ids:  # an engine without ids (a remote endpoint): nothing to continue
                continue
            conversation = [*messages, {"role": "assistant", "content": comp.text}]
            replies.append(_Reply(rid, i, conversation, [*comp.prompt_token_ids, *comp.token_ids]))
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)

    def _find(self, session: str, messages: list[dict[str, Any]]) -> _Reply | None:
        # The newest reply whose conversation the new messages extend (newest first: an agent
        # usually continues its last call).
        for reply in reversed(self._sessions.get(session, ())):
            n = len(reply.conversation)
            if len(messages) > n and messages[:n] == reply.conversation:
                return reply
        return None
