"""BFCL's rows, from the data files inside the bfcl-eval wheel (no hub): the generator the
`bfcl_*` cards read (`source: {kind: generator, path: "arlecli.data.bfcl:rows"}`) and the
transform that gives each row the text the prompt shows.

A row is bfcl-eval's own entry as its data file holds it (`id`, `question`: the turns of
chat messages, `function`: the function docs before any language hint), plus
`ground_truth` from its possible-answer file (an empty list for the relevance categories,
which have none), loaded with bfcl-eval's own `load_dataset_entry` and
`load_ground_truth_entry`. The docs are kept as the checker reads them; the env adds
bfcl-eval's language hints to what the model sees (envs/bfcl.py).

    source:
      kind: generator
      path: "arlecli.data.bfcl:rows"
      params: {categories: [simple_python]}
      splits: {test: {seed: 0, size: 400}}

Rows come in bfcl-eval's order, categories one after another; `seed` changes nothing
(BFCL is a fixed test set) and `size` takes the first rows.
"""

from __future__ import annotations

import difflib
from typing import Any

from arlecli.errors import UserError
from arlecli.rewards.bfcl import CATEGORIES, UNSUPPORTED, bfcl, category_of


def check_categories(categories: Any) -> list[str]:
    """The BFCL categories a card names, each one arle scores; else a one-line error that
    names the near ones, or says why a category (multi-turn, web search, ...) is not offered."""
    if isinstance(categories, str):
        categories = [categories]
    if not isinstance(categories, list) or not categories or not all(isinstance(c, str) for c in categories):
        raise UserError("BFCL source param 'categories' must be a list of category names, e.g. [simple_python]")
    for name in categories:
        if name in CATEGORIES:
            continue
        why = next((reason for prefix, reason in UNSUPPORTED.items() if name.startswith(prefix)), None)
        if why:
            raise UserError(f"BFCL category '{name}' is not offered: {why}")
        near = difflib.get_close_matches(name, CATEGORIES, n=3)
        hint = f"did you mean {', '.join(near)}?" if near else f"choose from: {', '.join(CATEGORIES)}"
        raise UserError(f"unknown BFCL category '{name}'; {hint}")
    return list(categories)


def entries(category: str) -> list[dict[str, Any]]:
    """One category's entries, each with its `ground_truth` (bfcl-eval's loaders)."""
    b = bfcl()
    found = b.utils.load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)
    try:
        truths = {t["id"]: t["ground_truth"] for t in b.utils.load_ground_truth_entry(category)}
    except FileNotFoundError:  # relevance categories: no answers, only whether a call is made
        truths = {}
    return [{**e, "ground_truth": truths.get(e["id"], [])} for e in found]


def rows(*, seed: int, size: int, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The first `size` rows of the categories `params["categories"]` names, in bfcl-eval's order."""
    out: list[dict[str, Any]] = []
    for category in check_categories((params or {}).get("categories")):
        if len(out) >= size:
            break
        out.extend(entries(category)[: size - len(out)])
    return out


def bfcl_row(row: dict[str, Any]) -> dict[str, Any]:
    """A BFCL entry, plus `query` (its last user message: what the card's input names),
    `category` (from its id) and `ground_truth` (empty where the row has none)."""
    turns = row["question"]
    messages = turns[0] if turns and isinstance(turns[0], list) else turns
    users = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return {
        **row,
        "query": str(users[-1] if users else ""),
        "category": category_of(row["id"]),
        "ground_truth": row.get("ground_truth") or [],
    }
