"""`arle runs list|show` and `arle compare`: look at run directories and pair two of them.

Reading is rundir's (find_runs, describe, load_eval) and the statistics are compare.py's;
this module only prints. Nothing here writes to a run directory.

Everything a run holds (completions, ids, model and benchmark names, paths) was written by a
model or by whoever made the folder: it is printed through cli/output (terminal_text, and
`plain` for table cells, so neither control characters nor Rich markup in it take effect).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, List, Optional

import typer

from arlecli.cli.output import Column, console, err_console, plain, print_json, print_lines, print_table
from arlecli.errors import UserError
from arlecli.records import Results, RunDir, Sample

app = typer.Typer(help="List and inspect run directories.", no_args_is_help=True)

# results.json keys printed as the metrics table and header; any other key (the efficiency,
# cost and consistency blocks, and whatever later versions add) is printed as it stands.
_RESULTS_CORE = {
    "benchmark",
    "card_version",
    "model",
    "split",
    "num_samples",
    "metrics",
    "n_tasks",
    "n_samples",
    "groups",
}


def _num(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def _stat_text(value: float | None, stderr: float | None) -> str:
    if value is None:
        return "-"
    return f"{_num(value, 3)} ± {_num(stderr, 3)}" if stderr is not None else _num(value, 3)


def _status_text(info: Any) -> str:
    if info.status == "interrupted":
        return "interrupted: resumable" if info.resumable else "interrupted"
    if info.status == "damaged":
        return f"damaged: {info.note}"
    return info.status


def _done_text(info: Any) -> str:
    if info.done is None:
        return "-"
    expected = "?" if info.expected is None else str(info.expected)
    return f"{info.done}/{expected}" + (f" {info.unit}" if info.unit in ("steps", "rounds") else "")


@app.command("list")
def list_command(
    directory: Optional[Path] = typer.Argument(None, help="Where to look (default: ./runs), searched recursively."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """List the runs under DIR: kind, benchmark, model, accuracy ± stderr, progress, status, start, path."""
    from arlecli import rundir

    base = directory if directory is not None else rundir.RUNS
    if not base.is_dir():
        if directory is not None:
            raise UserError(f"{base} is not a folder; pass the folder that holds your runs (default: ./runs)")
        infos = []  # a fresh project has no ./runs yet: that is no error
    else:
        infos = [rundir.describe(p) for p in rundir.find_runs(base)]
    if as_json:
        print_json([i.as_dict() for i in infos])
        return
    out = console()
    if not infos:
        out.print(f"no runs under {base} (arle eval and arle train write them there)", markup=False, highlight=False)
        return
    columns = [
        Column("kind"),
        Column("benchmark", "bench"),
        Column("model"),
        Column("accuracy ± stderr", "acc"),
        Column("done"),
        Column("status"),
        Column("started"),
        Column("path", key=True),
    ]
    rows = []
    for i in infos:
        metric = _stat_text(i.value, i.stderr) + (
            f" ({i.metric.split('@', 1)[1]})" if i.metric and "@" in i.metric else ""
        )
        rows.append(
            [
                str(v)
                for v in (
                    i.kind,
                    i.benchmark or "-",
                    i.model or "-",
                    metric,
                    _done_text(i),
                    _status_text(i),
                    i.started or "-",
                    i.path,
                )
            ]
        )
    print_table(out, columns, rows, title=f"{len(infos)} runs under {base}")


def _flat(prefix: str, value: Any) -> list[tuple[str, Any]]:
    """Nested dicts as dotted keys, so any block results.json holds prints as key: value lines."""
    if isinstance(value, dict):
        rows: list[tuple[str, Any]] = []
        for key, sub in value.items():
            rows += _flat(f"{prefix}.{key}" if prefix else str(key), sub)
        return rows
    return [(prefix, value)]


def _print_blocks(out: Any, data: dict[str, Any], skip: set[str]) -> None:
    for name, block in data.items():
        if name in skip:
            continue
        if isinstance(block, dict):
            out.print(f"{name}:", markup=False, highlight=False)
            for key, value in _flat("", block):
                text = _num(value) if isinstance(value, (int, float)) else json.dumps(value, default=str)
                out.print(f"  {key}: {text}", markup=False, highlight=False)
        else:
            out.print(f"{name}: {json.dumps(block, default=str)}", markup=False, highlight=False)


def _one_line(text: Any, width: int = 160) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[:width] + "…"


def _thinking_line(sample: Sample) -> str | None:
    """A sample's thinking as one line, with its token count and whether it was cut; None when
    the model did not think."""
    thinking = sample.thinking
    if not isinstance(thinking, str):
        return None
    tokens = sample.thinking_tokens
    about = [f"{tokens:,} tokens"] if isinstance(tokens, int) and not isinstance(tokens, bool) else []
    if sample.thinking_cut:
        about.append("cut: no answer")
    return f"    thinking{' (' + ', '.join(about) + ')' if about else ''}: {_one_line(thinking)}"


def _show_eval(run_dir: Path, failed: int, as_json: bool) -> None:
    from arlecli import rundir

    run = rundir.load_eval(run_dir)
    info = rundir.describe(run_dir)
    r, res = run.results, run.results.to_json()
    wrong = [s for s in run.samples if not s.correct]
    if as_json:
        print_json(
            {
                "info": info.as_dict(),
                "meta": run.meta.to_json(),
                "results": res,
                "failed": [s.to_json() for s in wrong[:failed]],
            }
        )
        return
    from rich.table import Table

    out = console()
    print_lines(
        out, [str(r.benchmark), str(r.model), f"split {r.split}", f"{r.n_tasks} tasks", f"{r.n_samples} samples"]
    )
    print_lines(out, [f"status: {_status_text(info)}", f"started {info.started or '-'}", str(run_dir)])
    if run.meta.command:
        out.print("command: " + " ".join(map(str, run.meta.command)), markup=False, highlight=False)
    table = Table()
    for col, justify in (
        ("group", "left"),
        ("metric", "left"),
        ("value", "right"),
        ("± stderr", "right"),
        ("n", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for group, metrics in [("all", r.metrics), *r.groups.items()]:
        for name, stat in metrics.items():
            table.add_row(
                plain(group), plain(name), _num(stat.get("value")), _num(stat.get("stderr")), _num(stat.get("n"))
            )
    out.print(table)
    _print_blocks(out, res, _RESULTS_CORE)
    if wrong and failed:
        out.print(f"failed samples (first {min(failed, len(wrong))} of {len(wrong)}):", markup=False, highlight=False)
        for s in wrong[:failed]:
            out.print(
                f"  {s.id}  target {_one_line(s.target, 60)}  extracted "
                f"{_one_line(s.extracted, 60)}  finish {s.finish_reason}",
                markup=False,
                highlight=False,
            )
            thinking = _thinking_line(s)
            if thinking is not None:  # the thought above its answer, dimmed: context, not the answer
                out.print(thinking, markup=False, highlight=False, style="dim")
            label = "answer" if thinking is not None else "completion"
            out.print(f"    {label}: {_one_line(s.completion)}", markup=False, highlight=False)
    elif not wrong:
        out.print("failed samples: none", highlight=False)


def _show_train(run_dir: Path, as_json: bool) -> None:
    from arlecli import rundir
    from arlecli.results import RESULTS, read_json

    files = RunDir(run_dir)
    info = rundir.describe(run_dir)
    meta = rundir.read_meta(run_dir)
    summary = read_json(files.summary) if files.summary.exists() else None
    evals = {p.name: read_json(p / RESULTS) for p in rundir.held_out_dirs(run_dir) if (p / RESULTS).exists()}
    steps = files.read_metrics()
    if as_json:
        print_json(
            {
                "info": info.as_dict(),
                "meta": meta.to_json(),
                "summary": summary,
                "evals": evals,
                "last_step": steps[-1] if steps else None,
            }
        )
        return
    from rich.table import Table

    out = console()
    out.print(
        f"train · {meta.benchmark} · {meta.model} · {meta.algo} · {_done_text(info)}", markup=False, highlight=False
    )
    note = f" ({info.note})" if info.note and info.status != "damaged" else ""
    out.print(
        f"status: {_status_text(info)}{note} · started {info.started or '-'} · {run_dir}", markup=False, highlight=False
    )
    if evals:
        table = Table(title="held-out evaluations")
        for col in ("eval", "accuracy", "± stderr", "tasks", "path"):
            table.add_column(col)
        for label, res in evals.items():
            held = Results.from_json(res if isinstance(res, dict) else {})
            value, stderr = held.stat("accuracy")
            table.add_row(plain(label), _num(value), _num(stderr), _num(held.n_tasks), plain(files.eval_dir(label)))
        out.print(table)
    if steps:
        last = steps[-1]
        keys = [k for k in ("step", "reward", "accuracy", "kl", "loss", "tokens_per_second") if k in last]
        out.print("last logged step: " + "  ".join(f"{k} {_num(last[k])}" for k in keys), markup=False, highlight=False)
    if isinstance(summary, dict):
        _print_blocks(out, {"summary": {k: v for k, v in summary.items() if k != "evals"}}, set())
    if len(evals) > 1:
        labels = list(evals)
        root = files.held_out
        # soft_wrap: a long path must not be broken across lines in a command meant to be copied.
        out.print(
            f"before/after: arle compare {root / labels[0]} {root / labels[-1]}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


@app.command("show")
def show_command(
    run: Path = typer.Argument(..., help="A run directory (an eval run, a training run, or RUN/eval/step-N)."),
    failed: int = typer.Option(5, "--failed", min=0, help="How many failed samples to print."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Show one run: metrics with stderr, groups, efficiency/cost blocks and the first failed samples
    (a training run: its held-out evals, last logged step and summary)."""
    from arlecli import rundir

    meta = rundir.read_meta(run)
    if meta.is_training:
        _show_train(run, as_json)
    else:
        _show_eval(run, failed, as_json)


