"""Loglikelihood scoring of multiple-choice cards, as lm-evaluation-harness 0.4.13 does it.

`arle eval CARD --scoring loglikelihood` reads the card's `loglikelihood:` block (the
lm-eval task's YAML in arle's terms, see cards.Loglikelihood) and, for each document:

    context       = description + exemplars ("q" + target_delimiter + "a" + fewshot_delimiter each) + q
    requests      = (context, target_delimiter + choice) for each choice
                    partial scoring (winogrande): (prefix + context_i, target_delimiter + continuation)
    acc           = argmax(loglikelihoods) == gold
    acc_norm      = argmax(loglikelihood / len(choice)) == gold    (characters of the choice, as lm-eval)
    acc_bytes     = argmax(loglikelihood / UTF-8 bytes of the choice) == gold

The engine computes each continuation's loglikelihood (`engine.loglikelihood`: hf, vllm, or
an endpoint that echoes prompt logprobs). One sample per document goes to samples.jsonl,
with every choice's loglikelihood, so a rerun with --resume skips finished documents and
results.json is aggregated from the file like any other run. Generative scoring stays what
training uses: this path only evaluates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from arlecli import fewshot
from arlecli.cards import Card, Loglikelihood
from arlecli.data.sources import load_rows, tasks_from_rows
from arlecli.errors import UserError
from arlecli.records import Sample, sample_id
from arlecli.results import SampleWriter
from arlecli.rundir import close_run, open_run, release
from arlecli.types import Task


@dataclass
class Doc:
    """One document's requests: contexts and continuations (one pair per choice), the choices
    lm-eval normalises by, the gold (an index, several, or -100 where lm-eval finds none)."""

    task: Task
    contexts: list[str]
    continuations: list[str]
    choices: list[str]
    gold: int | list[int]
    fewshot: list[str]


def spec_of(card: Card) -> Loglikelihood:
    """The card's `loglikelihood:` block, or a one-line error naming the cards that have one."""
    if card.loglikelihood is None:
        raise UserError(
            f"{card.name} has no `loglikelihood:` block, so it cannot be scored by loglikelihood; "
            f"use --scoring generate (multiple-choice cards that follow an lm-eval task have one)"
        )
    return card.loglikelihood


def tasks_for(card: Card, spec: Loglikelihood, rows: list[dict[str, Any]], origin: str) -> list[Task]:
    """Tasks whose fields are lm-eval's documents: the block's transform (lm-eval's
    process_docs) replaces the card's own; ids are the card's (field map, `id` column, row)."""
    if not spec.transform:
        return tasks_from_rows(card, rows, origin)
    # The Task's target is the gold (a column, or the literal index); its input is unused here.
    fields = {"input": "input", "target": spec.gold if isinstance(spec.gold, str) else "target"}
    if "id" in card.fields:
        fields["id"] = card.fields["id"]
    extra = {"input": ""} if isinstance(spec.gold, str) else {"input": "", "target": spec.gold}
    rows = [{**extra, **r} if isinstance(r, dict) else r for r in rows]
    return tasks_from_rows(replace(card, transform=spec.transform, fields=fields), rows, origin)


def _fill(template: str, task: Task, where: str) -> str:
    from arlecli.cards import fill

    return fill(template, task, where)


def _column(task: Task, name: str, where: str) -> Any:
    if name not in task.fields:
        raise UserError(
            f"card field '{where}' names column '{name}', which is not in the documents of task "
            f"{task.id} (columns: {', '.join(sorted(map(str, task.fields)))})"
        )
    return task.fields[name]


def choices_of(spec: Loglikelihood, task: Task) -> list[str]:
    """lm-eval's doc_to_choice: a literal list, or a column holding the options."""
    if isinstance(spec.choices, list):
        return list(spec.choices)
    value = _column(task, spec.choices, "loglikelihood.choices")
    if not isinstance(value, (list, tuple)) or not value:
        raise UserError(f"loglikelihood.choices: column '{spec.choices}' of task {task.id} is not a list of options")
    return [str(v) for v in value]


def gold_of(spec: Loglikelihood, task: Task) -> Any:
    """lm-eval's doc_to_target (doc_to_text for partial scoring): a literal index or a column's value."""
    return spec.gold if isinstance(spec.gold, int) else _column(task, spec.gold, "loglikelihood.gold")


def gold_index(gold: Any, choices: list[str]) -> int | list[int]:
    """lm-eval's gold resolution: an index (kept only if in range), a choice's text, or a list."""
    if isinstance(gold, list):
        return [int(g) if int(g) < len(choices) else -100 for g in gold]
    if isinstance(gold, str) and not gold.strip().lstrip("-").isdigit():
        return choices.index(gold) if gold in choices else -100
    index = int(gold)
    return index if index < len(choices) else -100


