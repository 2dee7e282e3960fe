"""Question-answering rewards: SQuAD exact match / F1, DROP, numeric (FinQA) and TAT-QA.

Every QA card uses one extraction rule, stated in its prompt: the answer is the content of
the last `<answer>...</answer>` when the completion has one, else the rest of the line
after the last "Answer:", else the last non-empty line. Markdown emphasis and a trailing
period are dropped.

`qa` follows the official SQuAD (v1.1/v2.0) evaluation: normalise (lowercase, drop
punctuation and the articles a/an/the, collapse whitespace), exact match and bag-of-tokens
F1, the max over the gold answers. `drop` follows the DROP evaluation (as lm-eval's
`drop/utils.py`): answers become bags of spans, numbers are compared as numbers, and F1
aligns predicted and gold spans one-to-one. `tatqa` applies TAT-QA's scale rendering
(`-12.6` with scale "million" is -12,600,000) before the same span metrics. `finqa`
compares numbers with a tolerance and accepts a percentage for a fraction.
"""

from __future__ import annotations

import itertools
import math
import re
import string
from typing import Any, Iterable, cast

from arlecli.rewards import RewardFn, register
from arlecli.rewards.procedural import answer_tag
from arlecli.types import Episode, Score, Task

# What a model writes to say the passage has no answer (SQuAD v2). Normalised before the
# comparison, so "Unanswerable." and "**no answer**" count too.
ABSTAIN_PHRASES = ("unanswerable", "no answer", "not answerable", "cannot be answered")

