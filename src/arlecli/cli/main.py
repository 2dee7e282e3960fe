"""The `arle` command: a Typer app with one sub-app per command group.

Heavy libraries (torch, transformers, datasets) are imported only inside the commands
that need them, so `arle --help` and `arle bench list` answer at once.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from arlecli import __version__, package_map
from arlecli.errors import UserError


def _plain_help() -> None:
    """Help that fits any terminal: click's two columns (options, then their help wrapped by
    whole words) instead of Rich's option panels, and no type tokens.

    Why: typer's panels give the option names, short names, negative flags, types and help a
    column each; at 80 columns the help column shrank to ~25 and Rich cut what did not fit
    with `…` (defaults, option names, the model name). The tokens typer adds (`<str>`,
    `<int range>`, `[x>=1]`, `{bench}`) say little the help text does not: a bad value is
    refused in one line that says why. Explicit metavars (SECONDS, N, KEY=VALUE) stay, and
    arguments are named in capitals (`BENCH`). Applied to typer's classes once, so every
    command of every group gets it."""
    from typer import core
    from typer._click import _textwrap

    if getattr(core, "_arle_plain_help", False):
        return
    core._arle_plain_help = True  # type: ignore[attr-defined]
    core.HAS_RICH = False  # click's formatter (typer reads this flag at each help)
    core._TyperParameter.display_type = lambda self, ctx: ""  # type: ignore[method-assign]
    for cls in (core.TyperArgument, core.TyperOption):
        cls._get_number_range_help_str = lambda self: None  # type: ignore[method-assign]
    core.TyperArgument.display_name_raw = property(  # type: ignore[method-assign,assignment]
        lambda self: self.metavar if self.metavar is not None else (self.name or "").upper()
    )

    def usage_name(self: core.TyperArgument) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    core.TyperArgument._usage_display_name = usage_name  # type: ignore[method-assign]
    option_record = core.TyperOption.get_help_record

    def help_record(self: core.TyperOption, ctx: Any) -> tuple[str, str] | None:
        record = option_record(self, ctx)  # an option without a metavar ends in a space
        return None if record is None else (" ".join(record[0].split()), record[1])

    core.TyperOption.get_help_record = help_record  # type: ignore[method-assign]
    wrapper_init = _textwrap.TextWrapper.__init__

    def words_whole(self: Any, *args: Any, **kwargs: Any) -> None:
        # Wrap between words only: `--price-input` is not broken at its hyphen, a URL not cut.
        kwargs.setdefault("break_long_words", False)
        kwargs.setdefault("break_on_hyphens", False)
        wrapper_init(self, *args, **kwargs)

    _textwrap.TextWrapper.__init__ = words_whole  # type: ignore[method-assign]


_plain_help()

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
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    """Evaluate and RL-train LLMs and agents on benchmarks."""
    from arlecli.engine.lookup import configured_draft_tokens
    from arlecli.engine.prefix_cache import configured_max_tokens

    # A bad $ARLE_KV_REUSE_TOKENS or $ARLE_PROMPT_LOOKUP is refused before any model loads.
    configured_max_tokens()
    configured_draft_tokens()


def register_commands() -> None:
    """Mount every subcommand on `app` (what `main` does first; a CliRunner over `app` calls it)."""
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


def usage_error_line(exc: Exception) -> str | None:
    """A usage error (a bad option value, an unknown option, a missing argument) as arle's one
    `error:` line that says where the help is, instead of click's usage screen; None for the
    help shown when a group is given no command."""
    from typer._click.exceptions import NoArgsIsHelpError

    from arlecli.cli.output import terminal_text

    if isinstance(exc, NoArgsIsHelpError):
        return None
    ctx = getattr(exc, "ctx", None)
    message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
    where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"error: {terminal_text(message)}{where}"


def quiet_warnings() -> None:
    """Hide deprecation and future warnings from users: they come from the libraries arle
    drives (transformers, TRL, datasets), about APIs the user never called, and the user can do
    nothing about them. The test suite turns those raised from arle's own code into errors
    (pyproject's filterwarnings), so hiding them here hides nothing of arle's. `python -W` and
    PYTHONWARNINGS still decide when given."""
    if sys.warnoptions:
        return
    import warnings

    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category)


def quiet_library_logs() -> None:
    """Drop the library log lines that say nothing a user of arle can act on. transformers logs
    one for a BPE tokenizer whose config asks for WordPiece's space clean-up (the embedded
    SmolLM2's does) and then decodes as if it had not: the text is the same either way, and its
    advice (edit the model's config) is not the user's to take in the middle of an eval."""
    import logging

    logging.getLogger("transformers.tokenization_utils_tokenizers").addFilter(
        lambda record: not str(record.msg).startswith("Ignoring clean_up_tokenization_spaces=True for BPE")
    )


def skip_the_exit_collection() -> None:
    """At interpreter exit, after the other exit handlers, keep Python's last garbage
    collections from walking every object the process made (gc.freeze).

    Why: once torch and transformers are imported the process holds millions of objects, and
    the collections that run while the interpreter shuts down took 0.6-0.65 s of every command
    here (`arle eval ... --limit 1 --max-tokens 1`: 0.87 s from the command's end to the
    process's, 0.23 s with this). Frozen objects are still freed as modules are cleared; what
    is skipped is finding garbage in reference cycles, which exit leaves to the OS anyway
    (Python does not promise `__del__` at exit). Registered as an exit handler, not done now:
    tests run `main` in-process, and freezing their long-lived process would stop it collecting."""
    import atexit
    import gc

    atexit.unregister(gc.freeze)  # once, however often main runs in a process
    atexit.register(gc.freeze)  # exit handlers run last-registered first: this one after the libraries'


def _what_is_kept() -> str:
    """What an interrupted command leaves to resume: the runs this process had started (held)."""
    rundir = sys.modules.get("arlecli.rundir")  # not imported: no run was started
    started = rundir.started() if rundir is not None else []
    if not started:
        return ": nothing was started"
    where = ", ".join(str(p) for p in started)
    return f": what finished is kept in {where}; rerun the command with --resume to continue"


def main() -> None:
    """Console-script entry point: user mistakes print one line and exit 2."""
    quiet_warnings()
    quiet_library_logs()
    skip_the_exit_collection()
    package_map.install()  # before anything imports transformers
    register_commands()
    try:
        # standalone_mode=False: typer returns exit codes (Ctrl-C becomes 130) instead of
        # exiting, and lets UserError through to us.
        rc = app(standalone_mode=False, prog_name="arle")
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
        line = usage_error_line(exc)
        if line is None:
            show()  # no arguments at all: the help screen
        else:
            typer.echo(line, err=True)
        sys.exit(2)
    if rc == 130:
        typer.echo(f"interrupted{_what_is_kept()}", err=True)
    sys.exit(rc if isinstance(rc, int) else 0)
