"""What a long job has done so far, counted as it happens, for the progress display.

An eval's samples can take minutes each (a 20-turn game, a batch of rows that all run to
their token budget and finish together), so counting finished samples alone leaves a
display at 0/N for that long. The Meter also counts model turns as they finish and tokens
as they are generated: `metered(engine, meter)` wraps any engine and counts every
completion it yields (one model turn); an engine that can say more (hf: `streams`, its
`on_tokens` called after each decode step) reports its tokens as they are sampled, so
tokens/s moves while a batch is still running.

Plain counters, written by the job's threads and read by the display's: each update is one
integer addition, and a display that reads a count one step old shows nothing wrong.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


@dataclass
class Meter:
    """Counts of one job: samples (of `total`, `resumed` of them done before this process),
    model turns, generated tokens, and the accuracy of this process's samples."""

    total: int = 0
    done: int = 0
    resumed: int = 0
    correct: int = 0
    turns: int = 0
    tokens: int = 0
    phase: str = "starting"  # what the job does now, shown until the first sample finishes
    started: float = field(default_factory=time.monotonic)
    generating_since: float | None = None  # when the first request went to the engine

    def start(self, total: int, done: int) -> None:
        """The job knows its size: `total` samples, `done` of them finished by an earlier run."""
        self.total, self.done, self.resumed = total, done, done
        self.phase = "generating"
        self.generating_since = time.monotonic()

    def sample(self, correct: bool) -> None:
        """One more sample finished."""
        self.done += 1
        self.correct += bool(correct)

    def add_tokens(self, n: int) -> None:
        """`n` more tokens generated."""
        self.tokens += n

    @property
    def new(self) -> int:
        """Samples finished by this process."""
        return self.done - self.resumed

    def accuracy(self) -> float | None:
        """The share of this process's samples that were correct (None before the first)."""
        return self.correct / self.new if self.new else None

    def generating_s(self) -> float:
        """Seconds since generation began (0 before)."""
        return 0.0 if self.generating_since is None else time.monotonic() - self.generating_since

    def tokens_per_s(self) -> float | None:
        """Generated tokens per second of generation, once there are some."""
        seconds = self.generating_s()
        return self.tokens / seconds if self.tokens and seconds > 0 else None

    def eta_s(self) -> float | None:
        """Seconds left at this process's pace so far; None until a sample has finished."""
        if not self.new or not self.total:
            return None
        return (self.total - self.done) * self.generating_s() / self.new


class MeteredEngine:
    """`engine` (every attribute passed through) whose completions are counted in `meter`:
    each one a model turn; its tokens as the engine samples them where it can say so (an
    engine that `streams` calls `generate(..., on_tokens=fn)`'s fn after each decode step),
    else when the completion arrives."""

    def __init__(self, engine: Any, meter: Meter) -> None:
        self.engine = engine
        self.meter = meter
        self._live = bool(getattr(engine, "streams", False))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, requests: list[Any], *args: Any, **kwargs: Any) -> Iterator[tuple[int, Any]]:
        """The engine's generate, counting each completion as it is yielded."""
        if self._live:
            kwargs["on_tokens"] = self._counter(kwargs.get("on_tokens"))
        for index, completion in self.engine.generate(requests, *args, **kwargs):
            self.meter.turns += 1
            if not self._live:
                self.meter.add_tokens(
                    completion.completion_tokens
                    if completion.completion_tokens is not None
                    else len(completion.token_ids or [])
                )
            yield index, completion

    def _counter(self, then: Callable[[int, list[int]], None] | None) -> Callable[[int, list[int]], None]:
        # Called once per row and decode step, right after the row's new token: one token each.
        def count(index: int, ids: list[int]) -> None:
            self.meter.tokens += 1
            if then is not None:
                then(index, ids)

        return count


def metered(engine: Any, meter: Meter) -> Any:
    """`engine` counting its turns and tokens into `meter` (see MeteredEngine)."""
    return MeteredEngine(engine, meter)
