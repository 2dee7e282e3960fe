"""Transforms for QA datasets: render passages/tables as text and pull out the gold answers."""

from __future__ import annotations

from typing import Any

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


def _drop_eleuther_answer(answer: dict[str, Any]) -> list[str]:
    # EleutherAI/drop: a number if given, else the spans, else the date "day month year".
    if answer.get("number"):
        return [str(answer["number"])]
    if answer.get("spans"):
        return [str(s) for s in answer["spans"]]
    date = answer.get("date") or {}
    text = " ".join(str(date.get(k) or "") for k in ("day", "month", "year")).strip()
    return [text] if text else []


@transform("drop")
def drop(row: Row) -> Row:
    """DROP gold answers as a list of alternatives, each a list of spans.

    ucinlp/drop: `answers_spans.spans` is ONE answer (several spans = a multi-span answer).
    EleutherAI/drop rows (`answer` + `validated_answers`) also work, as lm-eval reads them.
    """
    golds: list[list[str]] = []
    if "answers_spans" in row:
        spans = [str(s) for s in (row["answers_spans"] or {}).get("spans") or []]
        golds = [spans] if spans else []
    elif isinstance(row.get("answer"), dict):
        golds = [_drop_eleuther_answer(row["answer"])]
        validated = row.get("validated_answers") or {}
        if isinstance(validated, dict) and validated.get("number") is not None:
            # dict-of-lists in the hub rows: one entry per validated answer
            keys = list(validated)
            for i in range(len(validated["number"])):
                golds.append(_drop_eleuther_answer({k: validated[k][i] for k in keys}))
        golds = [g for i, g in enumerate(golds) if g and g not in golds[:i]]
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
    context = "\n".join([" ".join(row.get("pre_text") or []), _table_text(row.get("table")),
                         " ".join(row.get("post_text") or [])])
    return {**row, "question": question, "gold": str(gold), "context_text": context.strip()}


@transform("tatqa")
def tatqa(row: Row) -> Row | list[Row]:
    """TAT-QA: a record holds one context (`table` {uid, table}, `paragraphs` [{uid, order,
    text}]) and its `questions`; each question becomes a task with the table and the
    paragraphs rendered in order. A row that is already one question is rendered as is."""
    if "questions" in row:
        context = {k: v for k, v in row.items() if k != "questions"}
        return [tatqa({**context, **question}) for question in row["questions"]]
    table = row.get("table") or {}
    cells = table.get("table") if isinstance(table, dict) else table
    paragraphs = sorted(row.get("paragraphs") or [], key=lambda p: int(p.get("order") or 0))
    text = "\n\n".join(str(p.get("text", "")) for p in paragraphs)
    return {**row, "context_text": f"{_table_text(cells)}\n\n{text}".strip(), "scale": row.get("scale") or ""}
