"""The controls long reasoning needs (DAPO, arXiv 2503.14476), beside TRL's own.

Two of DAPO's four techniques are GRPOConfig fields already and reach TRL as they are
(`--set epsilon_high=0.28`, `--set loss_type=dapo`, see train.config): clip-higher and the
token-level policy-gradient loss. The other two, and DAPO's reward shaping, need arle's
rollouts and live here, one documented field each (`DAPOOptions`), set in a recipe or with
`--set` like any trainer field:

- overlong filtering: a sample cut at its token limit (finish reason "length") or inside its
  thought (no answer) carries no loss (env_mask 0 on all of its tokens). Its reward still
  counts in its group's baseline, as in DAPO. TRL's `mask_truncated_completions` decides
  "cut" from the last token of the flattened sequence, which a multi-turn episode or a cut
  thought does not show; this one reads the episode.
- soft overlong punishment: a length-aware penalty added to the card's reward in the last
  `overlong_buffer_len` tokens of the per-turn budget (`overlong_penalty`).
- dynamic sampling: a group whose rewards are all equal (all right, all wrong) teaches nothing;
  it is dropped and replaced by a group of another task, sampled in up to
  `dynamic_sampling_rounds` more rounds (`fill_groups`). The counts go to metrics.jsonl
  (rLLM's zero-advantage diagnostic) with the share of the step's generated tokens spent on
  dropped groups.

This module holds no trainer: the GRPO/RLOO glue (train.grpo), the reward adapter
(train.reward) and the sequences (train.batches) call into it.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from arlecli.errors import UserError
from arlecli.train.algorithm import Algorithm, names
from arlecli.types import Episode, Score


@dataclass(frozen=True)
class DAPOOptions:
    """DAPO's controls of a training run (defaults: all off, plain GRPO/RLOO/PPO).

    overlong_filter (`bool`, defaults to `False`):
        Overlong filtering (DAPO section 3.4): no loss from a sample that was cut, i.e. one of
        its turns stopped at the token limit (finish reason "length") or ended inside its
        thought (`thinking_cut`: no answer). grpo, rloo and ppo.
    overlong_buffer_len (`int`, defaults to `0`):
        Soft overlong punishment (DAPO eq. 13): the last `overlong_buffer_len` tokens of the
        per-turn budget `max_completion_length` form a penalty band. A turn of L tokens with
        L <= max - buffer costs nothing; inside the band it costs
        `overlong_penalty_factor * (L - (max - buffer)) / buffer`; past the budget the whole
        factor. The episode's longest turn decides. 0 turns it off. DAPO: 4096 of 20480.
    overlong_penalty_factor (`float`, defaults to `1.0`):
        The penalty at the end of the band (DAPO: 1.0, the size of its correct/wrong reward gap).
    dynamic_sampling (`bool`, defaults to `False`):
        Dynamic sampling (DAPO section 3.2): each step, a group (one task's `num_generations`
        completions) whose card rewards are all equal (all right or all wrong; the overlong
        penalty aside, as DAPO filters on accuracy) is dropped and refilled with a group of
        another task (tasks not dropped this step, those outside the batch first), so the
        batch holds only groups with a learning signal. grpo and rloo, one process.
    dynamic_sampling_rounds (`int`, defaults to `4`):
        At most this many refill rounds per step (DAPO's `max_num_gen_batches`). Groups still
        missing after them are filled with dropped groups that carry no loss (logged as
        `dynamic_sampling/unfilled_groups`), so a step never waits on an endless search.
    """

    overlong_filter: bool = False
    overlong_buffer_len: int = 0
    overlong_penalty_factor: float = 1.0
    dynamic_sampling: bool = False
    dynamic_sampling_rounds: int = 4

    def check(self, algo: Algorithm, where: str = "settings") -> None:
        """A UserError naming the setting that `algo` cannot use (its declaration says which it
        takes: overlong_filter, dynamic_sampling), or a bad value."""
        if self.overlong_buffer_len < 0 or self.dynamic_sampling_rounds < 0:
            raise UserError(f"{where}: overlong_buffer_len and dynamic_sampling_rounds must be >= 0")
        if self.overlong_penalty_factor < 0:
            raise UserError(f"{where}: overlong_penalty_factor must be >= 0 (it is subtracted from the reward)")
        if (self.overlong_filter or self.overlong_buffer_len) and not algo.overlong_filter:
            raise UserError(
                f"{where}: overlong_filter and overlong_buffer_len are for --algo "
                f"{', '.join(names(lambda a: a.overlong_filter))}, not {algo.name}"
            )
        if self.dynamic_sampling and not algo.dynamic_sampling:
            raise UserError(
                f"{where}: dynamic_sampling drops groups of completions of one task, which only "
                f"--algo {' and '.join(names(lambda a: a.dynamic_sampling))} sample; not {algo.name}"
            )


DAPO_FIELDS = {name: spec.type for name, spec in DAPOOptions.__dataclass_fields__.items()}


def is_cut(episode: Episode) -> bool:
    """Whether a turn of `episode` stopped at its token limit or ended inside its thought."""
    return any(t.finish_reason == "length" or t.thinking_cut for t in episode.turns)


def longest_turn(episode: Episode) -> int:
    """The most tokens one model turn of `episode` generated (thinking and answer together)."""
    return max((t.completion_count() or 0 for t in episode.turns), default=0)


def overlong_penalty(length: int, max_tokens: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment for a turn of `length` tokens under a budget of
    `max_tokens` with a penalty band of the last `buffer` tokens (0: no penalty); <= 0."""
    if buffer <= 0 or max_tokens <= 0:
        return 0.0
    start = max_tokens - min(buffer, max_tokens)
    if length <= start:
        return 0.0
    if length <= max_tokens:
        return -factor * (length - start) / min(buffer, max_tokens)
    return -factor


@dataclass
class Filled:
    """A step's batch after dynamic sampling.

    `episodes`, `indices` (task per row) and `scores` are the rows the trainer gets, in
    groups of `group`; `trained[i]` is False for a row of a dropped group kept only to fill
    the batch (it carries no loss). `scored` is every (episode, task index, score, dropped)
    sampled this step, in sampling order (what rewards.jsonl records); `stats` the metrics."""

    episodes: list[Episode]
    indices: list[int]
    scores: list[Score]
    trained: list[bool]
    scored: list[tuple[Episode, int, Score, bool]] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)


