"""Asynchronous rollouts (`--max-staleness N`): the rollouts of steps s+1 .. s+N are sampled
while step s updates the policy.

With N = 0 (the default) training is synchronous and nothing here runs. With N > 0, whenever
a step takes its rollouts (`Ahead.episodes`), the rollouts of the next N steps are queued on
one worker thread, each sampled from a snapshot of the policy's weights as they are now
(version v = the optimizer steps taken). The trainer goes on with its update while the
worker generates, so in the steady state step s trains on rollouts of version s - N, as
verl's one-step-off trainer (N = 1) and TRL's AsyncGRPO (`max_staleness`) do:

    the rollouts of step s = `arle eval --seed SEED+s ...` on the tasks of step s, for the
                             weights of version v (s - N <= v <= s)

(the parity contract of train.batches, with the version's weights in place of step s's). A
rollout older than N steps is never trained on: a queued job whose version fell more than N
behind, or whose tasks are not the ones the trainer asks for (a schedule the plan did not
foresee), is dropped and the step samples from the live weights instead. The loss corrects for
the lag with the rollouts' own sampling logprobs (truncated importance sampling: `is_weights`).

Snapshots are policy modules copied once and refilled in place (one per queued step, N at
most; a peft adapter merged into them, train.weights), so the worker never reads weights the
optimizer is writing. On the hf backend the worker generates with the snapshot itself; on the
vllm backend the snapshot's weights are loaded into the one vLLM engine before its job (jobs
take turns on that engine).

Exact resume: a checkpoint holds the queued rollouts (`state`/`restore`, a JSON file beside
the trainer's state), waited for before the checkpoint is written; a resumed run takes them
instead of regenerating, so it trains on the same rollouts, with the same losses, as an
uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from arlecli import safeio
from arlecli.errors import UserError
from arlecli.results import write_json
from arlecli.types import Episode, Turn

from arlecli.train.batches import Rollouts, numbered, unwrap
from arlecli.train.weights import GenerationCopy, copies_fit

if TYPE_CHECKING:
    import torch

STATE_FILE = "arle_rollouts_ahead.json"  # in a checkpoint folder: the queued rollouts (rank 0's)


def state_file() -> str:
    """This process's file of queued rollouts in a checkpoint folder: every rank of an
    accelerate/torchrun launch queues its own rollouts, so each writes its own (as TRL's
    rng_state_{rank}.pth); rank 0, and a single process, write STATE_FILE."""
    rank = int(os.environ.get("RANK", "0") or 0)
    return STATE_FILE if rank == 0 else f"arle_rollouts_ahead_rank{rank}.json"


MAX_STALENESS = 8  # steps ahead the queue may hold (each one is a copy of the policy's weights)


@dataclass
class Job:
    """The rollouts of one future step, queued or done."""

    step: int  # the optimizer step that trains on them (their seed is SEED + step)
    version: int  # the optimizer steps the weights they are sampled from had taken
    indices: list[int]
    future: Future[list[Episode]]


@dataclass
class Clock:
    """When the rollout engine worked and when the trainer waited for it (monotonic seconds),
    for the idle shares of each step."""

    busy: list[tuple[float, float]] = field(default_factory=list)
    waits: list[tuple[float, float]] = field(default_factory=list)
    mark: float = field(default_factory=time.monotonic)
    running: float | None = None  # when the job the engine is on began (None: none is)

    def shares(self, now: float | None = None) -> dict[str, float]:
        """The share of the time since the last call that the engine and the trainer sat idle.
        A job still running counts up to `now` (the next step's rollouts usually are, when the
        step logs), and the rest of it in the next call's share."""
        now = time.monotonic() if now is None else now
        start, self.mark = self.mark, now
        span = max(now - start, 1e-9)
        running = self.running
        busy = overlap(self.busy + ([(running, now)] if running is not None else []), start, now)
        waited = overlap(self.waits, start, now)
        self.busy = [(a, b) for a, b in self.busy if b > now]
        self.waits = [(a, b) for a, b in self.waits if b > now]
        return {"idle/engine_share": max(0.0, 1.0 - busy / span), "idle/trainer_share": min(1.0, waited / span)}


def overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of `spans` (open ones end at `end`) that fall inside [start, end]."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


