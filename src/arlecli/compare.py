"""Paired comparison of two eval runs on the tasks they share (`arle compare`, reports).

Two runs of one benchmark answer the same tasks, so their difference is measured task by
task: for each metric, d_i = B_i - A_i over the shared tasks (a task's value is the mean over
its samples, as in results.json), reported as mean(d) with the paired standard error
sd(d) / sqrt(n) and a normal 95% interval. Pairing removes the spread between easy and hard
tasks that two independent stderrs would count twice (Miller, "Adding Error Bars to Evals",
2024). Where both runs score every task 0 or 1 (one sample per task), McNemar's exact test
gives the p-value: under "no difference" each task that flipped is equally likely to have
flipped either way, so the count that went B's way is Binomial(flips, 1/2).

    from arlecli.compare import compare_runs
    cmp = compare_runs("runs/a", "runs/b")       # a Comparison; cmp.as_dict() for JSON

Direction: everything is "B versus A": a positive difference and a "won" task mean B scored
higher there.

Compute. Next to the scores, each run's cost in tokens (`ComputePoint`): accuracy, mean thinking
tokens per sample (a sample that did not think counts 0), the share cut inside its thinking, and
mean and total completion tokens (thinking + answer). Two runs of one model with different
thinking budgets (`--max-thinking-tokens`) are then two points of the accuracy-vs-compute curve
with their paired difference; `compute_curve` takes any number of runs and pairs each with the
first.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from arlecli import rundir
from arlecli.errors import UserError
from arlecli.records import Sample, samples_of
from arlecli.results import mean_stderr, pass_at_k

Z95 = 1.959963984540054  # two-sided 95% quantile of the normal distribution
_PASS_RE = re.compile(r"^pass([@^])(\d+)$")


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs: tasks only A got right
    (`a_only`) and tasks only B got right (`b_only`).

    It is the exact binomial test of min(a_only, b_only) successes in a_only + b_only trials
    at p = 1/2: 2 * P(X <= min), capped at 1 (no flips at all: 1)."""
    if a_only < 0 or b_only < 0:
        raise ValueError("discordant counts must be >= 0")
    n = a_only + b_only
    if n == 0:
        return 1.0
    k = min(a_only, b_only)
    # Integer arithmetic until the one division: exact for any n (a float 0.5**n underflows past ~1074).
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


@dataclass
class PairedStat:
    """The mean paired difference B - A, its standard error and normal 95% interval."""

    diff: float
    stderr: float
    ci_low: float
    ci_high: float
    n: int


def paired_difference(a: list[float], b: list[float]) -> PairedStat:
    """Mean of b_i - a_i with the paired standard error sd(d, ddof=1) / sqrt(n) (the same
    estimator as results.json's stderr, applied to the differences). n < 2: stderr is NaN."""
    if len(a) != len(b):
        raise ValueError(f"paired values differ in length: {len(a)} vs {len(b)}")
    stat = mean_stderr([y - x for x, y in zip(a, b)])
    return PairedStat(stat.value, stat.stderr, stat.value - Z95 * stat.stderr, stat.value + Z95 * stat.stderr, stat.n)


@dataclass
class MetricComparison:
    """One metric compared over shared tasks: means, paired difference, task counts, McNemar."""

    metric: str
    a: float
    b: float
    diff: float
    stderr: float
    ci_low: float
    ci_high: float
    n: int
    won: int  # tasks where B scored higher
    lost: int  # tasks where A scored higher
    tied: int
    mcnemar_p: float | None  # None unless every task scored 0 or 1 in both runs


