"""The one reward path: a TRL reward function over the card's `score(task, episode)`.

Every trainer's completions come from `train.rollout` as whole Episodes (the ones the eval
would produce), so the adapter scores exactly what `arle eval` scores: TRL hands each
rollout's `episode` (an extra field of the rollout) and the dataset's `task_index` column to
reward functions; PPO calls `score` directly. Each verdict is one line of rewards.jsonl.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

from arlecli import safeio
from arlecli.cards import Card
from arlecli.efficiency import thinking_counts
from arlecli.envs import env_kind
from arlecli.rewards import check_tasks, get_reward, score_samples
from arlecli.types import Episode, Score, Task

REWARDS_FILE = "rewards.jsonl"


class CardReward:
    """Scores episodes with the card's reward; callable as a TRL reward function.

    Per-sample verdicts are appended to `<run>/rewards.jsonl`, with each episode's finish
    reason (and, for multi-turn cards, its turns and end reason).

    Under several processes each rank scores its own completions; `gather` (every rank's
    lines, in rank order, on every rank) lets the one rank given a `run_dir` write them all, so
    the file keeps one line per completion. Every rank must then call the adapter equally often,
    as TRL's trainers do."""

    def __init__(self, card: Card, tasks: list[Task], run_dir: Path | None = None,
                 gather: Callable[[list[str]], list[str]] | None = None) -> None:
        self.card = card
        self.tasks = tasks
        self.score_fn = get_reward(card.reward, card.reward_params)
        check_tasks(self.score_fn, card, tasks)
        self.multi_turn = env_kind(card.env).multi_turn
        self.path = Path(run_dir) / REWARDS_FILE if run_dir is not None else None
        self.__name__ = card.reward  # TRL names the logged metric rewards/<__name__>/mean
        self._lock = threading.Lock()
        self._correct: list[bool] = []  # since the last pop_accuracy(), for loops without log_metric
        self.step: int | None = None    # the step label for callers that pass none (ppo)
        self.gather = gather
        self.last: list[float] = []     # the rewards of the latest TRL call (the seat advantages read them)

    def close(self) -> None:
        """Release what the reward holds (a judge's engine; it reports replies without a verdict)."""
        close = getattr(self.score_fn, "close", None)
        if close is not None:
            close()

    def score(self, episodes: list[Episode], indices: list[int], step: int | None = None) -> list[Score]:
        """Score each episode against the task at the same position in `indices`."""
        step = self.step if step is None else step
        scores: list[Score] = []
        lines: list[str] = []
        tasks = [self.tasks[int(index)] for index in indices]
        # A reward that grades many at once (the judge) gets the batch; one that raises on a
        # completion scores it 0 with the error in its details, and the step goes on (score_samples).
        results = score_samples(self.score_fn, tasks, episodes)
        for episode, index, task, result in zip(episodes, indices, tasks, results, strict=True):
            scores.append(result)
            line = {"step": step, "task_id": task.id, "task_index": int(index), "completion": episode.completion,
                    "extracted": result.extracted, "target": task.target, "reward": float(result.reward),
                    "correct": bool(result.correct), "details": result.details,
                    "finish_reason": episode.turns[-1].finish_reason if episode.turns else None,
                    **thinking_counts(episode.turns)}
            if self.multi_turn:
                line.update(turns=len(episode.turns), end_reason=episode.end_reason, env_info=episode.info)
            lines.append(safeio.dumps(line, default=str) + "\n")  # valid UTF-8 whatever the model wrote
        if self.gather is not None:
            lines = self.gather(lines)
        with self._lock:
            self._correct.extend(bool(s.correct) for s in scores)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.writelines(lines)
        return scores

    def __call__(self, prompts: list[Any], completions: list[Any], task_index: list[int], episode: list[Episode],
                 trainer_state: Any = None, log_metric: Any = None, **_: Any) -> list[float]:
        """TRL's reward-function signature: every dataset column and each rollout's `episode`
        arrive as keywords (`completions` is TRL's decoding of the same ids, not scored)."""
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        scores = self.score(episode, task_index, step=step)
        self.last = [float(s.reward) for s in scores]
        if log_metric is not None and scores:
            log_metric("accuracy", sum(s.correct for s in scores) / len(scores))
            self.pop_accuracy()  # TRL averaged it already
        return list(self.last)

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
            step = safeio.loads(raw).get("step")
        except (ValueError, AttributeError):  # damaged (or not an object): keep nothing after it
            break
        if step is None or step <= after_step:
            keep.append(raw)
    path.write_bytes(b"".join(keep))
