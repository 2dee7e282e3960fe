"""Row transforms: small functions `row -> row` that cards name when a field map is not enough.

A transform returns a new dict with the columns the card's field map and prompt template
read (it may keep the original columns), or a list of such dicts when one source record
holds several questions (TAT-QA: one table, many questions; each becomes a task). Each module
in this package holds one family's transforms (choice, math, code, qa, procedural) and
registers them with `@transform("name")`;
cards name them by that key, by "module:function" or "file.py:function" (relative to the
card), and packages add them through `arle.transforms` entry points (arlecli/plugins.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

from arlecli.plugins import Registry

Row = dict[str, Any]
Transform = Callable[[Row], "Row | list[Row]"]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# Every module of this package registers its transforms on import (on the first lookup).
TRANSFORMS: Registry[Transform] = Registry("transforms", "transform", builtin=["arlecli.data.transforms.*"])
_T = TypeVar("_T", bound=Transform)


def transform(name: str | None = None) -> Callable[[_T], _T]:
    """Register a row transform under `name` (default: its own name; a decorator)."""
    return TRANSFORMS.decorator(name)


def transform_names() -> list[str]:
    """Names of the known transforms (arle's, decorated in imported modules, entry points)."""
    return TRANSFORMS.names()


def get_transform(name: str, base: Path | None = None) -> Transform:
    """A transform by registered name, "module:function" or "file.py:function" (relative to `base`)."""
    return TRANSFORMS.get(name, base)
