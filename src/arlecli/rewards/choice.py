"""Multiple-choice reward: find the letter a generative model chose, compare with the gold.

Models answer in many shapes ("The answer is (B)", "**B**", "B) Paris", a lone "B"), so the
extractor tries the most explicit forms first and only falls back to weaker evidence.
"""

from __future__ import annotations

import re
import string
from typing import Any

from arlecli.rewards import RewardFn, register
from arlecli.types import Episode, Score, Task

LETTERS = string.ascii_uppercase
DEFAULT_NUM_CHOICES = 10  # A-J, MMLU-Pro's widest set, when a row does not list its choices

# "answer is", "Answer:", "correct option is", ... then optional decoration (markdown,
# \text{, \boxed{) and the letter: any case inside brackets ("(b)"), upper case otherwise,
# because "the answer is a bit..." must not read as choice A.
# Each run of separators can be read only one way (a model's reply can be hostile: with four
# adjacent runs that could each take the same spaces, "The answer is" + 400 spaces took 46 s
# to fail): after "answer is" the spaces, an optional colon and its spaces, then either a word
# (option, choice, letter) and any markup, or markup that starts with a mark, not a space.
_EXPLICIT = re.compile(
    r"(?:answer\s*(?:is|:|=)|answer\s+(?:would|should)\s+be|(?:option|choice)\s*(?:is|:))"
    r"\s*(?::\s*)?(?:(?:option|choice|letter)[\s*_`'\"$]*|[*_`'\"$][\s*_`'\"$]*)?"
    r"(?:\\(?:text|textbf|mathrm|boxed)\{[\s*_`]*){0,2}"
    r"(?:[(\[]([A-Za-z])[)\]]|(?-i:([A-Z]))(?![A-Za-z0-9]))",
    re.IGNORECASE,
)
# A letter that opens the reply: "B", "B.", "B)", "(B) text", "**B** because", "B: text",
# "B" alone on the first line; but not "A cat..." or "I think...".
_LEADING = re.compile(r"^[\s*_`\"'(\[]*([A-Z])(?:[ \t*_`\"')\]]*(?:\n|$)|[*_`\"']*(?:\*\*|[.):\]])(?!\d))")
_STANDALONE = re.compile(r"(?<![A-Za-z0-9'])([A-Z])(?![A-Za-z0-9'])")
# "A" and "I" are also English words; standing before a lowercase word they usually are
# words ("A rabbit", "I think") unless the next word says something about the option.
_WORD_AFTER = re.compile(r"\s+([a-z]+)")
_OPTION_VERBS = {"is", "was", "would", "seems", "appears", "matches", "fits", "correct"}


def task_choices(task: Task) -> list[str] | None:
    """The task's options as a list: `fields["choices"]`, else `fields["options"]`, else None.

    A column that is not a list (ARC's raw {label, text} dict) does not count."""
    for key in ("choices", "options"):
        choices = task.fields.get(key)
        if isinstance(choices, (list, tuple)) and choices:
            return [str(c) for c in choices]
    return None


def choice_count(task: Task) -> int:
    """How many letters are valid for `task`: the number of its choices, else A-J."""
    choices = task_choices(task)
    return min(len(choices), len(LETTERS)) if choices else DEFAULT_NUM_CHOICES


def gold_letter(target: Any) -> str:
    """The gold as a letter: "B", "(B)" and 1 (an index) all become "B"."""
    if isinstance(target, int) and not isinstance(target, bool):
        return LETTERS[target]
    return str(target).strip().strip("()[]. ").upper()


def gold_letters(target: Any) -> set[str]:
    """Every accepted letter: a list of golds (MMLU-Redux's multiple correct answers) or one."""
    if isinstance(target, (list, tuple, set)):
        return {gold_letter(t) for t in target}
    return {gold_letter(target)}


def _is_english_word(text: str, match: re.Match[str]) -> bool:
    if match.group(1) not in "AI":
        return False
    after = _WORD_AFTER.match(text, match.end())
    return after is not None and after.group(1) not in _OPTION_VERBS


