"""Feeds concurrent HTTP requests to one engine in batches, one `generate` call at a time.

Requests are queued from the event loop; a single worker thread takes what is waiting (up
to `max_batch`, waiting `wait_s` after the first for company), runs one
`engine.generate(batch)` and resolves each request's future the moment the engine yields
its completion. Requests that arrive while a batch runs form the next batch. One worker
because the engines are not thread-safe (the hf engine owns one model and one KV cache).

An engine that admits requests into a running call (`admits = True`, hf: `generate(more=...)`)
is handed what arrives meanwhile, up to `max_batch` in flight, so a request that comes while a
batch runs joins it at the engine's next refill instead of waiting for the whole batch to end
(a stream's first token would otherwise wait for the slowest row of the batch before it). Jobs
that arrive meanwhile run then too, between two decode steps.

A request may carry `on_tokens(ids)`: an engine that streams (`streams = True`, hf) calls it
with the ids generated so far after each decode step, so a streamed reply goes out token by
token. Other work on the engine (scoring a prompt's logprobs, serve/scoring.py) goes through
`call`, run by the same worker between batches.
"""

from __future__ import annotations

import collections
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Callable, cast

from arlecli.safeio import terminal_text
from arlecli.engine.base import Completion, Engine, GenerationRequest
from arlecli.errors import UserError

SHUTDOWN = "the server is shutting down"


@dataclass
class Finished:
    """A completion with when its batch started, when it finished, and how big the batch was."""

    completion: Completion
    started_at: float
    finished_at: float
    batch_size: int


@dataclass
class _Item:
    request: GenerationRequest | None  # None: a job (`call`), run alone between batches
    future: Future[Any]
    on_tokens: Callable[[list[int]], None] | None = None
    job: Callable[[], Any] | None = None


