"""Rewards: pure, deterministic functions `score(task, episode) -> Score`.

Each reward module registers factories by name with `@register("name")`. A card names
a reward and its params; `get_reward(name, params)` builds the scoring function. The
same function scores eval samples and training completions.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Any, Callable

from arlecli.errors import UserError
from arlecli.types import Episode, Score, Task

RewardFn = Callable[[Task, Episode], Score]
RewardFactory = Callable[..., RewardFn]

_REWARDS: dict[str, RewardFactory] = {}


def register(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Register a reward factory under `name` (its keyword args are the card's params)."""

    def deco(factory: RewardFactory) -> RewardFactory:
        _REWARDS[name] = factory
        return factory

    return deco


def reward_names() -> list[str]:
    """All registered reward names."""
    _load_builtin()
    return sorted(_REWARDS)


def get_reward(name: str, params: dict[str, Any] | None = None) -> RewardFn:
    """Build the scoring function `name` with the card's `params`."""
    _load_builtin()
    if name not in _REWARDS:
        near = difflib.get_close_matches(name, _REWARDS, n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise UserError(f"unknown reward '{name}'{hint}; known: {', '.join(sorted(_REWARDS))}")
    try:
        return _REWARDS[name](**(params or {}))
    except TypeError as exc:
        raise UserError(f"bad params for reward '{name}': {exc}") from None


def _load_builtin() -> None:
    # Imported lazily so `arle --help` stays fast; every module of this package registers
    # its rewards on import.
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
