"""`arle report RUN...`: one self-contained HTML file that shows a run (or several side by side).

The file opens from disk with no network and no server: plotly's JavaScript is embedded once,
every chart is a plotly figure built here, and the data the page needs (figures, samples) sits
in one `<script type="application/json">` block that the page's small plain-JS part reads.

Samples are model output and must be treated as hostile. Nothing from a run becomes markup:
static tables go through `html.escape`, the JSON block has `<`, `>` and `&` written as \\u
escapes (so a completion holding `</script><script>...` cannot end the block), the sample
browser puts text into the page with `textContent` only, and a Content-Security-Policy allows
inline code but no request of any kind (no fetch, image or frame from anywhere).

What a report shows:
    eval run       metrics with stderr, a chart of them and one per group, the efficiency /
                   cost / consistency blocks of results.json (or counts from samples.jsonl for
                   runs written before those blocks), and a sample browser (filter, search).
                   When the model thought: each sample's thinking folded (a <details>) above
                   its answer, with its token count and whether it was cut, and a chart of
                   accuracy against thinking length (samples bucketed by thinking tokens).
    training run   curves of reward, accuracy, KL, loss and tokens/s from metrics.jsonl,
                   held-out accuracy at each eval under eval/step-N/, the before/after
                   comparison, a few completions per logged step from rewards.jsonl, and the
                   last held-out eval's sample browser.
    several runs   a comparison table, accuracy against compute (each run's accuracy, mean
                   thinking and completion tokens, paired difference with the first run: the
                   curve of a model at several thinking budgets) and a per-group chart with
                   one bar per run, on the tasks all the runs hold (paired; `all_tasks`: each
                   run on all of its own) and saying which, then each run's own section.
Efficiency blocks are tables in words and units, rounded (`plain_rows`); each embedded sample
carries its question for its collapsed row, and the browser sorts by task, reward, latency or
length (`sample_orders`, computed here).
At most `SAMPLE_CAP` samples per run are embedded; the rest are counted, and the page says so.
"""

from __future__ import annotations

import html
import json
import math
import time
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, Sequence

from arlecli import rundir, safeio
from arlecli.errors import UserError
from arlecli.records import Meta, RewardRow, RunDir, Sample, TrainSummary
from arlecli.results import RESULTS, read_json
from arlecli.rundir import EvalRun

SAMPLE_CAP = 2000  # samples embedded per run; more make the page slow to open
TEXT_CAP = 20_000  # characters kept of one text field (a runaway completion)
STEP_SAMPLES = 4  # completions shown per logged training step
STEP_ROWS_CAP = 400  # training steps whose completions are shown
THINK_BUCKETS = 6  # bars of the accuracy-vs-thinking-length chart (at most)
# --max-staleness runs (train.overlap): how stale each step's rollouts were, how long the rollout
# engine and the trainer each sat idle, and the importance weights that corrected the lag.
ASYNC_CHARTS = [
    ("Rollout staleness (steps)", ["staleness/mean", "staleness/max"]),
    ("Idle share of the step", ["idle/engine_share", "idle/trainer_share"]),
    ("Importance weights", ["is_weight/mean", "is_weight/clip_fraction"]),
]
TRAIN_CURVES = [  # (metrics.jsonl key, title); the ones a trainer did not log are named as missing
    ("reward", "Reward"),
    ("accuracy", "Accuracy"),
    ("kl", "KL"),
    ("loss", "Loss"),
    ("tokens_per_second", "Tokens/s"),
]
_BLOCKS_SKIP = {
    "metrics",
    "groups",
    "benchmark",
    "card_version",
    "model",
    "split",
    "num_samples",
    "n_tasks",
    "n_samples",
}
# What the sample browser (report_assets/report.js) shows in blocks of its own, of a sample and
# of a turn (records.Sample, records.TurnRecord; `question` is the report's); every other field
# is listed under "other fields" / "turn fields". The page's data carries these lists.
BROWSER_SCHEMA = {
    "shown": [
        "id",
        "task_id",
        "sample",
        "prompt",
        "completion",
        "extracted",
        "target",
        "reward",
        "correct",
        "details",
        "turns",
        "env_info",
        "group",
        "thinking",
        "thinking_cut",
        "thinking_tokens",
        "question",
    ],
    "turn_shown": [
        "completion",
        "observation",
        "finish_reason",
        "tool_calls",
        "thinking",
        "thinking_cut",
        "thinking_tokens",
    ],
}


# ---------------------------------------------------------------------------------------------
# Reading runs (read only: a report never writes into a run directory's files)


@dataclass
class TrainRun:
    """A training run directory (`arle train`), read back for a report."""

    path: Path
    meta: Meta
    metrics: list[dict[str, Any]]
    rewards: list[RewardRow]
    summary: TrainSummary | None
    evals: dict[int, EvalRun]  # finished held-out evals by step
    notes: list[str] = field(default_factory=list)


Run = EvalRun | TrainRun