_ANSWER_LINE = re.compile(r"answer\s*:", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def extract_answer(text: str) -> str:
    """The answer a completion gives: last `<answer>` tag, else after the last "Answer:",
    else the last non-empty line; emphasis markers, quotes and a trailing period removed."""
    tagged = answer_tag(text)
    if tagged is not None:
        answer = tagged
    else:
        marks = list(_ANSWER_LINE.finditer(text))
        if marks:
            answer = text[marks[-1].end() :].strip().split("\n", 1)[0]
        else:
            lines = [line for line in text.splitlines() if line.strip()]
            answer = lines[-1] if lines else ""
    answer = re.sub(r"[*_`]+", "", answer).strip()
    # A trailing period ends a sentence; one inside a number ("3.5") is kept.
    return answer.strip(" \"'").rstrip(".").strip()


# ---------------------------------------------------------------- SQuAD


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact(prediction: str, gold: str) -> int:
    """1 when the normalised strings are equal (two empty strings match: SQuAD v2 no-answer)."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str) -> float:
    """Token F1 of the normalised strings; when either is empty, 1 only if both are."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum(min(pred.count(t), ref.count(t)) for t in set(pred) & set(ref))
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def gold_list(target: Any) -> list[str]:
    """The gold answers as strings: a string becomes a one-item list, a list stays a list."""
    if target is None:
        return []
    if isinstance(target, (list, tuple)):
        return [str(t) for t in target]
    return [str(target)]


def is_abstention(answer: str) -> bool:
    """Whether `answer` says the question has no answer (see ABSTAIN_PHRASES)."""
    return normalize_answer(answer) in ABSTAIN_PHRASES


# With abstain, an empty gold means "unanswerable" (SQuAD v2), so it is not a missing target.
@register(
    "qa",
    metrics=lambda p: ["exact_match", "f1", *(["abstained"] if p.get("abstain") else [])],
    needs_target=lambda p: not p.get("abstain"),
)
def qa(abstain: bool = False) -> RewardFn:
    """Short-answer QA scored as the official SQuAD script: normalised exact match and F1.

    `task.target` is one gold string or a list of them (any may match; the max is taken).
    The answer is extracted by `extract_answer` (`<answer>` tag, "Answer:" line, last line).

    Args:
        abstain: SQuAD v2 mode. An empty gold list means the question is unanswerable and
            the right reply is to abstain: an answer that normalises to one of
            ABSTAIN_PHRASES ("unanswerable", "no answer", ...) counts as the empty
            prediction, which scores 1 against no gold and 0 against any gold (as the
            official v2 script scores an empty prediction). A reply that normalises
            to nothing ("", "the", ".") scores 0 in either mode, even against a gold
            that also normalises to nothing.

    Details: exact_match (0/1), f1 (0-1); with abstain, also abstained (0/1).
    correct = exact match; reward = exact match. `extracted` is the extracted answer.
    """

    def score(task: Task, episode: Episode) -> Score:
        answer = extract_answer(episode.completion)
        golds = gold_list(task.target)
        details: dict[str, Any] = {}
        prediction = answer
        if abstain:
            abstained = is_abstention(answer)
            details["abstained"] = int(abstained)
            prediction = "" if abstained else answer
            golds = golds or [""]
        if not normalize_answer(prediction) and not (abstain and details["abstained"]):
            # Silence is not an abstention, and "the" must not match a gold that also
            # normalises to nothing (nor, in v2 mode, the empty no-answer gold).
            em, f1 = 0, 0.0
        else:
            em = max((squad_exact(prediction, g) for g in golds), default=0)
            f1 = max((squad_f1(prediction, g) for g in golds), default=0.0)
        details.update(exact_match=em, f1=f1)
        return Score(float(em), bool(em), answer, details)

    return score


# ---------------------------------------------------------------- DROP


def _drop_number(token: str) -> float | None:
    try:
        return float(token.replace(",", ""))
    except ValueError:
        return None


def _drop_token(token: str) -> str:
    # DROP keeps punctuation inside numbers ("3.5") and turns numbers into one float form.
    if _drop_number(token) is None:
        token = "".join(ch for ch in token if ch not in _PUNCT)
    else:
        token = str(_drop_number(token))
    return token


def drop_normalize(text: str) -> str:
    """DROP's span normalisation: split on spaces and hyphens, then per token lowercase,
    drop punctuation (not inside numbers), drop articles, numbers as floats."""
    tokens = [t for t in re.split(r" |-", str(text).lower()) if t]
    tokens = [_ARTICLES.sub(" ", _drop_token(t)).strip() for t in tokens]
    return " ".join(t for t in tokens if t)


def _bags(spans: Iterable[str]) -> tuple[list[str], list[set[str]]]:
    normalised = [drop_normalize(s) for s in spans]
    return normalised, [set(n.split()) for n in normalised]


def _bag_f1(pred: set[str], gold: set[str]) -> float:
    common = len(pred & gold)
    precision = common / len(pred) if pred else 1.0
    recall = common / len(gold) if gold else 1.0
    return 0.0 if precision == 0 and recall == 0 else 2 * precision * recall / (precision + recall)


def _numbers_agree(pred: set[str], gold: set[str]) -> bool:
    # DROP: a span pair scores F1 only if the gold has no number or they share one.
    gold_nums = {t for t in gold if _drop_number(t) is not None}
    return not gold_nums or bool(gold_nums & pred)


def _aligned_f1(pred: list[set[str]], gold: list[set[str]]) -> float:
    """Mean over max(len) slots of the best one-to-one pairing of gold and predicted bags."""
    scores = [[_bag_f1(p, g) if _numbers_agree(p, g) else 0.0 for p in pred] for g in gold]
    slots = max(len(pred), len(gold))
    if len(gold) <= len(pred):
        pairings = (zip(range(len(gold)), perm) for perm in itertools.permutations(range(len(pred)), len(gold)))
    else:
        pairings = (zip(perm, range(len(pred))) for perm in itertools.permutations(range(len(gold)), len(pred)))
    # Answers have a handful of spans, so trying every pairing is cheap; cap it all the same.
    best = 0.0
    for pairing in itertools.islice(pairings, 50_000):
        best = max(best, sum(scores[g][p] for g, p in pairing))
    return best / slots if slots else 0.0


def drop_em_f1(pred_spans: list[str], gold_spans: list[str]) -> tuple[int, float]:
    """DROP exact match and F1 for one predicted and one gold answer (each a list of spans)."""
    pred_norm, pred_bags = _bags(pred_spans)
    gold_norm, gold_bags = _bags(gold_spans)
    em = int(sorted(set(pred_norm)) == sorted(set(gold_norm)) and len(pred_norm) == len(gold_norm))
    return em, round(_aligned_f1(pred_bags, gold_bags), 2)


def split_spans(answer: str) -> list[str]:
    """A multi-span answer written as "A; B" (or "A | B") becomes its spans."""
    spans = [s.strip() for s in re.split(r"[;|]", answer)]
    return [s for s in spans if s] or [answer]


def drop_golds(target: Any) -> list[list[str]]:
    """Gold answers as lists of spans: "x" -> [["x"]], ["a", "b"] -> [["a", "b"]] (one
    multi-span answer), [["a"], ["b", "c"]] -> two alternative answers."""
    if isinstance(target, (list, tuple)) and target and all(isinstance(t, (list, tuple)) for t in target):
        return [[str(s) for s in t] for t in target if t]
    spans = gold_list(target)
    return [spans] if spans else []


@register("drop", metrics=["exact_match", "f1"])
def drop() -> RewardFn:
    """DROP scored as its official evaluator (lm-eval `drop`): EM and numeracy-aware F1,
    the max over gold answers.

    `task.target` is one answer (a string or a list of spans) or a list of alternative
    answers, each a list of spans. The model's answer (see `extract_answer`) is split into
    spans at ";" or "|". Details: exact_match (0/1), f1 (0-1). correct = exact match.
    """

    def score(task: Task, episode: Episode) -> Score:
        answer = extract_answer(episode.completion)
        golds = drop_golds(task.target)
        if not answer or not golds:
            return Score(0.0, False, answer, {"exact_match": 0, "f1": 0.0})
        pred = split_spans(answer)
        if not any(drop_normalize(p) for p in pred):
            return Score(0.0, False, answer, {"exact_match": 0, "f1": 0.0})  # only punctuation/articles
        results = [drop_em_f1(pred, g) for g in golds]
        em, f1 = max(r[0] for r in results), max(r[1] for r in results)
        return Score(float(em), bool(em), answer, {"exact_match": em, "f1": f1})

    return score


# ---------------------------------------------------------------- numbers (FinQA)

_NUMBER = re.compile(r"-?\$?\s?\d[\d,]*(?:\.\d+)?|-?\$?\s?\.\d+")


def parse_number(text: str) -> tuple[float, int, bool] | None:
    """The last number in `text` as (value, decimals written, followed by a percent sign)."""
    found = list(_NUMBER.finditer(text))
    if not found:
        return None
    m = found[-1]
    raw = re.sub(r"[\s$,]", "", m.group(0))
    # "(12.5)" is how financial tables write a negative number.
    negative = raw.startswith("-") or (text[: m.start()].rstrip().endswith("(") and text[m.end() :].startswith(")"))
    try:
        value = abs(float(raw))
    except ValueError:
        return None
    decimals = len(raw.split(".", 1)[1]) if "." in raw else 0
    after = text[m.end() :].lstrip()
    percent = after.startswith("%") or after.lower().startswith("percent")
    return (-value if negative else value), decimals, percent


def numbers_match(pred: float, decimals: int, gold: float, rel_tol: float, rounded: bool = True) -> bool:
    """Within `rel_tol` of the gold, or (when `rounded`) equal to the gold rounded to
    `decimals` places."""
    if math.isclose(pred, gold, rel_tol=rel_tol, abs_tol=1e-9):
        return True
    return rounded and abs(pred - gold) <= 0.5 * 10**-decimals + 1e-9


def _as_float(value: Any) -> float | None:
    try:
        return float(str(value).replace(",", "").replace("$", "").strip().rstrip("%"))
    except ValueError:
        return None


@register("finqa", metrics=["exact_match", "f1", "numeric_match"])
def finqa(rel_tol: float = 0.01) -> RewardFn:
    """FinQA answered in words, scored by the executed gold (`final_result` / `exe_ans`).

    A numeric gold matches the last number of the extracted answer (see `extract_answer`)
    within `rel_tol` relative tolerance, or rounded to the decimals the model wrote. A
    percentage and a fraction are the same answer: the model's number is also compared
    as x/100 and x*100 (gold 0.0134 matches "1.34%" and "1.34"). A yes/no gold is matched
    by SQuAD exact match.

    Args:
        rel_tol: relative tolerance of a numeric match (default 1%).

    Details: exact_match (SQuAD EM of the answer string vs the gold string), f1 (SQuAD
    token F1), numeric_match (0/1, the tolerance match; for a non-numeric gold, the EM).
    correct = numeric_match; reward = numeric_match.
    """

    def score(task: Task, episode: Episode) -> Score:
        answer = extract_answer(episode.completion)
        gold_text = str(task.target).strip()
        em = squad_exact(answer, gold_text) if answer else 0
        f1 = squad_f1(answer, gold_text) if answer else 0.0
        gold = _as_float(gold_text)
        parsed = parse_number(answer) if answer else None
        if gold is None:
            match = bool(em)
        elif parsed is None:
            match = False
        else:
            value, decimals, _ = parsed
            # Rounding leeway only for a model that wrote decimals: "1.3" for 1.338 matches,
            # "1" for 1.4 does not. The /100 and *100 variants shift the decimals with it.
            variants = ((value, decimals), (value / 100, decimals + 2), (value * 100, max(decimals - 2, 0)))
            match = any(numbers_match(v, d, gold, rel_tol, rounded=decimals >= 1) for v, d in variants)
        details = {"exact_match": em, "f1": f1, "numeric_match": int(match)}
        return Score(float(match), match, answer, details)

    return score


# ---------------------------------------------------------------- TAT-QA

SCALES = {"": 1.0, "thousand": 1e3, "million": 1e6, "billion": 1e9, "percent": 0.01}
_SCALE_WORD = re.compile(r"\b(thousand|million|billion|percent)s?\b|%", re.IGNORECASE)


def tatqa_scale(answer: str) -> tuple[str, str]:
    """Split a scale off an answer: "-12.6 million" -> ("-12.6", "million"), "5%" -> ("5", "percent")."""
    m = list(_SCALE_WORD.finditer(answer))
    if not m:
        return answer, ""
    last = m[-1]
    scale = "percent" if last.group(0) == "%" else last.group(1).lower()
    return (answer[: last.start()] + answer[last.end() :]).strip(), scale


def _render(spans: list[str], scale: str) -> str:
    """TAT-QA's answer string: numbers as '%.4f' of round(x, 2) * scale, words + ' scale'."""
    out = []
    for span in sorted(spans):
        value = _as_float(span)
        if value is None:
            out.append(f"{span} {scale}".strip())
        else:
            out.append("%.4f" % (round(value, 2) * SCALES.get(scale, 1.0)))
    return " ".join(out)


@register("tatqa", metrics=["exact_match", "f1"])
def tatqa() -> RewardFn:
    """TAT-QA scored like its official evaluator (tatqa_metric.py), with the scale.

    `task.target` is the row's `answer` (a list of spans, or a number for arithmetic and
    counting questions); `task.fields["scale"]` is "", thousand, million, billion or
    percent. The model's answer (see `extract_answer`) may carry its own scale word or a
    "%" ("-12.6 million", "23.4%"); both sides are rendered as TAT-QA does (numbers
    multiplied by their scale, to 4 decimals; span words followed by the scale), and a bare
    number is also tried unscaled. EM and F1 are the DROP span metrics; for arithmetic and
    counting answers F1 equals EM. Multi-span answers are separated by ";".

    Details: exact_match (0/1), f1 (0-1). correct = exact match.
    """

    def score(task: Task, episode: Episode) -> Score:
        answer = extract_answer(episode.completion)
        gold_scale = str(task.fields.get("scale") or "").lower()
        golds = gold_list(task.target)
        if not answer or not golds:
            return Score(0.0, False, answer, {"exact_match": 0, "f1": 0.0})
        body, pred_scale = tatqa_scale(answer)
        spans = [re.sub(r"[$]", "", s).strip() for s in split_spans(body)]
        candidates = [_render(spans, pred_scale)]
        if not pred_scale and len(spans) == 1 and _as_float(spans[0]) is not None:
            candidates.append("%.4f" % cast(float, _as_float(spans[0])))  # TAT-QA's add_percent_pred
        gold_str = _render(golds, gold_scale)
        if len(golds) == 1 and _as_float(golds[0]) is not None:
            # A numeric gold: compare the rendered numbers themselves, because DROP's
            # tokenizer splits on "-" and would drop the sign of "-12600000.0000".
            em = int(gold_str in candidates)
            f1 = float(em)
        else:
            results = [drop_em_f1([c], [gold_str]) for c in candidates]
            em, f1 = max(r[0] for r in results), max(r[1] for r in results)
        if str(task.fields.get("answer_type", "")) in ("arithmetic", "count", "counting"):
            f1 = float(em)
        return Score(float(em), bool(em), answer, {"exact_match": em, "f1": f1})

    return score
