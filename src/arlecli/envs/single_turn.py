"""The single-turn environment: render the prompt, take one completion, done.

`reset` renders what the model sees (a raw prompt string for `format: completion`, chat
messages for `format: chat`), with few-shot exemplars in front; `step` records the one
completion and ends the episode. Multi-turn envs follow the same reset/step shape.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

from arlecli.cards import Prompt
from arlecli.envs import Step, register_env
from arlecli.errors import UserError
from arlecli.types import Episode, Task, Turn

Rendered = str | list[dict[str, Any]]


def _context(task: Task) -> dict[str, Any]:
    return {**task.fields, "input": task.input, "target": task.target, "id": task.id}


def fill(template: str, task: Task, where: str = "prompt.template") -> str:
    """Fill `{column}` placeholders from the task; an unknown column names the card field."""
    ctx = _context(task)
    try:
        return string.Formatter().vformat(template, (), ctx)
    except KeyError as exc:
        raise UserError(f"card field '{where}' uses {{{exc.args[0]}}}, which is not a column of the rows "
                        f"(columns: {', '.join(sorted(ctx))}); use {{{{ }}}} for literal braces") from None
    except (IndexError, ValueError) as exc:
        raise UserError(f"card field '{where}' is not a valid template: {exc}") from None


def reset(prompt: Prompt, task: Task, exemplars: list[Task] | None = None) -> Rendered:
    """What the model sees for `task`, with `exemplars` rendered as solved examples first."""
    exemplars = exemplars or []
    if prompt.format == "completion":
        shots = [fill(prompt.template, ex) + fill(prompt.fewshot.target, ex, "prompt.fewshot.target")
                 for ex in exemplars]
        body = prompt.fewshot.separator.join([*shots, fill(prompt.template, task)])
        return f"{prompt.system}\n\n{body}" if prompt.system else body
    messages: list[dict[str, str]] = []
    if prompt.system:
        messages.append({"role": "system", "content": prompt.system})
    for ex in exemplars:  # few-shot as alternating turns (lm-eval's fewshot_as_multiturn)
        messages.append({"role": "user", "content": fill(prompt.template, ex)})
        messages.append({"role": "assistant",
                         "content": fill(prompt.fewshot.target, ex, "prompt.fewshot.target").strip()})
    messages.append({"role": "user", "content": fill(prompt.template, task)})
    return messages


def step(task: Task, rendered: Rendered, turn: Turn) -> Episode:
    """Record the single completion; the episode is done after one turn."""
    turn.prompt = rendered
    return Episode(task_id=task.id, turns=[turn])


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
def single_turn_env(card: Any, task: Task, exemplars: list[Task], native_tools: bool) -> SingleTurnEnv:
    """Env factory for `env: single_turn` (the default)."""
    return SingleTurnEnv(reset(card.prompt, task, exemplars))
