"""Math rewards: gsm8k scored exactly as lm-evaluation-harness does, and math-verify.

`gsm8k` reproduces lm-eval's `gsm8k.yaml` (version 3.0): two regex filters (strict-match,
flexible-extract) whose extraction is compared to the full gsm8k `answer` string by lm-eval's
`exact_match` with the card's `regexes_to_ignore` and `ignore_case`. It also reports a
math-verify equivalence so a model that answers in its own words still gets credit there.
`strict_regex` swaps the strict filter's pattern (lm-eval's `gsm8k_cot` reads "The answer is N").

`number` compares the last number of a completion with a numeric gold, exactly.

`math` compares a LaTeX/number gold against the last `\\boxed{}` of the completion (or
math-verify's own extraction) by symbolic equivalence, optionally with a relative numeric
tolerance for answers rounded to a few significant figures.
"""

from __future__ import annotations

import cmath
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, cast

from arlecli.rewards import RewardFn, register
from arlecli.rewards.procedural import answer_tag
from arlecli.types import Episode, Score, Task

# math-verify's regexes and sympy can be slow on long inputs, and its own timeout relies on
# signal.alarm (main thread only), so we disable that and bound the input instead. Answers sit
# at the end of a completion, so the tail is what we keep.
MAX_VERIFY_CHARS = 4000

# lm-eval gsm8k.yaml, filter_list and metric_list, verbatim patterns.
STRICT_REGEX = r"#### (\-?[0-9\.\,]+)"
# lm-eval gsm8k-cot.yaml's strict-match (the final `.` is any character, as there).
COT_STRICT_REGEX = r"The answer is (\-?[0-9\.\,]+)."
FLEXIBLE_REGEX = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
GSM8K_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")
INVALID = "[invalid]"


@dataclass(frozen=True)
class RegexFilter:
    """lm-eval's `regex` filter followed by `take_first` (one response per sample).

    `group_select` indexes the list of matches (0 = first, -1 = last). When the pattern has
    several groups, the first non-empty group of the selected match is the extraction.
    """

    pattern: str
    group_select: int = 0
    fallback: str = INVALID
    # A card's own pattern runs on model output under this budget (the `regex` module's, which
    # stops a match; `re` cannot be stopped): `(a|aa)*c` on 60 a's and a b backtracks for
    # minutes, and a policy in training finds such replies. Past it nothing is extracted.
    timeout_s: float | None = None

    def __call__(self, text: str) -> str:
        if self.timeout_s is None:
            matches = re.findall(self.pattern, text)
        else:
            import regex

            try:
                matches = regex.findall(self.pattern, text, timeout=self.timeout_s)
            except TimeoutError:
                matches = []
        if not matches:
            return self.fallback
        match = matches[self.group_select]
        if isinstance(match, tuple):
            groups = [g for g in match if g]
            match = groups[0] if groups else self.fallback
        return match.strip()


CARD_REGEX_SECONDS = 1.0  # a card-given pattern's budget on one reply (RegexFilter.timeout_s)
STRICT_MATCH = RegexFilter(STRICT_REGEX, group_select=0)
FLEXIBLE_EXTRACT = RegexFilter(FLEXIBLE_REGEX, group_select=-1)
_FILTERS = {"strict_match": STRICT_MATCH, "flexible_extract": FLEXIBLE_EXTRACT}


def exact_match(
    prediction: str,
    reference: str,
    regexes_to_ignore: tuple[str, ...] = (),
    ignore_case: bool = False,
) -> bool:
    """lm-eval's `exact_match` for one pair: each regex is removed from BOTH sides, in order,
    then the strings are lower-cased if asked and compared exactly (no stripping)."""
    for pattern in regexes_to_ignore:
        prediction = re.sub(pattern, "", prediction)
        reference = re.sub(pattern, "", reference)
    if ignore_case:
        prediction, reference = prediction.lower(), reference.lower()
    return prediction == reference


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (also `\\fbox{...}`, `\\boxed 5`) in `text`, or None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start + (6 if text.startswith("\\boxed", start) else 5) :]
    if rest.startswith(" "):
        # `\boxed 5$`: the argument runs to the next `$` or whitespace.
        return re.split(r"[\s$]", rest.lstrip(), maxsplit=1)[0] or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None  # unbalanced: the model was cut off inside the box


def _silence_timeout_warning() -> None:
    # math-verify warns once that its timeout is off; we bound input size on purpose, and the
    # warning would otherwise land in the middle of a user's progress bar.
    from math_verify import grader, parser

    parser.TIMEOUT_WARNING_SHOWN = True
    grader.TIMEOUT_WARNING_SHOWN = True


def mv_parse(text: str) -> list[Any]:
    """math-verify `parse` that is safe off the main thread; [] when nothing parses."""
    from math_verify import parse

    _silence_timeout_warning()
    try:
        return parse(text[-MAX_VERIFY_CHARS:], parsing_timeout=None)
    except Exception:  # a malformed completion is a wrong answer, never a crash
        return []


