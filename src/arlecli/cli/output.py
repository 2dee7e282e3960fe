"""Terminal and log output: Rich when stdout is a terminal, plain lines when it is not.

Model output, task ids, card text and run files reach the terminal, and a terminal acts on
some characters instead of showing them: ESC and CSI (U+009B) start sequences that write the
clipboard (OSC 52), retitle the window, move the cursor or rewrite what is on screen. So every
string printed goes through `terminal_text`, which shows such characters as escapes (`\\x1b`):
the consoles here apply it to everything they render, and anything written past them (plain
`typer.echo`, a server's log line) calls it itself (it lives in safeio.py, beside the
other rules for text arle does not control, so the server and engines use it too). `--json`
output keeps JSON's own escapes and also escapes the characters JSON leaves raw (C1 controls,
U+2028/U+2029, bidi controls).
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from arlecli.safeio import terminal_text

# In JSON the C0 controls are escaped already; these are what json.dumps leaves raw.
_JSON_RAW = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@lru_cache(maxsize=None)
def _console_class() -> type:
    from rich.console import Console

    class SafeConsole(Console):
        """A Console that passes every string it renders (print arguments, table cells,
        titles) through terminal_text before markup and styling."""

        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(terminal_text(text), **kwargs)

    return SafeConsole


def make_console(**kwargs: Any) -> Any:
    """A rich Console (same arguments) that shows control characters in what it prints escaped."""
    return _console_class()(**kwargs)


@lru_cache(maxsize=None)
def console():
    """The stdout console (Rich decides colour and width from whether it is a TTY)."""
    # Off a terminal (logs, pipes) Rich would assume 80 columns; a log has no width of its
    # own, so 200 unless COLUMNS says what the reader's is.
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return make_console()
    return make_console(width=200)


@lru_cache(maxsize=None)
def err_console():
    """The stderr console, for progress and status lines."""
    return make_console(stderr=True)


def plain(value: Any) -> Any:
    """A table cell or line for text from a run, a card or a model: shown as it is (Rich markup
    such as `[link=...]` in it is not interpreted), through terminal_text like all the rest."""
    from rich.text import Text

    return Text(terminal_text(value if isinstance(value, str) else str(value)))


def json_text(data: Any, **kwargs: Any) -> str:
    """`data` as JSON that is safe on a terminal and still parses to the same value: UTF-8
    whatever it holds (safeio.dumps) and with every character terminal_text escapes written
    as a JSON escape."""
    from arlecli import safeio

    text = safeio.dumps(data, default=str, **kwargs)
    # Outside strings JSON is plain ASCII, so these only ever occur inside strings.
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def stat_text(value: float | None) -> str:
    """A metric's value or stderr in a table: 4 decimals; "n/a" where there is none (a stderr
    over one task: null in results.json, NaN in files written before)."""
    return f"{value:.4f}" if value is not None and math.isfinite(value) else "n/a"


def print_json(data: Any) -> None:
    """JSON on stdout for scripts (no Rich markup or wrapping)."""
    sys.stdout.write(json_text(data, indent=2) + "\n")
    sys.stdout.flush()


# In logs and CI a progress line this often: at most one every ~10 s (a log is not flooded),
# and never more than 10 s of silence while a job runs.
PLAIN_EVERY_S = 8.0
# The first line comes FIRST_LINE_S after the command started (and SETTLE_S after the view
# did): within ~2 s of the user pressing enter, yet a mistake found at once (a bad row, a
# refused key) is still the one `error:` line it should be, not a progress line and an error.
FIRST_LINE_S = 1.0
SETTLE_S = 0.5


def _process_age_s() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere 0, i.e. since this import)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
            return max(0.0, float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


STARTED = time.monotonic() - _process_age_s()  # when the command started
TICK_S = 0.5  # how often a terminal's bar takes the meter's counts


def clock(seconds: float) -> str:
    """`seconds` as m:ss, or h:mm:ss past an hour."""
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class ProgressView:
    """A job's progress on stderr, read from its `arlecli.progress.Meter`: a live Rich bar on
    a terminal; in logs and pipes a plain line ~FIRST_LINE_S after the command started, then
    every PLAIN_EVERY_S, and at the end. Both show samples done, turns done (multi-turn jobs),
    tokens and tokens/s, and the ETA once a sample has finished; before generation starts,
    what the job is doing (the meter's `phase`: loading the model takes a while too).

    A thread keeps it going, so a model turn that takes a minute still shows time passing."""

    def __init__(self, label: str, meter: Any, *, turns: bool = False) -> None:
        import threading

        self.label, self.meter, self.turns = label, meter, turns
        self.tty = err_console().is_terminal
        self.bar: Any = None
        self.task: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="arle-progress", daemon=True)
        self._last_line = ""

    def start(self) -> "ProgressView":
        """Show the first line (or the bar) now and keep it updated until `stop`."""
        if self.tty:
            from rich.markup import escape
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=20),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                console=err_console(),
                refresh_per_second=4,
            )
            self.bar.start()
            # The bar renders its description as markup, past the console's own escaping.
            self.task = self.bar.add_task(escape(terminal_text(self.label)), total=None, info=self.info())
        self._thread.start()
        return self

    def resumed(self, done: int, total: int) -> None:
        """Say that `done` of `total` samples were finished by an earlier run."""
        err_console().print(f"resuming: {done}/{total} samples already done", highlight=False)

    def info(self) -> str:
        """Everything but the label and the sample count, as one short line."""
        m = self.meter
        if m.generating_since is None:
            return f"{m.phase} ({clock(time.monotonic() - m.started)})"
        parts = []
        if self.turns:
            parts.append(f"{m.turns:,} turns")
        rate = m.tokens_per_s()
        if m.tokens or m.turns:  # loglikelihood scoring generates none
            parts.append(f"{m.tokens:,} tokens" + (f", {rate:,.1f}/s" if rate is not None else ""))
        acc = m.accuracy()
        if acc is not None:
            parts.append(f"acc {acc:.3f}")
        parts.append(clock(time.monotonic() - m.started))
        eta = m.eta_s()
        if eta is not None and m.done < m.total:
            parts.append(f"ETA {clock(eta)}")
        return " · ".join(parts)

    def line(self) -> str:
        """The plain progress line."""
        m = self.meter
        count = f"{m.done}/{m.total} samples · " if m.generating_since is not None else ""
        return f"{self.label}: {count}{self.info()}"

    def _print(self) -> None:
        self._last_line = self.line()
        err_console().print(self._last_line, markup=False, highlight=False, soft_wrap=True)

    @property
    def started(self) -> bool:
        """Whether `start` was called."""
        return self._thread.is_alive() or self._stop.is_set() or self.bar is not None

    def _run(self) -> None:
        due = max(time.monotonic() + SETTLE_S, STARTED + FIRST_LINE_S)
        while not self._stop.wait(min(TICK_S, max(0.0, due - time.monotonic()))):
            if self.bar is not None:
                m = self.meter
                self.bar.update(self.task, total=m.total or None, completed=m.done, info=self.info())
            elif time.monotonic() >= due:
                self._print()
                due = time.monotonic() + PLAIN_EVERY_S

    def stop(self) -> None:
        """Stop updating; the bar shows its last state, a log gets a last line."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.bar is not None:
            m = self.meter
            self.bar.update(self.task, total=m.total or None, completed=m.done, info=self.info())
            self.bar.stop()
        elif self._last_line and self.meter.generating_since is not None:
            self._print()  # where it ended (a job over within FIRST_LINE_S prints no progress at all)


# ---------------------------------------------------------------- tables that fit the terminal


@dataclass(frozen=True)
class Column:
    """A table column: its header, the shorter one used when the table is too wide, how its
    cells align, whether a row's cell is the row's name (first in a record, unlabelled), and
    whether its text may wrap between words."""

    header: str
    short: str | None = None
    justify: str = "left"
    key: bool = False
    wrap: bool = False  # prose: may wrap between its words when the table is too wide


def wrap_fields(fields: list[str], width: int, *, sep: str = " · ", indent: str = "  ") -> list[str]:
    """`fields` joined by `sep` into lines of at most `width` cells, breaking only between
    fields (continuation lines indented): a number never parts from its unit or its ± and no
    word is cut. A field wider than a whole line keeps a line of its own, uncut."""
    from rich.cells import cell_len

    lines: list[str] = []
    line = ""
    for field in fields:
        if not line:
            line = (indent if lines else "") + field
        elif cell_len(line) + cell_len(sep) + cell_len(field) <= width:
            line += sep + field
        else:
            lines.append(line)
            line = indent + field
    if line:
        lines.append(line)
    return lines


def print_lines(out: Any, fields: list[str], **kwargs: Any) -> None:
    """`fields` wrapped to `out`'s width (wrap_fields), printed as plain text."""
    for line in wrap_fields(fields, out.width, **kwargs):
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def _rendered(renderable: Any, width: int) -> str:
    """`renderable` as plain text, printed `width` columns wide."""
    import io

    from rich.console import Console

    probe = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    with probe.capture() as captured:
        probe.print(renderable)
    return captured.get()


def _natural_width(renderable: Any) -> int:
    """The widest line of `renderable` printed with all the room it wants."""
    return max((len(line.rstrip()) for line in _rendered(renderable, 10_000).splitlines()), default=0)


def _ellipses(renderable: Any, width: int) -> int:
    """How many `…` `renderable` shows at `width` columns (Rich's mark of a cut cell)."""
    return _rendered(renderable, width).count("…")


def print_table(
    out: Any, columns: list[Column], rows: list[list[Any]], *, title: str | None = None, caption: str | None = None
) -> None:
    """A table that fits `out`'s width without cutting anything: the full table where it
    fits; else the same with short headers and no inner borders; else that with the `wrap`
    columns wrapped between words, where their longest words fit; else one record per row,
    its name then `header value` fields wrapped by whole fields. Cells are shown as they are
    (`plain`), never folded or cut with `…`."""
    from rich import box
    from rich.measure import Measurement
    from rich.table import Table

    cells = [[c if not isinstance(c, str) else plain(c) for c in row] for row in rows]

    def table(short: bool, wrap: bool = False) -> Any:
        t = Table(title=title, caption=caption, box=box.SIMPLE_HEAD if short else box.HEAVY_HEAD, pad_edge=not short)
        for col in columns:
            t.add_column(
                col.short or col.header if short else col.header,
                justify=col.justify,  # type: ignore[arg-type]
                no_wrap=not (wrap and col.wrap),
            )
        for row in cells:
            t.add_row(*row)
        return t

    for short, wrap in ((False, False), (True, False), (True, True)):
        t = table(short, wrap)
        # Wrapped, a column needs its longest word (Rich's minimum, measured unconstrained: it
        # clamps a measurement to the width it is given); unwrapped, the table as Rich lays it
        # out with room to spare (its maximum measure misses a few border columns, and a table
        # a few columns too wide gets every cell cut with `…`).
        if wrap:  # and the columns that do not wrap must not be cut to make room
            fits = (
                any(c.wrap for c in columns)
                and Measurement.get(out, out.options.update_width(10_000), t).minimum <= out.width
                and _ellipses(t, out.width) == sum(str(c).count("…") for row in rows for c in row)
            )
        else:
            fits = _natural_width(t) <= out.width
        if fits:
            out.print(t)
            return
    if title:
        print_lines(out, title.split(), sep=" ", indent="")
    for row in rows:
        named = [str(v) for c, v in zip(columns, row) if c.key]
        fields = [f"{c.short or c.header} {v}" for c, v in zip(columns, row) if not c.key]
        print_lines(out, [" ".join(named) + ":" if named else fields.pop(0), *fields], sep="  ", indent="    ")
    if caption:
        print_lines(out, caption.split(), sep=" ", indent="")
