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
that declaration when the card is loaded. The task fields a reward cannot score without are
declared at `@register(..., fields=[...])` too, so `check_task_fields` refuses bad rows
before any generation rather than in the middle of a run (after all of it was spent).

Scoring a sample never stops a run for that sample's sake: `score_samples` records a reward
that raises as a wrong sample carrying the error (see its docstring for what still stops).
"""

from __future__ import annotations

import collections.abc
import difflib
import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from arlecli.errors import ParamError, UserError
from arlecli.plugins import Registry
from arlecli.safeio import clean_text
from arlecli.types import REWARD_ERROR, Episode, Score, Task

RewardFn = Callable[[Task, Episode], Score]
RewardFactory = Callable[..., RewardFn]
# What a reward declares its details carry: names, or a function of the card's params (a
# reward that wraps another reports the inner one's too).
Metrics = Sequence[str] | Callable[[dict[str, Any]], Iterable[str]]

# Every module of this package registers its rewards on import (on the first lookup),
# and the rewards that live beside the env they score (FrozenLake's replays its rules).
REWARDS: Registry[RewardFactory] = Registry(
    "rewards",
    "reward",
    builtin=["arlecli.rewards.*", "arlecli.envs.frozenlake", "arlecli.envs.scienceworld", "arlecli.envs.textworld_env"],
)
# Always reported, whatever the reward: `accuracy` is the Score's `correct`, pass@k comes from it.
ALWAYS_METRICS = ("accuracy",)
_PASS_AT_K = re.compile(r"pass@[1-9][0-9]*")


@dataclass(frozen=True)
class Field:
    """A task field a reward cannot score without: any one of `names` will do. `param` is the
    card param that named them (a card that points it at another column is checked against
    that column, and the error says which param to fix), or None for a fixed name."""

    names: tuple[str, ...]
    param: str | None = None


# What `fields=` declares: a list of field specs (see `register`), or a function of the
# card's params giving specs or Fields (a reward that wraps another needs the inner one's).
Fields = Sequence[str] | Callable[[dict[str, Any]], Iterable["str | Field"]]
_PARAM_REF = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def register(
    name: str | None = None,
    *,
    metrics: Metrics | None = None,
    needs_target: bool | Callable[[dict[str, Any]], bool] = True,
    fields: Fields = (),
    runs_code: bool = False,
    forgeable: bool = False,
) -> Callable[[RewardFactory], RewardFactory]:
    """Register a reward factory under `name` (default: the function's name); its keyword args
    are the card's params, and `metrics` the names its Scores' `details` carry (a list, or a
    function of the card's params; [] for none beyond accuracy). `needs_target` False (or a
    function of the params) says the reward scores a row without its gold answer, so a row
    with an empty target is not refused at load (code tests, ifeval, a judge).

    `fields` names the task fields the reward reads and cannot score without, checked on
    every task before anything is generated (`check_task_fields`). Each spec is a field
    name ("numbers"), alternatives of which any one will do ("numbers|metadata"), or
    "{param}": the field the card's param `param` names (a list-valued param names
    alternatives). A function of the card's params may give specs or `Field`s instead.

    `runs_code` says the reward runs programs in the sandbox (the model's code, a checker), so
    the sandbox's isolation is checked before generation for every card it scores; `forgeable`
    says its verdict is reached inside the model's own interpreter (training on it warns)."""

    def deco(factory: RewardFactory) -> RewardFactory:
        if metrics is not None:
            factory.__arle_metrics__ = metrics  # type: ignore[attr-defined]
        factory.__arle_needs_target__ = needs_target  # type: ignore[attr-defined]
        factory.__arle_fields__ = fields  # type: ignore[attr-defined]
        factory.__arle_runs_code__ = runs_code  # type: ignore[attr-defined]
        factory.__arle_forgeable__ = forgeable  # type: ignore[attr-defined]
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


def runs_code(name: str) -> bool:
    """Whether reward `name` runs programs (the model's, or checkers) in the sandbox, as it
    declares with `@register(runs_code=True)`: a card scored by it has its isolation checked,
    and under `--sandbox require` enforced, before anything is generated."""
    return bool(getattr(_factory(name), "__arle_runs_code__", False))


def forgeable(name: str) -> bool:
    """Whether reward `name`'s verdict is reached inside the model's own interpreter, so code
    written to cheat can forge it (`@register(forgeable=True)`: training on it warns)."""
    return bool(getattr(_factory(name), "__arle_forgeable__", False))


def needs_target(name: str, params: dict[str, Any] | None = None) -> bool:
    """Whether reward `name` with `params` scores against each row's gold target (what it
    declares with `@register(needs_target=...)`; a reward that declares nothing does)."""
    declared = getattr(_factory(name), "__arle_needs_target__", True)
    return bool(declared(params or {}) if callable(declared) else declared)


def unknown_metrics(name: str, params: dict[str, Any], metrics: Iterable[str]) -> list[tuple[str, list[str]]]:
    """Each of `metrics` that reward `name` does not report, with its near names."""
    known = reward_metrics(name, params)
    return [
        (m, difflib.get_close_matches(m, [*known, "pass@1"], n=1))
        for m in metrics
        if m not in known and not _PASS_AT_K.fullmatch(m)
    ]


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


MAX_ERROR_CHARS = 300


def score_samples(score: RewardFn, tasks: Sequence[Task], episodes: Sequence[Episode]) -> list[Score]:
    """Score each episode against the task at the same position: through the reward's
    `score_batch` when it has one (the judge grades a batch in one engine call), else one
    call per sample. The one scoring path of eval and training.

    A sample whose reward raises (any Exception: a row the reward cannot read, a bug in a
    plugin, model text that trips a checker) or returns something that is no Score is that
    sample's problem: it scores 0.0, wrong, with `details["reward_error"]` naming the error,
    and the run goes on. A batch that raises is scored again one sample at a time, so only
    the samples that raise are marked.

    A UserError still stops the run: a reward raises one for a mistake the user must fix
    (a judge that cannot be reached after its retries, a column the card maps that the
    rows lack), which would fail every sample alike; samples already written are kept, and
    once it is fixed `--resume` continues. Mistakes a reward can see before generation are
    refused up front instead (`check_params`, `check_task_fields`, `check_tasks`).
    KeyboardInterrupt and SystemExit are not Exceptions: they stop the run as always.

    An episode whose final turn thought and gave no answer (`Episode.thinking_cut`: its
    budget ran out inside the thought) is not shown to the reward at all: it scores 0.0,
    wrong, nothing extracted, `details["no_answer"]` set, whatever its thought mentions."""
    if any(e.thinking_cut for e in episodes):
        answered = [i for i, e in enumerate(episodes) if not e.thinking_cut]
        scored = iter(score_samples(score, [tasks[i] for i in answered], [episodes[i] for i in answered]))
        return [no_answer_score() if e.thinking_cut else next(scored) for e in episodes]
    batch = getattr(score, "score_batch", None)
    if batch is not None and len(tasks) > 1:
        try:
            results = list(batch(list(tasks), list(episodes)))
            if len(results) == len(tasks) and all(_is_score(r) for r in results):
                return results
        except UserError:
            raise
        except Exception:
            pass  # one sample's error fails its whole batch: score them alone, below
    return [_score_one(score, t, e) for t, e in zip(tasks, episodes, strict=True)]


def _score_one(score: RewardFn, task: Task, episode: Episode) -> Score:
    try:
        result = score(task, episode)
        if not _is_score(result):
            raise TypeError(f"the reward returned {type(result).__name__}, not a Score")
        return result
    except UserError:
        raise
    except Exception as exc:
        return failed_score(exc)


def _is_score(result: Any) -> bool:
    # What eval and training read from it must convert, or the sample would fail later.
    if not isinstance(result, Score) or not isinstance(result.details, dict):
        return False
    try:
        float(result.reward)
    except (TypeError, ValueError):
        return False
    return True


NO_ANSWER = "no_answer"  # the detail of a sample whose turn ended inside its thinking


def no_answer_score() -> Score:
    """The Score of a sample that thought and gave no answer: 0.0, wrong, nothing extracted."""
    return Score(0.0, False, None, {NO_ANSWER: "the turn ended inside its thinking"})


def failed_score(exc: BaseException) -> Score:
    """The Score of a sample whose reward raised `exc`: 0.0, wrong, and the error (its type
    and a clipped message, safe to write as UTF-8) in `details["reward_error"]`."""
    try:
        message = clean_text(str(exc))
    except Exception:  # an exception whose own __str__ raises
        message = "(its message could not be read)"
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + "..."
    return Score(
        0.0, False, None, {REWARD_ERROR: f"{type(exc).__name__}: {message}" if message else type(exc).__name__}
    )


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
            known = (
                f"did you mean '{near[0]}'?"
                if near
                else (f"it takes: {', '.join(declared)}" if declared else "it takes no params")
            )
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
    type(None): ("null", "nulls"),
    bool: ("true or false", "booleans"),
    int: ("a whole number", "whole numbers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
    dict: ("a mapping", "mappings"),
    list: ("a list", "lists"),
}


def declared_fields(factory: RewardFactory) -> Fields:
    """What `factory` declares with `@register(..., fields=...)` (nothing for a plain function)."""
    return getattr(factory, "__arle_fields__", ())


def spec_params(spec: str) -> list[str]:
    """The card params a field spec refers to ("{test_field}" -> ["test_field"])."""
    return [p for alt in spec.split("|") if (p := _param_ref(alt)) is not None]


def _param_ref(alt: str) -> str | None:
    m = _PARAM_REF.fullmatch(alt.strip())
    return m.group(1) if m else None


def reward_fields(name: str, params: dict[str, Any] | None = None) -> list[Field]:
    """The task fields reward `name` with the card's `params` cannot score without, each
    "{param}" resolved to the column the param (or its default) names."""
    factory = _factory(name)
    params = params or {}
    declared = declared_fields(factory)
    specs = declared(params) if callable(declared) else declared
    defaults = {
        n: p.default
        for n, p in inspect.signature(factory).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    fields = [s if isinstance(s, Field) else _resolve(s, params, defaults) for s in specs]
    return [f for f in fields if f.names]  # a param set to null names no column: nothing to check


def _resolve(spec: str, params: dict[str, Any], defaults: dict[str, Any]) -> Field:
    names: list[str] = []
    param = None
    for alt in spec.split("|"):
        ref = _param_ref(alt)
        if ref is None:
            names.append(alt.strip())
            continue
        param = param or ref
        value = params.get(ref, defaults.get(ref))  # a reward's declaration names its own params (tested)
        names.extend(str(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None)
    return Field(tuple(names), param)


def check_task_fields(name: str, params: dict[str, Any], tasks: Sequence[Task], origin: str) -> None:
    """Refuse tasks that lack a field reward `name` reads (`@register(fields=...)`), before
    generation.

    The error names the first such task, the field, where the rows came from, and the fix."""
    for need in reward_fields(name, params):
        for task in tasks:
            if not any(n in task.fields for n in need.names):
                which = " or ".join(repr(n) for n in need.names)
                fix = f", or point the card's reward param {need.param} at the right one" if need.param else ""
                raise UserError(
                    f"task {task.id!r} of {origin} has no field {which}, which reward '{name}' needs; "
                    f"give rows with that column{fix}"
                )
