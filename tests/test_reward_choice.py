"""Multiple-choice letter extraction from generative output."""

from __future__ import annotations

import pytest

from arlecli.rewards import REWARDS
from arlecli.rewards import choice as c
from arlecli.types import Episode, Score, Task, Turn

FOUR = ["London", "Paris", "Rome", "Berlin"]


def run(target: object, completion: str, choices: list[str] | None = FOUR, **params: object) -> Score:
    fields = {"choices": choices} if choices is not None else {}
    score = REWARDS["multiple_choice"](**params)
    return score(Task("t", "q", target, fields), Episode("t", [Turn("q", completion)]))


@pytest.mark.parametrize(
    "completion, letter",
    [
        ("The answer is (B)", "B"),
        ("Answer: B", "B"),
        ("**B**", "B"),
        ("**B** because Paris is the capital.", "B"),
        ("B) Paris", "B"),
        ("(B)", "B"),
        ("B", "B"),
        ("B.", "B"),
        ("B. Paris is the capital of France.", "B"),
        ("B\nParis is the capital.", "B"),
        ("The answer is (b).", "B"),
        ("answer is: (C)", "C"),
        ("The final answer is $\\boxed{\\text{D}}$", "D"),
        ("Option A is wrong; the correct option is C", "C"),
        ("The answer is F. No wait, the answer is (A)", "A"),  # F is out of range
        ("A cat is not a capital. So C", "C"),  # "A" the article is skipped
        ("I think it is D", "D"),
        ("the answer is a bit unclear, but D", "D"),
        ("It is A", "A"),
        ("A is correct", "A"),
    ],
)
def test_extract_letter(completion: str, letter: str) -> None:
    assert c.extract_letter(completion, 4) == letter


@pytest.mark.parametrize("completion", ["The answer is E", "Answer: J", "(G)", "I don't know", ""])
def test_out_of_range_or_missing_letters(completion: str) -> None:
    assert c.extract_letter(completion, 4) is None


def test_valid_letters_follow_the_choices() -> None:
    assert run("E", "The answer is E", choices=FOUR).extracted is None
    five = [*FOUR, "Madrid"]
    assert run("E", "The answer is E", choices=five).correct
    # Without choices, A-J are valid.
    assert run("J", "Answer: J", choices=None).correct
    assert run("B", "Answer: E", choices=None, num_choices=4).extracted is None


def test_score_shape() -> None:
    right = run("B", "The answer is (B)")
    wrong = run("B", "The answer is (C)")
    assert (right.reward, right.correct, right.extracted) == (1.0, True, "B")
    assert (wrong.reward, wrong.correct, wrong.extracted) == (0.0, False, "C")
    assert (right.details, wrong.details) == ({"accuracy": 1}, {"accuracy": 0})


def test_gold_forms() -> None:
    assert run(1, "B").correct  # an int index (MMLU's ClassLabel)
    assert run("(B)", "B").correct
    assert run("b", "B").correct


@pytest.mark.parametrize(
    "completion, letter",
    [("Paris", "B"), ("The answer is rome.", "C"), ("It must be Berlin, the capital", "D")],
)
def test_choice_text_fallback(completion: str, letter: str) -> None:
    score = run(letter, completion)
    assert score.correct and score.extracted == letter


def test_choice_text_fallback_needs_one_clear_choice() -> None:
    assert run("B", "London or Paris, hard to say").extracted is None
    assert c.extract_by_text("10 apples", ["1", "10"]) == "B"  # word-bounded, not a substring


# --- match: text (BoolQ's yes/no), several golds, odd rows -------------------------------

YES_NO = ["no", "yes"]


@pytest.mark.parametrize(
    "completion, extracted",
    [
        ("Yes", "yes"),
        ("yes.", "yes"),
        ("**No**", "no"),
        ("Yes, the passage says the Pacific is the largest ocean.", "yes"),
        ("No. Penguins have flippers, not wings for flight.", "no"),
        ("Based on the passage, the answer is no.", "no"),
        ("The passage is clear. Answer: yes", "yes"),
        ("It is a berry with seeds, so yes", "yes"),
    ],
)
def test_text_match_reads_the_option_text(completion: str, extracted: str) -> None:
    score = run("B" if extracted == "yes" else "A", completion, choices=YES_NO, match="text")
    assert score.correct and score.extracted == extracted and score.details == {"accuracy": 1}


@pytest.mark.parametrize("completion", ["", "   ", "I cannot tell; maybe yes, maybe no", "B", "Perhaps"])
def test_text_match_without_one_clear_option_is_wrong(completion: str) -> None:
    score = run("B", completion, choices=YES_NO, match="text")
    assert (score.reward, score.correct, score.extracted) == (0.0, False, None)


def test_text_match_wrong_answer() -> None:
    assert not run("B", "No, it does not.", choices=YES_NO, match="text").correct


