"""`arle report RUN...`: write one self-contained HTML report of one or more run directories."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from arlecli.cli.output import console


def report_command(
    runs: Optional[List[Path]] = typer.Argument(
        None,
        help="Run directories (from `arle eval` or `arle train`); "
        "several are compared side by side. Default: the newest run "
        "under ./runs.",
    ),
    output: Optional[Path] = typer.Option(
        None,
        "--output",
        "-o",
        help="The HTML file to write (default: RUN/report.html for one run, ./report.html for several).",
    ),
    all_tasks: bool = typer.Option(
        False,
        "--all-tasks",
        help="Several runs: chart each on all of its own tasks "
        "(default: on the tasks all of them hold, a paired comparison).",
    ),
) -> None:
    """Write an HTML report that opens offline: metrics, charts, efficiency and every sample."""
    from arlecli.report import write_report

    out = write_report(runs or [newest_run()], output, all_tasks=all_tasks)
    console().print(
        f"report: {out}  (open file://{out.resolve()} in a browser; it needs no network)",
        highlight=False,
        soft_wrap=True,
    )


def newest_run(base: Path = Path("runs")) -> Path:
    """The run under `base` whose files were written last (the run that just finished)."""
    from arlecli import rundir
    from arlecli.errors import UserError
    from arlecli.records import RunDir

    found = rundir.find_runs(base) if base.is_dir() else []
    if not found:
        raise UserError(f"no run under {base}/; pass a run directory: arle report RUN")

    def written(run: Path) -> float:
        files = RunDir(run)
        return max(p.stat().st_mtime for p in (files.meta, files.results, files.summary) if p.exists())

    return max(found, key=written)


def report_hint(run_dir: Path) -> str:
    """The line `arle eval` and `arle train` end with: the command that shows this run."""
    import shlex

    return f"see it: arle report {shlex.quote(str(run_dir))}"