def flat_group(scores: Sequence[Score], tolerance: float = 1e-6) -> bool:
    """Whether the card's rewards of one group are all equal: all right or all wrong, as DAPO's
    filter reads its accuracy. The soft overlong penalty is left out: it tells a group's
    samples apart by their lengths alone, which is no signal about the task."""
    rewards = [card_reward(s) for s in scores]
    return max(rewards) - min(rewards) <= tolerance


def card_reward(score: Score) -> float:
    """The card's reward in a (possibly shaped) Score: the overlong penalty taken back out."""
    penalty = score.details.get("overlong_penalty", 0.0) if isinstance(score.details, dict) else 0.0
    return float(score.reward) - float(penalty or 0.0)


def fill_groups(
    indices: list[int],
    group: int,
    draw: Callable[[list[int]], list[Episode]],
    judge: Callable[[list[Episode], list[int]], list[Score]],
    refill: Callable[[int, list[set[int]], int], list[int]],
    rounds: int,
) -> Filled:
    """Dynamic sampling over one step's batch `indices` (task indices, each task's `group`
    entries consecutive, as TRL's sampler orders them).

    `draw(indices)` samples one episode per entry, `judge(episodes, indices)` scores them (the
    reward the trainer uses), `refill(n, last, round)` names `n` tasks to sample next, those
    in the sets of `last` only when there are too few others (first the batch's tasks, then
    the dropped ones, likeliest to be all-equal again). Round 0 is the batch itself; each later
    round samples as many groups as are still missing. Groups still missing after `rounds`
    refill rounds are filled with dropped groups, marked untrained."""
    if group < 2 or len(indices) % group:
        raise ValueError(
            f"dynamic sampling needs whole groups of >= 2 completions, got {len(indices)} rows in groups of {group}"
        )
    needed = len(indices) // group
    kept: list[tuple[list[Episode], list[int], list[Score]]] = []
    dropped: list[tuple[list[Episode], list[int], list[Score]]] = []
    scored: list[tuple[Episode, int, Score, bool]] = []
    tokens = {"kept": 0, "dropped": 0}
    batch_tasks = {int(i) for i in indices}
    todo, done_rounds = list(indices), 0
    while todo:
        episodes = draw(todo)
        scores = judge(episodes, todo)
        for start in range(0, len(todo), group):
            rows = (episodes[start : start + group], todo[start : start + group], scores[start : start + group])
            flat = flat_group(rows[2])
            (dropped if flat else kept).append(rows)
            tokens["dropped" if flat else "kept"] += sum(_tokens(e) for e in rows[0])
            scored += [(e, i, s, flat) for e, i, s in zip(*rows, strict=True)]
        missing = needed - len(kept)
        if missing <= 0 or done_rounds >= rounds:
            break
        done_rounds += 1
        flat_tasks = {int(g[1][0]) for g in dropped}
        tasks = refill(missing, [batch_tasks - flat_tasks, flat_tasks], done_rounds)
        todo = [t for t in tasks for _ in range(group)]
    unfilled = dropped[: max(0, needed - len(kept))]
    chosen = [(g, True) for g in kept[:needed]] + [(g, False) for g in unfilled]
    total = tokens["kept"] + tokens["dropped"]
    stats = {
        "dynamic_sampling/dropped_groups": float(len(dropped)),
        "dynamic_sampling/sampled_groups": float(len(kept) + len(dropped)),
        "dynamic_sampling/refill_rounds": float(done_rounds),
        "dynamic_sampling/unfilled_groups": float(len(unfilled)),
        "dynamic_sampling/dropped_token_share": tokens["dropped"] / total if total else 0.0,
    }
    return Filled(
        episodes=[e for (g, _) in chosen for e in g[0]],
        indices=[i for (g, _) in chosen for i in g[1]],
        scores=[s for (g, _) in chosen for s in g[2]],
        trained=[ok for (g, ok) in chosen for _ in g[0]],
        scored=scored,
        stats=stats,
    )