def _read_lines(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """A training log's JSON lines. A torn last line (the run is still writing, or was killed)
    is left out with a note; a damaged line before it is an error."""
    if not path.exists():
        return []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    rows = []
    for n, raw in enumerate(lines, 1):
        try:
            row = safeio.loads(raw)
        except ValueError:  # broken, not UTF-8, or nested deeper than safeio.MAX_DEPTH
            row = None
        if not isinstance(row, dict):
            if n == len(lines) and not data.endswith(b"\n"):
                notes.append(
                    f"{path.name}: its last line is incomplete (the run is still writing or was killed) and is left out"
                )
                break
            raise UserError(
                f"{path}: line {n} is not a JSON object (damaged or edited); nothing was changed: "
                f"repair or delete that line"
            )
        rows.append(row)
    return rows


def load_train(path: Path, meta: Meta) -> TrainRun:
    """A training run directory: metrics.jsonl, rewards.jsonl, summary.json and eval/step-N/.

    A training run is shown while it runs too: what it has not written yet is named in notes."""
    notes: list[str] = []
    files = RunDir(path)
    metrics = _read_lines(files.metrics, notes)
    rewards = [RewardRow.from_json(r) for r in _read_lines(files.rewards, notes)]
    summary = None
    if files.summary.is_file():
        data = read_json(files.summary)
        summary = TrainSummary.from_json(data) if isinstance(data, dict) else None
    else:
        notes.append(f"no {files.SUMMARY} yet: the run has not finished (or was interrupted)")
    evals: dict[int, EvalRun] = {}
    for sub in rundir.held_out_dirs(path):
        if not (sub / RESULTS).is_file():
            notes.append(f"eval/{sub.name} has no {RESULTS} (interrupted or running) and is left out")
            continue
        evals[int(sub.name.split("-", 1)[1])] = rundir.load_eval(sub)
    return TrainRun(path, meta, metrics, rewards, summary, evals, notes)


def load_run(path: Path | str) -> Run:
    """An eval or training run directory, read and checked (rundir.load_eval for an eval run),
    or a one-line UserError saying why it is not one. Reads only."""
    path = Path(path)
    meta = rundir.read_meta(path)
    if meta.is_training:
        return load_train(path, meta)
    return rundir.load_eval(path)


# ---------------------------------------------------------------------------------------------
# Small helpers


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become null (JSON.parse rejects them), unknown objects become text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def _cap_text(value: Any) -> Any:
    """Strings longer than TEXT_CAP are cut, saying how much was left out."""
    if isinstance(value, str) and len(value) > TEXT_CAP:
        return value[:TEXT_CAP] + f"\n... ({len(value) - TEXT_CAP:,} more characters in the run's files)"
    if isinstance(value, dict):
        return {k: _cap_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cap_text(v) for v in value]
    return value


def _script_json(data: Any) -> str:
    """JSON that is safe inside <script>: no '<', '>' or '&' can close the element or open a comment."""
    text = safeio.dumps(_clean(data), separators=(",", ":"))  # lone surrogates escaped: the page is UTF-8
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _plot_text(value: Any) -> str:
    # plotly renders a few HTML-like tags (<b>, <a href>) in labels; names from a run are shown literally.
    return html.escape(str(value), quote=False)


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return f"{value:.{digits}f}" if abs(value) < 1e6 else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _metric_rows(metrics: dict[str, Any]) -> list[tuple[str, Any, Any, Any]]:
    rows = []
    for name, stat in metrics.items():
        if isinstance(stat, dict):
            rows.append((name, stat.get("value"), stat.get("stderr"), stat.get("n")))
    return rows


def _headline(results: dict[str, Any]) -> str | None:
    metrics = results.get("metrics") or {}
    if "accuracy" in metrics:
        return "accuracy"
    return next(iter(metrics), None)


def _label(run: Run, index: int, labels: list[str]) -> str:
    name = run.path.name or str(run.path)
    return name if labels.count(name) == 1 else f"{index + 1}: {name}"


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """An HTML table from already-escaped cells."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


# ---------------------------------------------------------------------------------------------
# Figures (plotly figure dicts; the page draws them with the embedded plotly.js)


class _Figures:
    """Collects plotly figures; each gets a div the page fills in."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, fig: Any, name: str) -> str:
        """Register a plotly figure; return the (escaped) div that shows it."""
        import plotly.io as pio

        fig.update_layout(template="plotly_white", margin=dict(l=50, r=20, t=50, b=50), height=340)
        index = len(self.items)
        self.items.append(json.loads(pio.to_json(fig, validate=True)))
        return f'<div class="chart" id="chart-{index}" data-fig="{index}" data-name="{_esc(name)}"></div>'


def _step_axis(fig: Any, steps: list[Any]) -> None:
    """Whole-number ticks on a step axis (plotly would label 2 steps 1, 1.2, 1.4 ...)."""
    top = max([s for s in steps if isinstance(s, (int, float))], default=1)
    fig.update_xaxes(tickformat="d", dtick=max(1, round(top / 10)))


def _bar_chart(
    figs: _Figures, title: str, name: str, series: list[tuple[str, list[str], list[Any], list[Any]]], y_title: str
) -> str:
    """Bars with stderr error bars; one trace per (label, x, values, stderrs)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for label, xs, ys, errs in series:
        fig.add_trace(
            go.Bar(
                name=_plot_text(label),
                x=[_plot_text(x) for x in xs],
                y=ys,
                error_y=dict(type="data", array=[e if e is not None else 0 for e in errs], visible=True),
            )
        )
    fig.update_layout(title=_plot_text(title), barmode="group", yaxis_title=y_title, showlegend=len(series) > 1)
    values = [y for _, _, ys, _ in series for y in ys if isinstance(y, (int, float))]
    if values and all(0 <= y <= 1 for y in values):  # rates: keep the whole 0-1 scale in view
        fig.update_yaxes(range=[0, 1.05])
    return figs.add(fig, name)


# ---------------------------------------------------------------------------------------------
# Sections


def _metrics_table(results: dict[str, Any]) -> str:
    rows = [[_esc(n), _fmt(v), "± " + _fmt(s), _fmt(k)] for n, v, s, k in _metric_rows(results.get("metrics") or {})]
    for group, metrics in (results.get("groups") or {}).items():
        rows += [
            [f"{_esc(group)} · {_esc(n)}", _fmt(v), "± " + _fmt(s), _fmt(k)] for n, v, s, k in _metric_rows(metrics)
        ]
    return _table(["metric", "value", "stderr", "n (tasks)"], rows, "metrics")


def _group_chart(figs: _Figures, runs: list[tuple[str, dict[str, Any]]], title: str, prefix: str = "") -> str:
    """Per-group bars of the headline metric (one trace per run); without groups, the metrics themselves."""
    with_groups = [(label, res) for label, res in runs if res.get("groups")]
    if with_groups:
        metric = _headline(with_groups[0][1]) or "accuracy"
        series = []
        for label, res in with_groups:
            groups = res["groups"]
            xs = list(groups)
            series.append(
                (
                    label,
                    xs,
                    [groups[g].get(metric, {}).get("value") for g in xs],
                    [groups[g].get(metric, {}).get("stderr") for g in xs],
                )
            )
        return _bar_chart(figs, f"{title}{metric} per group", prefix + "groups", series, metric)
    series = []
    for label, res in runs:
        rows = _metric_rows(res.get("metrics") or {})
        series.append((label, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]))
    return _bar_chart(figs, f"{title}metrics", prefix + "metrics", series, "value")


def _flatten(prefix: str, value: Any, out: list[tuple[str, Any]]) -> None:
    if isinstance(value, dict):
        if set(value) >= {"value", "stderr"}:  # a Stat: one row
            out.append((prefix, f"{_fmt(value.get('value'))} ± {_fmt(value.get('stderr'))}"))
            return
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out.append((prefix, value))


# Efficiency blocks in words: each results.json block's title, and each key's label (a dotted
# path inside its block) and unit. Keys not named here are written from their name.
_BLOCK_TITLES = {
    "tokens": "Tokens",
    "time": "Time",
    "agents": "Agent episodes",
    "games": "Games",
    "consistency": "Consistency",
    "cost": "Cost",
    "reasoning": "Thinking",
    "samples": "Samples",
}
_LABELS: dict[str, tuple[str, str]] = {
    "tokens.prompt.mean": ("prompt tokens per sample", "tokens"),
    "tokens.prompt.total": ("prompt tokens in all", "count"),
    "tokens.prompt.n": ("samples with prompt counts", "count"),
    "tokens.completion.mean": ("completion tokens per sample", "tokens"),
    "tokens.completion.total": ("completion tokens in all", "count"),
    "tokens.completion.n": ("samples with completion counts", "count"),
    "time.wall_s": ("wall time", "s"),
    "time.sessions": ("sessions (a resumed run has several)", "count"),
    "time.samples_per_s": ("samples per second", "rate"),
    "time.completion_tokens_per_s": ("completion tokens per second", "rate"),
    "time.latency_s.p50": ("latency per sample, median", "s"),
    "time.latency_s.p95": ("latency per sample, 95th percentile", "s"),
    "time.latency_s.mean": ("latency per sample, mean", "s"),
    "time.latency_s.n": ("samples timed", "count"),
    "agents.episodes": ("episodes", "count"),
    "agents.turns_per_episode": ("turns per episode", "number"),
    "agents.tool_calls_per_episode": ("tool calls per episode", "number"),
    "agents.tool_errors_per_episode": ("tool errors per episode", "number"),
    "agents.successes": ("successful episodes", "count"),
    "agents.steps_to_success": ("turns to a success (mean)", "number"),
    "agents.tokens_per_success": ("tokens per success", "tokens"),
    "games.games": ("games", "count"),
    "games.invalid_move_rate": ("games lost to an invalid move", "share"),
    "games.invalid_moves_per_turn": ("invalid moves per move", "number"),
    "games.turns_per_game": ("moves per game", "number"),
    "world.episodes": ("episodes in a world", "count"),
    "world.success_rate": ("episodes the world says were won", "share"),
    "world.mean_score": ("the world's score (0-1), mean", "number"),
    "world.steps_to_success": ("world steps to a win (mean)", "number"),
    "world.invalid_actions_per_episode": ("invalid actions per episode", "number"),
    "consistency.samples_per_task": ("samples per task", "count"),
    "consistency.tasks": ("tasks with several samples", "count"),
    "consistency.all_agree": ("tasks whose samples agree on the outcome", "share"),
    "consistency.same_answer": ("tasks whose samples give the same answer", "share"),
    "cost.currency": ("currency", "text"),
    "cost.price_input_per_1m": ("price per 1M prompt tokens", "usd"),
    "cost.price_output_per_1m": ("price per 1M completion tokens", "usd"),
    "cost.total": ("total", "usd"),
    "cost.per_task": ("per task", "usd"),
    "cost.per_sample": ("per sample", "usd"),
    "cost.cost_of_pass": ("cost of one correct sample (cost-of-pass)", "usd"),
    "cost.samples_without_counts": ("samples without token counts", "count"),
    "reasoning.n": ("samples that thought", "count"),
    "reasoning.share_of_samples": ("share of samples that thought", "share"),
    "reasoning.thinking_tokens.mean": ("thinking tokens per sample, mean", "tokens"),
    "reasoning.thinking_tokens.median": ("thinking tokens per sample, median", "tokens"),
    "reasoning.thinking_tokens.n": ("samples with thinking counts", "count"),
    "reasoning.cut": ("cut inside their thinking (no answer)", "count"),
    "reasoning.cut_share": ("share cut inside their thinking", "share"),
    "reasoning.accuracy_cut": ("accuracy of the cut ones", "share"),
    "reasoning.accuracy_answered": ("accuracy of the answered ones", "share"),
}


def _number(value: float) -> str:
    """A float rounded for reading: 3 significant decimals below 1, 2 below 100, 1 above."""
    if not math.isfinite(value):
        return "n/a"
    digits = 3 if abs(value) < 1 else 2 if abs(value) < 100 else 1
    return f"{value:,.{digits}f}"


def plain_value(value: Any, unit: str) -> str:
    """An efficiency value in its unit, rounded (`n/a` for a missing one)."""
    if value is None:
        return "n/a"
    if isinstance(value, bool) or isinstance(value, str) or unit == "text":
        return str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    if unit == "share":
        return f"{value:.1%}"
    if unit == "usd":
        return f"${value:,.4f}" if abs(value) >= 0.01 or value == 0 else f"${value:.6f}"
    if unit == "s":  # 0.25 s, 33.9 s, 1,204 s
        return f"{value:,.{2 if abs(value) < 10 else 1 if abs(value) < 100 else 0}f} s"
    if unit == "rate":
        return f"{_number(value)}/s"
    if unit == "tokens":
        return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"
    if isinstance(value, int) or (unit == "count" and float(value).is_integer()):
        return f"{int(value):,}"
    return _number(float(value))


def plain_rows(block: str, value: Any) -> list[tuple[str, str]]:
    """(label, value) rows of one results.json block, in plain words and units."""
    flat: list[tuple[str, Any]] = []
    _flatten("", value, flat)
    rows = []
    for key, v in flat:
        label, unit = _LABELS.get(f"{block}.{key}", ("", ""))
        if not label:
            parts = key.split(".")
            if block == "agents" and parts[0] == "end_reasons":
                label, unit = f"ended: {'.'.join(parts[1:])}", "count"
            elif block == "games" and parts[0] == "per_seat" and len(parts) == 3:
                label, unit = (
                    (f"seat {parts[1]}: games", "count")
                    if parts[2] == "games"
                    else (f"seat {parts[1]}: {parts[2]} rate", "share")
                )
            else:  # a key this table does not know: its own name, in words
                label = key.replace(".", ", ").replace("_per_", " per ").replace("_", " ")
                unit = "rate" if key.endswith("_per_s") else "s" if key.endswith("_s") else "number"
        rows.append((label, plain_value(v, unit) if not isinstance(v, str) or unit != "number" else v))
    return rows


def _efficiency(run: EvalRun) -> str:
    """results.json's efficiency, cost and consistency blocks, one small table each; for runs
    written before those blocks, what samples.jsonl tells (tokens, finish reasons, turns)."""
    blocks = {k: v for k, v in run.results.to_json().items() if k not in _BLOCKS_SKIP and isinstance(v, dict)}
    source = "from results.json"
    if not blocks:
        source = "counted from samples.jsonl (this run's results.json has no efficiency block)"
        samples = run.samples
        counted: dict[str, Any] = {}
        tokens = [s.num_tokens for s in samples if isinstance(s.num_tokens, int)]
        if tokens:
            counted["completion tokens, total"] = sum(tokens)
            counted["completion tokens, mean"] = sum(tokens) / len(tokens)
        for s in samples:
            key = f"finish reason: {s.finish_reason}"
            counted[key] = counted.get(key, 0) + 1
        turns = [len(s.turns) for s in samples if s.turns is not None]
        if turns:
            counted["turns per episode, mean"] = sum(turns) / len(turns)
        blocks = {"samples": counted} if counted else {}
    if not blocks:
        return ""
    tables = []
    for name, block in blocks.items():
        cells = [[_esc(label), _esc(text)] for label, text in plain_rows(name, block)]
        tables.append(
            _table([_esc(_BLOCK_TITLES.get(name, name.replace("_", " ").capitalize())), ""], cells, "efficiency")
        )
    return (
        f'<h3>Efficiency, cost and consistency</h3><p class="note">{_esc(source)}</p>'
        f'<div class="blocks">{"".join(tables)}</div>'
    )


def _tokens_of(sample: Sample | RewardRow) -> int | None:
    value = sample.thinking_tokens
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def thinking_buckets(samples: list[Sample], buckets: int = THINK_BUCKETS) -> list[dict[str, Any]]:
    """The samples that thought (and whose thinking tokens are counted), in at most `buckets`
    ranges of thinking length holding about as many samples each (a count is never split
    across two): [{lo, hi, n, correct, accuracy, stderr, cut}], shortest first."""
    from arlecli.results import mean_stderr

    points = sorted(
        (t, bool(s.correct), bool(s.thinking_cut))
        for s in samples
        if s.thinking_cut is not None and (t := _tokens_of(s)) is not None
    )
    k = min(buckets, len({t for t, _, _ in points}))
    out, start = [], 0
    for b in range(k):
        end = max(start + 1, round((b + 1) * len(points) / k)) if b < k - 1 else len(points)
        while 0 < end < len(points) and points[end][0] == points[end - 1][0]:
            end += 1  # ties stay together
        chunk = points[start:end]
        if not chunk:
            continue
        stat = mean_stderr([float(c) for _, c, _ in chunk])
        out.append(
            {
                "lo": chunk[0][0],
                "hi": chunk[-1][0],
                "n": len(chunk),
                "correct": sum(c for _, c, _ in chunk),
                "accuracy": stat.value,
                "stderr": stat.stderr,
                "cut": sum(x for _, _, x in chunk),
            }
        )
        start = end
    return out


def _bucket_label(b: dict[str, Any]) -> str:
    return f"{b['lo']:,}" if b["lo"] == b["hi"] else f"{b['lo']:,}–{b['hi']:,}"


def _thinking(run: EvalRun, figs: _Figures) -> str:
    """A run whose model thought: how many samples did, and accuracy against thinking length
    (a chart and its table); nothing for a run without thinking."""
    import plotly.graph_objects as go

    thought = [s for s in run.samples if s.thinking_cut is not None]
    if not thought:
        return ""
    cut = sum(bool(s.thinking_cut) for s in thought)
    head = (
        f'<h3>Thinking</h3><p class="note">{len(thought):,} of {len(run.samples):,} samples thought; '
        f"{cut:,} of them ended inside their thinking with no answer (scored wrong).</p>"
    )
    buckets = thinking_buckets(run.samples)
    if not buckets:
        return (
            head + '<p class="note">No thinking token counts in this run (the endpoint gave none), so no chart of '
            "accuracy against thinking length.</p>"
        )
    labels = [_bucket_label(b) for b in buckets]
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=[b["accuracy"] for b in buckets],
            name="accuracy",
            text=[f"n={b['n']}" for b in buckets],
            textposition="outside",
            customdata=[[b["n"], b["cut"]] for b in buckets],
            hovertemplate="%{x} thinking tokens<br>accuracy %{y:.3f}<br>%{customdata[0]} samples, "
            "%{customdata[1]} cut<extra></extra>",
            error_y=dict(
                type="data", array=[b["stderr"] if math.isfinite(b["stderr"]) else 0 for b in buckets], visible=True
            ),
        )
    )
    fig.update_layout(
        title="Accuracy against thinking length",
        xaxis_title="thinking tokens (per sample)",
        yaxis_title="accuracy",
        showlegend=False,
    )
    fig.update_yaxes(range=[0, 1.1])
    rows = [
        [_esc(label), _fmt(b["n"]), _fmt(b["correct"]), _fmt(b["accuracy"]), _fmt(b["cut"])]
        for label, b in zip(labels, buckets)
    ]
    table = _table(["thinking tokens", "samples", "correct", "accuracy", "cut (no answer)"], rows, "thinking-buckets")
    return head + f'<div class="overview">{table}{figs.add(fig, "thinking-length")}</div>'


def _browser_payload(run: EvalRun, cap: int) -> tuple[dict[str, Any], str]:
    """The samples the sample browser embeds, and a note about the ones left out."""
    shown = run.samples[:cap]
    left = run.samples[cap:]
    note = ""
    if left:
        right = sum(bool(s.correct) for s in left)
        note = (
            f"This file embeds the first {len(shown):,} of {len(run.samples):,} samples (in samples.jsonl "
            f"order); the {len(left):,} left out ({right:,} correct, {len(left) - right:,} wrong) are counted "
            f"in the metrics above and are in {RunDir(run.path).samples}."
        )
    samples = []
    for s in shown:
        row = _cap_text({k: v for k, v in s.to_json().items() if k not in ("session_started_at", "finished_at")})
        row["question"] = question_of(s.prompt)  # shown on the collapsed row
        samples.append(row)
    return {"samples": samples, "total": len(run.samples), "omitted": len(left), "orders": sample_orders(shown)}, note


QUESTION_CAP = 300  # characters of the question a collapsed sample row shows


def question_of(prompt: Any) -> str:
    """What a sample asked, for its collapsed row: the last user message of a chat prompt, the
    last paragraph of a text prompt (few-shot exemplars come before it), cut at QUESTION_CAP."""
    text = ""
    if isinstance(prompt, list):
        for m in reversed(prompt):
            if isinstance(m, dict) and m.get("role") == "user":
                content = m.get("content")
                text = (
                    content
                    if isinstance(content, str)
                    else " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                    if isinstance(content, list)
                    else ""
                )
                break
    elif isinstance(prompt, str):
        parts = [p for p in prompt.split("\n\n") if p.strip()]
        text = parts[-1] if parts else prompt
    text = " ".join(text.split())
    return text if len(text) <= QUESTION_CAP else text[: QUESTION_CAP - 1] + "…"


def _length(sample: Sample) -> float:
    for value in (sample.completion_tokens, sample.num_tokens):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return float(len(str(sample.completion or "")))


def sample_orders(samples: list[Sample]) -> dict[str, list[int]]:
    """The sample browser's sort orders, as positions into `samples`: by task (natural order of
    ids, then sample number), reward (highest first), latency (slowest first; unknown last) and
    length (longest first: completion tokens, else characters). Ties keep samples.jsonl's order."""
    from arlecli.compare import natural_key

    idx = list(range(len(samples)))

    def number(s: Sample, key: str) -> float | None:
        v = getattr(s, key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

    def task_key(i: int) -> tuple[Any, ...]:
        return (natural_key(str(samples[i].task_id)), number(samples[i], "sample") or 0)

    def down(key: str) -> Any:
        return lambda i: (number(samples[i], key) is None, -(number(samples[i], key) or 0.0))

    return {
        "task": sorted(idx, key=task_key),
        "reward": sorted(idx, key=down("reward")),
        "latency": sorted(idx, key=down("latency_s")),
        "length": sorted(idx, key=lambda i: -_length(samples[i])),
    }


def _sample_browser(run: EvalRun, browsers: list[dict[str, Any]], cap: int, title: str = "Samples") -> str:
    payload, note = _browser_payload(run, cap)
    index = len(browsers)
    browsers.append(payload)
    n = payload["total"]
    right = sum(bool(s.correct) for s in run.samples)
    omitted = f'<p class="omitted">{_esc(note)}</p>' if note else ""
    return (
        f"<h3>{_esc(title)}</h3>"
        f'<p class="sample-count" data-total="{n}">{n:,} samples: {right:,} correct, {n - right:,} wrong</p>'
        f'{omitted}<div class="browser" data-browser="{index}"></div>'
    )


def _eval_section(run: EvalRun, label: str, figs: _Figures, browsers: list[dict[str, Any]], cap: int) -> str:
    r, res = run.results, run.results.to_json()
    head = (
        f'<p class="meta">{_esc(r.benchmark)} · {_esc(r.model)} · split '
        f"{_esc(r.split)} · {_fmt(r.n_tasks)} tasks · {_fmt(r.n_samples)} samples"
        f"{' · ' + _fmt(r.num_samples) + ' per task' if (r.num_samples or 1) > 1 else ''}"
        f" · {_esc(run.meta.created or '')}</p>"
    )
    if run.meta.command:
        head += f'<p class="meta"><code>{_esc(" ".join(map(str, run.meta.command)))}</code></p>'
    parts = [
        head,
        '<div class="overview"><div>',
        "<h3>Metrics</h3>",
        _metrics_table(res),
        "</div>",
        _group_chart(figs, [(label, res)], ""),
        "</div>",
        _thinking(run, figs),
        _efficiency(run),
        _sample_browser(run, browsers, cap),
    ]
    return "".join(parts)


def _train_section(run: TrainRun, label: str, figs: _Figures, browsers: list[dict[str, Any]], cap: int) -> str:
    import plotly.graph_objects as go

    meta = run.meta
    # What the algorithm logs a line per (rft: rounds; its max_steps caps each round's SFT).
    unit, field_name = meta.steps
    length = f"{unit} of {_esc(meta.trainer.get(field_name, '?'))}"
    lora = meta.options.get("lora_rank")
    parts = [
        f'<p class="meta">{_esc(meta.benchmark)} · {_esc(meta.model)} · '
        f"{_esc(meta.algo)}{' + LoRA r=' + _esc(lora) if lora else ''}"
        f" · {_fmt(len(run.metrics))} logged {length} · "
        f"{_esc(meta.created or '')}</p>"
    ]
    parts += [f'<p class="note">{_esc(n)}</p>' for n in run.notes]

    # Curves over steps: one chart per quantity the trainer logged.
    parts.append("<h3>Training curves</h3>")
    missing, curves = [], []
    steps = [r.get("step") for r in run.metrics]
    for key, title in TRAIN_CURVES:
        ys = [r.get(key) for r in run.metrics]
        if not any(isinstance(y, (int, float)) for y in ys):
            missing.append(key)
            continue
        fig = go.Figure(go.Scatter(x=steps, y=ys, mode="lines+markers", name=key))
        if key == "reward" and any(isinstance(r.get("reward_std"), (int, float)) for r in run.metrics):
            fig.data[0].error_y = dict(
                type="data", array=[r.get("reward_std") or 0 for r in run.metrics], visible=True, thickness=1
            )
        fig.update_layout(title=f"{title} per step", xaxis_title="step", yaxis_title=key)
        if key == "accuracy":
            fig.update_yaxes(range=[-0.02, 1.02])
        _step_axis(fig, steps)
        curves.append(figs.add(fig, f"train-{key}"))
    parts.append(f'<div class="charts">{"".join(curves)}</div>')
    if missing:
        parts.append(f'<p class="note">Not logged by this run\'s trainer: {_esc(", ".join(missing))}.</p>')
    parts.append(_async_curves(run.metrics, steps, figs))

    # Held-out evals: accuracy at each, and the first against the last.
    if run.evals:
        parts.append("<h3>Held-out evaluations</h3>")
        xs = list(run.evals)
        head = _headline(run.evals[xs[-1]].results.to_json()) or "accuracy"
        stats = [run.evals[s].results.metrics.get(head, {}) for s in xs]
        fig = go.Figure(
            go.Scatter(
                x=xs,
                y=[st.get("value") for st in stats],
                mode="lines+markers",
                name=head,
                error_y=dict(type="data", array=[st.get("stderr") or 0 for st in stats], visible=True),
            )
        )
        fig.update_layout(title=f"Held-out {head} at each evaluation", xaxis_title="step", yaxis_title=head)
        fig.update_yaxes(range=[-0.02, 1.02])
        _step_axis(fig, xs)
        parts.append(figs.add(fig, "heldout"))
        first, last = run.evals[xs[0]], run.evals[xs[-1]]
        parts.append(_before_after(first, last, f"step {xs[0]}", f"step {xs[-1]}"))
    else:
        parts.append('<p class="note">No held-out evaluation in this run (eval/step-N/ is empty).</p>')

    parts.append(step_completions(run))
    if run.evals:
        last_step = list(run.evals)[-1]
        parts.append(
            _sample_browser(
                run.evals[last_step], browsers, cap, f"Samples of the last held-out evaluation (step {last_step})"
            )
        )
    return "".join(parts)


def _before_after(first: EvalRun, last: EvalRun, a: str, b: str) -> str:
    """First vs last held-out eval: each metric, its difference, and paired statistics where
    `arlecli.compare` provides them."""
    rows = []
    ma, mb = first.results.metrics, last.results.metrics
    for name in [n for n in ma if n in mb]:
        va, vb = ma[name].get("value"), mb[name].get("value")
        delta = vb - va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) else None
        rows.append(
            [
                _esc(name),
                f"{_fmt(va)} ± {_fmt(ma[name].get('stderr'))}",
                f"{_fmt(vb)} ± {_fmt(mb[name].get('stderr'))}",
                _esc(f"{delta:+.4f}" if delta is not None else ""),
            ]
        )
    table = _table(["metric", _esc(a), _esc(b), "difference"], rows, "before-after")
    return f"<h4>Before and after training</h4>{table}{_paired(first, last)}"


