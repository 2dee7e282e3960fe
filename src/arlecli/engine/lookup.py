"""Prompt-lookup drafts for the hf engine's greedy rows (speculative decoding without a draft model).

Why: at batch 1 on a CPU a decode step is bound by reading the weights, so a forward over a
few more positions costs little more than one position (2 positions ~1.05x a step, 9 1.4-1.6x:
perf/README.md, "Prompt-lookup speculative decoding").
When the newest tokens repeat an n-gram seen earlier in the prompt or the output (a quoted
passage, code echoed back, an env's observation repeated, a list pattern), the tokens that
followed it then are a cheap guess of what follows now. The engine feeds the guess with the
last token in one forward and keeps the longest prefix the model itself would have chosen
greedily, plus the model's own next token, so the output is greedy's token for token; a
wrong guess costs only the extra positions of that forward, and the next guess is shorter.
"""

from __future__ import annotations

from dataclasses import dataclass

from arlecli.config import env_count

DEFAULT_DRAFT_TOKENS = 8  # the longest guess (`next_guess_len` sets each one's length up to it)
MAX_NGRAM = 3
MIN_NGRAM = 2  # 1-token matches left out: they match at almost every step, and a verify forward costs more than a step
ENV_VAR = "ARLE_PROMPT_LOOKUP"
FIRST_GUESS = 4


def next_guess_len(accepted: int, guessed: int) -> int:
    """The next guess's length from how much of the last one the model kept: a verify forward
    costs more with every position it feeds (SmolLM2 at batch 1: 9 positions ~1.4x a step, 2
    ~1.05x), so a guess grows only while guesses are kept whole (a passage being copied) and
    shrinks to what was kept, plus one, when it is cut."""
    return 2 * guessed if accepted == guessed else accepted + 1


@dataclass
class Tally:
    """What prompt lookup did in an engine's life: `tokens - forwards` decode steps saved."""

    forwards: int = 0  # verify forwards run (each in place of one decode step)
    guessed: int = 0  # draft ids fed to them
    tokens: int = 0  # tokens they emitted (each at least one: the model's own next token)


def configured_draft_tokens() -> int:
    """The draft length every hf engine of this process uses unless its caller passes one:
    $ARLE_PROMPT_LOOKUP (0 turns prompt lookup off) or DEFAULT_DRAFT_TOKENS. An environment
    variable, like ARLE_KV_REUSE_TOKENS, because eval, serve and training's rollouts all
    build hf engines and the output does not depend on it (only the speed)."""
    return env_count(ENV_VAR, DEFAULT_DRAFT_TOKENS, "give a whole number of draft tokens (0 turns prompt lookup off)")


def draft(ids: list[int], max_tokens: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to `max_tokens` ids that followed the latest earlier occurrence of the longest
    n-gram (`max_ngram` down to `min_ngram` tokens) that `ids` ends with; [] when none recurs.
    The latest occurrence, not the first: in generated text the nearest context predicts best."""
    if max_tokens <= 0:
        return []
    for n in range(min(max_ngram, len(ids) - 1), min_ngram - 1, -1):
        tail = ids[-n:]
        first = tail[0]
        # An occurrence ending before the tail itself starts, so at least one id follows it.
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start] == first and ids[start : start + n] == tail:
                return ids[start + n : start + n + max_tokens]
    return []
