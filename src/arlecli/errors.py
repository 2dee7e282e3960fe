"""User-facing errors: one line that says what is wrong and what to do (exit code 2)."""

from __future__ import annotations

from typing import Iterable


class UserError(Exception):
    """A mistake the user can fix. The CLI prints `error: <message>` and exits 2."""


class ParamError(UserError):
    """A card param that its reward or env refuses; `param` names it (e.g. "tools[1]") so the
    card error can point at the field."""

    def __init__(self, param: str, reason: str) -> None:
        super().__init__(f"param '{param}' {reason}")
        self.param = param
        self.reason = reason


def near_names(given: str, names: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The known `names` closest to a mistyped `given`, for a "did you mean" hint. Case is
    ignored (GSM8K finds gsm8k): names here are lower case, people type them otherwise."""
    import difflib

    by_lower: dict[str, str] = {}
    for name in names:
        by_lower.setdefault(name.lower(), name)
    if given.lower() in by_lower:
        return [by_lower[given.lower()]]
    return [by_lower[m] for m in difflib.get_close_matches(given.lower(), list(by_lower), n=n, cutoff=cutoff)]