def test_unknown_match_mode_is_a_card_error() -> None:
    from arlecli.errors import UserError
    from arlecli.rewards import get_reward

    with pytest.raises(UserError, match="match"):
        get_reward("multiple_choice", {"match": "fuzzy"})


def test_any_of_several_gold_letters_counts() -> None:
    assert run(["B", "D"], "The answer is (D)").correct
    assert run(["B", "D"], "B").correct
    assert not run(["B", "D"], "The answer is (A)").correct


def test_choices_that_are_not_a_list_fall_back_to_options_or_a_to_j() -> None:
    raw = {"label": ["A", "B"], "text": ["x", "y"]}  # ARC's raw column, before its transform
    score = REWARDS["multiple_choice"]()
    task = Task("t", "q", "E", {"choices": raw, "options": ["a", "b", "c", "d", "e"]})
    assert score(task, Episode("t", [Turn("q", "Answer: E")])).correct
    assert c.choice_count(Task("t", "q", "A", {"choices": raw})) == c.DEFAULT_NUM_CHOICES


def test_an_episode_without_turns_scores_zero() -> None:
    score = REWARDS["multiple_choice"]()
    assert not score(Task("t", "q", "A", {"choices": FOUR}), Episode("t", [])).correct


# --- transforms: each dataset's shape -> question, choices, choices_text, answer_letter -----

from arlecli.data.transforms import choice as t  # noqa: E402


def test_lettered_columns() -> None:
    row = t.lettered({"keep": 1}, "Q?", ["x", "y", "z"], 2)
    assert row["choices_text"] == "A. x\nB. y\nC. z"
    assert (row["answer_letter"], row["answer_text"], row["keep"]) == ("C", "z", 1)
    assert t.lettered({}, "Q?", ["x", "y"], [0, 1])["answer_letter"] == ["A", "B"]


