"""The eval loop: card -> tasks -> env episodes (engine turns) -> reward -> samples.jsonl -> results.json.

Resumable by construction: every finished sample is one appended line; a rerun with
`resume=True` skips ids already there and re-aggregates from the file, so an
interrupted-then-resumed run ends with exactly the results of an uninterrupted one.
Scoring runs on a thread pool while the engine keeps generating (code rewards spend
their time in sandbox subprocesses, so threads overlap them with generation).
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from arlecli import fewshot
from arlecli.cards import Card, card_error
from arlecli.efficiency import Prices
from arlecli.data.sources import load_rows, same_rows, tasks_from_rows
from arlecli.engine.base import Engine
from arlecli.envs import check_env_tasks, env_kind
from arlecli.envs.episodes import Sampling, collect
from arlecli.errors import UserError
from arlecli.fewshot import Exemplars
from arlecli.records import RunDir, Sample, sample_id
from arlecli.results import SampleWriter, read_samples
from arlecli.rewards import REWARD_ERROR, check_task_fields, check_tasks, get_reward, score_samples
from arlecli.rundir import close_run, open_run, release
from arlecli.safeio import terminal_text
from arlecli.catalog import card_runs_code
from arlecli.sandbox import ensure_isolation
from arlecli.types import Episode, Score, Task


@dataclass
class EvalOptions:
    """What shapes the results (everything but batch size and concurrency is checked on resume)."""

    split: str | None = None
    limit: int | None = None
    num_samples: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int | None = None
    num_fewshot: int | None = None
    seed: int = 1234
    data: str | None = None
    opponent: str | None = None  # two-player game cards: who plays the other seat (None: the card's)
    max_thinking_tokens: int | None = None  # a thinking model's thought per turn, apart from max_tokens


def load_tasks(card: Card, opts: EvalOptions, *, generator_ids: bool = False) -> tuple[list[Task], Exemplars]:
    """The tasks to evaluate (after --limit) and the few-shot exemplars to show first: one
    list for all tasks, or one per task id (`fewshot.exemplars_for` reads either).
    `generator_ids`: a generator card's task ids as its generator names them (a run written
    before they were named after the card, resumed: see legacy_ids)."""
    data = Path(opts.data) if opts.data else None
    split = opts.split or card.source.default_split
    origin = str(data) if data else f"{card.name}:{split}"
    if data is None and card.source.kind == "hub":
        from arlecli.models import offline_if_hub_unreachable

        # A hub that cannot be reached: the cached copy loads, a missing one fails now (one line).
        offline_if_hub_unreachable()
    tasks = tasks_from_rows(card, load_rows(card, split, data, limit=opts.limit, generator_ids=generator_ids), origin)
    if opts.limit is not None:
        tasks = tasks[: opts.limit]
    # Every task is checked for what the reward reads now, not when its sample is scored
    # mid-run; exemplars are only shown, never scored.
    check_task_fields(card.reward, card.reward_params, tasks, origin)
    check_env_tasks(card, tasks)  # and for what the env plays (a game seed out of range)
    if card.group_by and tasks and not any(card.group_by in t.fields for t in tasks):
        # A typo would put every sample in one group named "" and say nothing.
        raise card_error(
            card.path or card.name,
            "group_by",
            f"'{card.group_by}' is not a column of the rows (columns: {', '.join(sorted(tasks[0].fields))})",
        )
    n_shots = card.prompt.fewshot.n if opts.num_fewshot is None else opts.num_fewshot
    exemplars: Exemplars = []
    if n_shots > 0:
        fs_split = card.prompt.fewshot.split
        if not fs_split:
            raise UserError(f"{card.name} defines no few-shot split; use --num-fewshot 0")
        fs = card.prompt.fewshot
        shared = same_rows(card, fs_split, split)  # exemplars drawn from the evaluated rows
        try:
            # first_n needs only the first rows (generators make no more); a draw or ids need all
            need = n_shots + (len(tasks) if shared else 0) if fs.sampler == "first_n" and fs.ids is None else None
            pool = tasks_from_rows(
                card, load_rows(card, fs_split, limit=need, generator_ids=generator_ids), f"{card.name}:{fs_split}"
            )
        except UserError as exc:
            raise UserError(
                f"few-shot exemplars come from {card.name}'s '{fs_split}' split, which failed "
                f"({exc}); pass --num-fewshot 0 to run without them"
            ) from None
        exemplars = fewshot.draw(
            pool,
            tasks,
            n_shots,
            sampler=fs.sampler,
            seed=fs.seed,
            ids=fs.ids,
            exclude_doc=shared and data is None,
            where=f"{card.name}: prompt.fewshot",
        )
    return tasks, exemplars


def legacy_ids(card: Card, run_dir: Path, resume: bool) -> bool:
    """Whether a resumed run of a generator card holds task ids as the generator named them
    (`chain_sum-1000-0` in a one_digit_sums run written before ids were named after the card):
    it then goes on with those ids (and the sampling seeds they give), so it ends as it would
    have uninterrupted."""
    from arlecli.data.sources import generator_prefix

    prefix = generator_prefix(card)
    if not resume or prefix is None or not RunDir(run_dir).samples.is_file():
        return False
    return any(str(s.get("task_id", "")).startswith(prefix) for s in read_samples(Path(run_dir)))


def run_eval(
    card: Card,
    engine: Engine,
    opts: EvalOptions,
    *,
    model: str,
    run_dir: Path,
    resume: bool = False,
    command: list[str] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
    prices: Prices | None = None,
    scoring: str | None = None,
    prepared: tuple[list[Task], Exemplars] | None = None,
) -> dict[str, Any]:
    """Evaluate, appending to `run_dir/samples.jsonl`; return (and write) results.json's content.

    `on_start(total, already_done)` and `on_sample(sample)` (its samples.jsonl object) feed a progress display.
    `prices` adds results.json's `cost` block; they are not part of the run's settings (a
    resume may change them: results are recomputed from the samples either way).
    `scoring` "loglikelihood" scores multiple choice as lm-eval does (arlecli/loglik.py);
    None: the card's default (generate, unless its `loglikelihood:` block says otherwise).
    `prepared`: what `load_tasks(card, opts, generator_ids=legacy_ids(...))` returned, when the
    caller loaded the tasks before its engine (the CLI does: a bad row is one line before any
    model loads); None loads them here.
    """
    if opts.num_samples < 1:
        raise UserError("--num-samples must be at least 1")
    if (scoring or card.default_scoring) == "loglikelihood":
        from arlecli.loglik import run_loglikelihood

        return run_loglikelihood(
            card,
            engine,
            opts,
            model=model,
            run_dir=run_dir,
            resume=resume,
            command=command,
            on_start=on_start,
            on_sample=on_sample,
            prices=prices,
        )
    tasks, exemplars = prepared or load_tasks(card, opts, generator_ids=legacy_ids(card, run_dir, resume))
    if not tasks:
        raise UserError(f"no tasks to evaluate in {card.name} (check --split, --limit and --rows)")
    score = get_reward(card.reward, card.reward_params)
    check_tasks(score, card, tasks)
    if card_runs_code(card):
        ensure_isolation()  # refuse (or warn) before generating anything
    done_ids = open_run(
        card,
        engine,
        opts,
        model=model,
        run_dir=run_dir,
        resume=resume,
        command=command,
        expected=len(tasks) * opts.num_samples,
        scoring="generate",
    )
    sampling = Sampling(
        temperature=opts.temperature,
        top_p=opts.top_p,
        max_tokens=opts.max_tokens,
        seed=opts.seed,
        max_thinking_tokens=opts.max_thinking_tokens,
    )
    pending = [
        (i, k) for i, task in enumerate(tasks) for k in range(opts.num_samples) if sample_id(task.id, k) not in done_ids
    ]
    total = len(tasks) * opts.num_samples
    if on_start:
        on_start(total, total - len(pending))

    writer = SampleWriter(run_dir)
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="arle-score")
    futures: list[Future[None]] = []
    failures: list[BaseException] = []

    def note_failure(f: Future[None]) -> None:
        if not f.cancelled() and f.exception() is not None:
            failures.append(f.exception())  # type: ignore[arg-type]

    kind = env_kind(card.env)
    # Every sample of this process carries the same start, so results can add up the wall
    # time of each session of a resumed run from samples.jsonl alone (efficiency.time_stats).
    session_started_at = time.time()

    # A reward that grades many samples in one call (the judge: one batch of requests to its
    # model) gets chunks of its batch_size; any other is called once per sample.
    score_batch = getattr(score, "score_batch", None)
    chunk_size = max(1, int(getattr(score, "batch_size", 1))) if score_batch else 1

    def finish(chunk: list[tuple[Task, int, Episode]]) -> None:
        # A reward that raises on a sample scores it wrong with the error (score_samples).
        results = score_samples(score, [t for t, _, _ in chunk], [e for _, _, e in chunk])
        for (task, k, episode), result in zip(chunk, results, strict=True):
            record(task, k, episode, result)

    def record(task: Task, k: int, episode: Episode, result: Score) -> None:
        sample = Sample.from_episode(
            task,
            k,
            episode,
            result,
            multi_turn=kind.multi_turn,
            group_by=card.group_by,
            session_started_at=session_started_at,
        )
        writer.write(sample)
        if on_sample:
            on_sample(sample.to_json())

    ok = False
    try:
        chunk: list[tuple[Task, int, Episode]] = []
        for j, episode in collect(card, engine, tasks, exemplars, pending, sampling):
            i, k = pending[j]
            chunk.append((tasks[i], k, episode))
            if len(chunk) >= chunk_size:
                futures.append(pool.submit(finish, chunk))
                futures[-1].add_done_callback(note_failure)
                chunk = []
            if failures:  # surface a scoring error at once, not after the whole generation pass
                raise failures[0]
        if chunk:
            futures.append(pool.submit(finish, chunk))
        for f in futures:
            f.result()
        ok = True
    finally:
        pool.shutdown(wait=ok, cancel_futures=not ok)
        writer.close()
        if not ok:  # a failed run in a process that goes on (a notebook, a test) frees it for a --resume
            release(run_dir)
        if hasattr(score, "close"):  # a reward holding a judge engine releases it
            score.close()

    results = close_run(
        card,
        opts,
        model=model,
        run_dir=run_dir,
        metrics=card.metrics,
        prices=prices,
        env_stats=kind.stats,
    )
    if results.get("reward_errors"):
        print(
            terminal_text(
                f"warning: reward '{card.reward}' raised on {results['reward_errors']} of "
                f"{results['n_samples']} samples; they are scored wrong, and details.{REWARD_ERROR} "
                f"in {RunDir(run_dir).samples} says why"
            ),
            file=sys.stderr,
        )
    return results