def question(spec: Loglikelihood, task: Task) -> list[str]:
    """The document's question text(s): one (doc_to_text), or one context per choice (partial)."""
    if spec.contexts is not None:
        value = _column(task, spec.contexts, "loglikelihood.contexts")
        if not isinstance(value, (list, tuple)) or not value:
            raise UserError(f"loglikelihood.contexts: column '{spec.contexts}' of task {task.id} is not a list")
        return [str(v) for v in value]
    return [_fill(spec.text, task, "loglikelihood.text")]


def answer(spec: Loglikelihood, task: Task) -> str:
    """What an exemplar shows after its question: the gold choice, or the shared continuation."""
    if spec.continuation is not None:
        return _fill(spec.continuation, task, "loglikelihood.continuation")
    gold = gold_of(spec, task)
    if isinstance(gold, list):
        gold = gold[0]
    if isinstance(gold, str) and not gold.strip().isdigit():
        return gold
    return choices_of(spec, task)[int(gold)]


def exemplar_text(spec: Loglikelihood, ex: Task) -> str:
    """One solved exemplar as lm-eval renders it (build_qa_turn with an answer)."""
    if spec.contexts is not None:
        q = question(spec, ex)[int(gold_of(spec, ex))]
    else:
        q = question(spec, ex)[0]
    return q + spec.target_delimiter + answer(spec, ex) + spec.fewshot_delimiter


def build_doc(spec: Loglikelihood, task: Task, exemplars: list[Task]) -> Doc:
    """The requests of one document (see the module docstring)."""
    prefix = _fill(spec.description, task, "loglikelihood.description") if spec.description else ""
    prefix += "".join(exemplar_text(spec, ex) for ex in exemplars)
    qs = question(spec, task)
    if spec.contexts is not None:
        cont = spec.target_delimiter + answer(spec, task)
        contexts, continuations, choices = [prefix + q for q in qs], [cont] * len(qs), qs
        gold = gold_index(gold_of(spec, task), choices)
    else:
        choices = choices_of(spec, task)
        contexts = [prefix + qs[0]] * len(choices)
        continuations = [spec.target_delimiter + c for c in choices]
        gold = gold_index(gold_of(spec, task), choices)
    return Doc(task, contexts, continuations, choices, gold, [ex.id for ex in exemplars])


def load_docs(card: Card, opts: Any) -> list[Doc]:
    """Every document of the split (after --limit), with its exemplars and requests."""
    spec = spec_of(card)
    data = Path(opts.data) if opts.data else None
    split = opts.split or card.source.default_split
    origin = str(data) if data else f"{card.name}:{split}"
    tasks = tasks_for(card, spec, load_rows(card, split, data, limit=opts.limit), origin)
    if opts.limit is not None:
        tasks = tasks[: opts.limit]
    n = spec.fewshot_n if opts.num_fewshot is None else opts.num_fewshot
    pool: list[Task] = []
    if n > 0:
        if not spec.fewshot_split:
            raise UserError(f"{card.name}'s loglikelihood scoring defines no few-shot split; use --num-fewshot 0")
        try:
            pool = tasks_for(card, spec, load_rows(card, spec.fewshot_split), f"{card.name}:{spec.fewshot_split}")
        except UserError as exc:
            raise UserError(
                f"few-shot exemplars come from {card.name}'s '{spec.fewshot_split}' split, which failed "
                f"({exc}); pass --num-fewshot 0 to run without them"
            ) from None
    # --seed is lm-eval's fewshot_random_seed (both 1234 by default). One draw for the whole
    # split, in order, so a resumed run redraws from the first document and gets the same shots.
    shots = fewshot.draw(
        pool,
        tasks,
        n,
        sampler=spec.fewshot_sampler,
        seed=opts.seed,
        by=spec.fewshot_by,
        exclude_doc=spec.fewshot_exclude_doc,
        where=f"{card.name}: --num-fewshot {n} from the '{spec.fewshot_split}' split",
    )
    return [build_doc(spec, task, fewshot.exemplars_for(shots, task)) for task in tasks]


def _argmax(values: list[float]) -> int:
    """numpy's argmax: the first index of the largest value (NaN counts as the largest)."""
    best = 0
    for i, v in enumerate(values):
        if math.isnan(v):
            return i
        if v > values[best]:
            best = i
    return best