def _paired(a: EvalRun, b: EvalRun) -> str:
    """B against A on the tasks both hold (arlecli.compare): paired difference, its 95% interval,
    tasks won/lost/tied, McNemar's exact p, and the tasks that flipped."""
    from arlecli.compare import compare_runs

    try:
        cmp = compare_runs(a.path, b.path)
    except UserError as exc:  # different benchmarks or splits: the report still shows both
        return f'<p class="note">No paired comparison: {_esc(exc)}</p>'
    rows = []
    for m in cmp.metrics:
        rows.append(
            [
                _esc(m.metric),
                _fmt(m.a),
                _fmt(m.b),
                _esc(f"{m.diff:+.4f}") + " ± " + _fmt(m.stderr),
                f"[{_fmt(m.ci_low)}, {_fmt(m.ci_high)}]",
                f"{m.won} / {m.lost} / {m.tied}",
                _fmt(m.mcnemar_p) if m.mcnemar_p is not None else "",
            ]
        )
    table = _table(
        ["metric", "A", "B", "B - A ± paired stderr", "95% interval", "tasks won / lost / tied by B", "McNemar p"],
        rows,
        "paired",
    )
    flips = []
    for what, ids in (("gained by B", cmp.gained), ("lost by B", cmp.lost)):
        if ids:
            shown = ", ".join(ids[:30]) + (f" ... ({len(ids) - 30} more)" if len(ids) > 30 else "")
            flips.append(f'<p class="note">{len(ids)} tasks {what}: {_esc(shown)}</p>')
    warn = "".join(f'<p class="note">{_esc(w)}</p>' for w in cmp.warnings)
    return (
        f"<h4>Paired comparison: B = {_esc(b.path.name)} against A = {_esc(a.path.name)}, "
        f"on the {cmp.shared:,} tasks both hold</h4>{warn}{table}{''.join(flips)}"
    )


