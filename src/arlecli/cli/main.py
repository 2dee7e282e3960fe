"""The `arle` command: a Typer app with one sub-app per command group.

Heavy libraries (torch, transformers, datasets) are imported only inside the commands
that need them, so `arle --help` and `arle bench list` answer at once.
"""

from __future__ import annotations

import sys

import typer

from arlecli import __version__
from arlecli.errors import UserError

app = typer.Typer(
    name="arle",
    help="Evaluate and RL-train LLMs and agents on benchmarks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"arle {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """Evaluate and RL-train LLMs and agents on benchmarks."""


def _register() -> None:
    if app.registered_groups:  # mounted already (tests call this once per use)
        return
    from arlecli.cli import bench, data, eval as eval_cmd, model, report, runs, serve, train

    app.add_typer(model.app, name="model")
    app.add_typer(bench.app, name="bench")
    app.add_typer(data.app, name="data")
    app.add_typer(runs.app, name="runs")
    app.command("eval")(eval_cmd.eval_command)
    app.command("serve")(serve.serve_command)
    app.command("train")(train.train_command)
    app.command("report")(report.report_command)
    app.command("compare")(runs.compare_command)


def main() -> None:
    """Console-script entry point: user mistakes print one line and exit 2."""
    _register()
    try:
        # standalone_mode=False: typer returns exit codes (Ctrl-C becomes 130) instead of
        # exiting, and lets UserError through to us.
        rc = app(standalone_mode=False)
    except UserError as exc:
        from arlecli.cli.output import terminal_text

        typer.echo(f"error: {terminal_text(str(exc))}", err=True)  # it may quote a card, a row, a path
        sys.exit(2)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors (bad option values)
        show = getattr(exc, "show", None)
        if show is None:
            raise
        show()
        sys.exit(2)
    if rc == 130:
        typer.echo("interrupted: finished samples are saved; rerun with --resume to continue", err=True)
    sys.exit(rc if isinstance(rc, int) else 0)
