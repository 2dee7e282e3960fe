"""The hf engine's KV cache kept across `generate` calls, keyed by the token ids themselves.

Why: an agent episode's turn k+1 prompt is turn k's prompt + its completion + what the env
appended (engine.tokens.continue_ids), so without this every turn prefills the whole
conversation again. A finished row's KV is kept here under its ids; a later request whose
prompt shares a prefix with an entry prefills only the rest. Keyed by ids, not by an
episode: no API change, and any prompt that extends a kept sequence benefits (a chained
phase, a server's next chat turn). A causal model's KV of a prefix does not depend on what
follows it, so an entry also serves a prompt that diverges from it part way (its first
tokens' KV are taken).

Bounded: at most `max_tokens` tokens are held over all entries, least recently used
evicted first; an entry that a newer one extends is dropped (the newer one serves every
prompt the old one did, at least as far).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from arlecli.config import env_count

DEFAULT_MAX_TOKENS = 16384  # ~0.75 GB of fp32 KV for SmolLM2-135M (46 KB a token), 16 episodes of 1k tokens
ENV_VAR = "ARLE_KV_REUSE_TOKENS"


def configured_max_tokens() -> int:
    """The budget every hf engine of this process uses unless its caller passes one:
    $ARLE_KV_REUSE_TOKENS (0 turns KV reuse off) or DEFAULT_MAX_TOKENS. An environment
    variable rather than a flag because eval, serve and a training run's rollout engine all
    build hf engines, and the budget is a memory setting of the machine, not of a run."""
    return env_count(ENV_VAR, DEFAULT_MAX_TOKENS, "not a token count: set it to 0 (off) or a positive number of tokens")


@dataclass
class Entry:
    """A kept sequence: its ids and, per layer, its (keys, values) of shape [1, heads, len(ids), dim]."""

    ids: list[int]
    layers: list[tuple[Any, Any]]


class PrefixCache:
    """Kept KV per token sequence, LRU over a budget of `max_tokens` tokens (0: keep nothing)."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        self.max_tokens = max(0, max_tokens)
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # least recently used first
        self._next_key = 0
        self.tokens = 0  # ids held over all entries (what `max_tokens` bounds)
        self.lookups = 0
        self.hits = 0
        self.reused_tokens = 0  # prompt tokens served from here instead of prefilled

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, ids: list[int]) -> tuple[int, Entry | None]:
        """The longest common prefix of `ids` with a kept entry, as (length, entry); (0, None)
        when none. At most len(ids) - 1: the last prompt token is always run, its logits pick
        the first new token. The entry becomes the most recently used."""
        self.lookups += 1
        best, best_key = 0, None
        limit = len(ids) - 1
        for key, entry in self._entries.items():
            n = _common_prefix(entry.ids, ids, limit)
            if n > best:
                best, best_key = n, key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.reused_tokens += best
        return best, self._entries[best_key]

    def put(self, ids: list[int], layers: list[tuple[Any, Any]]) -> None:
        """Keep `layers` (copies, owned by the cache from now on) as the KV of `ids`; entries
        that `ids` extends are dropped, then the least recently used until within budget."""
        if not ids or len(ids) > self.max_tokens:
            return
        for key, entry in list(self._entries.items()):
            if len(entry.ids) <= len(ids) and ids[: len(entry.ids)] == entry.ids:
                self._drop(key)
        self._entries[self._next_key] = Entry(list(ids), layers)
        self._next_key += 1
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Drop every entry (the weights changed: no kept KV is valid any more)."""
        self._entries.clear()
        self.tokens = 0

    def _drop(self, key: int) -> None:
        self.tokens -= len(self._entries.pop(key).ids)


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """len of the common prefix of `a` and `b`, at most `limit`."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:  # the usual case, an episode's next turn: one C-level comparison
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect on slice equality
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