def _per(ll: float, length: int) -> float:
    # numpy's division by a zero length (an empty choice): -inf, +inf or nan, no exception.
    if length:
        return ll / length
    return -math.inf if ll < 0 else math.inf if ll > 0 else math.nan


def mc_metrics(lls: list[float], choices: list[str], gold: int | list[int]) -> dict[str, Any]:
    """lm-eval's multiple_choice process_results: acc, acc_norm, acc_bytes and the predictions."""
    pred = _argmax(lls)
    pred_norm = _argmax([_per(ll, len(c)) for ll, c in zip(lls, choices)])
    pred_bytes = _argmax([_per(ll, len(c.encode("utf-8"))) for ll, c in zip(lls, choices)])

    def hit(p: int) -> float:
        return float(p in gold) if isinstance(gold, list) else float(p == gold)

    return {
        "acc": hit(pred),
        "acc_norm": hit(pred_norm),
        "acc_bytes": hit(pred_bytes),
        "pred": pred,
        "pred_norm": pred_norm,
    }


def _engine_scores(engine: Any) -> Callable[..., Any]:
    fn = getattr(engine, "loglikelihood", None)
    if fn is None:
        raise UserError(
            f"the {engine.name} engine cannot score loglikelihoods; use the hf or vllm backend, an "
            f"endpoint that returns prompt logprobs, or --scoring generate"
        )
    return fn


def run_loglikelihood(
    card: Card,
    engine: Any,
    opts: Any,
    *,
    model: str,
    run_dir: Path,
    resume: bool = False,
    command: list[str] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
    prices: Any = None,
) -> dict[str, Any]:
    """Score every document by loglikelihood into `run_dir` (resumable); return results.json's content."""
    from arlecli.engine.base import LoglikRequest

    spec = spec_of(card)
    if opts.num_samples != 1:
        raise UserError("--scoring loglikelihood scores each document once; drop --num-samples")
    score_fn = _engine_scores(engine)
    docs = load_docs(card, opts)
    if not docs:
        raise UserError(f"no tasks to evaluate in {card.name} (check --split, --limit and --rows)")
    done = open_run(
        card,
        engine,
        opts,
        model=model,
        run_dir=run_dir,
        resume=resume,
        command=command,
        expected=len(docs),
        scoring="loglikelihood",
        lm_eval_task=spec.task,
    )
    pending = [d for d in docs if sample_id(d.task.id, 0) not in done]
    if on_start:
        on_start(len(docs), len(docs) - len(pending))
    requests = [LoglikRequest(c, x) for d in pending for c, x in zip(d.contexts, d.continuations)]
    owner = [(j, k) for j, d in enumerate(pending) for k in range(len(d.contexts))]
    results: list[list[Any]] = [[None] * len(d.contexts) for d in pending]
    missing = [len(d.contexts) for d in pending]
    writer = SampleWriter(run_dir)
    started = time.time()
    ok = False
    try:
        for r, ll in score_fn(requests):
            j, k = owner[r]
            results[j][k] = ll
            missing[j] -= 1
            if missing[j] == 0:  # every choice of the document is scored: write its sample now
                sample = _sample(spec, pending[j], results[j], card, started)
                writer.write(sample)
                if on_sample:
                    on_sample(sample.to_json())
        ok = True
    finally:
        writer.close()
        if not ok:  # as in eval.run_eval: a process that goes on frees the run for a --resume
            release(run_dir)
    return close_run(
        card,
        opts,
        model=model,
        run_dir=run_dir,
        metrics=spec.metrics,
        prices=prices,
        scoring="loglikelihood",
        lm_eval_task=spec.task,
    )


def _sample(spec: Loglikelihood, doc: Doc, lls: list[Any], card: Card, started: float) -> Sample:
    values = [ll.logprob for ll in lls]
    metrics = mc_metrics(values, doc.choices, doc.gold)
    pred = metrics["pred"]
    return Sample(
        sample_id(doc.task.id, 0),
        doc.task.id,
        0,
        prompt=doc.contexts[pred],
        completion=doc.continuations[pred],
        extracted=pred,
        target=doc.gold,
        reward=metrics["acc"],
        correct=bool(metrics["acc"]),
        details={
            **metrics,
            "loglikelihoods": values,
            "greedy": [ll.greedy for ll in lls],
            "continuation_tokens": [ll.num_tokens for ll in lls],
            "fewshot": doc.fewshot,
        },
        choices=doc.continuations if spec.contexts is None else doc.contexts,
        finish_reason="loglikelihood",
        num_tokens=sum(ll.num_tokens for ll in lls),
        group=doc.task.fields.get(card.group_by, "") if card.group_by else None,
        session_started_at=started,
        finished_at=time.time(),
    )
