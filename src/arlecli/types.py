"""The nouns every layer shares: Task, Episode, Score.

A benchmark card turns dataset rows into Tasks; an env turns a Task and the
engine's completions into an Episode; a reward turns (Task, Episode) into a Score.
Eval and train consume the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Task:
    """One problem to solve: what the model sees and what a correct answer is.

    `fields` holds the row's values after the card's field map (and transform), so
    prompt templates and rewards can reach any column (e.g. `test`, `entry_point`).
    """

    id: str
    input: str
    target: Any
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Turn:
    """One model turn: what was sent and what came back, with the engine's token ids."""

    prompt: str | list[dict[str, str]]
    completion: str
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"


@dataclass
class Episode:
    """Everything one rollout produced for one task (one turn for single-turn envs)."""

    task_id: str
    turns: list[Turn] = field(default_factory=list)

    @property
    def completion(self) -> str:
        """The final model output, which single-turn rewards score."""
        return self.turns[-1].completion if self.turns else ""


@dataclass
class Score:
    """A reward's verdict. `details` holds named sub-metrics (e.g. strict_match)."""

    reward: float
    correct: bool
    extracted: Any = None
    details: dict[str, Any] = field(default_factory=dict)
