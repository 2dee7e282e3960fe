"""gsm8k pinned to lm-eval's filters and exact_match; the math reward via math-verify; the
math transforms (asdiv, olympiadbench)."""

from __future__ import annotations

import threading

import pytest

from arlecli.data.transforms import get_transform
from arlecli.rewards import REWARDS
from arlecli.rewards import math as m
from arlecli.types import Episode, Score, Task, Turn

GOLD_1000 = "She buys 4 * 250 = <<4*250=1000>>1000 pens.\n#### 1,000"
GOLD_18 = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 18"
GOLD_NEG = "The temperature drops 5 degrees.\n#### -5"


def run(name: str, target: str, completion: str, **params: object) -> Score:
    score = REWARDS[name](**params)
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
def test_gsm8k_filters_match_lm_eval(gold: str, completion: str, strict: int, flexible: int) -> None:
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
        REWARDS["gsm8k"](primary="nope")


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
    assert score.details["math_verify"] == int(correct)
    assert score.extracted == extracted


def test_last_boxed() -> None:
    assert m.last_boxed("\\boxed{a} and \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert m.last_boxed("$\\boxed 5$") == "5"
    assert m.last_boxed("\\fbox{7}") == "7"
    assert m.last_boxed("\\boxed{cut off") is None
    assert m.last_boxed("no box") is None


COT_STRICT = m.COT_STRICT_REGEX


@pytest.mark.parametrize(
    "completion, strict, flexible",
    [
        ("18 - 0 = 18. The answer is 18.", 1, 1),
        ("The answer is 1,000 pens. Later: 7", 0, 0),
        # The pattern's final `.` needs one more character, as in lm-eval: nothing after "18".
        ("So she earns 18 dollars. The answer is 18", 0, 1),
        ("The answer is $18.", 0, 1),  # `$` is not in the strict group
        ("The answer is 17.\n\nQ: more?\nA: The answer is 18.", 0, 1),
        ("", 0, 0),
    ],
)
def test_gsm8k_cot_strict_regex(completion: str, strict: int, flexible: int) -> None:
    score = run("gsm8k", GOLD_18, completion, strict_regex=COT_STRICT)
    assert flags(score) == (strict, flexible)


def test_gsm8k_cot_strict_primary_extracts_the_number() -> None:
    score = run("gsm8k", "18", "The answer is 18.", strict_regex=COT_STRICT, primary="strict_match")
    assert score.correct and score.extracted == "18"


def test_gsm8k_rejects_a_bad_strict_regex() -> None:
    with pytest.raises(ValueError):
        REWARDS["gsm8k"](strict_regex="The answer is (")


@pytest.mark.parametrize(
    "gold, completion, tolerance, correct, verified",
    [
        # Scientific notation: a bare `e` exponent is read as 10^n, not Euler's number.
        ("6.63e-19", "$E = \\boxed{6.63 \\times 10^{-19}}$", 0.0, True, 1),
        ("6.63 \\times 10^{-19}", "\\boxed{6.63e-19}", 0.0, True, 1),
        # math-verify rounds floats to 6 decimals; tiny numbers must still differ.
        ("6.63e-19", "\\boxed{6.63 \\times 10^{-49}}", 0.0, False, 0),
        ("0.0000012", "\\boxed{0.0000014}", 0.0, False, 0),
        # 6-decimal agreement still counts (gsm-hard floats), a 2-decimal rounding does not.
        (2.6666666666666665, "\\boxed{\\frac{8}{3}}", 0.0, True, 1),
        (2.6666666666666665, "\\boxed{2.67}", 0.0, False, 0),
        # A relative tolerance accepts rounded physical answers, not other numbers.
        ("6.63e-19", "\\boxed{6.6 \\times 10^{-19}}", 0.01, True, 0),
        ("6.63e-19", "\\boxed{6.0 \\times 10^{-19}}", 0.01, False, 0),
        ("1200", "\\boxed{1190}", 0.01, True, 0),
        ("0", "\\boxed{0.001}", 0.01, True, 0),  # absolute when the gold is 0
        ("x^2", "\\boxed{x^2 + 0.001}", 0.01, False, 0),  # expressions: no tolerance
        (27.0, "\\boxed{27}", 0.0, True, 1),
        ("", "\\boxed{3}", 0.01, False, 0),  # an empty gold never matches
        ("3", "", 0.01, False, 0),
    ],
)
def test_math_tolerance_and_numbers(
    gold: object, completion: str, tolerance: float, correct: bool, verified: int
) -> None:
    score = run("math", gold, completion, tolerance=tolerance)  # type: ignore[arg-type]
    assert (score.correct, score.details["math_verify"]) == (correct, verified)
    assert score.reward == float(correct)


def test_math_list_gold_is_an_unordered_set_of_answers() -> None:
    gold = ["$2$", "$5$"]  # OlympiadBench final_answer
    assert run("math", gold, "So the final answer is $\\boxed{5, 2}$.").correct  # type: ignore[arg-type]
    assert not run("math", gold, "\\boxed{2}").correct  # type: ignore[arg-type]
    assert m.gold_text(gold) == "2, 5"


def test_math_boxed_detail_and_odd_text() -> None:
    assert run("math", "7", "\\boxed{7}").details["boxed"] == 1
    unboxed = run("math", "7", "so the answer is 7")
    assert unboxed.correct and unboxed.details["boxed"] == 0
    cut = run("math", "7", "\\boxed{7")  # cut off inside the box
    assert cut.details["boxed"] == 0
    for text in ("", "\\boxed{}", "}}}{{{\\frac", "\\boxed{\\frac{1}{0}}", "x" * 20000):
        score = run("math", "7", text, tolerance=0.01)
        assert not score.correct and score.reward == 0.0
    with pytest.raises(ValueError):
        REWARDS["math"](tolerance=-1)


def test_as_float_and_within() -> None:
    assert m.as_float(m.parse_latex("\\frac{1}{4}")) == 0.25
    assert m.as_float(m.parse_latex("x + 1")) is None
    assert m.as_float(m.parse_latex("1, 2")) is None
    assert m.as_float([]) is None
    assert m.within(100.0, 100.5, 0.01) and not m.within(100.0, 102.0, 0.01)
    assert not m.within(100.0, 100.0, 0.0)  # no tolerance: leave it to math-verify


# Non-finite and complex answers: inf - inf is nan, which used to make oo unequal to oo.
@pytest.mark.parametrize(
    "gold, completion, tolerance, correct",
    [
        ("\\infty", "\\boxed{\\infty}", 0.0, True),
        ("\\infty", "\\boxed{\\infty}", 0.01, True),
        ("-\\infty", "\\boxed{-\\infty}", 0.0, True),
        ("-\\infty", "\\boxed{\\infty}", 0.0, False),
        ("\\infty", "\\boxed{-\\infty}", 0.01, False),
        ("\\infty", "\\boxed{10^{400}}", 0.01, False),  # a huge number is not infinity
        ("1e400", "\\boxed{\\infty}", 0.01, False),  # nor is a float that overflows
        ("\\infty", "\\boxed{5}", 0.01, False),
        ("5", "\\boxed{\\infty}", 0.01, False),
        # NaN (0/0) is no number: it agrees with no value, within any tolerance.
        ("\\frac{0}{0}", "\\boxed{5}", 0.01, False),
        ("5", "\\boxed{\\frac{0}{0}}", 0.01, False),
        ("\\infty", "\\boxed{\\frac{0}{0}}", 0.01, False),
        # Complex values (sqrt of a negative): compared by their distance.
        ("1+2\\sqrt{-1}", "\\boxed{1+2\\sqrt{-1}}", 0.0, True),
        ("2\\sqrt{-1}", "\\boxed{\\sqrt{-4}}", 0.0, True),
        ("1+2\\sqrt{-1}", "\\boxed{1-2\\sqrt{-1}}", 0.01, False),
        ("100\\sqrt{-1}", "\\boxed{100.5\\sqrt{-1}}", 0.01, True),
        ("100\\sqrt{-1}", "\\boxed{100}", 0.01, False),
        ("1+2i", "\\boxed{1+2i}", 0.0, True),
        ("1+2i", "\\boxed{1-2i}", 0.01, False),
    ],
)
def test_math_infinity_nan_and_complex(gold: str, completion: str, tolerance: float, correct: bool) -> None:
    score = run("math", gold, completion, tolerance=tolerance)
    assert score.correct is correct and score.reward == float(correct)


def test_numeric_helpers_never_raise_on_odd_values() -> None:
    inf, nan = float("inf"), float("nan")
    values = [0, 1.0, -1.0, inf, -inf, nan, complex(1, 2), complex(inf, 0), complex(nan, nan), 1e308]
    for g in values:
        for p in values:
            agree = m.within(g, p, 0.01)
            assert agree in (True, False)
            if nan in (complex(g).real, complex(p).real) or complex(g) != complex(g):
                assert not agree
    assert m.within(inf, inf, 0.01) and m.within(-inf, -inf, 0.01) and not m.within(inf, -inf, 0.01)
    assert not m.within(nan, nan, 0.01)
    assert m.as_number(m.parse_latex("\\infty")) == complex(float("inf"), 0)
    assert m.as_number(m.parse_latex("\\sqrt{-4}")) == 2j
    assert m.as_float(m.parse_latex("\\sqrt{-4}")) is None  # not a real number


def test_asdiv_transform() -> None:
    row = {"body": "Sam has 3 apples.", "question": "How many apples?", "answer": "3 (apples)"}
    out = get_transform("asdiv")(row)
    assert out["problem"] == "Sam has 3 apples. How many apples?"
    assert out["answer_number"] == "3"
    assert get_transform("asdiv")({"body": None, "question": "Q?", "answer": "2:3"})["answer_number"] == "2:3"


def test_olympiadbench_transform() -> None:
    base = {"question": "Find x.", "subject": "Math", "unit": None, "answer_type": "Numerical"}
    single = get_transform("olympiadbench")({**base, "final_answer": ["$20$"], "is_multiple_answer": False})
    assert single["answer"] == "20"
    assert "should be a numerical value" in single["instruction"]
    assert '"So the final answer is \\boxed{answer}."' in single["instruction"]
    multi = get_transform("olympiadbench")(
        {
            **base,
            "final_answer": ["$2$", "$5$"],
            "is_multiple_answer": True,
            "unit": "cm",
            "answer_type": "Numerical,Expression",
        }
    )
    assert multi["answer"] == "2, 5"
    assert "answers in order being a numerical value, an expression" in multi["instruction"]
    assert "\\boxed{multiple answers connected with commas}(unit)" in multi["instruction"]
    assert "unit of the answer should not be included" in multi["instruction"]
    tuple_type = get_transform("olympiadbench")({**base, "final_answer": [], "answer_type": "Tuple"})
    assert tuple_type["answer"] == "" and "should be" not in tuple_type["instruction"]


@pytest.mark.timeout(60)
def test_a_cards_own_regex_cannot_hold_scoring_on_a_reply_built_to_backtrack() -> None:
    """A card's strict_regex runs on model output: `(a|aa)*c` on 60 a's and a b backtracks for
    minutes in `re` (an eval or a training step held), and a policy in training finds such
    replies. It runs on the `regex` module under a time budget: no answer past it."""
    score = run("gsm8k", "18", "a" * 60 + "b", strict_regex="(a|aa)*c", primary="strict_match")
    assert score.reward == 0.0
    assert run("gsm8k", "18", "so aac 18", strict_regex=r"a+c (\d+)", primary="strict_match").reward == 1.0
