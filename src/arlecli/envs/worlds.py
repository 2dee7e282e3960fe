"""What every interactive text world (ScienceWorld, TextWorld, ALFWorld-style games) reports.

A world env's `info()` holds, at the episode's end, the keys `world_stats` reads:

    world       the world's name ("scienceworld", "textworld")
    won         the world's own verdict: the task was completed
    score       the world's score normalised to 0-1 (ScienceWorld's 0-100 / 100; TextWorld's
                score / max_score)
    steps       actions the world executed (valid or not)
    invalid_actions   replies the world did not accept as an action

so results.json gets one `world` block for all of them (the env kinds register
`stats=world_stats`), and the reward reads the same fields (`world_reward`).
"""

from __future__ import annotations

from typing import Any

from arlecli.types import Episode, Score


def world_outcomes(samples: list[Any]) -> list[dict[str, Any]]:
    """The env_info of the samples that ran in a world (those with a `world` key)."""
    return [s.env_info for s in samples if isinstance(getattr(s, "env_info", None), dict) and "world" in s.env_info]


def world_stats(samples: list[Any]) -> dict[str, Any]:
    """results.json's `world` block: episodes, success_rate (the world's `won`), mean_score
    (0-1), steps_to_success (mean steps of the won episodes; None when none won) and
    invalid_actions_per_episode."""
    outs = world_outcomes(samples)
    if not outs:
        return {}
    won = [o for o in outs if o.get("won")]
    return {
        "world": {
            "episodes": len(outs),
            "success_rate": len(won) / len(outs),
            "mean_score": sum(float(o.get("score") or 0.0) for o in outs) / len(outs),
            "steps_to_success": sum(int(o.get("steps", 0)) for o in won) / len(won) if won else None,
            "invalid_actions_per_episode": sum(int(o.get("invalid_actions", 0)) for o in outs) / len(outs),
        }
    }


def world_reward(episode: Episode) -> Score:
    """The world's own verdict as a Score: reward = its normalised score, correct = won."""
    info = episode.info if isinstance(episode.info, dict) else {}
    score = max(0.0, min(1.0, float(info.get("score") or 0.0)))
    details: dict[str, Any] = {k: info[k] for k in ("won", "score", "steps", "invalid_actions") if k in info}
    return Score(reward=score, correct=bool(info.get("won")), details=details)