class Ahead:
    """The queue of rollouts sampled ahead of their step (module docstring).

    `plan(step)` is the task indices the trainer will ask for at `step` (None: unknown, or
    past the end); `max_step` is the run's last step (nothing is queued for steps at or after
    it)."""

    def __init__(
        self,
        rollouts: Rollouts,
        max_staleness: int,
        plan: Callable[[int], list[int] | None],
        max_step: int,
    ) -> None:
        self.rollouts = rollouts
        self.max_staleness = max_staleness
        self.plan = plan
        self.max_step = max_step
        self.jobs: dict[int, Job] = {}
        self.clock = Clock()
        self.last: dict[str, float] = {}  # the latest step's staleness (metrics)
        self.unforeseen = 0  # steps whose tasks the plan did not foresee (sampled synchronously)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arle-rollouts")
        self._snapshots: dict[int, Any] = {}
        self._lock = threading.Lock()

    # -- the trainer's side ---------------------------------------------------------------

    def episodes(self, indices: list[int], step: int, model: Any, tokenizer: Any) -> list[Episode]:
        """The rollouts of `step` for `indices`: the queued ones when they are the tasks asked
        for, else sampled now from `model`; then the next steps are queued from `model`'s
        weights. Each episode carries its policy version (`Episode.policy_version`)."""
        job = self.jobs.pop(step, None)
        started = time.monotonic()
        if job is not None and job.indices == list(indices) and step - job.version <= self.max_staleness:
            episodes = job.future.result()
            version = job.version
        else:
            if job is not None:
                job.future.cancel()
                self.unforeseen += 1
            version = step
            episodes = self._run(list(indices), step, version, model, tokenizer)
        self.clock.waits.append((started, time.monotonic()))
        self.last = {"staleness/mean": float(step - version), "staleness/max": float(step - version)}
        for ahead in range(step + 1, step + 1 + self.max_staleness):
            self.submit(ahead, step, model, tokenizer)
        return episodes

    def submit(self, step: int, version: int, model: Any, tokenizer: Any) -> None:
        """Queue the rollouts of `step` from `model`'s weights now (version `version`), unless
        they are queued already, unknown or past the run's end."""
        if step in self.jobs or step >= self.max_step:
            return
        indices = self.plan(step)
        if indices is None:
            return
        snapshot = self._snapshot(step, model)
        future = self._pool.submit(self._run, list(indices), step, version, snapshot, tokenizer)
        self.jobs[step] = Job(step, version, list(indices), future)

    def check_memory(self, model: Any) -> None:
        """Refuse (one line) a queue whose weight copies would not fit beside the policy."""
        fits, need, free = copies_fit(unwrap(model), self.max_staleness)
        if not fits and free is not None:
            raise UserError(
                f"--max-staleness {self.max_staleness} keeps {self.max_staleness} copies of the policy's weights "
                f"({need / 2**30:.1f} GiB) beside it and {free / 2**30:.1f} GiB is free: lower --max-staleness"
            )

    def _snapshot(self, step: int, model: Any) -> Any:
        """A copy of `model`'s weights that no optimizer writes (a peft adapter merged:
        train.weights): slot step % N, free because the job that used it (step - N) was taken
        before this one is queued."""
        slot = step % self.max_staleness
        live = unwrap(model)
        copy_of = self._snapshots.get(slot)
        if copy_of is None:
            if not self._snapshots:
                self.check_memory(live)
            copy_of = self._snapshots[slot] = GenerationCopy()
        return copy_of.of(live)

    def _run(self, indices: list[int], step: int, version: int, model: Any, tokenizer: Any) -> list[Episode]:
        with self._lock:  # one job at a time on the engine (the fallback too)
            started = self.clock.running = time.monotonic()
            try:
                episodes = self.rollouts.sample(numbered(indices), step, model, tokenizer, version)
            finally:
                self.clock.busy.append((started, time.monotonic()))
                self.clock.running = None
        for episode in episodes:
            episode.policy_version = version
        return episodes

    # -- checkpoints ----------------------------------------------------------------------

    def save(self, folder: Path) -> None:
        """Write the queued rollouts into checkpoint `folder` (waiting for them to finish)."""
        jobs = [
            {
                "step": j.step,
                "version": j.version,
                "indices": j.indices,
                "episodes": [to_json(e) for e in j.future.result()],
            }
            for j in sorted(self.jobs.values(), key=lambda j: j.step)
        ]
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / state_file(), {"max_staleness": self.max_staleness, "jobs": jobs})

    def restore(self, folder: Path | None) -> int:
        """Queue the rollouts a checkpoint holds (as done jobs); returns how many steps."""
        path = None if folder is None else Path(folder) / state_file()
        if path is None or not path.is_file():
            return 0
        state = safeio.loads(path.read_bytes())
        for row in state.get("jobs", []):
            future: Future[list[Episode]] = Future()
            future.set_result([from_json(e) for e in row["episodes"]])
            job = Job(int(row["step"]), int(row["version"]), [int(i) for i in row["indices"]], future)
            self.jobs[job.step] = job
        return len(self.jobs)

    def metrics(self) -> dict[str, float]:
        """This step's staleness and the idle shares since the last call (metrics.jsonl)."""
        return {**self.last, **self.clock.shares()}

    def close(self) -> None:
        """Stop the worker (queued jobs are dropped)."""
        for job in self.jobs.values():
            job.future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._snapshots.clear()


def to_json(episode: Episode) -> dict[str, Any]:
    """An episode as plain JSON (a checkpoint's queued rollouts)."""
    return dataclasses.asdict(episode)


def from_json(row: dict[str, Any]) -> Episode:
    """The episode `to_json` wrote."""
    turns = [Turn(**t) for t in row.get("turns", [])]
    return Episode(**{**row, "turns": turns})


def is_weights(
    old: "torch.Tensor", sampled: "torch.Tensor", mask: "torch.Tensor", cap: float
) -> tuple["torch.Tensor", dict[str, float]]:
    """Truncated importance weights min(pi_old / mu, cap) per token: `old` the logprobs of the
    policy the step starts from, `sampled` those of the (stale) policy that sampled the tokens;
    1 where `mask` is 0. Returns the weights and their mean and clip fraction over the masked
    tokens (metrics)."""
    import torch

    ratio = torch.exp((old - sampled).clamp(max=30.0)) * mask + (1 - mask)
    clipped = ratio > cap
    weights = ratio.clamp(max=cap)
    n = mask.sum().clamp(min=1)
    stats = {
        "is_weight/mean": float((weights * mask).sum() / n),
        "is_weight/clip_fraction": float((clipped.float() * mask).sum() / n),
    }
    return weights.detach(), stats
