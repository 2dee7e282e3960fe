"""Few-shot exemplars: which solved rows are shown before each task, drawn as lm-eval draws them.

A card's `prompt.fewshot` picks them from one split of its source:

    first_n   the first `n` rows (never the task itself): one list shared by every task
    ids       the rows with these ids, in this order (mbpp: lm-eval's task ids 2, 3, 4)
    default   lm-eval's default sampler: one `random.Random(seed)` (seed 1234, as lm-eval's
              `simple_evaluate` seeds it) draws `n` rows for each task in turn, so each
              task gets its own exemplars and the draws depend on the task order; where
              lm-eval hands its sampler the task itself (`exclude_doc`: the few-shot split is
              the eval split, or the lm-eval task names none), `n + 1` are drawn and rows
              equal to the task dropped, as lm-eval's `ContextSampler.sample` does

`by` (a column) keeps each task to exemplars with the same value there (per-subject MMLU
few-shot), one sampler per value, as lm-eval's one task per subject does.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from arlecli.errors import UserError
from arlecli.types import Task

SAMPLERS = ("first_n", "default")
LMEVAL_SEED = 1234  # lm_eval.defaults.DEFAULT_OTHER_SEED: simple_evaluate's fewshot_random_seed

# One list for every task, or a list per task id (what `draw` returns for `default`).
Exemplars = list[Task] | dict[str, list[Task]]


def exemplars_for(exemplars: Exemplars | None, task: Task) -> list[Task]:
    """The exemplars shown before `task`."""
    if not exemplars:
        return []
    if isinstance(exemplars, dict):
        return exemplars.get(task.id, [])
    return exemplars


def _group(task: Task, by: str | None) -> Any:
    return None if by is None else task.fields.get(by)


def draw(
    pool: Sequence[Task],
    tasks: Sequence[Task],
    n: int,
    *,
    sampler: str = "first_n",
    seed: int = LMEVAL_SEED,
    ids: Sequence[Any] | None = None,
    by: str | None = None,
    exclude_doc: bool = False,
    where: str = "prompt.fewshot",
) -> Exemplars:
    """Exemplars for `tasks` from `pool` (the few-shot split's tasks, in the split's order).

    `exclude_doc`: a task is never its own exemplar (the pool may hold it: the eval split).
    Raises UserError when the pool cannot supply them (naming `where`, the card field)."""
    if n <= 0:
        return []
    if ids is not None:
        by_id = {t.id: t for t in pool}
        missing = [str(i) for i in ids if str(i) not in by_id]
        if missing:
            raise UserError(f"card field '{where}.ids' names ids not in the few-shot split: {', '.join(missing)}")
        if n > len(ids):
            raise UserError(
                f"{n} exemplars asked, but card field '{where}.ids' lists {len(ids)}; "
                f"pass --num-fewshot {len(ids)} or fewer"
            )
        return [by_id[str(i)] for i in ids][:n]
    if sampler == "first_n" and by is None:
        eval_ids = {t.id for t in tasks} if exclude_doc else set()
        shots = [t for t in pool if t.id not in eval_ids][:n]
        if len(shots) < n:
            raise UserError(
                f"{where}: {n} exemplars asked of {len(shots)} rows; lower --num-fewshot or use a bigger split"
            )
        return shots
    groups: dict[Any, list[Task]] = {}
    for t in pool:
        groups.setdefault(_group(t, by), []).append(t)
    rngs: dict[Any, random.Random] = {}
    out: dict[str, list[Task]] = {}
    for task in tasks:
        key = _group(task, by)
        candidates = groups.get(key, [])
        if exclude_doc:
            candidates = candidates if sampler != "first_n" else _without(task, candidates)
        k = n + 1 if exclude_doc and sampler != "first_n" else n
        if len(candidates) < k:
            mine = " (a task is never its own exemplar)" if exclude_doc else ""
            raise UserError(
                f"{where}: {n} exemplars asked of {len(candidates)} rows"
                + (f" with {by} = {key!r}" if by else "")
                + f"{mine}; lower --num-fewshot or use a bigger split"
            )
        if sampler == "first_n":
            out[task.id] = candidates[:n]
            continue
        rng = rngs.setdefault(key, random.Random(seed))
        if not exclude_doc:
            out[task.id] = rng.sample(candidates, n)
            continue
        picked = _without(task, rng.sample(candidates, n + 1))[:n]
        if len(picked) < n:  # the pool holds copies of the task: lm-eval redraws without them
            rest = _without(task, candidates)
            if len(rest) < n:
                raise UserError(f"{where}: {n} exemplars asked, but only {len(rest)} rows differ from task {task.id}")
            picked = rng.sample(rest, n)
        out[task.id] = picked
    return out


def _without(task: Task, pool: Sequence[Task]) -> list[Task]:
    # lm-eval drops exemplars equal to the document (dict equality), not only the same row.
    return [t for t in pool if t.id != task.id and t.fields != task.fields]
