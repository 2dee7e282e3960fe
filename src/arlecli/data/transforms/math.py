"""Transforms for math datasets."""

from __future__ import annotations

from arlecli.data.transforms import Row, transform


@transform("gsm8k_answer_number")
def gsm8k_answer_number(row: Row) -> Row:
    """gsm8k: the gold number is the text after the last '####' (kept alongside the rationale)."""
    return {**row, "answer_number": str(row["answer"]).split("####")[-1].strip()}
