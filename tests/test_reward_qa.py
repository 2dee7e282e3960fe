"""QA rewards: answer extraction, SQuAD EM/F1 (with v2 abstention), DROP, FinQA, TAT-QA; QA transforms."""

from __future__ import annotations

import pytest

from arlecli.data.transforms import get_transform
from arlecli.rewards import REWARDS
from arlecli.rewards import qa
from arlecli.types import Episode, Score, Task, Turn


def run(reward: str, target: object, completion: str, fields: dict | None = None, **params: object) -> Score:
    score = REWARDS[reward](**params)
    return score(Task("t", "q", target, fields or {}), Episode("t", [Turn("q", completion)]))


@pytest.mark.parametrize(
    "text, answer",
    [
        ("Answer: Paris", "Paris"),
        ("Some reasoning.\nanswer: **Paris**.", "Paris"),
        ("Answer: Rome\nWait.\nAnswer: Paris\nHope that helps!", "Paris"),  # last "Answer:" line only
        ("<answer>Paris</answer> Answer: Rome", "Paris"),  # a tag wins
        ("<answer>first</answer> then <answer> Paris </answer>", "Paris"),
        ("I think it is\n\nParis\n", "Paris"),  # no marker: the last non-empty line
        ("Answer: 3.5.", "3.5"),
        ("", ""),
        ("   \n  ", ""),
    ],
)
def test_extract_answer(text: str, answer: str):
    assert qa.extract_answer(text) == answer


def test_squad_normalisation_and_f1():
    assert qa.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert qa.squad_exact("the Dellen River", "Dellen river.") == 1
    assert qa.squad_f1("Dellen", "the Dellen River") == pytest.approx(2 / 3)
    assert qa.squad_f1("", "") == 1.0 and qa.squad_f1("x", "") == 0.0


def test_qa_correct_wrong_and_partial():
    right = run("qa", ["Mars", "The Red Planet"], "It is the fourth planet.\nAnswer: red planet")
    assert right.correct and right.reward == 1.0 and right.details == {"exact_match": 1, "f1": 1.0}
    partial = run("qa", "Dellen River", "Answer: the river Dellen in Varrow")
    assert not partial.correct and partial.reward == 0.0 and 0 < partial.details["f1"] < 1
    wrong = run("qa", "Paris", "Answer: Rome")
    assert not wrong.correct and wrong.details == {"exact_match": 0, "f1": 0.0}


def test_qa_edge_cases_never_crash():
    for target in ["x", [], None, ["a", "b"], 7]:
        for text in ["", "\n", "Answer:", "<answer></answer>", "\x00", "Answer: " + "a " * 5000]:
            s = run("qa", target, text)
            assert s.reward in (0.0, 1.0)
    assert run("qa", 7, "Answer: 7").correct  # a non-string gold
    assert not run("qa", "the", "Answer: a").correct  # golds that normalise to nothing never match empty text
    assert not run("qa", [], "Answer: unanswerable").correct  # abstaining only counts in v2 mode


@pytest.mark.parametrize(
    "text", ["Answer: unanswerable", "Answer: **No answer.**", "<answer>cannot be answered</answer>"]
)
def test_squad_v2_abstention_on_unanswerable(text: str):
    s = run("qa", [], text, abstain=True)
    assert s.correct and s.details == {"abstained": 1, "exact_match": 1, "f1": 1.0}


def test_squad_v2_abstaining_on_an_answerable_question_or_answering_an_unanswerable_one():
    assert not run("qa", ["84 metres"], "Answer: unanswerable", abstain=True).correct
    s = run("qa", [], "Answer: the Amberline Hills", abstain=True)
    assert not s.correct and s.details["abstained"] == 0 and s.details["f1"] == 0.0
    assert run("qa", ["84 metres", "84"], "Answer: 84", abstain=True).correct
    assert not run("qa", [], "", abstain=True).correct  # silence is not abstaining


def test_drop_numbers_spans_and_multi_span():
    assert run("drop", [["3"]], "Answer: 3.0").correct  # numbers compare as numbers
    assert not run("drop", [["3"]], "Answer: 13").correct
    assert run("drop", [["Eli Brandt"]], "Answer: eli brandt.").correct
    multi = run("drop", [["23-yard", "38-yard"]], "Answer: 38-yard; 23-yard")
    assert multi.correct and multi.details["f1"] == 1.0
    half = run("drop", [["23-yard", "38-yard"]], "Answer: 38-yard")
    assert not half.correct and half.details["f1"] == 0.5
    assert run("drop", [["1,000"]], "Answer: 1000").correct


def test_drop_max_over_alternatives_and_f1_needs_matching_numbers():
    assert run("drop", [["2"], ["two"]], "Answer: two").correct
    s = run("drop", [["12 yards"]], "Answer: 15 yards")
    assert not s.correct and s.details["f1"] == 0.0  # the gold's number is missing: no partial credit


def test_drop_edge_cases():
    for target in [[], "7", ["a", "b"], [["a"], []]]:
        for text in ["", "Answer:", "; ;", "Answer: |"]:
            assert run("drop", target, text).reward == 0.0
    assert run("drop", "7", "Answer: 7").correct  # a bare string gold


