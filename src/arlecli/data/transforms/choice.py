"""Transforms for multiple-choice datasets: lettered option lines and a gold letter.

Every dataset stores its question, options and gold differently (an index, a letter, a
label list, the correct text in its own column). Each transform below only reads its
dataset's shape and hands (question, options, gold index) to `lettered`, which builds the
columns every multiple-choice card uses:

    question       the question text the prompt shows (cards map `input` to it)
    choices        the options as a list, in the order shown (the reward counts letters from it)
    choices_text   "A. ...\\nB. ..." lines
    answer_letter  the gold letter ("A".."J"), or a list of letters when several are right
    answer_text    the gold option's text

Datasets whose gold sits at a fixed position (GPQA, SciQ, TruthfulQA MC1) are shuffled
with a permutation drawn from a hash of the question, so the order is the same on every
run and machine while the gold letter is spread over A-D.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Sequence

from arlecli.data.transforms import LETTERS, Row, transform


def lettered(row: Row, question: str, options: Sequence[Any], gold: int | Sequence[int], **extra: Any) -> Row:
    """The shared multiple-choice columns for `row` (see the module docstring).

    `gold` is the index of the correct option, or several indices when any of them counts.
    """
    texts = [str(o) for o in options]
    golds = [gold] if isinstance(gold, int) else list(gold)
    letters = [LETTERS[g] for g in golds]
    return {
        **row,
        **extra,
        "question": question,
        "choices": texts,
        "choices_text": "\n".join(f"{LETTERS[i]}. {t}" for i, t in enumerate(texts)),
        "answer_letter": letters[0] if len(letters) == 1 else letters,
        "answer_text": texts[golds[0]],
    }


def shuffled(key: str, options: Sequence[Any], gold: int) -> tuple[list[Any], int]:
    """`options` in a fixed pseudo-random order seeded by `key`, and where `gold` went.

    The order sorts option positions by an md5 of (key, position): no RNG state, so it is
    the same under every Python version and on every machine.
    """

    def rank(i: int) -> str:
        return hashlib.md5(f"{key}\x00{i}".encode(), usedforsecurity=False).hexdigest()

    order = sorted(range(len(options)), key=rank)
    return [options[i] for i in order], order.index(gold)


def _index(value: Any) -> int:
    """A gold given as an int, a digit string or a letter, as a 0-based index."""
    if isinstance(value, str):
        value = value.strip()
        if value.isdigit():
            return int(value)
        if len(value) != 1 or value.upper() not in LETTERS:
            raise ValueError(f"not an option index or letter: {value!r}")
        return LETTERS.index(value.upper())
    return int(value)


def _subject(row: Row, key: str = "subject") -> dict[str, str]:
    # Several hub configs loaded together tag each row with its `config` (the subject).
    subject = row.get(key) or row.get("config")
    if not subject:
        return {"subject": "all", "subject_name": "general knowledge"}
    return {"subject": str(subject), "subject_name": str(subject).replace("_", " ")}


@transform("mmlu")
def mmlu(row: Row) -> Row:
    """cais/mmlu: `answer` is a ClassLabel int 0-3 (a letter also works)."""
    return lettered(row, row["question"], row["choices"], _index(row["answer"]), **_subject(row))


def _missing(value: Any) -> bool:
    # MMLU-Redux stores an absent fix as None, "" or (in all-null configs) a float NaN.
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""


def _redux_indices(fix: str, choices: list[str]) -> list[int]:
    """MMLU-Redux `correct_answer` as indices, read in evalscope's order: an index or letter
    first ("2" is the third option, "C", "(A) and (C)", "1,3"), option text second (when the
    fix is not a valid index: "4" among options 2/4/6/8, or a text fix)."""
    fix = fix.strip()
    parts = [p.strip(" ()") for p in re.split(r",|\band\b|\bor\b", fix) if p.strip(" ()")]
    try:
        found = [_index(p) for p in parts]
    except ValueError:
        found = []
    if found and all(0 <= i < len(choices) for i in found):
        return found
    if fix in choices:
        return [choices.index(fix)]
    return [choices.index(p) for p in (x.strip() for x in fix.split(",")) if p in choices]


@transform("mmlu_redux")
def mmlu_redux(row: Row) -> Row:
    """edinburgh-dawg/mmlu-redux-2.0: re-target by `error_type`, as evalscope does.

    `answer` is the original MMLU label. `wrong_groundtruth`: the gold is `correct_answer`
    (an index or letter first, option text second; see `_redux_indices`);
    `multiple_correct_answers`: any listed option counts;
    `no_correct_answer`: `correct_answer` (text) replaces the gold option. Other types
    (bad clarity, expert) keep the original label. Rows carry `error_type` for analysis.
    """
    choices = [str(c) for c in row["choices"]]
    gold: list[int] = [_index(row["answer"])]
    kind = str(row.get("error_type") or "ok")
    fix = row.get("correct_answer")
    if not _missing(fix):
        fix = str(fix)
        if kind == "no_correct_answer":
            choices[gold[0]] = fix
        elif kind in ("wrong_groundtruth", "multiple_correct_answers"):
            gold = _redux_indices(fix, choices) or gold
    return lettered(row, row["question"], choices, gold, error_type=kind, **_subject(row))


@transform("mmlu_pro")
def mmlu_pro(row: Row) -> Row:
    """TIGER-Lab/MMLU-Pro: up to 10 `options`, gold `answer` letter (`answer_index` as backup)."""
    gold = row.get("answer_index")
    gold = _index(row["answer"]) if gold is None or gold == "" else int(gold)
    return lettered(row, row["question"], row["options"], gold, **_subject(row, "category"))


@transform("supergpqa")
def supergpqa(row: Row) -> Row:
    """m-a-p/SuperGPQA: `options` (up to 10); gold `answer_letter` (`answer` is the option text)."""
    options = list(row["options"])
    letter = row.get("answer_letter")
    gold = _index(letter) if letter else options.index(row["answer"])
    # Groups by the 13 disciplines; the prompt names the narrower field ("Physics", not "Science").
    subject = _subject(row, "discipline")
    subject["subject_name"] = str(row.get("field") or subject["subject_name"])
    return lettered(row, row["question"], options, gold, **subject)


@transform("keyed_choices")
def keyed_choices(row: Row) -> Row:
    """ARC, CommonsenseQA, OpenBookQA: `choices` = {label: [...], text: [...]} and `answerKey`.

    Labels are usually "A".."E" but some ARC rows use "1".."4"; the gold is looked up by
    label, and the options are re-lettered A.. in order. OpenBookQA's question is
    `question_stem`.
    """
    labels = [str(x).strip() for x in row["choices"]["label"]]
    gold = labels.index(str(row["answerKey"]).strip())
    question = row["question"] if "question" in row else row["question_stem"]
    return lettered(row, question, list(row["choices"]["text"]), gold)


def hellaswag_clean(text: str) -> str:
    """lm-eval's HellaSwag text cleanup: " [title]" -> ". ", drop [tags], collapse double spaces."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