def mv_verify(gold: list[Any], pred: list[Any]) -> bool:
    """math-verify `verify` (gold first) that is safe off the main thread."""
    from math_verify import verify

    if not gold or not pred:
        return False
    _silence_timeout_warning()
    try:
        return bool(verify(gold, pred, timeout_seconds=None))
    except Exception:
        return False


# A bare float literal with an exponent ("4.5e-7", "1e+16"): math-verify reads the `e` as
# Euler's number, so it is rewritten as LaTeX scientific notation first.
_SCIENTIFIC = re.compile(r"^\s*(-?\d+(?:\.\d+)?)[eE]([-+]?\d+)\s*$")


def parse_latex(expr: str) -> list[Any]:
    """math-verify's parse of an answer: `expr` as LaTeX (boxed, then bare), scientific notation too."""
    sci = _SCIENTIFIC.match(expr)
    if sci:
        expr = f"{sci.group(1)} \\times 10^{{{int(sci.group(2))}}}"
    # Wrapping a bare answer in \boxed{} lets the LaTeX extractor take `\frac{1}{2}` as
    # well as `0.5`; the plain parse catches what the box wrapper cannot.
    return mv_parse(f"\\boxed{{{expr}}}") or mv_parse(expr)


def gsm8k_gold(answer: str) -> str:
    """The gold number of a gsm8k `answer` string (`... #### 1,000` -> `1000`)."""
    return answer.split("####")[-1].strip().replace(",", "")


@register("gsm8k", metrics=["strict_match", "flexible_extract", "math_verify"])
def gsm8k(primary: str = "flexible_extract", strict_regex: str = STRICT_REGEX) -> RewardFn:
    """GSM8K scored like lm-eval's `gsm8k` task, plus math-verify.

    The task target is the full gsm8k `answer` (rationale ending in `#### 72`) or the bare
    number. Each filter's extraction and the target go through lm-eval's `exact_match` with
    regexes_to_ignore `,`, `\\$`, `(?s).*#### `, `\\.$` and ignore_case, so the rationale and
    separators drop out.

    Args:
        primary: which sub-metric decides `correct` and `reward`: "flexible_extract" (last
            number in the text; the default), "strict_match" (first match of `strict_regex`),
            or "math_verify" (symbolic equivalence of the gold number and the completion).
        strict_regex: the strict-match pattern; its first non-empty group is the answer.
            Default `#### N` (lm-eval `gsm8k`); lm-eval `gsm8k_cot` uses
            `The answer is (\\-?[0-9\\.\\,]+).`

    Details: strict_match, flexible_extract, math_verify (each 0/1). `extracted` is the
    primary filter's extraction (`[invalid]` when it found nothing; math-verify's answer
    string for primary="math_verify").
    """
    choices = (*_FILTERS, "math_verify")
    if primary not in choices:
        raise ValueError(f"primary must be one of {', '.join(choices)}, got {primary!r}")
    try:
        re.compile(strict_regex)
    except re.error as exc:
        raise ValueError(f"strict_regex {strict_regex!r} is not a valid regex: {exc}") from None
    strict = STRICT_MATCH if strict_regex == STRICT_REGEX else RegexFilter(strict_regex, timeout_s=CARD_REGEX_SECONDS)
    filters = {"strict_match": strict, "flexible_extract": FLEXIBLE_EXTRACT}

    def score(task: Task, episode: Episode) -> Score:
        reference = str(task.target)
        text = episode.completion
        extractions: dict[str, str | None] = {name: f(text) for name, f in filters.items()}
        details: dict[str, Any] = {
            name: int(exact_match(cast(str, got), reference, GSM8K_IGNORE, ignore_case=True))  # a filter's: a str
            for name, got in extractions.items()
        }
        pred = mv_parse(text)
        details["math_verify"] = int(mv_verify(parse_latex(gsm8k_gold(reference)), pred))
        extractions["math_verify"] = str(pred[-1]) if pred else None
        correct = bool(details[primary])
        return Score(float(correct), correct, extractions[primary], details)

    return score


def gold_text(target: Any) -> str:
    """A gold answer as one LaTeX string: a list (several answers) is comma-joined, `$`s
    around each part dropped; a full solution keeps only its last `\\boxed{}` content."""
    if isinstance(target, (list, tuple)):
        return ", ".join(str(t).strip().strip("$").strip() for t in target)
    text = str(target)
    return last_boxed(text) or text


def as_number(parsed: list[Any]) -> complex | None:
    """The numeric value of math-verify's first parse (a sympy number) as a complex number
    (imaginary part 0 for a real one; infinities and NaN kept as such), else None."""
    if not parsed:
        return None
    try:
        value = complex(parsed[0].evalf())
        # 10^{400} is finite but overflows a float: no value to compare (not infinity).
        if cmath.isinf(value) and not parsed[0].is_infinite:
            return None
        return value
    except Exception:  # sets, equations, symbols, strings: not a single number
        return None