@pytest.mark.parametrize(
    "gold, text",
    [
        ("94.0", "Answer: 94"),
        ("94.0", "Answer: $94 million"),
        ("0.098", "Answer: 9.8%"),  # a percentage for a fraction
        ("0.098", "Answer: 0.098"),
        ("0.0134", "Answer: 1.3%"),  # rounded to the decimal the model wrote
        ("9.8", "Answer: 0.098"),  # a fraction for a percentage
        ("2000.0", "Answer: 2,000 shares"),
        ("12345.67", "Answer: 12346"),  # within 1%
        ("-5.5", "Answer: (5.5)"),  # accounting negative
        ("yes", "Answer: Yes."),
    ],
)
def test_finqa_matches(gold: str, text: str):
    s = run("finqa", gold, text)
    assert s.correct and s.details["numeric_match"] == 1


@pytest.mark.parametrize(
    "gold, text",
    [
        ("94.0", "Answer: 104"),
        ("0.0134", "Answer: 1%"),
        ("1.4", "Answer: 1"),
        ("-5.5", "Answer: 5.5"),
        ("yes", "Answer: no"),
        ("94.0", ""),
        ("94.0", "Answer: ninety-four"),
        ("", "Answer: 3"),
    ],
)
def test_finqa_mismatches(gold: str, text: str):
    assert not run("finqa", gold, text).correct


def test_finqa_tolerance_is_a_param():
    assert not run("finqa", "100", "Answer: 104", rel_tol=0.01).correct
    assert run("finqa", "100", "Answer: 104", rel_tol=0.05).correct


def tat(answer: object, scale: str, text: str, answer_type: str = "arithmetic") -> Score:
    return run("tatqa", answer, text, {"scale": scale, "answer_type": answer_type})


def test_tatqa_scale():
    assert tat(-12.6, "million", "Answer: -12.6 million").correct
    assert tat(-12.6, "million", "Answer: -12,600,000").correct  # the scale applied by hand
    assert not tat(-12.6, "million", "Answer: 12.6 million").correct  # the sign matters
    assert not tat(-12.6, "million", "Answer: -12.6 thousand").correct
    assert tat(24.41, "percent", "Answer: 24.41%").correct
    assert tat(24.41, "percent", "Answer: 0.2441").correct  # TAT-QA's bare-number retry
    assert not tat(24.41, "percent", "Answer: 24.41").correct  # a percent must be said
    assert tat(3, "", "Answer: 3", "count").correct


def test_tatqa_spans():
    assert tat(["2019"], "", "Answer: 2019", "span").correct
    multi = tat(["Fixed Price", "Other"], "", "Answer: Other; Fixed Price", "multi-span")
    assert multi.correct and multi.details["f1"] == 1.0
    part = tat(["Fixed Price", "Other"], "", "Answer: Fixed Price", "multi-span")
    assert not part.correct and 0 < part.details["f1"] < 1
    for text in ["", "Answer:", "%", "million"]:
        assert not tat(["2019"], "", text, "span").correct


def test_transforms_for_qa_rows():
    hp = get_transform("hotpotqa")(
        {
            "question": "q",
            "answer": "a",
            "context": {"title": ["T1", "T2"], "sentences": [["One.", " Two."], ["Three."]]},
        }
    )
    assert hp["context_text"] == "T1: One. Two.\n\nT2: Three."
    tq = get_transform("triviaqa")({"question": "q", "answer": {"aliases": ["Mars"], "value": "Planet Mars"}})
    assert tq["answers"] == ["Mars", "Planet Mars"]
    assert get_transform("squad_v2")({"answers": {"text": [], "answer_start": []}})["answer_texts"] == []
    ucinlp = get_transform("drop")({"answers_spans": {"spans": ["a", "b"], "types": ["span", "span"]}})
    assert ucinlp["gold_answers"] == [["a", "b"]]
    eleuther = get_transform("drop")(
        {
            "answer": {"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": ["x"]},
            "validated_answers": {
                "number": ["", "4"],
                "date": [{"day": "", "month": "", "year": ""}] * 2,
                "spans": [["x"], []],
            },
        }
    )
    assert eleuther["gold_answers"] == [["x"], ["4"]]
    fin = get_transform("finqa")(
        {
            "pre_text": ["a"],
            "post_text": ["b"],
            "table": [["", "2019"], ["x", "1"]],
            "qa": {"question": "q?", "exe_ans": 0.5},
        }
    )
    assert fin["question"] == "q?" and fin["gold"] == "0.5" and " | 2019" in fin["context_text"]
    tat_row = get_transform("tatqa")(
        {
            "table": {"uid": "u", "table": [["a", "b"]]},
            "question": "q",
            "answer": 1,
            "paragraphs": [{"order": 2, "text": "second"}, {"order": 1, "text": "first"}],
            "scale": None,
        }
    )
    assert tat_row["context_text"] == "a | b\n\nfirst\n\nsecond" and tat_row["scale"] == ""
