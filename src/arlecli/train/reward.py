"""The one reward path: a TRL reward function over the card's `score(task, episode)`.

The training dataset carries a `task_index` column; TRL hands every dataset column to
reward functions, so the adapter looks the Task up by index, wraps the completion in the
same Episode the eval builds, and returns the same `score.reward` the eval records. Text is
cut at the card's stop strings first, as the eval's engines do, so a completion earns in
training exactly what it would earn in `arle eval`.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable

from arlecli.cards import Card
from arlecli.envs import single_turn
from arlecli.rewards import get_reward
from arlecli.types import Episode, Score, Task, Turn

REWARDS_FILE = "rewards.jsonl"


def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or (chat prompts) a list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # [{"role": "assistant", "content": ...}], possibly with tool turns
        return "".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")
    return str(completion)


def cut_at_stop(text: str, stop: list[str]) -> str:
    """Cut `text` at the first stop string, as the eval's engines return it."""
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[:min(cuts)] if cuts else text


class CardReward:
    """Scores completions with the card's reward; callable as a TRL reward function.

    `rendered[i]` is task i's prompt as the eval renders it (kept in each Episode, as the
    eval does). Per-sample verdicts are appended to `<run>/rewards.jsonl`.

    Under several processes each rank scores its own completions; `gather` (every rank's
    lines, in rank order, on every rank) lets the one rank given a `run_dir` write them all, so
    the file keeps one line per completion. Every rank must then call the adapter equally often,
    as TRL's trainers do."""

    def __init__(self, card: Card, tasks: list[Task], rendered: list[Any], run_dir: Path | None = None,
                 gather: Callable[[list[str]], list[str]] | None = None,
                 exemplars: list[Task] | None = None) -> None:
        self.card = card
        self.tasks = tasks
        self.exemplars = exemplars or []
        self.rendered = rendered
        self.score_fn = get_reward(card.reward, card.reward_params)
        self.stop = list(card.prompt.stop)
        self.path = Path(run_dir) / REWARDS_FILE if run_dir is not None else None
        self.__name__ = card.reward  # TRL names the logged metric rewards/<__name__>/mean
        self._lock = threading.Lock()
        self._correct: list[bool] = []  # since the last pop_accuracy(), for loops without log_metric
        self.step: int | None = None    # the step label for callers that pass none (ppo)
        self.gather = gather

    def score(self, completions: list[Any], indices: list[int], step: int | None = None,
              episodes: list[Episode] | None = None) -> list[Score]:
        """Score each completion against the task at the same position in `indices`; with
        `episodes` (multi-turn rollouts), score those whole episodes instead."""
        step = self.step if step is None else step
        scores: list[Score] = []
        lines: list[str] = []
        for n, (completion, index) in enumerate(zip(completions, indices, strict=True)):
            task = self.tasks[int(index)]
            if episodes is not None:
                episode = episodes[n]
                text = episode.completion
            else:
                text = cut_at_stop(completion_text(completion), self.stop)
                episode = single_turn.step(task, self.rendered[int(index)], Turn(prompt="", completion=text))
            result = self.score_fn(task, episode)
            scores.append(result)
            line = {"step": step, "task_id": task.id, "task_index": int(index), "completion": text,
                    "extracted": result.extracted, "target": task.target, "reward": float(result.reward),
                    "correct": bool(result.correct), "details": result.details}
            if episodes is not None:
                line.update(turns=len(episode.turns), end_reason=episode.end_reason, env_info=episode.info)
            lines.append(json.dumps(line, ensure_ascii=False, default=str) + "\n")
        if self.gather is not None:
            lines = self.gather(lines)
        with self._lock:
            self._correct.extend(bool(s.correct) for s in scores)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.writelines(lines)
        return scores

    def __call__(self, prompts: list[Any], completions: list[Any], task_index: list[int],
                 trainer_state: Any = None, log_metric: Any = None, episode: list[Episode] | None = None,
                 **_: Any) -> list[float]:
        """TRL's reward-function signature: every dataset column (and each rollout's
        `episode`, for multi-turn envs) arrives as a keyword."""
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        scores = self.score(completions, task_index, step=step, episodes=episode)
        if log_metric is not None and scores:
            log_metric("accuracy", sum(s.correct for s in scores) / len(scores))
            self.pop_accuracy()  # TRL averaged it already
        return [float(s.reward) for s in scores]

    def rewards(self, completions: list[str], indices: list[int]) -> list[float]:
        """`reward_fn(completions, prompt_indices)` as `train_ppo` calls it."""
        return [float(s.reward) for s in self.score(completions, indices)]

    def pop_accuracy(self) -> float | None:
        """Mean `correct` over completions scored since the last call (None if none)."""
        with self._lock:
            done, self._correct = self._correct, []
        return sum(done) / len(done) if done else None


def truncate_rewards(run_dir: Path, after_step: int) -> None:
    """On resume: drop lines of steps after the checkpoint, which are about to be redone."""
    path = Path(run_dir) / REWARDS_FILE
    if not path.exists():
        return
    keep = []
    for raw in path.read_bytes().splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            break  # torn by a kill mid-write
        try:
            step = json.loads(raw).get("step")
        except json.JSONDecodeError:
            break
        if step is None or step <= after_step:
            keep.append(raw)
    path.write_bytes(b"".join(keep))
