"""lm-eval's documents for loglikelihood scoring: each transform here is what the lm-eval task's
YAML (its `process_docs` and Jinja expressions) computes from a raw row, as plain columns the
card's `loglikelihood:` block names (`choices`, `gold`, ...). Named `lm_<task>`.

They read the raw rows (a card's `loglikelihood.transform` replaces its own transform), so
options keep the dataset's order: lm-eval lists SciQ's gold last and TruthfulQA's first, and
so do these (no shuffle: loglikelihood scoring shows no letters to give the gold away).
"""

from __future__ import annotations

from typing import Any

from arlecli.data.transforms import Row, transform
from arlecli.data.transforms.choice import hellaswag_clean


def _subject(row: Row) -> dict[str, str]:
    subject = str(row.get("subject") or row.get("config") or "all")
    return {"subject": subject, "subject_name": subject.replace("_", " ")}


@transform("lm_mmlu")
def lm_mmlu(row: Row) -> Row:
    """cais/mmlu as lm-eval's mmlu_<subject> tasks: `question.strip()`, gold `answer` (0-3);
    `subject_name` is the subject with spaces, as in each task's description."""
    return {
        **row,
        "question": str(row["question"]).strip(),
        "choices": list(row["choices"]),
        "gold": int(row["answer"]),
        **_subject(row),
    }


@transform("lm_keyed_choices")
def lm_keyed_choices(row: Row) -> Row:
    """ARC and OpenBookQA: options `choices.text`, gold `choices.label.index(answerKey)`
    (OpenBookQA's `answerKey.lstrip()`); OpenBookQA's question is `question_stem`."""
    labels = list(row["choices"]["label"])
    return {**row, "options": list(row["choices"]["text"]), "gold": labels.index(str(row["answerKey"]).lstrip())}


@transform("lm_commonsense_qa")
def lm_commonsense_qa(row: Row) -> Row:
    """tau/commonsense_qa: `question.strip()`, the five option texts as `options`; gold is
    `answerKey`, a letter looked up among the card's literal choices A-E."""
    return {
        **row,
        "question": str(row["question"]).strip(),
        "options": list(row["choices"]["text"]),
        "gold": str(row["answerKey"]),
    }


@transform("lm_hellaswag")
def lm_hellaswag(row: Row) -> Row:
    """lm-eval's hellaswag process_docs: `query` (activity label, ctx_a, capitalised ctx_b,
    cleaned), the cleaned endings as `choices`, `gold` = int(label)."""
    ctx = str(row["ctx_a"]) + " " + str(row["ctx_b"]).capitalize()
    return {
        **row,
        "query": hellaswag_clean(str(row["activity_label"]) + ": " + ctx),
        "choices": [hellaswag_clean(str(e)) for e in row["endings"]],
        "gold": int(row["label"]),
    }


@transform("lm_winogrande")
def lm_winogrande(row: Row) -> Row:
    """lm-eval's winogrande (partial scoring): one context per option (the sentence up to the
    blank, the option filled in) and the shared rest of the sentence after the blank."""
    sentence = str(row["sentence"])
    blank = sentence.index("_")
    return {
        **row,
        "contexts": [sentence[:blank] + str(row["option1"]), sentence[:blank] + str(row["option2"])],
        "rest": sentence[blank + 1 :].strip(),
        "gold": {"1": 0, "2": 1}[str(row["answer"])],
    }


@transform("lm_piqa")
def lm_piqa(row: Row) -> Row:
    """PIQA: options [sol1, sol2], gold `label`."""
    return {**row, "choices": [row["sol1"], row["sol2"]], "gold": int(row["label"])}


@transform("lm_boolq")
def lm_boolq(row: Row) -> Row:
    """super_glue boolq: gold `label` (0 no, 1 yes); google/boolq's bool `answer` also works."""
    gold: Any = row["label"] if "label" in row else bool(row["answer"])
    return {**row, "gold": int(gold)}


@transform("lm_sciq")
def lm_sciq(row: Row) -> Row:
    """allenai/sciq: `support.lstrip()`, options [distractor1..3, correct_answer] (gold last)."""
    return {
        **row,
        "support": str(row.get("support") or "").lstrip(),
        "choices": [row["distractor1"], row["distractor2"], row["distractor3"], row["correct_answer"]],
        "gold": 3,
    }


@transform("lm_truthfulqa_mc1")
def lm_truthfulqa_mc1(row: Row) -> Row:
    """truthful_qa multiple_choice: `mc1_targets.choices` in the dataset's order (the true
    answer first, gold 0, as lm-eval's `doc_to_target: 0`)."""
    return {**row, "choices": list(row["mc1_targets"]["choices"]), "gold": 0}
