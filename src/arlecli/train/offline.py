"""`arle train BENCH --algo sft|dpo --data FILE.jsonl`: training on recorded trajectories.

The data file holds SFT rows (sft) or preference pairs (dpo), as `arle data from-eval` writes
them (arlecli.trajectories). Every line is checked before the run directory exists: a line of
the wrong shape is a one-line error naming the file, the line and the fix. Rows recorded on
another benchmark than BENCH are trained on, with a warning: the held-out evaluations measure
BENCH, which may be the point (transfer) or a mistake.

The run is an RL run's without rollouts: the same run directory (meta.json with the data file's
path, hash and row count; metrics.jsonl; checkpoint-N/; eval/step-N/; final/; summary.json,
no rewards.jsonl), the same held-out evaluations (before, every --eval-every steps, after),
the same `--resume` (from the newest checkpoint; a data file whose content changed is refused),
and the same TRL loop (trl_glue.train_loop) around SFTTrainer (train.sft) or DPOTrainer
(train.dpo). `--limit N` trains on the first N rows of the file. This module registers the
algorithms sft and dpo (declared `data`: train.run opens the run directory without rollouts).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from arlecli import safeio
from arlecli.cards import Card
from arlecli.errors import UserError
from arlecli.train import dpo, sft
from arlecli.train.algorithm import ALGORITHMS, Algorithm, Prepared, TrainContext
from arlecli.train.config import TrainConfig
from arlecli.train.trl_glue import import_trl, load_model, train_loop

SFT_SHAPE = (
    '{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]} or {"prompt": "text", "completion": "text"}'
)
DPO_SHAPE = (
    '{"prompt": [messages], "chosen": [assistant messages], "rejected": [assistant messages]} or '
    '{"prompt": "text", "chosen": "text", "rejected": "text"}'
)


def _messages_problem(value: Any, name: str) -> str | None:
    if not isinstance(value, list) or not value:
        return f"`{name}` must be a non-empty list of chat messages"
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return f'`{name}` holds {json.dumps(m)[:60]}, not a chat message ({{"role": ..., "content": ...}})'
        if "content" not in m and "tool_calls" not in m:
            return f"a {m['role']} message in `{name}` has no content"
    return None


def sft_row_problem(row: dict[str, Any]) -> str | None:
    """Why `row` is not an SFT row (None if it is one): chat `messages`, or TRL's prompt/completion
    (plain text, or conversational: the prompt's messages and the assistant's)."""
    if "messages" not in row and "completion" in row:
        prompt, completion = row.get("prompt"), row["completion"]
        if isinstance(prompt, str) or isinstance(completion, str):
            if not isinstance(prompt, str) or not isinstance(completion, str):
                return "`prompt` and `completion` must both be text (or both lists of chat messages)"
            return None if completion else "`completion` is empty: nothing to train on"
        problem = _messages_problem(prompt, "prompt") or _messages_problem(completion, "completion")
        if problem:
            return problem
        assert isinstance(prompt, list) and isinstance(completion, list)  # _messages_problem checked both
        return sft_row_problem({"messages": [*prompt, *completion]})
    if "messages" not in row:
        if "chosen" in row:
            return "a DPO pair (prompt/chosen/rejected), not an SFT row: train on it with --algo dpo"
        return f"no `messages`: an SFT row is {SFT_SHAPE} (what `arle data from-eval` writes)"
    problem = _messages_problem(row["messages"], "messages")
    if problem:
        return problem
    messages = row["messages"]
    if messages[-1]["role"] != "assistant":
        return (
            f"the last message is a {messages[-1]['role']} message: an SFT row ends with the assistant's "
            f"reply (drop the messages after it)"
        )
    if messages[0]["role"] == "assistant":
        return "the first message is the assistant's: the prompt (a user message) must come before it"
    return None


def dpo_row_problem(row: dict[str, Any]) -> str | None:
    """Why `row` is not a preference pair (None if it is one)."""
    if "messages" in row and "chosen" not in row:
        return (
            "an SFT row, not a DPO pair: train on it with --algo sft, or write pairs with `arle data from-eval --pairs`"
        )
    for key in ("prompt", "chosen", "rejected"):
        if key not in row:
            return f"no `{key}`: a DPO pair is {DPO_SHAPE} (what `arle data from-eval --pairs` writes)"
    texts = [isinstance(row[key], str) for key in ("prompt", "chosen", "rejected")]
    if any(texts):
        if not all(texts):
            return "`prompt`, `chosen` and `rejected` must all be text (or all lists of chat messages)"
        return None if row["chosen"] and row["rejected"] else "`chosen` or `rejected` is empty"
    for key in ("prompt", "chosen", "rejected"):
        problem = _messages_problem(row[key], key)
        if problem:
            return problem
    if row["prompt"][-1]["role"] == "assistant":
        return "`prompt` ends with an assistant message: it holds the messages before the first assistant turn"
    for key in ("chosen", "rejected"):
        if row[key][0]["role"] != "assistant" or row[key][-1]["role"] != "assistant":
            return f"`{key}` must start and end with an assistant message (the model's turns)"
    return None


def read_rows(path: str | Path, algo: str) -> list[dict[str, Any]]:
    """Every row of a --data file, each checked for `algo`'s shape (UserError naming file:line)."""
    path = Path(path).expanduser()
    hint = "arle data from-eval RUN" + (" --pairs" if algo == "dpo" else "")
    if not path.is_file():
        raise UserError(f"--data {path}: no such file; write one with `{hint} -o {path}`")
    check = dpo_row_problem if algo == "dpo" else sft_row_problem
    rows: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = safeio.loads(line, clean=True)  # rows go to a tokenizer: no lone surrogates
                except ValueError as exc:  # broken, or nested deeper than safeio.MAX_DEPTH
                    why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                    raise UserError(
                        f"{path}:{n}: not valid JSON ({why}); a --data file holds one JSON "
                        f"object per line: fix or delete that line"
                    ) from None
                problem = "not a JSON object" if not isinstance(row, dict) else check(row)
                if problem is None and row.get("tools") is not None and not isinstance(row["tools"], list):
                    problem = "`tools` must be a list of JSON schemas (or absent)"
                if problem:
                    raise UserError(f"{path}:{n}: {problem}")
                rows.append(row)
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; --data takes a JSONL file (`{hint} -o FILE.jsonl`)") from None
    except OSError as exc:
        raise UserError(f"cannot read --data {path}: {exc.strerror or exc}") from None
    if not rows:
        raise UserError(f"{path} holds no rows; write some with `{hint} -o {path}`")
    return rows


