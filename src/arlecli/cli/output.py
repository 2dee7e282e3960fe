"""Terminal and log output: Rich when stdout is a terminal, plain lines when it is not."""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=None)
def console():
    """The stdout console (Rich decides colour and width from whether it is a TTY)."""
    from rich.console import Console

    # Off a terminal (logs, pipes) Rich would assume 80 columns and crop table cells.
    return Console() if sys.stdout.isatty() else Console(width=200)


@lru_cache(maxsize=None)
def err_console():
    """The stderr console, for progress and status lines."""
    from rich.console import Console

    return Console(stderr=True)


def print_json(data: Any) -> None:
    """JSON on stdout for scripts (no Rich markup or wrapping)."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()