def _print_comparison(cmp: Any, flips: int) -> None:
    out = console()
    extra = [f"{n} only in {side}" for n, side in ((cmp.only_a, "A"), (cmp.only_b, "B")) if n]
    print_lines(out, [cmp.benchmark, f"split {cmp.split}", f"{cmp.shared} shared tasks", *extra])
    print_lines(out, [f"A: {cmp.run_a}", f"({cmp.model_a})"], sep=" ")
    print_lines(out, [f"B: {cmp.run_b}", f"({cmp.model_b})"], sep=" ")
    columns = [
        Column("group", key=True),
        Column("metric", key=True),
        Column("A", justify="right"),
        Column("B", justify="right"),
        Column("B - A", "B-A", "right"),
        Column("± stderr", "±", "right"),
        Column("95% CI", "CI", "right"),
        Column("won/lost/tied", "W/L/T", "right"),
        Column("McNemar p", "p", "right"),
    ]
    rows = []
    for group, metrics in [("all", cmp.metrics), *cmp.groups.items()]:
        for m in metrics:
            ci = "-" if not math.isfinite(m.stderr) else f"[{m.ci_low:+.4f}, {m.ci_high:+.4f}]"
            rows.append(
                [
                    str(group),
                    str(m.metric),
                    _num(m.a),
                    _num(m.b),
                    f"{m.diff:+.4f}",
                    _num(m.stderr),
                    ci,
                    f"{m.won}/{m.lost}/{m.tied}",
                    _num(m.mcnemar_p),
                ]
            )
    print_table(
        out,
        columns,
        rows,
        caption="B - A, paired over shared tasks; won/lost/tied (W/L/T): tasks where B scored higher/lower/same",
    )
    for label, ids in (("B right, A wrong", cmp.gained), ("A right, B wrong", cmp.lost)):
        shown = ids[:flips] + ([f"... ({len(ids) - flips} more)"] if len(ids) > flips else []) or ["-"]
        print_lines(out, [f"{label} ({len(ids)}): {shown[0]}", *shown[1:]], sep=", ", indent="  ")
    _print_compute(cmp.compute, [None, next((m for m in cmp.metrics if m.metric == "accuracy"), None)], ["A", "B"])
    for warning in cmp.warnings:
        err_console().print(f"warning: {warning}", markup=False, highlight=False)


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _print_compute(points: list[Any], diffs: list[Any], labels: list[str]) -> None:
    """Accuracy against compute, one row per run: accuracy, thinking and completion tokens per
    sample (thinking columns only when a run thought) and the paired accuracy difference
    against the first run."""
    if not points:
        return
    thought = any(p.thought for p in points)
    columns = [Column("run", key=True), Column("accuracy", "acc", "right"), Column("± stderr", "±", "right")]
    if thought:
        columns += [Column("thinking tokens", "think", "right"), Column("cut", justify="right")]
    columns += [
        Column("completion tokens", "compl", "right"),
        Column("total completion", "total", "right"),
        Column("budget", justify="right"),
        Column("accuracy - first", "vs first", "right"),
    ]
    rows = []
    for label, p, diff in zip(labels, points, diffs):
        budget = "/".join(str(b) for b in (p.max_thinking_tokens, p.max_tokens) if b is not None) or "-"
        row = [str(label), _num(p.accuracy), _num(p.stderr)]
        if thought:
            row += [_tokens(p.thinking_tokens), "-" if p.cut_share is None else f"{p.cut_share:.1%}"]
        row += [
            _tokens(p.completion_tokens),
            _num(p.completion_tokens_total),
            budget,
            "-" if diff is None else f"{diff.diff:+.4f} ± {_num(diff.stderr)}",
        ]
        rows.append(row)
    print_table(
        console(),
        columns,
        rows,
        title="accuracy against compute" if thought else "accuracy and tokens",
        caption="tokens are means per sample; vs first: accuracy - the first run's, paired over shared tasks",
    )


