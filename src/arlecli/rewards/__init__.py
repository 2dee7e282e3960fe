"""Rewards: pure, deterministic functions `score(task, episode) -> Score`.

A reward is a factory: its keyword arguments are the params a card may set, and it returns the
scoring function. arle's own register by name with `@register("name", metrics=[...])`; a card
names a reward by that name, by "module:attr" or by "file.py:attr" next to the card, or an
installed package adds one through an `arle.rewards` entry point (arlecli/plugins.py). The same
function scores eval samples and training completions.

`metrics` declares the names the Score's `details` carry (inspect_ai's `@scorer(metrics=...)`);
a card's `metrics:` are held to them when it loads (`card_metrics`), so a typo fails there
rather than reading as 0.0. `accuracy` (the Score's `correct`) and `pass@k` are always there.

A reward's params are declared by its factory's signature: each keyword argument, with its
type hint and default, is a param a card may set. `check_params` holds a card's params to
that declaration when the card is loaded, and `FIELDS_NEEDED` (below) names the task fields
a reward cannot score without, so `check_task_fields` can refuse bad rows before any
generation rather than in the middle of a run.
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import re
import types
import typing
from typing import Any, Callable, Iterable, Sequence

from arlecli.errors import ParamError, UserError
from arlecli.plugins import Registry
from arlecli.types import Episode, Score, Task

RewardFn = Callable[[Task, Episode], Score]
RewardFactory = Callable[..., RewardFn]
# What a reward declares its details carry: names, or a function of the card's params (a
# reward that wraps another reports the inner one's too).
Metrics = Sequence[str] | Callable[[dict[str, Any]], Iterable[str]]

# Every module of this package registers its rewards on import (on the first lookup).
REWARDS: Registry[RewardFactory] = Registry("rewards", "reward", builtin=["arlecli.rewards.*"])
_REWARDS = REWARDS  # indexable by name, as tests and older callers do
# Always reported, whatever the reward: `accuracy` is the Score's `correct`, pass@k comes from it.
ALWAYS_METRICS = ("accuracy",)
_PASS_AT_K = re.compile(r"pass@[1-9][0-9]*")

# The task fields each reward reads and cannot score without, named by the param that holds
# the field's name (so a card that points the param at another column is checked against
# that column). A param whose value is a list names alternatives: any one of them will do
# (code_io reads whichever of public and private tests a row has).
FIELDS_NEEDED: dict[str, tuple[str, ...]] = {
    "code_tests": ("prompt_field", "test_field", "entry_point_field"),
    "code_unittest": ("prompt_field", "test_field", "entry_point_field"),
    "code_io": ("tests_fields",),
}


def register(name: str | None = None, *, metrics: Metrics | None = None,
             needs_target: bool | Callable[[dict[str, Any]], bool] = True) -> Callable[[RewardFactory], RewardFactory]:
    """Register a reward factory under `name` (default: the function's name); its keyword args
    are the card's params, and `metrics` the names its Scores' `details` carry (a list, or a
    function of the card's params; [] for none beyond accuracy). `needs_target` False (or a
    function of the params) says the reward scores a row without its gold answer, so a row
    with an empty target is not refused at load (code tests, ifeval, a judge)."""

    def deco(factory: RewardFactory) -> RewardFactory:
        if metrics is not None:
            factory.__arle_metrics__ = metrics  # type: ignore[attr-defined]
        factory.__arle_needs_target__ = needs_target  # type: ignore[attr-defined]
        REWARDS.add(name or factory.__name__, factory)
        return factory

    return deco


def reward_names() -> list[str]:
    """All registered reward names (arle's, decorated in imported modules, entry points)."""
    return REWARDS.names()


def reward_metrics(name: str, params: dict[str, Any] | None = None) -> list[str]:
    """The metrics reward `name` reports with `params`: what it declares plus `accuracy`
    (pass@k, for any k, is always available too; see `unknown_metrics`)."""
    declared = declared_metrics(_factory(name))
    names = declared(params or {}) if callable(declared) else declared or ()
    return list(dict.fromkeys([*ALWAYS_METRICS, *names]))


def declared_metrics(factory: RewardFactory) -> Metrics | None:
    """What `factory` declares its details carry; None if it declares nothing (a plain
    function named by "module:attr" or "file.py:attr" without `@register(..., metrics=...)`)."""
    return getattr(factory, "__arle_metrics__", None)


def needs_target(name: str, params: dict[str, Any] | None = None) -> bool:
    """Whether reward `name` with `params` scores against each row's gold target (what it
    declares with `@register(needs_target=...)`; a reward that declares nothing does)."""
    declared = getattr(_factory(name), "__arle_needs_target__", True)
    return bool(declared(params or {}) if callable(declared) else declared)


def unknown_metrics(name: str, params: dict[str, Any], metrics: Iterable[str]) -> list[tuple[str, list[str]]]:
    """Each of `metrics` that reward `name` does not report, with its near names."""
    known = reward_metrics(name, params)
    return [(m, difflib.get_close_matches(m, [*known, "pass@1"], n=1)) for m in metrics
            if m not in known and not _PASS_AT_K.fullmatch(m)]


def get_reward(name: str, params: dict[str, Any] | None = None) -> RewardFn:
    """Build the scoring function `name` with the card's `params`."""
    factory = _factory(name)
    try:
        check_params(name, params or {})
    except ParamError as exc:
        raise UserError(f"reward '{name}': {exc}") from None
    try:
        return factory(**(params or {}))
    except (TypeError, ValueError) as exc:  # a factory's own check of a value (gsm8k's primary)
        raise UserError(f"bad params for reward '{name}': {exc}") from None


def reward_factory(name: str) -> RewardFactory:
    """The factory `name` names: a registered name, "module:attr" or "file.py:attr"."""
    return REWARDS.get(name)


_factory = reward_factory


def check_tasks(score: Any, card: Any, tasks: list[Task]) -> None:
    """Let a reward that reads the rows' columns (a judge's rubric) refuse them before anything
    is generated; the one-line error names the card."""
    check = getattr(score, "check_tasks", None)
    if check is None:
        return
    try:
        check(tasks)
    except UserError as exc:
        raise UserError(f"{card.path or card.name}: {exc}") from None


def check_params(name: str, params: dict[str, Any]) -> None:
    """Check a card's `params` for reward `name` against the factory's signature.

    Raises ParamError for a param the reward does not take (suggesting a near name), a value
    of the wrong type (`timeout_s: ten`), a negative number (no reward takes one), or a time
    or memory limit of 0 (every sample would fail). Raises UserError for an unknown reward."""
    factory = _factory(name)
    sig = inspect.signature(factory)
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # a hint that does not resolve (a name imported only for type checkers): names only
        hints = {}
    declared = {n: p for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    for key, value in params.items():
        if key not in declared:
            near = difflib.get_close_matches(key, declared, n=1)
            known = f"did you mean '{near[0]}'?" if near else (
                f"it takes: {', '.join(declared)}" if declared else "it takes no params")
            raise ParamError(key, f"is not a param of reward '{name}'; {known}")
        hint = hints.get(key, Any)
        if not _fits(value, hint):
            raise ParamError(key, f"must be {_type_text(hint)}, got {type(value).__name__} ({value!r})")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise ParamError(key, f"must not be negative, got {value!r}")
            if value == 0 and (key.endswith("_s") or key == "memory_mb"):
                raise ParamError(key, f"must be greater than 0 (a limit of 0 fails every sample), got {value!r}")


def _fits(value: Any, hint: Any) -> bool:
    """Whether `value` (from YAML: None, bool, int, float, str, list, dict) fits the type hint."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin in (list, tuple, collections.abc.Sequence):
        args = typing.get_args(hint)
        return isinstance(value, (list, tuple)) and (not args or all(_fits(v, args[0]) for v in value))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is bool:
        return isinstance(value, bool)
    # YAML's `true` is an int to Python; a number param given `true` is a mistake.
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _type_text(hint: Any) -> str:
    """A type hint in the words a card's author uses ("a whole number", "a list of strings")."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_text(a) for a in typing.get_args(hint))
    origin = typing.get_origin(hint)
    if origin in (list, tuple, collections.abc.Sequence):
        args = typing.get_args(hint)
        return f"a list of {_TYPE_WORDS.get(args[0], 'values')[1]}" if args else "a list"
    return _TYPE_WORDS.get(origin or hint, (f"a {getattr(hint, '__name__', hint)}",))[0]


# How each YAML-visible type is named in an error: (one value, several).
_TYPE_WORDS: dict[Any, tuple[str, str]] = {
    type(None): ("null", "nulls"), bool: ("true or false", "booleans"), int: ("a whole number", "whole numbers"),
    float: ("a number", "numbers"), str: ("a string", "strings"), dict: ("a mapping", "mappings"),
    list: ("a list", "lists"),
}


def check_task_fields(name: str, params: dict[str, Any], tasks: Sequence[Task], origin: str) -> None:
    """Refuse tasks that lack a field reward `name` reads (see FIELDS_NEEDED), before generation.

    The error names the first such task, the field, where the rows came from, and the fix."""
    needed = FIELDS_NEEDED.get(name, ())
    if not needed:
        return
    defaults = {n: p.default for n, p in inspect.signature(_factory(name)).parameters.items()}
    for param in needed:
        if param not in defaults:  # renamed in the reward; test_bad_input holds the table to the signatures
            continue
        value = params.get(param, defaults[param])
        names = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
        for task in tasks:
            if not any(n in task.fields for n in names):
                which = " or ".join(repr(n) for n in names)
                raise UserError(
                    f"task {task.id!r} of {origin} has no field {which}, which reward '{name}' needs; "
                    f"give rows with that column, or point the card's reward param {param} at the right one")