def as_float(parsed: list[Any]) -> float | None:
    """The numeric value of math-verify's first parse when it is a real number, else None."""
    value = as_number(parsed)
    return value.real if value is not None and value.imag == 0 else None


def _close(gold: complex, pred: complex, rel: float, scale: float) -> bool:
    # inf - inf is nan, which compares False with everything: an infinity can only equal
    # itself (so oo == oo, -oo != oo), and a NaN (0/0, oo - oo) is no number to agree with.
    if cmath.isnan(gold) or cmath.isnan(pred):
        return False
    if cmath.isinf(gold) or cmath.isinf(pred):
        return gold == pred
    return abs(pred - gold) <= rel * scale


def within(gold: complex | float | None, pred: complex | float | None, tolerance: float) -> bool:
    """`pred` is within a relative `tolerance` of `gold` (absolute when gold is 0); complex
    values by their distance; an infinity only matches the same infinity, NaN nothing."""
    if gold is None or pred is None or tolerance <= 0:
        return False
    return _close(complex(gold), complex(pred), tolerance, abs(gold) or 1.0)


# math-verify compares floats after rounding them to 6 decimals, so any two tiny values
# (6.63e-19 and 6.63e-49) are "equal"; numbers it accepts must also agree this closely.
_SAME_NUMBER_REL = 1e-4


def equivalent(gold: list[Any], pred: list[Any]) -> bool:
    """math-verify equivalence, where two numbers must also agree to a relative 1e-4."""
    if not mv_verify(gold, pred):
        return False
    g, p = as_number(gold), as_number(pred)
    if g is None or p is None:
        return True
    if cmath.isnan(g) and cmath.isnan(p):
        return True  # both undefined (0/0): no value to compare, math-verify's verdict stands
    return _close(g, p, _SAME_NUMBER_REL, max(abs(g), abs(p)))


@register("math", metrics=["math_verify", "boxed"])
def math_answer(tolerance: float = 0.0) -> RewardFn:
    """Symbolic equivalence of a math answer, by math-verify.

    Gold: `task.target` as LaTeX or a number (a list of answers is comma-joined); if it holds
    a `\\boxed{}` (a full solution), the last boxed content. Prediction: the last `\\boxed{}`
    of the completion, else math-verify's own extraction from the text (its last-answer
    heuristics). So `\\boxed{\\frac{1}{2}}` matches a gold of `0.5`.

    Args:
        tolerance: relative tolerance for numeric answers (0.01 = within 1%); 0 (the
            default) leaves it to math-verify.

    Details: math_verify (0/1, math-verify equivalence alone; numbers must also agree to a
    relative 1e-4, since math-verify rounds floats to 6 decimals and so equates any two tiny
    values), boxed (0/1, the completion has a complete `\\boxed{}`). `correct` is math_verify,
    or within `tolerance`. `extracted` is the boxed content or math-verify's answer string,
    None when nothing was found.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")

    def score(task: Task, episode: Episode) -> Score:
        gold = parse_latex(gold_text(task.target))
        boxed = last_boxed(episode.completion)
        pred = parse_latex(boxed) if boxed is not None else []
        if not pred:
            pred = mv_parse(episode.completion)
        extracted = boxed if boxed is not None else (str(pred[-1]) if pred else None)
        verified = equivalent(gold, pred)
        correct = verified or within(as_number(gold), as_number(pred), tolerance)
        details = {"math_verify": int(verified), "boxed": int(boxed is not None)}
        return Score(float(correct), correct, extracted, details)

    return score


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in `text` (`1,000` -> `1000`, `-3.50` -> `-3.50`), else None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def _as_fraction(value: Any) -> Fraction | None:
    try:
        return Fraction(str(value).strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


@register("number", metrics=["accuracy", "tagged"])
def number() -> RewardFn:
    """A numeric answer: the last number of the completion equals `task.target` exactly.

    The answer is the last number inside the last `<answer>...</answer>` when the completion
    has one, else the last number anywhere in it, so "3 + 4 = 7" and "<answer>7</answer>"
    both answer 7. Compared as exact fractions (`7.0` == `7`, `1,000` == `1000`).

    Takes no params. Details: accuracy (0/1), tagged (0/1: the answer came from a tag).
    `extracted` is the number string or None.
    """

    def score(task: Task, episode: Episode) -> Score:
        tagged = answer_tag(episode.completion)
        got = last_number(tagged if tagged is not None else episode.completion)
        gold = _as_fraction(task.target)
        value = _as_fraction(got) if got is not None else None
        correct = value is not None and value == gold
        details = {"accuracy": int(correct), "tagged": int(tagged is not None)}
        return Score(float(correct), correct, got, details)

    return score
