"""Environments: how a Task and the model's turns become an Episode.

An env kind is registered by name with `@register_env("name")`: a factory
`(card, task, exemplars, native_tools) -> Env`, one Env per episode, and the driver that
runs its episodes against an engine (default: `envs.episodes.run_episodes`, turn by turn;
`env: rollout` registers the @rollout agent driver). A card names its env (`env: tools` or
`env: {name: tools, params: {...}}`); `envs.episodes.collect` is the one producer of
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

import difflib
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from arlecli.errors import UserError


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


@dataclass(frozen=True)
class EnvKind:
    """A registered env kind: how to build one episode's env and how its episodes run.

    `multi_turn` False (single_turn only) means an episode is one prompt and one completion,
    so samples need no per-turn record."""

    name: str
    factory: EnvFactory
    driver: Driver | None = None  # None: envs.episodes.run_episodes
    multi_turn: bool = True

    def run(self, engine: Any, jobs: list[Any]) -> Iterator[tuple[int, Any]]:
        """Run `jobs` (envs.episodes.Job) on `engine` with this kind's driver."""
        if self.driver is not None:
            return self.driver(engine, jobs)
        from arlecli.envs.episodes import run_episodes

        return run_episodes(engine, jobs)


_ENVS: dict[str, EnvKind] = {}


def register_env(name: str, *, driver: Driver | None = None,
                 multi_turn: bool = True) -> Callable[[EnvFactory], EnvFactory]:
    """Register an env factory `(card, task, exemplars, native_tools, **params) -> Env` under
    `name`, with the driver that runs its episodes (default: the turn-by-turn env driver)."""

    def deco(factory: EnvFactory) -> EnvFactory:
        _ENVS[name] = EnvKind(name, factory, driver, multi_turn)
        return factory

    return deco


def env_names() -> list[str]:
    """The registered env kinds."""
    _load_builtin()
    return sorted(_ENVS)


def env_kind(name: str) -> EnvKind:
    """The registered env kind `name`; an unknown name suggests near ones."""
    _load_builtin()
    if name not in _ENVS:
        near = difflib.get_close_matches(name, _ENVS, n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise UserError(f"unknown env '{name}'{hint}; known: {', '.join(sorted(_ENVS))}")
    return _ENVS[name]


def make_env(card: Any, task: Any, exemplars: list[Any] | None = None, native_tools: bool = False) -> Env:
    """A fresh env of the card's kind for one episode of `task`."""
    factory = env_kind(card.env).factory
    try:
        return factory(card, task, exemplars or [], native_tools, **card.env_params)
    except TypeError as exc:
        raise UserError(f"bad params for env '{card.env}': {exc}") from None


def _load_builtin() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
