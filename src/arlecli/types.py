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
    """One model turn: what was sent and what came back, with the engine's token ids.

    `observation` holds the messages the environment answered this turn with (tool
    results, a game's new state); empty on the last turn."""

    prompt: str | list[dict[str, Any]]
    completion: str
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"
    observation: list[dict[str, Any]] = field(default_factory=list)
    # The engine's counts when they are not the ids' lengths (an endpoint's `usage`), and the
    # turn's generation wall time; None: unknown (see `prompt_count` / `completion_count`).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    # Thinking (thinking.py): what the model wrote before its answer (None: it did not think;
    # `completion` is the answer alone either way, what rewards score and envs read), whether
    # it thought and gave no answer (scored wrong), and how many of `token_ids` are thinking.
    thinking: str | None = None
    thinking_cut: bool = False
    thinking_tokens: int | None = None
    # Positions in `token_ids` that arle wrote rather than the model sampled (the end tag that
    # budget forcing inserts); training keeps them out of the loss.
    forced: list[int] = field(default_factory=list)

    def prompt_count(self) -> int | None:
        """Prompt tokens this turn sent: the engine's count, else the prompt ids' length, else None."""
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        return len(self.prompt_token_ids) if self.prompt_token_ids else None

    def completion_count(self) -> int | None:
        """Tokens this turn generated: the engine's count, else the ids' length; None when the
        engine gave neither for a non-empty completion (an endpoint without ids or usage)."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        if self.token_ids:
            return len(self.token_ids)
        return 0 if not self.completion else None


@dataclass
class Episode:
    """Everything one rollout produced for one task (one turn for single-turn envs).

    `end_reason` says why it ended ("done": the model answered or the game ended;
    "turn_limit"; "length": the context ran out). `info` is what the environment knows
    at the end that a reward may need (a game's outcome, tool-call counts)."""

    task_id: str
    turns: list[Turn] = field(default_factory=list)
    end_reason: str = "done"
    info: dict[str, Any] = field(default_factory=dict)
    # The tool schemas the chat template rendered into every prompt (native tools), or None:
    # part of what the model saw, so a trajectory can be replayed exactly (trajectories.py).
    tools: list[dict[str, Any]] | None = None
    # Asynchronous training (train.overlap): the optimizer steps the weights that sampled it had
    # taken; None: sampled by the weights of the step that trains on it (or not in training).
    policy_version: int | None = None

    @property
    def completion(self) -> str:
        """The final turn's answer (its thinking left out), which single-turn rewards score."""
        return self.turns[-1].completion if self.turns else ""

    @property
    def thinking_cut(self) -> bool:
        """Whether the final turn thought and gave no answer: nothing to score."""
        return bool(self.turns) and self.turns[-1].thinking_cut

    @property
    def cut(self) -> bool:
        """Whether a model turn stopped at its token limit: a conversation that ends its turn
        there would teach an end-of-turn token the model never produced."""
        return any(t.finish_reason == "length" for t in self.turns)


REWARD_ERROR = "reward_error"  # the detail a Score carries when its reward raised (scored wrong)


@dataclass
class Score:
    """A reward's verdict. `details` holds named sub-metrics (e.g. strict_match)."""

    reward: float
    correct: bool
    extracted: Any = None
    details: dict[str, Any] = field(default_factory=dict)
