"""`<run>/metrics.jsonl`: one JSON line per logged training step, plus throughput.

Each line holds the trainer's logs for that step (reward, reward_std, accuracy, kl, loss,
entropy, completion lengths ...) with `step`, `elapsed_s`, `seconds_per_step` and
`tokens_per_second` added. On resume, lines after the checkpoint's step are dropped first:
those steps run again, and the file keeps one line per step.

`open_reporter` forwards the same lines to TensorBoard, Trackio or W&B for the PPO loop
(TRL's trainers report through their own `report_to`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from arlecli import safeio
from arlecli.errors import UserError
from arlecli.records import RunDir

METRICS_FILE = RunDir.METRICS


def _plain(value: Any) -> Any:
    # Trainer logs hold numpy/torch scalars and NaN; JSON wants plain numbers or null.
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends step lines to metrics.jsonl and works out throughput between them."""

    def __init__(self, run_dir: Path, start_step: int = 0, *, truncate: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        if truncate:  # False on the ranks other than the main one: they never write here
            truncate_metrics(run_dir, start_step)
        self.start = time.monotonic()
        self._last_time = self.start
        self._last_step = start_step
        # A resumed trainer restarts its token counter, so the first delta would be wrong.
        self._last_tokens: float | None = 0.0 if start_step == 0 else None
        self.tags: dict[str, Any] = {}  # added to every line (a staged run's `stage`)

    def restart_clock(self) -> None:
        """Start timing now: model loading and the step-0 evaluation are not step time."""
        self.start = self._last_time = time.monotonic()

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` (a held-out evaluation between steps) out of the next step's time."""
        self._last_time += seconds

    def record(self, step: int, logs: dict[str, Any]) -> dict[str, Any]:
        """Write one line for `step` and return it (what the live view shows)."""
        now = time.monotonic()
        row: dict[str, Any] = {"step": step, **self.tags, **{k: _plain(v) for k, v in logs.items()}}
        row["elapsed_s"] = round(now - self.start, 3)
        steps = step - self._last_step
        if steps > 0:
            row["seconds_per_step"] = round((now - self._last_time) / steps, 4)
        tokens = row.get("num_tokens")
        if isinstance(tokens, (int, float)) and self._last_tokens is not None and now > self._last_time:
            row["tokens_per_second"] = round((tokens - self._last_tokens) / (now - self._last_time), 2)
        self._last_time, self._last_step = now, step
        self._last_tokens = tokens if isinstance(tokens, (int, float)) else None
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(safeio.dumps(row, default=str) + "\n")
        return row


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The complete lines of metrics.jsonl (a torn last line is skipped)."""
    return RunDir(run_dir).read_metrics()


def truncate_metrics(run_dir: Path, after_step: int) -> None:
    """Keep only the lines of steps up to `after_step` (and drop a torn tail)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return
    keep = [r for r in read_metrics(run_dir) if int(r.get("step", 0)) <= after_step]
    path.write_text("".join(safeio.dumps(r, default=str) + "\n" for r in keep), encoding="utf-8")


@dataclass
class Reporter:
    """Where each step's scalar metrics go besides metrics.jsonl."""

    log: Callable[[int, dict[str, Any]], None]
    close: Callable[[], None]


_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def _scalars(row: dict[str, Any]) -> dict[str, float]:
    return {
        f"train/{k}": float(v)
        for k, v in row.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _open_one(name: str, run_dir: Path, config: dict[str, Any]) -> Reporter:
    project = os.environ.get("WANDB_PROJECT" if name == "wandb" else "TRACKIO_PROJECT", "arle")
    if name == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(run_dir / "runs"))  # where TRL's trainers write theirs

        def log_tb(step: int, row: dict[str, Any]) -> None:
            for key, value in _scalars(row).items():
                writer.add_scalar(key, value, step)

        return Reporter(log_tb, writer.close)
    module = importlib.import_module(name)
    if name == "wandb":
        run = module.init(project=project, dir=str(run_dir), name=run_dir.name, config=config)
        return Reporter(lambda step, row: run.log(_scalars(row), step=step), run.finish)
    module.init(project=project, name=run_dir.name, config=config)
    return Reporter(lambda step, row: module.log(_scalars(row), step=step), module.finish)


def open_reporter(report_to: str | list[str] | None, run_dir: Path, config: dict[str, Any]) -> Reporter | None:
    """A reporter for `report_to` (none, tensorboard, trackio, wandb, a list, or "all" = every
    installed one), or None when there is nothing to report to. A named integration whose
    package is missing is a UserError naming the pip install."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "all" in names:
        names = [n for n, pkg in _PACKAGES.items() if importlib.util.find_spec(pkg) is not None]
    reporters = []
    for name in (n for n in names if n != "none"):
        try:
            reporters.append(_open_one(name, Path(run_dir), config))
        except ModuleNotFoundError as exc:
            raise UserError(
                f"--report-to {name} needs the {_PACKAGES[name]} package ({exc.name} is missing): "
                f"pip install {_PACKAGES[name]}"
            ) from None
    if not reporters:
        return None

    def log(step: int, row: dict[str, Any]) -> None:
        for reporter in reporters:
            reporter.log(step, row)

    def close() -> None:
        for reporter in reporters:
            reporter.close()

    return Reporter(log, close)
