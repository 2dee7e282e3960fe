"""Multiple-choice letter extraction from generative output."""

from __future__ import annotations

import pytest

from arlecli.rewards import _REWARDS
from arlecli.rewards import choice as c
from arlecli.types import Episode, Score, Task, Turn

FOUR = ["London", "Paris", "Rome", "Berlin"]


def run(
    target: object, completion: str, choices: list[str] | None = FOUR, **params: object
) -> Score:
    fields = {"choices": choices} if choices is not None else {}
    score = _REWARDS["multiple_choice"](**params)
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
