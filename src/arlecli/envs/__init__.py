"""Environments: how a Task and the model's turns become an Episode.

An env kind is registered by name with `@register_env("name")`: a factory
`(card, task, exemplars, native_tools) -> Env`, one Env per episode. A card names its env
(`env: tools` or `env: {name: tools, params: {...}}`); `envs.episodes.run_episodes`
drives any env against any engine, turn by turn, for eval and for training alike.

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
from typing import Any, Callable, Protocol

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
_ENVS: dict[str, EnvFactory] = {}


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Register an env factory `(card, task, exemplars, native_tools, **params) -> Env`."""

    def deco(factory: EnvFactory) -> EnvFactory:
        _ENVS[name] = factory
        return factory

    return deco


def env_names() -> list[str]:
    """The registered env kinds."""
    _load_builtin()
    return sorted(_ENVS)


def get_env_factory(name: str) -> EnvFactory:
    """The factory for env kind `name`; an unknown name suggests near ones."""
    _load_builtin()
    if name not in _ENVS:
        near = difflib.get_close_matches(name, _ENVS, n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise UserError(f"unknown env '{name}'{hint}; known: {', '.join(sorted(_ENVS))}")
    return _ENVS[name]


def make_env(card: Any, task: Any, exemplars: list[Any] | None = None, native_tools: bool = False) -> Env:
    """A fresh env of the card's kind for one episode of `task`."""
    factory = get_env_factory(card.env)
    try:
        return factory(card, task, exemplars or [], native_tools, **card.env_params)
    except TypeError as exc:
        raise UserError(f"bad params for env '{card.env}': {exc}") from None


def _load_builtin() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
