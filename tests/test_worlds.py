"""The `world` block every interactive world (ScienceWorld, TextWorld) reports: results.json's
figures from the episodes' env_info, the reward from the world's verdict, and the report's
rows in plain words."""

from __future__ import annotations

from types import SimpleNamespace

from arlecli.envs.worlds import world_reward, world_stats
from arlecli.report import plain_rows
from arlecli.types import Episode


def _sample(**info: object) -> SimpleNamespace:
    return SimpleNamespace(env_info={"world": "scienceworld", **info})


def test_world_stats_count_wins_scores_steps_and_invalid_actions():
    samples = [
        _sample(won=True, score=1.0, steps=10, invalid_actions=0),
        _sample(won=False, score=0.25, steps=30, invalid_actions=4),
        _sample(won=True, score=1.0, steps=20, invalid_actions=2),
        SimpleNamespace(env_info={"seat": 0, "outcome": "win"}),  # a game, not a world: not counted
    ]
    block = world_stats(samples)["world"]
    assert block == {
        "episodes": 3,
        "success_rate": 2 / 3,
        "mean_score": 0.75,
        "steps_to_success": 15.0,
        "invalid_actions_per_episode": 2.0,
    }
    assert world_stats([SimpleNamespace(env_info={})]) == {}
    assert world_stats([_sample(won=False, score=0.0, steps=5)])["world"]["steps_to_success"] is None


def test_the_reward_is_the_worlds_own_verdict_clamped_to_0_1():
    won = world_reward(Episode(task_id="t", info={"won": True, "score": 1.0, "steps": 3}))
    assert (won.reward, won.correct, won.details["steps"]) == (1.0, True, 3)
    lost = world_reward(Episode(task_id="t", info={"won": False, "score": -1.0}))  # ScienceWorld's failed task
    assert (lost.reward, lost.correct) == (0.0, False)


def test_the_report_names_every_figure_of_the_block():
    block = world_stats([_sample(won=True, score=1.0, steps=12, invalid_actions=1)])["world"]
    rows = dict(plain_rows("world", block))
    assert list(rows) == [
        "episodes in a world",
        "episodes the world says were won",
        "the world's score (0-1), mean",
        "world steps to a win (mean)",
        "invalid actions per episode",
    ]
    assert rows["episodes in a world"] == "1" and rows["episodes the world says were won"] == "100.0%"
    assert rows["world steps to a win (mean)"].startswith("12") and rows["invalid actions per episode"].startswith("1")
