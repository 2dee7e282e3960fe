"""Transforms for QA datasets: render passages/tables as text and pull out the gold answers."""

from __future__ import annotations

import math
from typing import Any, cast

from arlecli import safeio
from arlecli.data.transforms import Row, transform


def _table_text(table: Any) -> str:
    """A table (list of rows of cells) as pipe-separated lines."""
    rows = table or []
    return "\n".join(" | ".join(str(c).strip() for c in row) for row in rows)


@transform("hotpotqa")
def hotpotqa(row: Row) -> Row:
    """hotpotqa/hotpot_qa (distractor): `context` is {title: [...], sentences: [[...], ...]};
    render each paragraph as "Title: sentences" (the 10 gold + distractor paragraphs)."""
    context = row.get("context") or {}
    titles = list(context.get("title") or [])
    sentences = list(context.get("sentences") or [])
    paragraphs = [f"{t}: {''.join(s).strip()}" for t, s in zip(titles, sentences)]
    return {**row, "context_text": "\n\n".join(paragraphs)}


@transform("triviaqa")
def triviaqa(row: Row) -> Row:
    """mandarjoshi/trivia_qa: the gold is any of `answer.aliases` (as lm-eval's triviaqa);
    `value` is added in case a row lists no aliases."""
    answer = row.get("answer") or {}
    aliases = list(answer.get("aliases") or [])
    if answer.get("value") and answer["value"] not in aliases:
        aliases.append(answer["value"])
    return {**row, "answers": aliases}


@transform("squad_v2")
def squad_v2(row: Row) -> Row:
    """rajpurkar/squad_v2: `answers.text` lists the gold spans; empty = unanswerable."""
    answers = row.get("answers") or {}
    return {**row, "answer_texts": list(answers.get("text") or [])}


def _drop_answer(answer: dict[str, Any]) -> list[str]:
    # One DROP answer (EleutherAI/drop, the source JSON): the number if given, else the
    # spans, else the date "day month year" (lm-eval's parse_answer).
    if str(answer.get("number") or "").strip():
        return [str(answer["number"])]
    if answer.get("spans"):
        return [str(s) for s in answer["spans"]]
    date = answer.get("date") or {}
    text = " ".join(str(date.get(k) or "").strip() for k in ("day", "month", "year")).strip()
    return [text] if text else []


def _validated(validated: Any) -> list[dict[str, Any]]:
    """`validated_answers` as a list of answers: the hub rows hold them as a dict of lists
    (one entry per validator; `date` a list of dicts, or itself a dict of lists), the source
    JSON and a parquet written from plain rows as a list of dicts."""
    if isinstance(validated, list):
        return [v for v in validated if isinstance(v, dict)]
    if not isinstance(validated, dict):
        return []
    count = max((len(v) for v in validated.values() if isinstance(v, list)), default=0)

    def pick(value: Any, i: int) -> Any:
        if isinstance(value, list):
            return value[i] if i < len(value) else None
        if isinstance(value, dict):  # a dict of lists nested in the dict of lists (date)
            return {k: pick(v, i) for k, v in value.items()}
        return value

    return [{k: pick(v, i) for k, v in validated.items()} for i in range(count)]


def _ucinlp_golds(answers: dict[str, Any]) -> list[list[str]]:
    # ucinlp/drop concatenates every validator's answer into one `spans` list, tagged by
    # `types`. A number or a date is one span per validator, so each is its own alternative;
    # span answers cannot be told apart (two validators' "A" and "B" read like one answer
    # "A; B"), so they stay one answer with repeats dropped. EleutherAI/drop keeps each
    # validator's answer whole, which is why the card reads it.
    spans = [str(s) for s in answers.get("spans") or []]
    types = list(answers.get("types") or [])
    types += ["span"] * (len(spans) - len(types))
    golds = [[s] for s, kind in zip(spans, types) if kind in ("number", "date")]
    words = list(dict.fromkeys(s for s, kind in zip(spans, types) if kind not in ("number", "date")))
    return golds + ([words] if words else [])


@transform("drop")
def drop(row: Row) -> Row:
    """DROP gold answers as a list of alternatives, each a list of spans, as lm-eval's drop
    builds them: a prediction scores the max EM and F1 over the alternatives.

    EleutherAI/drop (the card's source, as lm-eval's): `answer` and every one of
    `validated_answers` is an alternative (repeats dropped, empty ones skipped), so a
    correct "Chaz Schilens" scores EM 1 even when another validator wrote another name.
    ucinlp/drop rows (`answers_spans`) work too, with the limits given in `_ucinlp_golds`.
    """
    if "answers_spans" in row:
        candidates = _ucinlp_golds(row["answers_spans"] or {})
    else:
        candidates = [
            _drop_answer(a) for a in [row["answer"], *_validated(row.get("validated_answers"))] if isinstance(a, dict)
        ]
    golds: list[list[str]] = []
    for gold in candidates:
        if gold and str(gold[0]).strip() and gold not in golds:
            golds.append(gold)
    return {**row, "gold_answers": golds}


@transform("finqa")
def finqa(row: Row) -> Row:
    """FinQA: text before the table, the table, text after it; the gold is the executed
    program result. Reads the flattened hub rows (`question`, `final_result`) and the
    source JSON (`qa.question`, `qa.exe_ans`) alike."""
    qa = row.get("qa") or {}
    question = row.get("question") or qa.get("question") or ""
    gold = row.get("final_result")
    if gold in (None, ""):
        gold = qa.get("exe_ans", row.get("answer", ""))
    context = "\n".join(
        [" ".join(row.get("pre_text") or []), _table_text(row.get("table")), " ".join(row.get("post_text") or [])]
    )
    return {**row, "question": question, "gold": str(gold), "context_text": context.strip()}


@transform("tatqa")
def tatqa(row: Row) -> Row | list[Row]:
    """TAT-QA: a record holds one context (`table` {uid, table}, `paragraphs` [{uid, order,
    text}]) and its `questions`; each question becomes a task with the table and the
    paragraphs rendered in order. A row that is already one question is rendered as is."""
    if "questions" in row:
        context = {k: v for k, v in row.items() if k != "questions"}
        return [cast(Row, tatqa({**context, **question})) for question in row["questions"]]  # one question: one Row
    table = row.get("table") or {}
    cells = table.get("table") if isinstance(table, dict) else table
    paragraphs = sorted(row.get("paragraphs") or [], key=lambda p: int(p.get("order") or 0))
    text = "\n\n".join(str(p.get("text", "")) for p in paragraphs)
    return {
        **row,
        "context_text": f"{_table_text(cells)}\n\n{text}".strip(),
        "scale": row.get("scale") or "",
        **({"answer": _json_answer(row["answer"])} if "answer" in row else {}),
    }


def _json_answer(answer: Any) -> Any:
    # `answer` mixes lists (spans) and numbers, so datasets types it as JSON, and a parquet
    # written from it (`arle data pull`) holds the JSON text: '["2019"]', '-12.6'. Decoded
    # back here; text that is not a JSON list or a finite number stays as it is.
    if not isinstance(answer, str):
        return answer
    try:
        value = safeio.loads(answer)
    except ValueError:
        return answer
    if isinstance(value, list) or type(value) is int or (type(value) is float and math.isfinite(value)):
        return value
    return answer