@transform("hellaswag")
def hellaswag(row: Row) -> Row:
    """Rowan/hellaswag: the context and endings as lm-eval builds them; `label` is a str."""
    ctx = f"{row['activity_label']}: {row['ctx_a']} {str(row['ctx_b']).capitalize()}"
    endings = [hellaswag_clean(str(e)) for e in row["endings"]]
    return lettered(row, hellaswag_clean(ctx), endings, int(row["label"]))


@transform("winogrande")
def winogrande(row: Row) -> Row:
    """allenai/winogrande: fill the `_` in `sentence` with option1 or option2; `answer` is "1"/"2"."""
    return lettered(row, row["sentence"], [row["option1"], row["option2"]], int(row["answer"]) - 1)


@transform("piqa")
def piqa(row: Row) -> Row:
    """PIQA: a `goal` and two solutions `sol1`/`sol2`; `label` 0/1."""
    return lettered(row, row["goal"], [row["sol1"], row["sol2"]], int(row["label"]))


@transform("boolq")
def boolq(row: Row) -> Row:
    """BoolQ: options ["no", "yes"]; gold from super_glue's `label` (0/1) or google's `answer` (bool).

    The question gets lm-eval's trailing "?" (the dataset's questions are lowercase with none).
    """
    gold = int(row["label"]) if "label" in row else int(bool(row["answer"]))
    question = str(row["question"]).strip()
    question = question if question.endswith("?") else question + "?"
    return lettered(row, question, ["no", "yes"], gold)


@transform("truthfulqa_mc1")
def truthfulqa_mc1(row: Row) -> Row:
    """truthfulqa/truthful_qa multiple_choice: `mc1_targets` has one true answer, always first,
    so the options are shuffled deterministically per question."""
    targets = row["mc1_targets"]
    options, gold = shuffled(row["question"], list(targets["choices"]), list(targets["labels"]).index(1))
    return lettered(row, row["question"], options, gold)


def _gpqa_clean(text: Any) -> str:
    # As lm-eval's gpqa preprocess: strip, " [title]" -> ". ", drop [tags], collapse spaces.
    return hellaswag_clean(str(text))


@transform("gpqa")
def gpqa(row: Row) -> Row:
    """Idavidrein/gpqa: `Correct Answer` and three `Incorrect Answer N` columns (text only),
    shuffled deterministically per question; `High-level domain` becomes `domain`."""
    columns = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
    options, gold = shuffled(str(row["Question"]), [_gpqa_clean(row[c]) for c in columns], 0)
    domain = str(row.get("High-level domain") or "all")
    return lettered(row, str(row["Question"]).strip(), options, gold, domain=domain)


@transform("sciq")
def sciq(row: Row) -> Row:
    """allenai/sciq: `correct_answer` and `distractor1..3` (text), shuffled deterministically.

    `support_text` is the supporting paragraph and a blank line, or "" where a row has none."""
    options = [row["correct_answer"], row["distractor1"], row["distractor2"], row["distractor3"]]
    options, gold = shuffled(str(row["question"]), options, 0)
    support = str(row.get("support") or "").strip()
    return lettered(row, row["question"], options, gold, support_text=f"{support}\n\n" if support else "")
