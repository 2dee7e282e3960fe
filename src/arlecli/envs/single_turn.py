"""The single-turn environment: the card's prompt (cards.render_prompt), one completion, done.

Multi-turn envs follow the same reset/step shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arlecli.cards import Card, Rendered, render_prompt
from arlecli.envs import Step, register_env
from arlecli.types import Task


@dataclass
class SingleTurnEnv:
    """The one-step env: the card's prompt, one completion, done."""

    rendered: Rendered
    tools: list[dict[str, Any]] | None = None
    max_turns: int = 1

    def reset(self) -> Rendered:
        return self.rendered

    def step(self, completion: str) -> Step:
        return Step(done=True)

    def info(self) -> dict[str, Any]:
        return {}


@register_env("single_turn", multi_turn=False)
def single_turn_env(card: Card, task: Task, exemplars: list[Task], native_tools: bool) -> SingleTurnEnv:
    """Env factory for `env: single_turn` (the default)."""
    return SingleTurnEnv(render_prompt(card.prompt, task, exemplars))
