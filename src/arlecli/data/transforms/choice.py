"""Transforms for multiple-choice datasets: lettered option lines and a gold letter."""

from __future__ import annotations

from arlecli.data.transforms import LETTERS, Row, transform


@transform("mmlu")
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
