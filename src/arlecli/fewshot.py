"""Few-shot exemplars: which solved rows are shown before each task, drawn as lm-eval draws them.

A card's `prompt.fewshot` picks them from one split of its source:

    first_n   the first `n` rows (never the task itself): one list shared by every task
    ids       the rows with these ids, in this order (mbpp: lm-eval's task ids 2, 3, 4)
    default   lm-eval's default sampler: one `random.Random(seed)` (seed 1234, as lm-eval's
              `simple_evaluate` seeds it) draws `n` rows for each task in turn, so each
              task gets its own exemplars and the draws depend on the task order; when the
              exemplars come from the eval split itself, `n + 1` are drawn and the task
              dropped, as lm-eval's `ContextSampler.sample` does

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


def draw(pool: Sequence[Task], tasks: Sequence[Task], n: int, *, sampler: str = "first_n",
         seed: int = LMEVAL_SEED, ids: Sequence[Any] | None = None, by: str | None = None,
         same_split: bool = False, where: str = "prompt.fewshot") -> Exemplars:
    """Exemplars for `tasks` from `pool` (the few-shot split's tasks, in the split's order).

    `same_split`: the pool is the eval split itself, so a task is never its own exemplar.
    Raises UserError when the pool cannot supply them (naming `where`, the card field)."""
    if n <= 0:
        return []
    if ids is not None:
        by_id = {t.id: t for t in pool}
        missing = [str(i) for i in ids if str(i) not in by_id]
        if missing:
            raise UserError(f"card field '{where}.ids' names ids not in the few-shot split: {', '.join(missing)}")
        if n > len(ids):
            raise UserError(f"{n} exemplars asked, but card field '{where}.ids' lists {len(ids)}; "
                            f"pass --num-fewshot {len(ids)} or fewer")
        return [by_id[str(i)] for i in ids][:n]
    if sampler == "first_n" and by is None:
        eval_ids = {t.id for t in tasks} if same_split else set()
        shots = [t for t in pool if t.id not in eval_ids][:n]
        return shots
    groups: dict[Any, list[Task]] = {}
    for t in pool:
        groups.setdefault(_group(t, by), []).append(t)
    rngs: dict[Any, random.Random] = {}
    out: dict[str, list[Task]] = {}
    for task in tasks:
        key = _group(task, by)
        candidates = groups.get(key, [])
        if sampler == "first_n":
            out[task.id] = [t for t in candidates if not (same_split and t.id == task.id)][:n]
            continue
        rng = rngs.setdefault(key, random.Random(seed))
        k = n + 1 if same_split else n
        if len(candidates) < k:
            raise UserError(f"card field '{where}': {n} exemplars drawn from {len(candidates)} rows"
                            + (f" with {by} = {key!r}" if by else "") + "; lower n or use a bigger split")
        picked = rng.sample(candidates, k)
        out[task.id] = [t for t in picked if t.id != task.id][:n] if same_split else picked
    return out
