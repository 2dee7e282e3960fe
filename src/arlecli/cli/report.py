"""`arle report RUN...`: write one self-contained HTML report of one or more run directories."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from arlecli.cli.output import console


def report_command(
    runs: List[Path] = typer.Argument(..., help="Run directories (from `arle eval` or `arle train`); "
                                      "several are compared side by side."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="The HTML file to write (default: "
                                          "RUN/report.html for one run, ./report.html for several)."),
) -> None:
    """Write an HTML report that opens offline: metrics, charts, efficiency and every sample."""
    from arlecli.report import write_report

    out = write_report(runs, output)
    console().print(f"report: {out}  (open file://{out.resolve()} in a browser; it needs no network)",
                    highlight=False, soft_wrap=True)


def report_hint(run_dir: Path) -> str:
    """The line `arle eval` and `arle train` end with: the command that shows this run."""
    import shlex

    return f"see it: arle report {shlex.quote(str(run_dir))}"