def extract_letter(text: str, n_choices: int) -> str | None:
    """The letter a model chose, among the first `n_choices` letters, or None.

    Order: the last explicit "answer is X"/"Answer: X"; a letter opening the reply; the last
    standalone valid letter (skipping "A"/"I" used as English words).
    """
    valid = LETTERS[:n_choices]
    explicit = [(m.group(1) or m.group(2)).upper() for m in _EXPLICIT.finditer(text)]
    for letter in reversed(explicit):
        if letter in valid:
            return letter
    lead = _LEADING.match(text)
    if lead and lead.group(1) in valid:
        return lead.group(1)
    for m in reversed(list(_STANDALONE.finditer(text))):
        if m.group(1) in valid and not _is_english_word(text, m):
            return m.group(1)
    return None


def _normalise(text: str) -> str:
    text = re.sub(r"[*_`$]", "", text).lower()
    text = re.sub(r"\s+", " ", text)
    return text.strip(" .!?:;\"'")


def extract_by_text(text: str, choices: list[str], leading: bool = False) -> str | None:
    """The letter whose choice text the model wrote: the whole reply, the span after
    "answer is", a choice opening the reply (only with `leading`, for short options such as
    "yes"/"no"), or the only choice text that appears in the reply (word-bounded)."""
    norm = [_normalise(str(c)) for c in choices]
    reply = _normalise(text)
    tail = re.split(r"answer\s*(?:is|:)", reply)[-1].strip(" .:")
    for candidate in (reply, tail):
        if candidate and candidate in norm and norm.count(candidate) == 1:
            return LETTERS[norm.index(candidate)]
    if leading:
        opening = [i for i, c in enumerate(norm) if c and re.match(rf"{re.escape(c)}(?![a-z0-9])", tail)]
        if len(opening) == 1:
            return LETTERS[opening[0]]
    found = [i for i, c in enumerate(norm) if c and re.search(rf"(?<![a-z0-9]){re.escape(c)}(?![a-z0-9])", reply)]
    return LETTERS[found[0]] if len(found) == 1 else None


MATCH_MODES = ("letter", "text")


@register("multiple_choice", metrics=["accuracy"])
def multiple_choice(num_choices: int | None = None, match: str = "letter") -> RewardFn:
    """Accuracy of a generative multiple-choice answer.

    `task.target` is the gold letter ("A".."J"; an int index or "(B)" also works), or a
    list of letters when any of them counts. The number of valid letters comes from
    `task.fields["choices"]` (or `"options"`), else A-J.

    With `match: letter` (the default) the model's letter is the last explicit
    "answer is (B)" / "Answer: B", else a letter opening the reply ("B", "B.", "(B) text",
    "**B**"), else the last standalone valid letter. Letters beyond the number of choices
    never count. When no letter is found and the choices are known, writing the exact text
    of one choice selects it.

    With `match: text` the options are answered by their text, not a letter (BoolQ's
    "yes"/"no"): the whole reply, the words after "answer is", the option opening the reply,
    or the only option mentioned. `extracted` is then the option text.

    Args:
        num_choices: force the number of valid letters (for rows that carry no
            `choices` list, e.g. 4 for MMLU when the card drops the choices column).
        match: "letter" or "text" (see above).

    Details: accuracy (0/1). `extracted` is the chosen letter (or option text) or None.
    """
    if match not in MATCH_MODES:
        raise TypeError(f"match must be one of {', '.join(MATCH_MODES)}, got {match!r}")

    def score(task: Task, episode: Episode) -> Score:
        n = num_choices or choice_count(task)
        text = episode.completion or ""
        choices = (task_choices(task) or [])[:n]
        if match == "text":
            letter = extract_by_text(text, choices, leading=True) if choices else None
            extracted = choices[LETTERS.index(letter)] if letter else None
        else:
            letter = extract_letter(text, n)
            if letter is None and choices:
                letter = extract_by_text(text, choices)
            extracted = letter
        correct = letter is not None and letter in gold_letters(task.target)
        return Score(float(correct), correct, extracted, {"accuracy": int(correct)})

    return score