def _thinking_summary(row: RewardRow) -> str:
    about = [f"{_fmt(t)} tokens"] if (t := _tokens_of(row)) is not None else []
    if row.thinking_cut:
        about.append("cut: no answer")
    return "thinking" + (f" ({', '.join(about)})" if about else "")


def _folded_thinking(row: RewardRow) -> str:
    """A row's thinking as a closed <details> (static, escaped); "" when it did not think."""
    thinking = row.thinking
    if not isinstance(thinking, str):
        return ""
    cut = "1" if row.thinking_cut else "0"
    return (
        f'<details class="thinking" data-cut="{cut}"><summary>{_esc(_thinking_summary(row))}</summary>'
        f"<pre>{_esc(_cap_text(thinking))}</pre></details>"
    )


def step_completions(run: TrainRun) -> str:
    """A few completions per logged step (rewards.jsonl), as static escaped text."""
    if not run.rewards:
        return ""
    by_step: dict[Any, list[RewardRow]] = {}
    for r in run.rewards:  # records, or rewards.jsonl objects
        r = r if isinstance(r, RewardRow) else RewardRow.from_json(r)
        by_step.setdefault(r.step, []).append(r)
    steps = list(by_step)[-STEP_ROWS_CAP:]
    rows = []
    for step in steps:
        for r in by_step[step][:STEP_SAMPLES]:
            text = r.completion if isinstance(r.completion, str) else json.dumps(r.completion)
            rows.append(
                [
                    _esc(step),
                    _esc(r.task_id),
                    _fmt(r.reward),
                    "✓" if r.correct else "✗",
                    _esc(r.extracted),
                    _esc(r.target),
                    f"{_folded_thinking(r)}<pre>{_esc(_cap_text(text))}</pre>",
                ]
            )
    left = len(by_step) - len(steps)
    note = (
        (
            f'<p class="omitted">Completions of the first {left:,} logged steps are left out (the last '
            f"{len(steps):,} are shown); all are in {_esc(RunDir(run.path).rewards)}.</p>"
        )
        if left
        else ""
    )
    return (
        f'<h3>Sampled completions per step</h3><p class="note">Up to {STEP_SAMPLES} per logged step, '
        f"from rewards.jsonl.</p>{note}"
        + _table(["step", "task", "reward", "", "extracted", "target", "completion"], rows, "step-samples")
    )