class Batcher:
    """Batches requests for `engine`; `submit` returns one future per request.

    Args:
        engine: any engine of the protocol in arlecli.engine.base.
        max_batch: most requests in one generate call (the server's --max-concurrency).
        wait_s: after the first request of an idle spell, how long to wait for more.
    """

    def __init__(self, engine: Engine, max_batch: int = 16, wait_s: float = 0.005) -> None:
        self.engine = engine
        self.max_batch = max(1, max_batch)
        self.wait_s = wait_s
        self.generate_calls = 0
        self.requests_done = 0
        self.cancelled = 0  # requests given up on because their client went away
        self.retried = 0  # requests run again alone because their batch raised
        self.recent_batch_sizes: collections.deque[int] = collections.deque(maxlen=1024)
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self._running: list[_Item] = []
        self._retrying = False  # one request at a time after a failed batch: no newcomers join
        # What this engine's generate takes (a subclass may override it without the keywords);
        # `streams`: requests' on_tokens hooks are fed token by token.
        import inspect

        try:
            takes = set(inspect.signature(engine.generate).parameters)
        except (TypeError, ValueError):
            takes = set()
        self.streams = bool(getattr(engine, "streams", False)) and "on_tokens" in takes
        self._admits = bool(getattr(engine, "admits", False)) and "more" in takes
        self._thread = threading.Thread(target=self._run, name="arle-batcher", daemon=True)
        self._thread.start()

    def submit(
        self, requests: list[GenerationRequest], on_tokens: list[Callable[[list[int]], None] | None] | None = None
    ) -> list[Future[Finished]]:
        """Queue `requests`; each future resolves to a Finished or raises the engine's error.
        Cancelling a future before its batch starts drops the request. `on_tokens[i]`, where
        given, sees request i's ids so far after each step (engines that stream only; it runs
        in the worker thread and must be quick)."""
        hooks = on_tokens or [None] * len(requests)
        items = [_Item(r, Future(), hook) for r, hook in zip(requests, hooks)]
        self._put(items)
        return [item.future for item in items]

    @property
    def running(self) -> int:
        """How many requests the batch now generating holds (0 between batches)."""
        return len(self._running)

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn()` in the worker thread, alone, between batches (it may use the engine);
        the future holds its result or its exception."""
        item = _Item(None, Future(), job=fn)
        self._put([item])
        return item.future

    def _put(self, items: list[_Item]) -> None:
        with self._lock:  # so close() cannot miss an item put after it drained the queue
            if self._closed:
                raise RuntimeError(SHUTDOWN)
            for item in items:
                self._queue.put(item)

    def cancel(self, futures: list[Future[Finished]]) -> int:
        """Give up on the requests of `futures` (their client went away); returns how many
        were still queued or generating.

        A queued request is dropped before its batch starts. One already generating is cut
        short: its max_tokens drops to 1, and the hf engine, which reads its rows' params at
        every decode step, ends the row (and frees its KV cache) at the next step, leaving
        the rest of the batch running. (The engine protocol has no cancel call; an engine
        that reads params only at the start, as vLLM's does, finishes the row as asked.)
        """
        stopped = 0
        # Under the lock: a batch moves its items from queued to running under it too, so
        # none slips between "could not cancel" and "is not running yet".
        with self._lock:
            running = {id(it.future): it for it in self._running}
            for future in futures:
                if future.cancel():
                    stopped += 1
                    continue
                item = running.get(id(future))
                if item is not None and item.request is not None and not future.done():
                    # An int store is atomic; the worker thread sees it at its next step.
                    item.request.params.max_tokens = 1
                    stopped += 1
            self.cancelled += stopped
        return stopped

    def close(self, timeout: float | None = 30.0) -> bool:
        """Stop: every request not answered yet, queued or in the running batch, fails at once
        with a shut-down error (its client gets a 503 instead of waiting). Returns True if the
        worker thread ended within `timeout`; False while a generate call still runs (the engine
        is busy, and cannot be interrupted mid-batch)."""
        error = RuntimeError(SHUTDOWN)
        item: _Item | None
        with self._lock:
            self._closed = True
            for item in self._running:
                _settle(item.future, exc=error)
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None and item.future.set_running_or_notify_cancel():
                    item.future.set_exception(error)
            self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if item.job is not None:
                self._run_job(item)
                continue
            batch = [item]
            deadline = time.monotonic() + self.wait_s
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # handle the batch in hand, then stop
                    break
                if item.job is not None:  # after this batch, in queue order
                    self._run_batch(batch)
                    batch = []
                    self._run_job(item)
                    break
                batch.append(item)
            if batch:
                self._run_batch(batch)

    def _run_job(self, item: _Item) -> None:
        if not item.future.set_running_or_notify_cancel():
            return
        if self._closed:
            item.future.set_exception(RuntimeError(SHUTDOWN))
            return
        try:
            result = item.job()  # type: ignore[misc]
        except Exception as exc:
            _settle(item.future, exc=exc)
        else:
            _settle(item.future, result)

    def _run_batch(self, batch: list[_Item]) -> None:
        with self._lock:
            # Requests whose client went away (future cancelled) are dropped, not generated.
            live = [it for it in batch if it.future.set_running_or_notify_cancel()]
            if self._closed:
                for it in live:
                    it.future.set_exception(RuntimeError(SHUTDOWN))
                return
            self._running = live
        if not live:
            return
        try:
            self._generate(live)
        except Exception:
            pending = [it for it in live if not it.future.done()]
            if len(live) == 1:
                self._fail(pending)
            else:
                # One bad request (say, a prompt the tokenizer rejects) must not fail its batch
                # mates: retry the unfinished ones alone, so only the culprit gets the error.
                # That is slow (one call each), so the app refuses what it knows the engine would
                # raise on before it is batched (app._fit_context).
                self.retried += len(pending)
                self._retrying = True
                try:
                    for it in pending:
                        if self._closed:
                            break
                        try:
                            self._generate([it])
                        except Exception:
                            self._fail([it])
                finally:
                    self._retrying = False
        finally:
            with self._lock:
                self._running = []

    def _generate(self, items: list[_Item]) -> None:
        self.generate_calls += 1
        started = time.time()
        # cast: a batch holds requests only (a job, whose request is None, runs alone in _run_job).
        requests = cast(list[GenerationRequest], [it.request for it in items])
        kwargs: dict[str, Any] = {}
        if self.streams:

            def on_tokens(i: int, ids: list[int]) -> None:
                hook = items[i].on_tokens
                if hook is not None:
                    hook(ids)

            kwargs["on_tokens"] = on_tokens
        if self._admits and not self._retrying:
            kwargs["more"] = lambda: self._more(items)
        stream = self.engine.generate(requests, **kwargs)
        size = len(items)
        try:
            for i, completion in stream:
                _settle(items[i].future, Finished(completion, started, time.time(), size))
                self.requests_done += 1
                if i >= size:  # one that joined: let go of it (a busy server's call may run for hours)
                    items[i] = _DONE
        finally:
            self.recent_batch_sizes.append(len(items))  # the requests this call served, joined ones included
        for it in items:
            if not it.future.done():
                _settle(it.future, exc=RuntimeError(f"engine {self.engine.name} returned no completion"))

    def _more(self, items: list[_Item]) -> list[tuple[int, GenerationRequest]]:
        """Requests queued since `items` started, appended to it (their index is their place
        there), while fewer than `max_batch` are unfinished; jobs met on the way run now."""
        out: list[tuple[int, GenerationRequest]] = []
        unfinished = sum(not it.future.done() for it in items[-self.max_batch * 4 :])  # the finished are mostly behind
        while unfinished < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:  # closing: leave the sentinel for the worker loop
                self._queue.put(None)
                break
            if item.job is not None:
                self._run_job(item)
                continue
            with self._lock:
                if not item.future.set_running_or_notify_cancel():
                    continue  # its client went away while it waited
                if self._closed:
                    item.future.set_exception(RuntimeError(SHUTDOWN))
                    continue
                # `items` is the running batch's list (self._running): cancel() sees it at once.
                items.append(item)
            assert item.request is not None
            out.append((len(items) - 1, item.request))
            unfinished += 1
        return out

    def _fail(self, items: list[_Item]) -> None:
        exc = sys.exc_info()[1]
        assert exc is not None
        if not isinstance(exc, UserError):  # a bug or a device error: leave a trace in the server log
            # Escaped: the message may quote a prompt, which must not drive the log's terminal.
            sys.stderr.write(terminal_text(traceback.format_exc()))
        for it in items:
            _settle(it.future, exc=exc)


# What a joined request's place in a running batch holds once it is answered.
_DONE = _Item(None, Future())
_DONE.future.cancel()


def _settle(future: Future[Finished], result: Finished | None = None, exc: BaseException | None = None) -> None:
    """Resolve a running future unless close() already failed it (the two race by design)."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:
        pass
