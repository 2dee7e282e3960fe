"""What a run cost and how it behaved, next to how well it scored: results.json's `tokens`,
`time`, `agents` and `cost` blocks (and `consistency`'s all-agree share).

Everything here is computed from samples.jsonl lines alone, like the metrics in results.py,
so a resumed run and a recomputation give the same numbers. What each sample line holds
(records.Sample, written by eval.py):

    prompt_tokens, completion_tokens   summed over the episode's turns (a later turn's prompt
                                       repeats the conversation, and is billed again); the
                                       endpoint's `usage` when it sends one, else the engine's
                                       ids; null when the backend gave neither
    latency_s                          summed generation wall time of its turns; null if unknown
    session_started_at, finished_at    unix seconds: when this `arle eval` process started
                                       generating, and when this sample was written
    num_turns, tool_calls, tool_errors multi-turn envs only (tool counts where the env keeps them)
    end_reason                         multi-turn envs only: why the episode ended

What results.json gains (each block is left out when it has nothing to report; a value that
cannot be known is null, never estimated: a run without prices has no `cost` block at all):

    metrics."pass^k"      with -n > 1, for k in 1, 2, 4, ..., n: {value, stderr, n}, tau-bench's
                          pass^k (mean over tasks of C(c,k)/C(n,k)), next to pass@k
    tokens                {prompt, completion}: {mean, total, n} per sample
    time                  wall_s (sum over sessions), sessions, samples_per_s,
                          completion_tokens_per_s, latency_s: {p50, p95, mean, n}
    agents                multi-turn runs: episodes, turns_per_episode, tool_calls_per_episode,
                          tool_errors_per_episode, end_reasons: {reason: count}, successes,
                          steps_to_success (mean turns of correct episodes), tokens_per_success
    (an env kind's own)   e.g. `games` of game cards: envs/textarena.py's game_stats
    consistency           with -n > 1: samples_per_task, tasks (those with 2+ samples),
                          all_agree (share whose samples are all correct or all wrong),
                          same_answer (share whose extracted answers are all equal)
    cost                  with prices: currency ("USD"), price_input_per_1m, price_output_per_1m,
                          total, per_task, per_sample, cost_of_pass (total / correct samples;
                          null if none), samples_without_counts (only when some are unknown:
                          then every amount is null)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from arlecli.errors import UserError
from arlecli.records import Sample, samples_of

Lines = Iterable[Sample | Mapping[str, Any]]  # records, or samples.jsonl objects


@dataclass(frozen=True)
class Prices:
    """USD per 1M prompt (input) and completion (output) tokens."""

    input_per_1m: float
    output_per_1m: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """USD for this many tokens."""
        return (prompt_tokens * self.input_per_1m + completion_tokens * self.output_per_1m) / 1e6


def check_price(value: Any, what: str) -> float | None:
    """`value` as USD per 1M tokens (None stays None); a UserError naming `what` unless it is a
    finite number >= 0 (text from the command line, or a number from a profile file)."""
    if value is None:
        return None
    number: float | None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        number = None
    if number is None or not math.isfinite(number) or number < 0:
        raise UserError(
            f"{what} must be a price in USD per 1M tokens, a number >= 0 (got {value!r}), "
            "e.g. --price-input 0.15 --price-output 0.60"
        )
    return number


def make_prices(price_input: float | None, price_output: float | None, origin: str) -> Prices | None:
    """Prices from both rates, None from neither; one without the other is a UserError (a
    cost that silently counts only one side would be a made-up number)."""
    if price_input is None and price_output is None:
        return None
    if price_input is None or price_output is None:
        missing = "--price-input" if price_input is None else "--price-output"
        raise UserError(f"{origin} sets only one price: pass {missing} too (USD per 1M tokens; 0 if free)")
    return Prices(price_input, price_output)


def reasoning_stats(lines: Lines) -> dict[str, Any] | None:
    """`reasoning`: how the samples that thought did: how many (`n`), their thinking tokens
    (mean, median; over those with counts), the share cut inside their thinking (no answer),
    and the accuracy of the cut and of the others (what a bigger thinking budget could win
    back). None when no sample thought."""
    samples = samples_of(lines)
    thought = [s for s in samples if s.thinking_cut is not None]
    if not thought:
        return None
    tokens = _known(thought, "thinking_tokens")
    cut = [s for s in thought if s.thinking_cut]
    whole = [s for s in thought if not s.thinking_cut]

    def accuracy(group: list[Sample]) -> float | None:
        return sum(bool(s.correct) for s in group) / len(group) if group else None

    return {
        "n": len(thought),
        "share_of_samples": len(thought) / len(samples),
        "thinking_tokens": (
            {"mean": sum(tokens) / len(tokens), "median": percentile(tokens, 50), "n": len(tokens)} if tokens else None
        ),
        "cut": len(cut),
        "cut_share": len(cut) / len(thought),
        "accuracy_cut": accuracy(cut),
        "accuracy_answered": accuracy(whole),
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between ranks (numpy's default)."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _known(samples: list[Sample], key: str) -> list[Any]:
    # The numbers a field holds, over the samples where it is one (null: unknown).
    values = [getattr(s, key) for s in samples]
    return [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def token_stats(lines: Lines) -> dict[str, Any] | None:
    """`tokens`: {prompt, completion}: {mean, total, n} per sample, over samples whose counts are
    known (n says how many); None when no sample has counts."""
    samples = samples_of(lines)
    out = {}
    for side in ("prompt", "completion"):
        values = _known(samples, f"{side}_tokens")
        if values:
            out[side] = {"mean": sum(values) / len(values), "total": sum(values), "n": len(values)}
    return out or None


def time_stats(lines: Lines) -> dict[str, Any] | None:
    """`time`: wall seconds of the run and throughput, latency percentiles where known.

    wall_s adds up each session (one `arle eval` process: its samples share
    `session_started_at`) from its start to its last written sample, so a resumed run counts
    the time each part took and not the pause between; what a killed session did after its
    last written sample was redone and is counted there."""
    samples = samples_of(lines)
    sessions: dict[float, float] = {}
    timed = [
        s for s in samples if isinstance(s.session_started_at, (int, float)) and isinstance(s.finished_at, (int, float))
    ]
    for s in timed:
        start, end = float(s.session_started_at), float(s.finished_at)  # type: ignore[arg-type]  # numbers: filtered above
        sessions[start] = max(sessions.get(start, start), end)
    out: dict[str, Any] = {}
    if timed:
        wall = sum(end - start for start, end in sessions.items())
        out.update(wall_s=wall, sessions=len(sessions), samples_per_s=len(timed) / wall if wall > 0 else None)
        completion = _known(timed, "completion_tokens")
        if len(completion) == len(timed):
            out["completion_tokens_per_s"] = sum(completion) / wall if wall > 0 else None
    latencies = _known(samples, "latency_s")
    if latencies:
        out["latency_s"] = {
            "p50": percentile(latencies, 50),
            "p95": percentile(latencies, 95),
            "mean": sum(latencies) / len(latencies),
            "n": len(latencies),
        }
    return out or None


def agent_stats(lines: Lines) -> dict[str, Any] | None:
    """`agents` (multi-turn episodes only, i.e. samples with `num_turns`): per-episode means of
    turns, tool calls and tool errors (the latter where the env counts them), end reasons,
    steps-to-success (mean turns of the correct episodes; null if none) and tokens per success
    (prompt + completion tokens of all episodes over the correct ones; null if none or unknown)."""
    samples = samples_of(lines)
    episodes = [s for s in samples if isinstance(s.num_turns, int)]
    if not episodes:
        return None
    wins = [s for s in episodes if s.correct]
    out: dict[str, Any] = {
        "episodes": len(episodes),
        "turns_per_episode": sum(s.num_turns or 0 for s in episodes) / len(episodes),
    }
    for key in ("tool_calls", "tool_errors"):
        values = _known(episodes, key)
        if values:
            out[f"{key}_per_episode"] = sum(values) / len(values)
    reasons: dict[str, int] = {}
    for s in episodes:
        reason = str(s.end_reason if s.end_reason is not None else "unknown")
        reasons[reason] = reasons.get(reason, 0) + 1
    out["end_reasons"] = dict(sorted(reasons.items()))
    out["successes"] = len(wins)
    out["steps_to_success"] = sum(s.num_turns or 0 for s in wins) / len(wins) if wins else None
    prompt, completion = _known(episodes, "prompt_tokens"), _known(episodes, "completion_tokens")
    known = len(prompt) == len(completion) == len(episodes)
    out["tokens_per_success"] = (sum(prompt) + sum(completion)) / len(wins) if wins and known else None
    return out


def cost_stats(lines: Lines, n_tasks: int, prices: Prices | None) -> dict[str, Any] | None:
    """`cost` in USD (None without prices): total, per task, per sample, and cost-of-pass, the
    expected cost of one correct sample: total cost / correct samples (= mean cost per sample /
    accuracy; with one sample per task, cost per task / accuracy). Null when no sample is
    correct, and every amount null when some sample's token counts are unknown
    (`samples_without_counts` says how many)."""
    samples = samples_of(lines)
    if prices is None:
        return None
    out: dict[str, Any] = {
        "currency": "USD",
        "price_input_per_1m": prices.input_per_1m,
        "price_output_per_1m": prices.output_per_1m,
    }
    missing = sum(1 for s in samples if not (isinstance(s.prompt_tokens, int) and isinstance(s.completion_tokens, int)))
    if missing or not samples:
        out.update(total=None, per_task=None, per_sample=None, cost_of_pass=None, samples_without_counts=missing)
        return out
    total = sum(prices.cost(s.prompt_tokens or 0, s.completion_tokens or 0) for s in samples)
    correct = sum(bool(s.correct) for s in samples)
    out.update(
        total=total,
        per_task=total / n_tasks,
        per_sample=total / len(samples),
        cost_of_pass=total / correct if correct else None,
    )
    return out


def all_agree(by_task: dict[str, list[Sample]], task_ids: list[str]) -> dict[str, Any]:
    """Shares of tasks (with 2+ samples) whose samples all agree: on the outcome (all correct
    or all wrong: `all_agree`) and on the extracted answer (`same_answer`)."""
    multi = [t for t in task_ids if len(by_task[t]) > 1]
    if not multi:
        return {"tasks": 0, "all_agree": None, "same_answer": None}
    agree = sum(len({bool(s.correct) for s in by_task[t]}) == 1 for t in multi)
    # Answers compare by their JSON form: extracted values may be lists or dicts.
    same = sum(len({repr(s.extracted) for s in by_task[t]}) == 1 for t in multi)
    return {"tasks": len(multi), "all_agree": agree / len(multi), "same_answer": same / len(multi)}
