"""Environments: how a Task and the model's turns become an Episode.

An env kind is registered by name with `@register_env("name")`: a factory
`(card, task, exemplars, native_tools, **params) -> Env`, one Env per episode, and the driver
that runs its episodes against an engine (default: `envs.episodes.run_episodes`, turn by turn;
`env: rollout` registers the @rollout agent driver). A card names its env (`env: tools` or
`env: {name: tools, params: {...}}`) by registered name, "module:attr" or "file.py:attr" (a
factory, decorated or not), or a package adds one through an `arle.envs` entry point
(arlecli/plugins.py). `envs.episodes.collect` is the one producer of
Episodes, for eval and for every trainer alike: it looks the driver up here, so no caller
ever compares env names.

    env.reset() -> prompt          what the model sees first (chat messages, or a raw
                                   prompt string for single-turn completion cards)
    env.step(completion) -> Step   the environment's reply messages, and whether the
                                   episode is over (and why)
    env.info() -> dict             what a reward may need at the end (a game's outcome)
    env.tools                      JSON schemas of its tools (native chat-template tools)
    env.max_turns                  model turns before the episode ends ("turn_limit")

Every module of this package registers its env kinds on import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from arlecli.errors import UserError
from arlecli.plugins import Registry


@dataclass
class Step:
    """The environment's answer to one model turn."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    reason: str = "done"


class Env(Protocol):
    """One episode's environment."""

    tools: list[dict[str, Any]] | None
    max_turns: int

    def reset(self) -> Any: ...

    def step(self, completion: str) -> Step: ...

    def info(self) -> dict[str, Any]: ...


EnvFactory = Callable[..., Env]
# (engine, jobs) -> (job index, Episode) as each episode ends (see envs.episodes.run_episodes).
Driver = Callable[..., Iterator[tuple[int, Any]]]
# (the card's env params, the card's folder or None) -> None; raises errors.ParamError naming
# the bad param (or UserError) when the card loads, before any episode runs.
ParamsCheck = Callable[[dict[str, Any], Path | None], None]
# (card, task) -> None; raises UserError (naming the task) for a task the kind cannot play (a
# game seed out of range), when tasks load: before any model loads, not mid-run.
TaskCheck = Callable[[Any, Any], object]  # what it returns is not used
# A kind's own results.json blocks from a run's samples (records.Sample): {block name: stats}.
Stats = Callable[[list[Any]], dict[str, Any]]


@dataclass(frozen=True)
class EnvKind:
    """A registered env kind: how to build one episode's env and how its episodes run.

    `multi_turn` False (single_turn only) means an episode is one prompt and one completion,
    so samples need no per-turn record. `replayable` False (the @rollout gateway) means its
    episodes' turns are not the whole conversation the model had (an agent's own requests,
    its rewritten history), so they are no SFT data (rft refuses the card). `check`, when
    set, holds a card's env params to what the kind takes when the card loads. `stats`, when
    set, is the kind's own results.json blocks from a run's samples ({block: stats}, e.g. a
    game env's `games`), next to the blocks every run gets. `check_task`, when set, holds each
    task to what the kind can play when tasks load (`check_env_tasks`)."""

    name: str
    factory: EnvFactory
    driver: Driver | None = None  # None: envs.episodes.run_episodes
    multi_turn: bool = True
    replayable: bool = True
    check: ParamsCheck | None = None
    stats: Stats | None = None
    check_task: TaskCheck | None = None

    def run(self, engine: Any, jobs: list[Any]) -> Iterator[tuple[int, Any]]:
        """Run `jobs` (envs.episodes.Job) on `engine` with this kind's driver."""
        if self.driver is not None:
            return self.driver(engine, jobs)
        from arlecli.envs.episodes import run_episodes

        return run_episodes(engine, jobs)


def _as_kind(obj: Any, name: str) -> EnvKind:
    # A factory named by "module:attr", a file or an entry point: the kind its decorator made
    # (with its driver), else a turn-by-turn multi-turn env.
    kind = getattr(obj, "__arle_env__", None)
    return kind if isinstance(kind, EnvKind) else EnvKind(name, obj)


# Every module of this package registers its env kinds on import; arlecli.agent adds `rollout`.
ENVS: Registry[EnvKind] = Registry("envs", "env", builtin=["arlecli.envs.*", "arlecli.agent"], wrap=_as_kind)


def register_env(
    name: str | None = None,
    *,
    driver: Driver | None = None,
    multi_turn: bool = True,
    replayable: bool = True,
    check: ParamsCheck | None = None,
    stats: Stats | None = None,
    check_task: TaskCheck | None = None,
) -> Callable[[EnvFactory], EnvFactory]:
    """Register an env factory `(card, task, exemplars, native_tools, **params) -> Env` under
    `name` (default: its own name), with the driver that runs its episodes (default: the
    turn-by-turn env driver); see EnvKind for `multi_turn`, `replayable`, `check`, `stats`
    and `check_task`."""

    def deco(factory: EnvFactory) -> EnvFactory:
        kind = EnvKind(name or factory.__name__, factory, driver, multi_turn, replayable, check, stats, check_task)
        factory.__arle_env__ = kind  # type: ignore[attr-defined]
        ENVS.add(kind.name, kind, source=factory)
        return factory

    return deco


def env_names() -> list[str]:
    """The registered env kinds (arle's, decorated in imported modules, entry points)."""
    return ENVS.names()


def env_kind(name: str) -> EnvKind:
    """The env kind `name` (a registered name, "module:attr" or "file.py:attr"); an unknown
    name suggests near ones."""
    return ENVS.get(name)


def check_env_tasks(card: Any, tasks: list[Any]) -> None:
    """Hold every task to what the card's env kind can play (its `check_task`), so that a bad
    row stops the run with one line when tasks load, before a model loads or a sample runs."""
    check = env_kind(card.env).check_task
    if check is not None:
        for task in tasks:
            check(card, task)


def make_env(card: Any, task: Any, exemplars: list[Any] | None = None, native_tools: bool = False) -> Env:
    """A fresh env of the card's kind for one episode of `task`."""
    factory = env_kind(card.env).factory
    try:
        return factory(card, task, exemplars or [], native_tools, **card.env_params)
    except TypeError as exc:
        raise UserError(f"bad params for env '{card.env}': {exc}") from None
