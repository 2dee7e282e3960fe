"""Row transforms: small functions `row -> row` that cards name when a field map is not enough.

A transform returns a new dict with the columns the card's field map and prompt template
read (it may keep the original columns). Cards name them by key here, or give
"module:function" for a user's own.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from arlecli.errors import UserError

Row = dict[str, Any]
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def mmlu(row: Row) -> Row:
    """cais/mmlu: `answer` is a ClassLabel int 0-3; render the choices as lettered lines."""
    choices = list(row["choices"])
    answer = row["answer"]
    letter = LETTERS[int(answer)] if not isinstance(answer, str) or answer.isdigit() else answer.strip().upper()
    return {
        **row,
        "choices_text": "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices)),
        "answer_letter": letter,
        "subject": row.get("subject") or "all",
        "subject_name": (row.get("subject") or "general knowledge").replace("_", " "),
    }


def gsm8k_answer_number(row: Row) -> Row:
    """gsm8k: the gold number is the text after the last '####' (kept alongside the rationale)."""
    return {**row, "answer_number": str(row["answer"]).split("####")[-1].strip()}


TRANSFORMS: dict[str, Callable[[Row], Row]] = {
    "mmlu": mmlu,
    "gsm8k_answer_number": gsm8k_answer_number,
}


def get_transform(name: str) -> Callable[[Row], Row]:
    """A transform by registered name or by "module:function"."""
    if name in TRANSFORMS:
        return TRANSFORMS[name]
    module, _, func = name.partition(":")
    if not func:
        raise UserError(f"unknown transform '{name}'; use one of {', '.join(TRANSFORMS)} or 'module:function'")
    try:
        return getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load transform '{name}': {exc}") from None