def test_keyed_choices_finds_digit_labels_and_letters_options_in_order() -> None:
    row = {
        "id": "1",
        "question": "Q?",
        "choices": {"text": ["a", "b", "c", "d"], "label": ["1", "2", "3", "4"]},
        "answerKey": "3",
    }
    out = t.keyed_choices(row)
    assert (out["answer_letter"], out["choices"]) == ("C", ["a", "b", "c", "d"])
    obqa = {"question_stem": "Stem", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": " B"}
    assert (t.keyed_choices(obqa)["question"], t.keyed_choices(obqa)["answer_letter"]) == ("Stem", "B")


def test_shuffle_is_deterministic_and_tracks_the_gold() -> None:
    opts = ["right", "w1", "w2", "w3"]
    first = t.shuffled("some question", opts, 0)
    assert first == t.shuffled("some question", opts, 0)
    assert first[0][first[1]] == "right" and sorted(first[0]) == sorted(opts)
    # The gold lands on different letters across questions (it is not always A).
    golds = {t.shuffled(f"question {i}", opts, 0)[1] for i in range(40)}
    assert golds == {0, 1, 2, 3}


def test_gpqa_sciq_truthfulqa_shuffle_the_fixed_gold() -> None:
    gpqa = {
        "Question": "Q?",
        "Correct Answer": " right ",
        "Incorrect Answer 1": "w1",
        "Incorrect Answer 2": "w2",
        "Incorrect Answer 3": "w3",
        "Record ID": "rec1",
        "High-level domain": "Physics",
    }
    out = t.gpqa(gpqa)
    assert out["answer_text"] == "right" and out["domain"] == "Physics"
    assert out["choices"][ord(out["answer_letter"]) - 65] == "right"
    sciq = {
        "question": "Q?",
        "correct_answer": "right",
        "distractor1": "a",
        "distractor2": "b",
        "distractor3": "c",
        "support": "",
    }
    assert t.sciq(sciq)["answer_text"] == "right" and t.sciq(sciq)["support_text"] == ""
    tqa = {"question": "Q?", "mc1_targets": {"choices": ["right", "a", "b"], "labels": [1, 0, 0]}}
    assert t.truthfulqa_mc1(tqa)["answer_text"] == "right"


def test_mmlu_redux_follows_the_annotation() -> None:
    base = {"question": "Q?", "choices": ["a", "b", "c", "d"], "answer": "0", "config": "virology"}
    assert t.mmlu_redux({**base, "error_type": "ok", "correct_answer": None})["answer_letter"] == "A"
    assert t.mmlu_redux({**base, "error_type": "wrong_groundtruth", "correct_answer": "C"})["answer_letter"] == "C"
    assert t.mmlu_redux({**base, "error_type": "wrong_groundtruth", "correct_answer": "2"})["answer_letter"] == "C"
    multi = t.mmlu_redux({**base, "error_type": "multiple_correct_answers", "correct_answer": "(B) and (D)"})
    assert multi["answer_letter"] == ["B", "D"]
    fixed = t.mmlu_redux({**base, "error_type": "no_correct_answer", "correct_answer": "e"})
    assert (fixed["choices"][0], fixed["answer_letter"]) == ("e", "A")
    # All-null configs store the missing fix as NaN; unreadable fixes keep MMLU's label.
    for fix in (float("nan"), "AB"):
        assert t.mmlu_redux({**base, "error_type": "wrong_groundtruth", "correct_answer": fix})["answer_letter"] == "A"
    assert t.mmlu_redux(base)["subject_name"] == "virology"


def _redux_row(choices: list[str], answer: int, error_type: str, fix: object) -> dict:
    # edinburgh-dawg/mmlu-redux-2.0's schema: `answer` is MMLU's label, `correct_answer` the fix.
    return {
        "question": "Which number is the cube of 2?",
        "choices": choices,
        "answer": answer,
        "error_type": error_type,
        "source": "https://example.org/q",
        "correct_answer": fix,
        "potential_reason": "the label points at the wrong option",
        "config": "elementary_mathematics",
    }


@pytest.mark.parametrize(
    "choices, error_type, fix, letter",
    [
        # An index first, as evalscope's mmlu_redux reads it: "2" is the third option even
        # when another option's text is "2".
        (["4", "2", "8", "16"], "wrong_groundtruth", "2", "C"),
        (["4", "2", "8", "16"], "wrong_groundtruth", "C", "C"),
        # Option text second: "16" is no option index, so it names the option "16".
        (["4", "2", "8", "16"], "wrong_groundtruth", "16", "D"),
        (["six", "eight", "ten", "twelve"], "wrong_groundtruth", "eight", "B"),
        (["six", "eight", "ten", "twelve"], "wrong_groundtruth", " 1 ", "B"),
        (["4", "2", "8", "16"], "multiple_correct_answers", "(A) and (C)", ["A", "C"]),
        (["4", "2", "8", "16"], "multiple_correct_answers", "0,2", ["A", "C"]),
        (["4", "2", "8", "16"], "multiple_correct_answers", "8, 16", ["C", "D"]),
        # A fix that is neither keeps MMLU's label (B here).
        (["six", "eight", "ten", "twelve"], "wrong_groundtruth", "nine", "B"),
    ],
)
def test_mmlu_redux_reads_correct_answer_as_an_index_first_then_as_option_text(
    choices: list[str], error_type: str, fix: str, letter: object
) -> None:
    assert t.mmlu_redux(_redux_row(choices, 1, error_type, fix))["answer_letter"] == letter


def test_mmlu_pro_supergpqa_use_their_own_option_count() -> None:
    pro = {"question": "Q?", "options": ["a", "b", "c"], "answer": "C", "answer_index": 2, "category": "law"}
    out = t.mmlu_pro(pro)
    assert (out["answer_letter"], out["subject"], len(out["choices"])) == ("C", "law", 3)
    sg = {"question": "Q?", "options": ["a", "b"], "answer": "b", "answer_letter": "", "discipline": "Law"}
    assert t.supergpqa(sg)["answer_letter"] == "B"  # falls back to the option text


def test_hellaswag_winogrande_piqa_boolq_shapes() -> None:
    hs = {
        "activity_label": "Cooking",
        "ctx_a": "A man [step] cuts onions.",
        "ctx_b": "then he",
        "endings": ["cries.", "Wash hands [title] Dry them."],
        "label": "1",
    }
    out = t.hellaswag(hs)
    assert out["question"] == "Cooking: A man cuts onions. Then he"
    assert (out["choices"][1], out["answer_letter"]) == ("Wash hands. Dry them.", "B")
    wg = t.winogrande({"sentence": "The _ fell.", "option1": "cup", "option2": "plate", "answer": "2"})
    assert (wg["choices"], wg["answer_letter"]) == (["cup", "plate"], "B")
    pq = t.piqa({"goal": "G", "sol1": "s1", "sol2": "s2", "label": 0})
    assert pq["answer_letter"] == "A"
    sg = t.boolq({"question": "is it true", "passage": "P", "idx": 0, "label": 1})
    gg = t.boolq({"question": "is it true?", "passage": "P", "answer": False})
    assert (sg["question"], sg["answer_text"], gg["question"], gg["answer_text"]) == (
        "is it true?",
        "yes",
        "is it true?",
        "no",
    )


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "reply",
    ["The answer is" + " " * 3000 + ".", "Answer:" + "\n" * 3000, "answer is option" + " \t" * 1500 + "?"],
    ids=["spaces", "newlines", "tabs"],
)
def test_a_reply_built_to_backtrack_is_read_at_once(reply: str) -> None:
    """A model's reply is hostile input: the explicit-answer pattern had four adjacent runs that
    could each take the same spaces, so "The answer is" + 400 spaces took 46 s to fail (3,000:
    hours, holding an eval or a training step). Each run now reads one way only."""
    assert c.extract_letter(reply + " B", 4) == "B"
    assert c.extract_letter(reply, 4) is None