def training_rows(cfg: TrainConfig) -> list[dict[str, Any]]:
    """The rows an sft/dpo run trains on (the first --limit of --data), checked; the algorithm's
    check reads them before anything starts, so a bad file is the only thing printed."""
    opts = cfg.options
    if opts.split:
        raise UserError(
            f"--split picks the benchmark rows RL samples from; --algo {opts.algo} trains on --data "
            f"(its held-out split is --eval-split): drop --split"
        )
    if opts.opponent:
        raise UserError(
            f"--opponent picks who plays a game's other seat in RL rollouts; --algo {opts.algo} "
            "trains on --data and plays no games (held-out games play the card's opponent): "
            "drop --opponent"
        )
    return read_rows(opts.data or "", opts.algo)[: opts.limit]


def other_benchmarks(rows: list[dict[str, Any]], bench: str) -> Counter:
    """How many rows name a `benchmark` other than `bench` (by name)."""
    return Counter(r["benchmark"] for r in rows if isinstance(r.get("benchmark"), str) and r["benchmark"] != bench)


def validate_offline(cfg: TrainConfig) -> None:
    """sft and dpo train on a --data file: refuse a run without one."""
    opts = cfg.options
    if not opts.data:
        kind = (
            "preference pairs (`arle data from-eval RUN --pairs -o pairs.jsonl`)"
            if opts.algo == "dpo"
            else "trajectories (`arle data from-eval RUN -o rows.jsonl`)"
        )
        raise UserError(f"--algo {opts.algo} trains on recorded {kind}: pass --data FILE.jsonl")


def check_offline(cfg: TrainConfig, card: Card, run_dir: Path) -> Prepared:
    """The --data rows (every line checked: a bad file is the only thing printed) and the
    SFTConfig / DPOConfig, before the run directory exists."""
    rows = training_rows(cfg)
    return Prepared(sft.trainer_args(cfg, run_dir), rows)


def run_offline(ctx: TrainContext, build: Callable[..., Any]) -> tuple[dict[str, dict[str, Any]], int]:
    """Train `ctx.spec`'s model on the checked --data rows (ctx.prepared) with the trainer
    `build(cfg, args, model, tokenizer, rows, callbacks, template_kwargs)` makes; returns
    (every evaluation's results by label, the last step)."""
    card, cfg, spec, prepared = ctx.card, ctx.cfg, ctx.spec, ctx.prepared
    others = other_benchmarks(prepared.rows, card.name)
    if others:
        names = ", ".join(f"{name} ({n} rows)" for name, n in others.most_common(3))
        ctx.view.message(
            f"warning: {cfg.options.data} holds trajectories of {names}, not {card.name}; held-out "
            f"evaluations measure {card.name}"
        )
    tokenizer = sft.load_tokenizer(spec.path_or_id or "")
    model = load_model(spec.path_or_id or "", spec.is_adapter)
    return train_loop(
        ctx,
        lambda callbacks: build(
            cfg, prepared.trainer_args, model, tokenizer, prepared.rows, callbacks, spec.chat_template_kwargs
        ),
    )


def run_sft(ctx: TrainContext) -> tuple[dict[str, dict[str, Any]], int]:
    """SFT on recorded trajectories (train.sft)."""
    return run_offline(ctx, sft.build_sft_trainer)


def run_dpo(ctx: TrainContext) -> tuple[dict[str, dict[str, Any]], int]:
    """DPO on preference pairs (train.dpo)."""
    return run_offline(ctx, dpo.build_dpo_trainer)


def _config(name: str) -> Sequence[type]:
    return (getattr(import_trl(False), name),)


# On --data rows, in one process or many.
_OFFLINE: dict[str, Any] = dict(
    data=True, distributed=True, validate=validate_offline, check=check_offline, read_data=training_rows
)
ALGORITHMS.add("sft", Algorithm("sft", run_sft, lambda: _config("SFTConfig"), **_OFFLINE), source=run_sft)
ALGORITHMS.add("dpo", Algorithm("dpo", run_dpo, lambda: _config("DPOConfig"), **_OFFLINE), source=run_dpo)