def _tokens(episode: Episode) -> int:
    return sum(t.completion_count() or 0 for t in episode.turns)


def refill_picker(num_tasks: int, seed: int, step: int) -> Callable[[int, list[set[int]], int], list[int]]:
    """`refill` for `fill_groups`: `n` tasks drawn with a seed of (seed, step, round), so a
    resumed step draws the same ones: tasks in none of the sets of `last` first (shuffled),
    then those of each set in turn (never none: a one-task split refills from itself)."""

    def pick(n: int, last: list[set[int]], round_no: int) -> list[int]:
        digest = hashlib.sha256(f"{seed}:{step}:{round_no}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "little"))
        later = set().union(*last) if last else set()
        tiers = [[t for t in range(num_tasks) if t not in later]]
        tiers += [
            [t for t in range(num_tasks) if t in group and all(t not in g for g in last[:k])]
            for k, group in enumerate(last)
        ]
        pool: list[int] = []
        for tier in tiers:
            rng.shuffle(tier)
            pool += tier
        return [pool[k % len(pool)] for k in range(n)]

    return pick


def shaped(score: Score, episode: Episode, options: DAPOOptions, max_tokens: int) -> Score:
    """`score` with the soft overlong punishment added to its reward (the same Score when the
    band is off or the episode stayed short of it); the penalty goes in details."""
    penalty = overlong_penalty(
        longest_turn(episode), max_tokens, options.overlong_buffer_len, options.overlong_penalty_factor
    )
    if not penalty:
        return score
    return Score(
        reward=float(score.reward) + penalty,
        correct=score.correct,
        extracted=score.extracted,
        details={**score.details, "overlong_penalty": penalty},
    )
