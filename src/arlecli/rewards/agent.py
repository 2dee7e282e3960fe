"""Rewards for agent cards: solver-then-judge episodes (a game's outcome, FrozenLake's, is
scored beside its env: envs/frozenlake.py)."""

from __future__ import annotations

from typing import Any

from arlecli.rewards import Field, RewardFn, get_reward, register, reward_fields, reward_metrics
from arlecli.types import Episode, Score, Task


@register(
    "solver_judge",
    metrics=lambda p: [
        *reward_metrics(p.get("reward", "countdown"), p.get("reward_params")),
        "solver_correct",
        "judge_fixed",
    ],
    fields=lambda p: _inner_fields(p.get("reward", "countdown"), p.get("reward_params")),
)
def solver_judge(reward: str = "countdown", reward_params: dict[str, Any] | None = None) -> RewardFn:
    """A solver-then-judge episode (envs/judge.py) scored by `reward` on the final (judge's)
    answer, with the solver's own first answer scored by the same reward as a detail.

    The score, `correct` and every detail are the inner reward's on the final completion,
    unchanged; added details: solver_correct (0/1: the first turn scored alone) and
    judge_fixed (0/1: the solver was wrong and the final answer is right). On a one-turn
    episode the solver's answer is the final one.
    """
    inner = get_reward(reward, reward_params)

    def score(task: Task, episode: Episode) -> Score:
        final = inner(task, episode)
        first = inner(task, Episode(episode.task_id, episode.turns[:1], episode.end_reason, episode.info))
        details = {
            **final.details,
            "solver_correct": int(first.correct),
            "judge_fixed": int(final.correct and not first.correct),
        }
        return Score(final.reward, final.correct, final.extracted, details)

    return score


def _inner_fields(reward: str, params: dict[str, Any] | None) -> list[Field]:
    # The wrapped reward reads the same task: its fields, with its params named as the card writes them.
    return [Field(f.names, f"reward_params.{f.param}" if f.param else None) for f in reward_fields(reward, params)]


GAME_METRICS = ["win", "draw", "loss", "invalid_move", "invalid_moves", "turns"]


@register("game", metrics=GAME_METRICS, needs_target=False)
def game() -> RewardFn:
    """A TextArena game (envs/textarena.py): the game's own reward for the player's seat
    (two players: 1 win, 0 draw, -1 loss; a puzzle: 1 solved, else the fraction done), and
    correct when the seat won (a puzzle: solved).

    The outcome is the env's (`episode.info`): a game is scored only as the env played it.

    Takes no params. Details: win, draw, loss, invalid_move (0/1 each: the game ended on
    this seat's invalid move), invalid_moves (how many moves the game refused), turns (this
    seat's moves), seat. `extracted` is the outcome.
    """

    def score(task: Task, episode: Episode) -> Score:
        info = episode.info
        if "outcome" not in info:
            raise ValueError(f"task {task.id}: the game reward scores games played by env 'textarena'")
        outcome = str(info["outcome"])
        details = {
            "win": int(outcome == "win"),
            "draw": int(outcome == "draw"),
            "loss": int(outcome == "loss"),
            "invalid_move": int(bool(info.get("invalid_move"))),
            "invalid_moves": int(info.get("invalid_moves", 0)),
            "turns": int(info.get("turns", 0)),
            "seat": int(info.get("seat", 0)),
        }
        return Score(float(info.get("reward", 0.0)), outcome == "win", outcome, details)

    return score
