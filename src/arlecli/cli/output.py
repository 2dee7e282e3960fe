"""Terminal and log output: Rich when stdout is a terminal, plain lines when it is not.

Model output, task ids, card text and run files reach the terminal, and a terminal acts on
some characters instead of showing them: ESC and CSI (U+009B) start sequences that write the
clipboard (OSC 52), retitle the window, move the cursor or rewrite what is on screen. So every
string printed goes through `terminal_text`, which shows such characters as escapes (`\\x1b`):
the consoles here apply it to everything they render, and anything written past them (plain
`typer.echo`, a server's log line) calls it itself (it lives in safeio.py, beside the
other rules for text arle does not control, so the server and engines use it too). `--json` output keeps JSON's own escapes
and also escapes the characters JSON leaves raw (C1 controls, U+2028/U+2029, bidi controls).
"""

from __future__ import annotations

import re
import sys
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
    # Off a terminal (logs, pipes) Rich would assume 80 columns and crop table cells.
    return make_console() if sys.stdout.isatty() else make_console(width=200)


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


def print_json(data: Any) -> None:
    """JSON on stdout for scripts (no Rich markup or wrapping)."""
    sys.stdout.write(json_text(data, indent=2) + "\n")
    sys.stdout.flush()
