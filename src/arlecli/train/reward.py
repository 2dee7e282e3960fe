"""The one reward path: a TRL reward function over the card's `score(task, episode)`.

Every trainer's completions come from `train.batches` as whole Episodes (the ones the eval
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
from arlecli.envs import env_kind
from arlecli.records import RewardRow, RunDir
from arlecli.rewards import check_tasks, get_reward, score_samples
from arlecli.train.dapo import DAPOOptions, shaped
from arlecli.types import Episode, Score, Task

REWARDS_FILE = RunDir.REWARDS


class CardReward:
    """Scores episodes with the card's reward; callable as a TRL reward function.

    Per-sample verdicts are appended to `<run>/rewards.jsonl`, with each episode's finish
    reason (and, for multi-turn cards, its turns, end reason and env info: `seams` there
    names the turns whose prompt the chat template rewrote, see train.batches). With DAPO's
    soft overlong punishment (`shaping`) the reward trained on is the card's plus the penalty;
    a line keeps the card's `reward` and adds `overlong_penalty` and `trained_reward`.

    Under several processes each rank scores its own completions; `gather` (every rank's
    lines, in rank order, on every rank) lets the one rank given a `run_dir` write them all, so
    the file keeps one line per completion. Every rank must then call the adapter equally often,
    as TRL's trainers do."""

    def __init__(
        self,
        card: Card,
        tasks: list[Task],
        run_dir: Path | None = None,
        gather: Callable[[list[str]], list[str]] | None = None,
        *,
        shaping: DAPOOptions | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.card = card
        self.tasks = tasks
        self.score_fn = get_reward(card.reward, card.reward_params)
        check_tasks(self.score_fn, card, tasks)
        self.multi_turn = env_kind(card.env).multi_turn
        self.path = RunDir(run_dir).rewards if run_dir is not None else None
        self.__name__ = card.reward  # TRL names the logged metric rewards/<__name__>/mean
        self._lock = threading.Lock()
        self._correct: list[bool] = []  # since the last pop_accuracy(), for loops without log_metric
        self.step: int | None = None  # the step label for callers that pass none (ppo)
        self.gather = gather
        self.last: list[float] = []  # the rewards of the latest TRL call (the seat advantages read them)
        # DAPO's soft overlong punishment (train.dapo), against the per-turn budget `max_tokens`.
        self.shaping = shaping if shaping is not None and shaping.overlong_buffer_len > 0 and max_tokens else None
        self.max_tokens = max_tokens or 0

    def close(self) -> None:
        """Release what the reward holds (a judge's engine; it reports replies without a verdict)."""
        close = getattr(self.score_fn, "close", None)
        if close is not None:
            close()

    def judge(self, episodes: list[Episode], indices: list[int]) -> list[Score]:
        """The verdict on each episode against the task at the same position in `indices`,
        with the soft overlong punishment added when the run has one (its penalty in
        details). Writes nothing: `record` does."""
        tasks = [self.tasks[int(index)] for index in indices]
        # A reward that grades many at once (the judge) gets the batch; one that raises on a
        # completion scores it 0 with the error in its details, and the step goes on (score_samples).
        results = score_samples(self.score_fn, tasks, episodes)
        if self.shaping is None:
            return results
        return [shaped(r, e, self.shaping, self.max_tokens) for r, e in zip(results, episodes, strict=True)]

    def record(
        self,
        episodes: list[Episode],
        indices: list[int],
        scores: list[Score],
        step: int | None = None,
        dropped: list[bool] | None = None,
    ) -> None:
        """One rewards.jsonl line per verdict (`dropped`: dynamic sampling left that episode's
        group out of the batch); `reward` is the card's, an overlong penalty rides beside it."""
        step = self.step if step is None else step
        lines: list[str] = []
        for k, (episode, index, result) in enumerate(zip(episodes, indices, scores, strict=True)):
            row = RewardRow.from_episode(
                step,
                self.tasks[int(index)],
                index,
                episode,
                result,
                multi_turn=self.multi_turn,
                dropped=bool(dropped[k]) if dropped is not None else None,
            )
            lines.append(safeio.dumps(row.to_json(), default=str) + "\n")  # valid UTF-8 whatever the model wrote
        if self.gather is not None:
            lines = self.gather(lines)
        with self._lock:
            self._correct.extend(bool(s.correct) for s, d in zip(scores, dropped or [False] * len(scores)) if not d)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.writelines(lines)

    def score(self, episodes: list[Episode], indices: list[int], step: int | None = None) -> list[Score]:
        """Score each episode against the task at the same position in `indices` (`judge`) and
        record the verdicts; returns the rewards the trainer uses."""
        scores = self.judge(episodes, indices)
        self.record(episodes, indices, scores, step)
        return scores

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        task_index: list[int],
        episode: list[Episode],
        trainer_state: Any = None,
        log_metric: Any = None,
        arle_score: list[Score] | None = None,
        **_: Any,
    ) -> list[float]:
        """TRL's reward-function signature: every dataset column and each rollout's `episode`
        arrive as keywords (`completions` is TRL's decoding of the same ids, not scored);
        `arle_score`: the verdicts a rollout with dynamic sampling recorded already."""
        step = trainer_state.global_step + 1 if trainer_state is not None else None
        scores = list(arle_score) if arle_score is not None else self.score(episode, task_index, step=step)
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
    path = RunDir(run_dir).rewards
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
