"""gsm8k pinned to lm-eval's filters and exact_match; the math reward via math-verify."""

from __future__ import annotations

import threading

import pytest

from arlecli.rewards import _REWARDS
from arlecli.rewards import math as m
from arlecli.types import Episode, Score, Task, Turn

GOLD_1000 = "She buys 4 * 250 = <<4*250=1000>>1000 pens.\n#### 1,000"
GOLD_18 = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 18"
GOLD_NEG = "The temperature drops 5 degrees.\n#### -5"


def run(name: str, target: str, completion: str, **params: object) -> Score:
    score = _REWARDS[name](**params)
    return score(Task("t", "q", target), Episode("t", [Turn("q", completion)]))


def flags(score: Score) -> tuple[int, int]:
    return score.details["strict_match"], score.details["flexible_extract"]


@pytest.mark.parametrize(
    "gold, completion, strict, flexible",
    [
        # The few-shot format, with and without lm-eval's ignored comma.
        (GOLD_1000, "4 * 250 = 1000\n#### 1,000", 1, 1),
        (GOLD_1000, "#### 1000", 1, 1),
        # `$` right after "#### " is not in the strict regex, so strict extracts nothing.
        (GOLD_18, "#### $18", 0, 1),
        (GOLD_NEG, "It gets colder.\n#### -5", 1, 1),
        (GOLD_NEG, "#### 5", 0, 0),
        # Trailing period: flexible extracts "18." and `\.$` removes the period.
        (GOLD_18, "The answer is 18.", 0, 1),
        # Several "####": strict takes the first, flexible the last number.
        (GOLD_18, "#### 18\n\nQuestion: 3 more?\nAnswer: #### 21", 1, 0),
        (GOLD_18, "#### 21\n#### 18", 0, 1),
        # No number at all: both filters fall back to "[invalid]".
        (GOLD_18, "I am not sure.", 0, 0),
        # A number, then more text with another number: flexible picks the last one.
        (GOLD_18, "She makes 18 dollars every 2 days", 0, 0),
        (GOLD_18, "2 days give 9 * 2 = 18 dollars", 0, 1),
        (GOLD_18, "The answer is $18.00", 0, 0),  # exact match, not numeric equality
        (GOLD_1000, "Total: $1,000.", 0, 1),
    ],
)
def test_gsm8k_filters_match_lm_eval(
    gold: str, completion: str, strict: int, flexible: int
) -> None:
    score = run("gsm8k", gold, completion)
    assert flags(score) == (strict, flexible)
    assert score.correct == bool(flexible)  # primary defaults to flexible_extract
    assert score.reward == float(flexible)


def test_filter_extractions_and_fallback() -> None:
    assert m.STRICT_MATCH("#### 1,000 then #### 7") == "1,000"
    assert m.FLEXIBLE_EXTRACT("costs $5 or 1,200.") == "1,200."
    assert m.FLEXIBLE_EXTRACT("about 7 things") == "7"  # single digit: the second group
    assert m.STRICT_MATCH("no marker 12") == "[invalid]"
    assert m.FLEXIBLE_EXTRACT("nothing here") == "[invalid]"


def test_exact_match_ignores_on_both_sides() -> None:
    # The reference loses its rationale through `(?s).*#### `, exactly as in lm-eval.
    assert m.exact_match("1000", GOLD_1000, m.GSM8K_IGNORE, ignore_case=True)
    assert not m.exact_match("1000", GOLD_1000)
    assert not m.exact_match(" 1000", "1000", m.GSM8K_IGNORE)  # no stripping


def test_primary_param_and_extracted() -> None:
    completion = "#### 18\nso maybe 20"
    default = run("gsm8k", GOLD_18, completion)
    strict = run("gsm8k", GOLD_18, completion, primary="strict_match")
    assert (default.correct, default.extracted) == (False, "20")
    assert (strict.correct, strict.extracted) == (True, "18")
    assert default.details == strict.details
    with pytest.raises(ValueError):
        _REWARDS["gsm8k"](primary="nope")


def test_gsm8k_math_verify() -> None:
    assert run("gsm8k", GOLD_18, "so she earns \\boxed{18} dollars.").details["math_verify"] == 1
    assert run("gsm8k", GOLD_1000, "The answer is 1,000.").details["math_verify"] == 1
    assert run("gsm8k", GOLD_18, "The answer is 17.").details["math_verify"] == 0
    verified = run("gsm8k", GOLD_18, "It is $\\frac{36}{2}$", primary="math_verify")
    assert verified.correct and verified.details["flexible_extract"] == 0


def test_math_verify_works_off_the_main_thread() -> None:
    out: list[Score] = []
    worker = threading.Thread(target=lambda: out.append(run("math", "0.5", "\\boxed{1/2}")))
    worker.start()
    worker.join()
    assert out[0].correct


@pytest.mark.parametrize(
    "gold, completion, correct, extracted",
    [
        ("0.5", "So $x = \\boxed{\\frac{1}{2}}$.", True, "\\frac{1}{2}"),
        ("\\frac{1}{2}", "The answer is 0.5", True, "0.5"),
        ("\\frac{14}{3}", "\\boxed{4} first, then \\boxed{\\dfrac{14}{3}}", True, "\\dfrac{14}{3}"),
        ("The area is $\\boxed{\\frac{14}{3}}$.", "\\boxed{14/3}", True, "14/3"),
        ("3", "\\boxed{4}", False, "4"),
        ("x^2+1", "\\boxed{1 + x^2}", True, "1 + x^2"),
        ("0.5", "I cannot solve this.", False, None),
    ],
)
def test_math_reward(gold: str, completion: str, correct: bool, extracted: str | None) -> None:
    score = run("math", gold, completion)
    assert score.correct is correct
    assert score.details == {"math_verify": int(correct)}
    assert score.extracted == extracted


def test_last_boxed() -> None:
    assert m.last_boxed("\\boxed{a} and \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert m.last_boxed("$\\boxed 5$") == "5"
    assert m.last_boxed("\\fbox{7}") == "7"
    assert m.last_boxed("\\boxed{cut off") is None
    assert m.last_boxed("no box") is None
