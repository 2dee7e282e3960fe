"""Tools bound to the task's own row: `search` over a HotpotQA row's paragraphs and
`table_lookup` over a FinQA row's table, with the transforms their cards use to show only
what the tools do not (paragraph titles; the table's row and column labels).

Both are tool factories (see envs/tools.py): `get_tool("search", task)` returns a typed
function that closes over `task.fields`, so each episode searches its own paragraphs.

    env: {name: tools, params: {tools: [search], max_turns: 5}}
    transform: "arlecli.envs.row_tools:hotpotqa_search"
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable

from arlecli.data.transforms import Row
from arlecli.data.transforms.qa import finqa, hotpotqa
from arlecli.envs.tools import register_tool
from arlecli.types import Task

MAX_PARAGRAPHS = 3  # a search returns the best few, as a search engine's first results would
# Words that match nearly every paragraph; overlap on them says nothing about relevance.
_STOPWORDS = frozenset(
    "a an and are as at be by did does for from has have in is it of on or the to was were what when where "
    "which who whom whose why how with that this".split()
)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", str(text).lower())


def _norm(text: str) -> str:
    return " ".join(_words(text))


# HotpotQA ---------------------------------------------------------------------------------


def hotpotqa_search(row: Row) -> Row:
    """hotpotqa, plus `titles_text`: the row's paragraph titles, one "- title" a line."""
    out = hotpotqa(row)
    titles = list((row.get("context") or {}).get("title") or [])
    return {**out, "titles_text": "\n".join(f"- {t}" for t in titles)}


def paragraphs(fields: dict[str, Any]) -> list[tuple[str, str]]:
    """(title, text) of each paragraph of a HotpotQA row's `context`."""
    context = fields.get("context") or {}
    return [(str(t), "".join(s).strip()) for t, s in zip(context.get("title") or [], context.get("sentences") or [])]


def rank_paragraphs(query: str, paras: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The paragraphs matching `query`, best first: title matches (the title is the query,
    or inside it, or contains it) before the rest, then by how many of the query's words
    (stopwords aside) the title and text hold. Paragraphs with neither are left out."""
    q = _norm(query)
    terms = set(_words(query)) - _STOPWORDS
    scored = []
    for i, (title, text) in enumerate(paras):
        t = _norm(title)
        title_hit = bool(q and t) and (t == q or f" {t} " in f" {q} " or f" {q} " in f" {t} ")
        overlap = len(terms & set(_words(f"{title} {text}")))
        if title_hit or overlap:
            scored.append((not title_hit, t != q, -overlap, i))  # exact title first among title hits
    return [paras[i] for *_, i in sorted(scored)]


@register_tool("search")
def _search(task: Task) -> Callable[..., Any]:
    paras = paragraphs(task.fields)

    def search(query: str) -> str:
        """Search this question's paragraphs by title or keywords; returns the best matches.

        Args:
            query: A paragraph title (best) or a few keywords, e.g. "Varrow" or "river Varrow".
        """
        found = rank_paragraphs(query, paras)[:MAX_PARAGRAPHS]
        if not found:
            titles = "; ".join(t for t, _ in paras)
            return f"No paragraph matches '{query}'. Titles: {titles}"
        return "\n\n".join(f"{title}: {text}" for title, text in found)

    return search


# FinQA ------------------------------------------------------------------------------------


def finqa_tools(row: Row) -> Row:
    """finqa, plus the text before and after the table (`text_before`, `text_after`) and the
    table's labels without its values: `table_rows` (first cells of the rows below the
    header) and `table_columns` (the header's cells after the first)."""
    out = finqa(row)
    table = row.get("table") or []
    header = [str(c).strip() for c in (table[0] if table else [])]
    labels = [str(r[0]).strip() for r in table[1:] if r]
    return {
        **out,
        "text_before": " ".join(row.get("pre_text") or []).strip() or "(none)",
        "text_after": " ".join(row.get("post_text") or []).strip() or "(none)",
        "table_rows": "; ".join(labels) or "(none)",
        "table_columns": "; ".join(header[1:]) or "(none)",
    }


def match_label(name: str, labels: list[str], what: str) -> int:
    """The index of the label `name` means: equal after normalising (case, punctuation,
    spacing), else the one label that contains it or that it contains, else the closest
    spelling. Raises ValueError naming the choices (the model reads it as the tool result)."""
    key = _norm(name)
    normed = [_norm(label) for label in labels]
    if key in normed:
        return normed.index(key)
    inside = [i for i, n in enumerate(normed) if key and n and (key in n or n in key)]
    if len(inside) == 1:
        return inside[0]
    close = difflib.get_close_matches(key, normed, n=1, cutoff=0.75)  # a typo ("revenu")
    if close:
        return normed.index(close[0])
    choices = "; ".join(labels)
    ambiguous = f" ({len(inside)} match)" if len(inside) > 1 else ""
    raise ValueError(f"no {what} '{name}'{ambiguous}; {what}s: {choices}")


@register_tool("table_lookup")
def _table_lookup(task: Task) -> Callable[..., Any]:
    table = [[str(c).strip() for c in r] for r in task.fields.get("table") or [] if r]

    def table_lookup(row: str, column: str) -> str:
        """Look up one cell of the report's table by its row label and column header.

        Args:
            row: The row's label (its first cell), e.g. "revenue".
            column: The column's header, e.g. "2019".
        """
        if len(table) < 2:
            raise ValueError("this report has no table")
        header, body = table[0], table[1:]
        r = match_label(row, [line[0] for line in body], "row")
        c = match_label(column, header[1:], "column") + 1
        cells = body[r]
        value = cells[c] if c < len(cells) else ""
        return f"{body[r][0]} / {header[c]}: {value or '(empty)'}"

    return table_lookup