def shared_results(evals: list[EvalRun]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each run's results recomputed on the tasks every run holds (results.aggregate over
    those tasks' samples: the same metrics, groups and stderr as results.json), and those
    task ids, naturally sorted. Runs that hold the same tasks keep their results.json."""
    from arlecli.compare import natural_key
    from arlecli.results import aggregate

    sets = [{str(s.task_id) for s in run.samples} for run in evals]
    shared = set.intersection(*sets) if sets else set()
    ids = sorted(shared, key=natural_key)
    if all(ts == shared for ts in sets):
        return [run.results.to_json() for run in evals], ids
    out = []
    for run in evals:
        kept = [s for s in run.samples if str(s.task_id) in shared]
        names = [m for m in run.results.metrics if m != "accuracy" and not m.startswith("pass")]
        grouped = any(s.group is not None for s in kept)
        res = (
            aggregate(kept, names, int(run.meta.options.get("num_samples") or 1), group_by="group" if grouped else None)
            if kept
            else {"metrics": {}}
        )
        out.append({**res, "benchmark": run.results.benchmark})
    return out, ids


def _compared_tasks(evals: list[EvalRun], shared: list[str], all_tasks: bool) -> str:
    """The line under the comparison that says which tasks its chart compares."""
    counts = [len({str(s.task_id) for s in run.samples}) for run in evals]
    if len(set(counts)) == 1 and len(shared) == counts[0]:
        return f"The chart compares the runs on the same {len(shared):,} tasks."
    each = ", ".join(f"{n:,}" for n in counts)
    if all_tasks:
        return (
            f"The chart shows each run on all of its own tasks ({each}): different task sets, so the bars are "
            f"not a paired comparison; without --all-tasks it compares the {len(shared):,} tasks all hold."
        )
    return (
        f"The chart compares the runs on the {len(shared):,} tasks all of them hold (paired), out of {each}; "
        f"the table above is each run on all of its own tasks (`arle report --all-tasks` charts those)."
    )


def _comparison(runs: list[Run], labels: list[str], figs: _Figures, all_tasks: bool = False) -> str:
    """Several runs: one row per run, and the per-group chart with one bar per run: on the
    tasks every run holds (paired) unless `all_tasks`, saying which."""
    results: list[tuple[str, Run, dict[str, Any]]] = []
    for run, label in zip(runs, labels):
        if isinstance(run, EvalRun):
            results.append((label, run, run.results.to_json()))
        elif run.evals:
            last = list(run.evals)[-1]
            results.append((label, run, run.evals[last].results.to_json()))
        else:
            results.append((label, run, {}))
    names: list[str] = []
    for _, _, res in results:
        names += [n for n in (res.get("metrics") or {}) if n not in names]
    rows = []
    for label, run, res in results:
        metrics = res.get("metrics") or {}
        kind = "train (last held-out eval)" if isinstance(run, TrainRun) else "eval"
        rows.append(
            [
                _esc(label),
                kind,
                _esc(res.get("benchmark") or run.meta.benchmark),
                _esc(res.get("model") or run.meta.model),
                _fmt(res.get("n_samples")),
            ]
            + [f"{_fmt(metrics[n]['value'])} ± {_fmt(metrics[n].get('stderr'))}" if n in metrics else "" for n in names]
        )
    table = _table(["run", "kind", "benchmark", "model", "samples", *map(_esc, names)], rows, "comparison")
    benchmarks = {res.get("benchmark") for _, _, res in results if res}
    charted = [(label, res) for label, _, res in results if res]
    title, tasks_note = "Runs side by side: ", ""
    evals = [run if isinstance(run, EvalRun) else run.evals[list(run.evals)[-1]] for _, run, res in results if res]
    if len(benchmarks) == 1 and len(evals) == len(charted) > 1:
        shared_res, shared = shared_results(evals)
        if not all_tasks:
            charted = [(label, res) for (label, _), res in zip(charted, shared_res)]
            title = f"Runs side by side on the {len(shared):,} shared tasks: "
        tasks_note = (
            f'<p class="note compared-tasks" data-shared="{len(shared)}">'
            f"{_esc(_compared_tasks(evals, shared, all_tasks))}</p>"
        )
    chart = _group_chart(figs, charted, title, "compare-")
    note = (
        '<p class="note">These runs are of different benchmarks: their numbers are not comparable.</p>'
        if len(benchmarks) > 1
        else ""
    )
    paired = ""
    evals = [run for run in runs if isinstance(run, EvalRun)]
    if len(runs) == 2 and len(evals) == 2:
        paired = _paired(evals[0], evals[1])
    if not paired:
        paired = (
            '<p class="note">Side by side only; `arle compare RUN_A RUN_B` gives the paired difference, its '
            "interval and the tasks that flipped.</p>"
        )
    compute = _compute(runs, labels, figs) if len(benchmarks) == 1 else ""
    return f"<h2>Comparison</h2>{note}{table}{paired}{compute}{tasks_note}{chart}"


def _compute(runs: list[Run], labels: list[str], figs: _Figures) -> str:
    """Accuracy against compute: one row per run (a training run: its last held-out eval) with
    its accuracy, mean thinking and completion tokens and its paired accuracy difference with
    the first run, and the curve (accuracy against mean thinking tokens, or completion tokens
    when no run thought)."""
    import plotly.graph_objects as go

    from arlecli.compare import compare_runs, compute_point

    shown: list[tuple[str, EvalRun]] = []
    for run, label in zip(runs, labels):
        if isinstance(run, TrainRun):
            if not run.evals:
                continue
            run = run.evals[list(run.evals)[-1]]
        shown.append((label, run))
    if len(shown) < 2:
        return ""
    points = [compute_point(run, label) for label, run in shown]
    thought = any(p.thought for p in points)
    rows = []
    for i, (point, (_, run)) in enumerate(zip(points, shown)):
        diff = ""
        if i:
            try:
                acc = next(
                    (m for m in compare_runs(shown[0][1].path, run.path).metrics if m.metric == "accuracy"), None
                )
            except UserError:  # different splits or data: side by side only
                acc = None
            diff = "" if acc is None else _esc(f"{acc.diff:+.4f}") + " ± " + _fmt(acc.stderr)
        budget = "/".join(_fmt(b) for b in (point.max_thinking_tokens, point.max_tokens) if b is not None)
        rows.append(
            [
                _esc(point.run),
                f"{_fmt(point.accuracy)} ± {_fmt(point.stderr)}",
                *([_fmt(point.thinking_tokens, 1), _fmt(point.cut_share)] if thought else []),
                _fmt(point.completion_tokens, 1),
                _fmt(point.completion_tokens_total),
                _esc(budget),
                diff,
            ]
        )
    head = [
        "run",
        "accuracy",
        *(["thinking tokens (mean)", "cut share"] if thought else []),
        "completion tokens (mean)",
        "completion tokens (total)",
        "budget (thinking/max)",
        "accuracy - first run ± paired stderr",
    ]
    table = _table(head, rows, "compute")
    xs = [p.thinking_tokens if thought else p.completion_tokens for p in points]
    known = {i: x for i, x in enumerate(xs) if x is not None}
    order = sorted(known, key=known.__getitem__)
    chart = ""
    if order:
        fig = go.Figure(
            go.Scatter(
                x=[xs[i] for i in order],
                y=[points[i].accuracy for i in order],
                mode="lines+markers+text",
                text=[_plot_text(points[i].run) for i in order],
                textposition="top center",
                name="accuracy",
                error_y=dict(
                    type="data",
                    visible=True,
                    array=[points[i].stderr if math.isfinite(points[i].stderr) else 0 for i in order],
                ),
            )
        )
        what = "thinking" if thought else "completion"
        fig.update_layout(
            title=f"Accuracy against {what} tokens",
            xaxis_title=f"{what} tokens (mean per sample)",
            yaxis_title="accuracy",
            showlegend=False,
        )
        fig.update_yaxes(range=[-0.02, 1.1])
        chart = figs.add(fig, "compute")
    title = "Accuracy against compute" if thought else "Accuracy and tokens"
    return f"<h4>{title}</h4>{table}{chart}"


# ---------------------------------------------------------------------------------------------
# The page

# The page's style and its plain JS are files of their own (report_assets/report.css, .js), read
# from arle's package. Every piece of run data reaches the page through textContent (never
# innerHTML), so a completion is shown as the text it is, whatever it holds.
_ASSETS = files("arlecli") / "report_assets"
# Each after a newline, as the page has always had them.
_CSS = "\n" + (_ASSETS / "report.css").read_text(encoding="utf-8")
_JS = "\n" + (_ASSETS / "report.js").read_text(encoding="utf-8")


def _async_curves(metrics: list[dict[str, Any]], steps: list[Any], figs: "_Figures") -> str:
    """The asynchronous-rollout charts (ASYNC_CHARTS) of a --max-staleness run; "" for others."""
    if not any(isinstance(r.get("staleness/max"), (int, float)) for r in metrics):
        return ""
    import plotly.graph_objects as go

    charts = []
    for title, keys in ASYNC_CHARTS:
        fig = go.Figure()
        for key in keys:
            fig.add_trace(go.Scatter(x=steps, y=[r.get(key) for r in metrics], mode="lines+markers", name=key))
        fig.update_layout(title=f"{title} per step", xaxis_title="step")
        _step_axis(fig, steps)
        charts.append(figs.add(fig, "train-async-" + keys[0].split("/")[0]))
    return f'<h3>Asynchronous rollouts</h3><div class="charts">{"".join(charts)}</div>'


def build_report(paths: list[Path | str], *, sample_cap: int = SAMPLE_CAP, all_tasks: bool = False) -> str:
    """The HTML text of the report of one or more run directories (each checked first); the
    runs' chart compares the tasks they all hold unless `all_tasks`."""
    runs = [load_run(p) for p in paths]  # every run checked before anything is built
    if not runs:
        raise UserError("pass at least one run directory")
    import plotly.offline

    names = [r.path.name or str(r.path) for r in runs]
    labels = [_label(r, i, names) for i, r in enumerate(runs)]
    figs = _Figures()
    browsers: list[dict[str, Any]] = []
    body = []
    if len(runs) > 1:
        body.append(_comparison(runs, labels, figs, all_tasks))
    for run, label in zip(runs, labels):
        kind = "training run" if isinstance(run, TrainRun) else "eval run"
        inner = (
            _train_section(run, label, figs, browsers, sample_cap)
            if isinstance(run, TrainRun)
            else _eval_section(run, label, figs, browsers, sample_cap)
        )
        body.append(
            f'<section class="run" data-kind="{"train" if isinstance(run, TrainRun) else "eval"}">'
            f'<h2>{_esc(label)} <span class="note">({kind}: {_esc(run.path)})</span></h2>{inner}</section>'
        )
    title = "arle report: " + ", ".join(labels)
    # The library's JavaScript, once per file; a `</script` inside it would end the element early.
    plotly_js = plotly.offline.get_plotlyjs().replace("</script", "<\\/script")
    data = _script_json({"figures": figs.items, "browsers": browsers, "schema": BROWSER_SCHEMA})
    generated = time.strftime("%Y-%m-%d %H:%M:%S")
    # The policy lets the inline code run and forbids every request: no hostile sample (nor
    # the library) can load an image, a script, a font or a frame from anywhere.
    csp = (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
        "font-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>{_esc(title)}</h1><p>generated {generated} by arle · one file, works offline</p></header>"
        f"<main>{''.join(body)}</main>"
        f'<script type="application/json" id="report-data">{data}</script>'
        f"<script>{plotly_js}</script><script>{_JS}</script></body></html>\n"
    )


def default_output(paths: Sequence[Path | str]) -> Path:
    """report.html inside the run directory for one run; ./report.html for several."""
    return Path(paths[0]) / "report.html" if len(paths) == 1 else Path("report.html")


def write_report(
    paths: Sequence[Path | str], output: Path | None = None, *, sample_cap: int = SAMPLE_CAP, all_tasks: bool = False
) -> Path:
    """Check the runs, build the report and write it (atomically); return where it went.

    Every run is read and checked before anything is written, so bad input leaves no file."""
    paths = [Path(p) for p in paths]
    if output is not None:
        rundir.refuse_overwriting(Path(output), paths)
    text = build_report(paths, sample_cap=sample_cap, all_tasks=all_tasks)
    out = Path(output) if output is not None else default_output(paths)
    tmp = out.with_name(out.name + ".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}; choose another place with -o") from None
    return out
