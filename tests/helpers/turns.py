"""A multi-turn env that always replies, so every episode runs its whole turn limit."""

from __future__ import annotations

from typing import Any, Callable

from arlecli.envs import Step, register_env
from arlecli.types import Task


def register_replying_env(name: str, reply: Callable[[str], str], turns: int = 4) -> None:
    """Register env kind `name`: the task's input as the first user turn, then `reply(completion)`
    as the user's answer to every model turn, for `turns` model turns."""

    @register_env(name)
    def _make(card: Any, task: Task, exemplars: list[Task], native_tools: bool) -> Any:
        class Replying:
            tools = None
            max_turns = turns

            def reset(self) -> list[dict[str, str]]:
                return [{"role": "user", "content": task.input}]

            def step(self, completion: str) -> Step:
                return Step([{"role": "user", "content": reply(completion)}])

            def info(self) -> dict[str, Any]:
                return {}

        return Replying()