def compare_command(
    runs: List[Path] = typer.Argument(
        ..., help="Eval runs: A (the baseline, e.g. RUN/eval/step-0), B, and optionally more (each compared with A)."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Compare runs of different benchmarks, splits or --data files anyway (on the task ids they share).",
    ),
    flips: int = typer.Option(20, "--flips", min=0, help="How many flipped task ids to print per direction."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Compare two eval runs task by task: per-metric difference B - A with paired stderr and 95%
    interval, exact McNemar p-value, tasks won/lost/tied and the ones that flipped, per group,
    and each run's accuracy against its tokens (thinking and completion). Given more runs (the
    same model at several thinking budgets), print the accuracy-vs-compute curve: one row per
    run, each paired with the first."""
    from arlecli.compare import compare_runs, compute_curve

    if len(runs) < 2:
        raise UserError("pass two eval runs to compare (A, then B), or more for the accuracy-vs-compute curve")
    result = compare_runs(runs[0], runs[1], force=force) if len(runs) == 2 else compute_curve(runs, force=force)
    if as_json:
        print_json(result.as_dict())
    elif len(runs) == 2:
        _print_comparison(result, flips)
    else:
        _print_curve(result)


def _print_curve(curve: Any) -> None:
    out = console()
    first = curve.pairs[0]
    print_lines(out, [first.benchmark, f"split {first.split}", f"{len(curve.points)} runs, each paired with the first"])
    labels = [chr(ord("A") + i) if i < 26 else str(i + 1) for i in range(len(curve.points))]
    for label, point in zip(labels, curve.points):
        print_lines(out, [f"{label}: {point.run}", f"({point.model})"], sep=" ")
    _print_compute(curve.points, [curve.accuracy_diff(i) for i in range(len(curve.points))], labels)
    for pair in curve.pairs:
        for warning in pair.warnings:
            err_console().print(f"warning: {pair.run_b}: {warning}", markup=False, highlight=False)