@dataclass
class Comparison:
    """Run B compared with run A on the tasks both hold (see the module docstring)."""

    run_a: str
    run_b: str
    benchmark: str | None
    split: str | None
    model_a: str | None
    model_b: str | None
    shared: int
    only_a: int  # tasks only A holds (left out of every number)
    only_b: int
    metrics: list[MetricComparison]
    groups: dict[str, list[MetricComparison]] = field(default_factory=dict)
    gained: list[str] = field(default_factory=list)  # accuracy flipped in B's favour: task ids
    lost: list[str] = field(default_factory=list)  # ... and against it
    warnings: list[str] = field(default_factory=list)
    compute: list["ComputePoint"] = field(default_factory=list)  # [A, B] (compare_runs fills it)

    def as_dict(self) -> dict[str, Any]:
        """JSON form; NaN (a stderr over fewer than two tasks) becomes null, which strict JSON readers accept."""
        return _no_nan(asdict(self))


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def natural_key(text: str) -> list[Any]:
    """A sort key that orders task ids as people do: "2" < "10", "HumanEval/9" < "HumanEval/10"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _by_task(samples: list[Sample]) -> dict[str, list[Sample]]:
    by_task: dict[str, list[Sample]] = {}
    for s in samples:
        by_task.setdefault(str(s.task_id), []).append(s)
    return by_task


def task_values(by_task: dict[str, list[Sample]], metric: str) -> dict[str, float] | None:
    """Each task's value of `metric`, computed as results.json aggregates it (mean over the task's
    samples; pass@k and pass^k from its n samples and c correct). None when this run cannot give
    it for every task (pass@k with fewer than k samples)."""
    m = _PASS_RE.match(metric)
    out = {}
    for tid, samples in by_task.items():
        n, c = len(samples), sum(bool(s.correct) for s in samples)
        if m:
            k = int(m.group(2))
            if n < k:
                return None
            if m.group(1) == "@":
                out[tid] = pass_at_k(n, c, k)
            else:
                from arlecli.results import pass_hat_k  # only runs that report pass^k reach here

                out[tid] = pass_hat_k(n, c, k)
        elif metric == "accuracy":
            out[tid] = c / n
        else:
            out[tid] = sum(float(s.details.get(metric, 0.0)) for s in samples) / n
    return out


def _compare_metric(metric: str, a: dict[str, float], b: dict[str, float], tasks: list[str]) -> MetricComparison:
    xs, ys = [a[t] for t in tasks], [b[t] for t in tasks]
    paired = paired_difference(xs, ys)
    won = sum(y > x for x, y in zip(xs, ys))
    lost = sum(y < x for x, y in zip(xs, ys))
    binary = all(v in (0.0, 1.0) for v in xs + ys)
    n = len(tasks)
    return MetricComparison(
        metric,
        sum(xs) / n,
        sum(ys) / n,
        paired.diff,
        paired.stderr,
        paired.ci_low,
        paired.ci_high,
        n,
        won,
        lost,
        n - won - lost,
        mcnemar_exact(lost, won) if binary else None,
    )


def compare_samples(
    samples_a: Sequence[Sample | dict[str, Any]], samples_b: Sequence[Sample | dict[str, Any]], metrics: list[str]
) -> Comparison:
    """Compare two runs' samples (records or samples.jsonl objects) on the task ids both hold,
    for each of `metrics` either run can compute per task; groups come from the samples' `group`
    field (cards with group_by). The run fields (paths, benchmark, models) are left empty for
    the caller."""
    ta, tb = _by_task(samples_of(samples_a)), _by_task(samples_of(samples_b))
    shared = sorted(set(ta) & set(tb), key=natural_key)
    if not shared:
        raise UserError(
            "the two runs share no task ids, so there is nothing to pair; compare runs of the same benchmark and split"
        )
    a_values = {m: task_values(ta, m) for m in metrics}
    b_values = {m: task_values(tb, m) for m in metrics}
    usable = [m for m in metrics if a_values[m] is not None and b_values[m] is not None]

    def over(tasks: list[str]) -> list[MetricComparison]:
        return [_compare_metric(m, a_values[m], b_values[m], tasks) for m in usable]  # type: ignore[arg-type]

    groups: dict[str, list[str]] = {}
    if any(s.group is not None for samples in ta.values() for s in samples):
        for tid in shared:
            group = ta[tid][0].group
            groups.setdefault(str(group if group is not None else ""), []).append(tid)
    # Flips are read on accuracy (the reward's `correct`), whichever metrics were asked for.
    acc_a: dict[str, float] = task_values(ta, "accuracy") or {}
    acc_b: dict[str, float] = task_values(tb, "accuracy") or {}
    return Comparison(
        run_a="",
        run_b="",
        benchmark=None,
        split=None,
        model_a=None,
        model_b=None,
        shared=len(shared),
        only_a=len(set(ta) - set(tb)),
        only_b=len(set(tb) - set(ta)),
        metrics=over(shared),
        groups={g: over(ids) for g, ids in sorted(groups.items())},
        gained=[t for t in shared if acc_b[t] > acc_a[t]],
        lost=[t for t in shared if acc_b[t] < acc_a[t]],
    )


def _refusal(a: rundir.EvalRun, b: rundir.EvalRun) -> str | None:
    """Why two runs do not measure the same thing (None: they do)."""
    ra, rb = a.results, b.results
    if ra.benchmark != rb.benchmark:
        return f"different benchmarks ({ra.benchmark} vs {rb.benchmark})"
    if ra.split != rb.split:
        return f"different splits ({ra.split} vs {rb.split})"
    # --rows runs name their split by the file; the same path may hold other rows by now.
    ha, hb = a.meta.data_hash, b.meta.data_hash
    if ha and hb and ha != hb:
        return f"different --rows contents (hash {ha} vs {hb})"
    return None


def compare_runs(run_a: Path | str, run_b: Path | str, *, force: bool = False) -> Comparison:
    """Compare finished eval runs A and B (either may be a training run's RUN/eval/step-N).

    Raises UserError (one line) for a folder that is not a finished eval run (rundir.load_eval),
    and for runs of different benchmarks, splits or --rows files unless `force`. Metrics are
    those both results.json report; with `force` the mismatch is kept in `warnings`."""
    a, b = rundir.load_eval(Path(run_a)), rundir.load_eval(Path(run_b))
    why = _refusal(a, b)
    if why and not force:
        raise UserError(
            f"{run_a} and {run_b} are not comparable: {why}; pass --force to pair the task ids they share anyway"
        )
    names_b = set(b.results.metrics)
    metrics = [m for m in a.results.metrics if m in names_b]
    cmp = compare_samples(a.samples, b.samples, metrics)
    cmp.run_a, cmp.run_b = str(run_a), str(run_b)
    cmp.benchmark, cmp.split = a.results.benchmark, a.results.split
    cmp.model_a, cmp.model_b = a.results.model, b.results.model
    if why:
        cmp.warnings.append(f"compared despite {why} (--force)")
    if a.results.card_version != b.results.card_version:
        cmp.warnings.append(
            f"card versions differ ({a.results.card_version} vs "
            f"{b.results.card_version}): the tasks may be scored differently"
        )
    cmp.compute = [compute_point(a, str(run_a)), compute_point(b, str(run_b))]
    return cmp


# ---------------------------------------------------------------------------------------------
# Accuracy against compute


@dataclass
class ComputePoint:
    """One run on the accuracy-vs-compute curve. Means are per sample; a token figure is None
    when the run's samples carry no counts of it (thinking: when none of them thought)."""

    run: str
    model: str | None
    accuracy: float
    stderr: float
    n_samples: int
    thinking_tokens: float | None  # mean; a sample that did not think counts 0
    thought_share: float  # samples that thought
    cut_share: float | None  # samples cut inside their thinking (no answer); None: none thought
    completion_tokens: float | None  # mean generated tokens (thinking + answer)
    completion_tokens_total: int | None
    max_thinking_tokens: int | None  # the run's thinking budget, where its options name one
    max_tokens: int | None

    @property
    def thought(self) -> bool:
        """Whether any of the run's samples thought."""
        return self.thought_share > 0


def _int_option(options: Any, key: str) -> int | None:
    value = options.get(key) if isinstance(options, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(sample: Sample, *keys: str) -> int | None:
    for key in keys:
        value = getattr(sample, key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def compute_point(run: rundir.EvalRun, label: str | None = None) -> ComputePoint:
    """Where `run` sits on the accuracy-vs-compute curve (see the module docstring); accuracy is
    results.json's (mean over tasks, with its stderr)."""
    samples = run.samples
    accuracy, stderr = run.results.stat("accuracy")
    if not isinstance(accuracy, (int, float)):  # a run without the metric: the share of correct samples
        accuracy = sum(bool(s.correct) for s in samples) / len(samples) if samples else float("nan")
    thought = [s for s in samples if s.thinking_cut is not None]
    # A sample that did not think spent no thinking tokens; one that thought counts where known.
    thinking = [0 if s.thinking_cut is None else _count(s, "thinking_tokens") for s in samples]
    known = [t for t in thinking if t is not None]
    generated = [_count(s, "completion_tokens", "num_tokens") for s in samples]
    counted = [g for g in generated if g is not None]
    options = run.meta.options
    n = len(samples)
    return ComputePoint(
        run=label if label is not None else str(run.path),
        model=run.results.model,
        accuracy=float(accuracy),
        stderr=float(stderr) if isinstance(stderr, (int, float)) else float("nan"),
        n_samples=n,
        thinking_tokens=sum(known) / len(known) if thought and len(known) > n - len(thought) else None,
        thought_share=len(thought) / n if n else 0.0,
        cut_share=sum(bool(s.thinking_cut) for s in thought) / len(thought) if thought else None,
        completion_tokens=sum(counted) / len(counted) if counted else None,
        completion_tokens_total=sum(counted) if counted else None,
        max_thinking_tokens=_int_option(options, "max_thinking_tokens"),
        max_tokens=_int_option(options, "max_tokens"),
    )


@dataclass
class Curve:
    """Several runs as an accuracy-vs-compute curve: one point per run (in the order given) and
    each later run's paired comparison with the first (`pairs[i]` is run i + 1 against run 0)."""

    points: list[ComputePoint]
    pairs: list[Comparison]

    def accuracy_diff(self, i: int) -> MetricComparison | None:
        """Run i's paired accuracy difference against the first run (None for the first, or when
        accuracy is not a metric both report)."""
        if i == 0:
            return None
        return next((m for m in self.pairs[i - 1].metrics if m.metric == "accuracy"), None)

    def as_dict(self) -> dict[str, Any]:
        """JSON form: the points, each with its paired accuracy difference against the first run."""
        points = []
        for i, point in enumerate(self.points):
            diff = self.accuracy_diff(i)
            points.append(
                {
                    **asdict(point),
                    "accuracy_diff": None
                    if diff is None
                    else {
                        "diff": diff.diff,
                        "stderr": diff.stderr,
                        "ci_low": diff.ci_low,
                        "ci_high": diff.ci_high,
                        "n": diff.n,
                        "mcnemar_p": diff.mcnemar_p,
                    },
                }
            )
        return _no_nan({"points": points, "pairs": [asdict(p) for p in self.pairs]})


def compute_curve(runs: Sequence[Path | str], *, force: bool = False) -> Curve:
    """The accuracy-vs-compute curve of two or more finished eval runs: each run's ComputePoint
    and every later run compared with the first (compare_runs: UserError for runs that do not
    measure the same thing, unless `force`)."""
    if len(runs) < 2:
        raise UserError("pass at least two eval runs to compare")
    pairs = [compare_runs(runs[0], other, force=force) for other in runs[1:]]
    return Curve([pairs[0].compute[0], *(p.compute[1] for p in pairs)], pairs)
