"""A run directory's files: meta.json, samples.jsonl (append-only), results.json; metric aggregation.
(Their names and records: records.py. Naming run directories, the resume check: rundir.py.)

samples.jsonl is the single source of truth: results.json is always recomputed from it,
so a resumed run and an uninterrupted one aggregate the same lines the same way. A
line is written whole and flushed as each sample finishes; a kill -9 can tear at most
the last line, which `read_samples` drops (and `SampleWriter` truncates) on resume.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from arlecli import efficiency, safeio
from arlecli.efficiency import Prices
from arlecli.errors import UserError
from arlecli.records import RunDir, Sample, samples_of
from arlecli.types import REWARD_ERROR

META, SAMPLES, RESULTS = RunDir.META, RunDir.SAMPLES, RunDir.RESULTS  # the names importers use


# What aggregation reads from every sample; a line without them was not written by arle.
_SAMPLE_KEYS = ("id", "task_id", "correct", "details")


def read_samples(run_dir: Path) -> list[dict[str, Any]]:
    """Every complete sample line as its JSON object (`records.Sample.from_json` types one); a
    torn last line (from a kill mid-write) is ignored.

    A write ends with its newline, so only the last line can be torn, and that one is
    redone. Any other line that is not a sample means the file was damaged or edited:
    that raises UserError naming the file and line, because skipping it (or everything
    after it) would silently redo or lose samples and change the results."""
    path = RunDir(run_dir).samples
    if not path.exists():
        return []
    samples = []
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    with f:
        for n, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                break  # torn tail: the sample was not finished, it will be redone
            try:
                sample = safeio.loads(raw)
            except ValueError:  # broken, not UTF-8, or nested deeper than safeio.MAX_DEPTH: damaged
                sample = None
            if not isinstance(sample, dict) or any(k not in sample for k in _SAMPLE_KEYS):
                raise UserError(
                    f"{path}: line {n} is not a sample (damaged or edited); nothing was changed: "
                    f"repair that line or delete it (its sample is then redone), then rerun"
                )
            samples.append(sample)
    return samples


class SampleWriter:
    """Appends one JSON line per finished sample; safe to call from scoring threads."""

    def __init__(self, run_dir: Path) -> None:
        path = RunDir(run_dir).samples
        self._truncate_torn_tail(path)
        self._f = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    @staticmethod
    def _truncate_torn_tail(path: Path) -> None:
        if not path.exists():
            return
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1  # keep everything up to the last complete line
        if end != len(data):
            with open(path, "r+b") as f:
                f.truncate(end)

    def write(self, sample: Sample) -> None:
        """Append one sample as a whole line and flush it to the OS."""
        line = safeio.dumps(sample.to_json(), default=str) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()

    def close(self) -> None:
        """Flush to disk and close."""
        with self._lock:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file + rename) so a kill never leaves half a file."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(safeio.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """Read a JSON file written by `write_json`; UserError (one line) when it cannot be read,
    is not UTF-8, is not JSON or is nested deeper than safeio.MAX_DEPTH."""
    text = safeio.read_text(path, "run file")
    try:
        return safeio.loads(text)
    except ValueError as exc:
        raise UserError(
            f"cannot read {path}: {safeio.clean_text(str(exc))}; the file is damaged (a full disk, an edit): "
            "restore it, or start again with another --output"
        ) from None


@dataclass
class Stat:
    """A metric's mean over tasks and the standard error of that mean."""

    value: float
    stderr: float
    n: int

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON form. What cannot be estimated (the stderr of fewer than two tasks, anything over
        none) is null, not NaN: strict JSON readers (a browser's JSON.parse) reject NaN, and
        lm-eval writes "N/A" there."""
        return {"value": _finite(self.value), "stderr": _finite(self.stderr), "n": self.n}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def mean_stderr(values: list[float]) -> Stat:
    """Mean and sample standard error (ddof=1), as lm-evaluation-harness reports them."""
    n = len(values)
    if n == 0:
        return Stat(float("nan"), float("nan"), 0)
    mean = sum(values) / n
    if n < 2:
        return Stat(mean, float("nan"), n)
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return Stat(mean, math.sqrt(var / n), n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021): 1 - C(n-c, k) / C(n, k), computed stably."""
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k (tau-bench, Yao et al., 2024): the chance that k samples drawn without replacement
    from a task's n (c of them correct) are all correct, C(c, k) / C(n, k). Needs k <= n."""
    if k > n:
        raise ValueError(f"pass^{k} needs at least {k} samples, got {n}")
    prod = 1.0
    for i in range(k):  # C(c,k)/C(n,k) = prod (c-i)/(n-i), without huge binomials
        prod *= max(c - i, 0) / (n - i)
    return prod


def pass_ks(n: int) -> list[int]:
    """The k values reported for n samples per task: 1, powers of two below n, and n."""
    ks = {1, n}
    k = 2
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def aggregate(
    lines: Iterable[Sample | Mapping[str, Any]],
    metrics: list[str],
    num_samples: int,
    group_by: str | None = None,
    prices: Prices | None = None,
    env_stats: Callable[[list[Sample]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Per-task means (over a task's samples), then mean and stderr over tasks.

    Always reports `accuracy` (the reward's `correct`); each name in `metrics` is read
    from the samples' `details`; with several samples per task, pass@k and pass^k for the k
    values of `pass_ks` (pass^k over the tasks with at least k samples). `group_by` adds the
    same breakdown per group; `reward_errors` counts the samples whose reward raised (only
    when there are any). Then the efficiency blocks (arlecli.efficiency): `tokens`,
    `time`, `agents` (multi-turn runs), the blocks `env_stats` gives (the card's env kind's own:
    `games` for game cards), `consistency` (several samples per task) and `cost` (only with
    `prices`); a block with nothing to report is left out. `lines`: Samples or samples.jsonl
    objects.
    """
    samples = samples_of(lines)
    by_task: dict[str, list[Sample]] = {}
    for s in samples:
        by_task.setdefault(s.task_id, []).append(s)

    def summarize(task_ids: list[str]) -> dict[str, dict[str, float | int | None]]:
        out: dict[str, dict[str, float | int | None]] = {}
        names = ["accuracy", *[m for m in metrics if m != "accuracy" and not m.startswith("pass@")]]
        for name in names:
            per_task = []
            for tid in task_ids:
                vals = [
                    float(s.correct) if name == "accuracy" else float(s.details.get(name, 0.0)) for s in by_task[tid]
                ]
                per_task.append(sum(vals) / len(vals))
            out[name] = mean_stderr(per_task).as_dict()
        ks = pass_ks(num_samples) if num_samples > 1 else [1]
        if num_samples > 1 or any(m.startswith("pass@") for m in metrics):
            for k in ks:
                per_task = [pass_at_k(len(by_task[t]), sum(bool(s.correct) for s in by_task[t]), k) for t in task_ids]
                out[f"pass@{k}"] = mean_stderr(per_task).as_dict()
        if num_samples > 1:
            for k in ks:
                per_task = [
                    pass_hat_k(len(by_task[t]), sum(bool(s.correct) for s in by_task[t]), k)
                    for t in task_ids
                    if len(by_task[t]) >= k
                ]
                out[f"pass^{k}"] = mean_stderr(per_task).as_dict()
        return out

    task_ids = sorted(by_task)
    result: dict[str, Any] = {"metrics": summarize(task_ids), "n_tasks": len(task_ids), "n_samples": len(samples)}
    # Samples whose reward raised are in the metrics as wrong; the count says how many (rewards.score_samples).
    errors = sum(1 for s in samples if REWARD_ERROR in s.detail_map)
    if errors:
        result["reward_errors"] = errors
    if group_by:
        groups: dict[str, list[str]] = {}
        for tid in task_ids:
            group = by_task[tid][0].group
            groups.setdefault(str(group if group is not None else ""), []).append(tid)
        result["groups"] = {g: summarize(ids) for g, ids in sorted(groups.items())}
    blocks = {
        "tokens": efficiency.token_stats(samples),
        "time": efficiency.time_stats(samples),
        "agents": efficiency.agent_stats(samples),
        **(env_stats(samples) if env_stats is not None else {}),  # the env kind's own (a game's `games`)
        "consistency": (
            {"samples_per_task": num_samples, **efficiency.all_agree(by_task, task_ids)} if num_samples > 1 else None
        ),
        "cost": efficiency.cost_stats(samples, len(task_ids), prices),
        "reasoning": efficiency.reasoning_stats(samples),
    }
    result.update({name: block for name, block in blocks.items() if block is not None})
    return result
