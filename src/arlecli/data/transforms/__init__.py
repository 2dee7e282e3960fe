"""Row transforms: small functions `row -> row` that cards name when a field map is not enough.

A transform returns a new dict with the columns the card's field map and prompt template
read (it may keep the original columns), or a list of such dicts when one source record
holds several questions (TAT-QA: one table, many questions; each becomes a task). Each module in this package holds one family's
transforms (choice, math, code, qa, procedural) and registers them with `@transform("name")`;
cards name them by that key, or give "module:function" for a user's own.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Any, Callable

from arlecli.errors import UserError

Row = dict[str, Any]
Transform = Callable[[Row], "Row | list[Row]"]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

_TRANSFORMS: dict[str, Transform] = {}


def transform(name: str) -> Callable[[Transform], Transform]:
    """Register a row transform under `name` (a decorator)."""

    def deco(fn: Transform) -> Transform:
        if name in _TRANSFORMS:
            raise ValueError(f"transform '{name}' registered twice")
        _TRANSFORMS[name] = fn
        return fn

    return deco


def _load_builtin() -> None:
    # Every module of this package registers its transforms on import.
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def transform_names() -> list[str]:
    """Names of the built-in transforms."""
    _load_builtin()
    return sorted(_TRANSFORMS)


def get_transform(name: str) -> Transform:
    """A transform by registered name or by "module:function"."""
    _load_builtin()
    if name in _TRANSFORMS:
        return _TRANSFORMS[name]
    module, _, func = name.partition(":")
    if not func:
        near = difflib.get_close_matches(name, _TRANSFORMS, n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise UserError(f"unknown transform '{name}'{hint}; use a built-in one "
                        f"(arlecli/data/transforms/) or 'module:function'")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load transform '{name}': {exc}") from None
