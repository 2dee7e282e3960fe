"""`arle eval BENCH`: score a model on a benchmark and write a run directory."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from arlecli.cli import options
from arlecli.cli.output import (
    Column,
    ProgressView,
    console,
    err_console,
    print_json,
    print_lines,
    print_table,
    stat_text,
)
from arlecli.cli.report import report_hint
from arlecli.errors import UserError


def eval_command(
    bench: str = typer.Argument(..., help="Benchmark name (see `arle bench list`) or a card file."),
    model: Optional[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="Profile name, local folder or hub id. "
        "Default: the default profile, else the embedded SmolLM2-135M-Instruct.",
    ),
    base_url: Optional[str] = typer.Option(
        None,
        "--base-url",
        help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (then --model is the served model name).",
    ),
    backend: Optional[str] = typer.Option(
        None,
        "--backend",
        help="hf, vllm or openai. Default: openai for an "
        "endpoint; vllm on a CUDA machine with vLLM installed; hf otherwise "
        "(on CPU, vLLM's ~20 s start-up only pays off when asked for).",
    ),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Env var holding the endpoint's API key."),
    request_timeout: Optional[str] = options.REQUEST_TIMEOUT,
    max_retries: Optional[str] = options.MAX_RETRIES,
    price_input: Optional[str] = options.PRICE_INPUT,
    price_output: Optional[str] = options.PRICE_OUTPUT,
    split: Optional[str] = typer.Option(None, "--split", help="Split to evaluate (default: the card's)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Evaluate only the first N tasks."),
    num_samples: int = typer.Option(1, "--num-samples", "-n", min=1, help="Samples per task (pass@k)."),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", min=0.0, help="0 = greedy. Default: 0, or 0.8 when -n > 1."
    ),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="Default: the card's."),
    max_thinking_tokens: Optional[int] = options.MAX_THINKING_TOKENS,
    think_tags: Optional[str] = options.THINK_TAGS,
    chat_template_kwargs: Optional[list[str]] = options.CHAT_TEMPLATE_KWARGS,
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", min=0, help="Default: the card's."),
    scoring: Optional[str] = typer.Option(
        None,
        "--scoring",
        help="generate (the model answers; the reward "
        "scores it) or loglikelihood (multiple-choice cards: each option's "
        "loglikelihood, acc/acc_norm as lm-eval). Default: the card's.",
    ),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="hf backend batch size."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Concurrent requests (openai backend)."),
    tensor_parallel_size: int = options.TENSOR_PARALLEL,
    data_parallel_size: int = options.DATA_PARALLEL,
    gpu_memory_utilization: float = options.GPU_MEMORY,
    max_model_len: Optional[int] = options.MAX_MODEL_LEN,
    quantization: Optional[str] = options.QUANTIZATION,
    kv_cache_dtype: Optional[str] = options.KV_CACHE_DTYPE,
    dtype: Optional[str] = options.DTYPE,
    seed: int = typer.Option(1234, "--seed"),
    opponent: Optional[str] = typer.Option(
        None,
        "--opponent",
        help="Two-player game cards: who plays the other "
        "seat: random or scripted (built-in players), self (the model "
        "itself), or a profile name, folder or hub id (any model arle can "
        "run, with its own default engine). Default: the card's.",
    ),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Run directory (default: a new folder in runs/ named BENCH-MODEL-TIMESTAMP)."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue an interrupted run (the latest matching one when --output is not given)."
    ),
    rows: Optional[Path] = typer.Option(
        None,
        "--rows",
        help="The benchmark's rows from a local file in the "
        "dataset's own schema (jsonl, json, parquet, csv) instead of the card's "
        "source; `arle train --rows` trains on them.",
    ),
    data: Optional[Path] = typer.Option(None, "--data", hidden=True, help="The old name of --rows."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
    sandbox: str = typer.Option(
        "auto",
        "--sandbox",
        help="Where the code sandbox cannot isolate "
        "model-written code (no user namespaces, root without a pids cgroup): "
        "auto warns and runs it with rlimits only, require refuses.",
    ),
) -> None:
    """Score a model on a benchmark; writes meta.json, samples.jsonl and results.json."""
    from arlecli.sandbox import set_policy

    set_policy(sandbox)
    from arlecli.eval import EvalOptions
    from arlecli.models import resolve_model
    from arlecli.cards import SCORINGS
    from arlecli.catalog import load_card, resolve_references
    from arlecli.efficiency import check_price, make_prices
    from arlecli.config import parse_template_kwargs

    if data is not None:  # the old spelling: `arle train --data` is SFT/DPO rows, so one word for both
        if rows is not None:
            raise UserError("--data is the old name of --rows: pass one of them")
        if err_console().is_terminal:  # for the person typing it; scripts and logs keep their output as it was
            err_console().print(
                "note: `arle eval --data` is now `--rows` (the benchmark's rows, as in `arle train "
                "--rows`); --data still works",
                highlight=False,
                soft_wrap=True,
            )
        rows = data
    card = load_card(bench)
    resolve_references(card)
    if scoring is not None and scoring not in SCORINGS:
        raise UserError(f"--scoring {scoring!r}: choose one of {', '.join(SCORINGS)}")
    if (scoring or card.default_scoring) == "loglikelihood":
        from arlecli.loglik import spec_of

        spec_of(card)  # a card without a loglikelihood block is refused before any model loads
    if temperature is None:
        temperature = 0.8 if num_samples > 1 else 0.0
    opts = EvalOptions(
        split=split,
        limit=limit,
        num_samples=num_samples,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        num_fewshot=num_fewshot,
        seed=seed,
        data=str(rows) if rows else None,
        opponent=opponent,
        max_thinking_tokens=max_thinking_tokens,
    )
    opponent_spec = None
    if opponent is not None:
        from arlecli.envs.textarena import OPPONENT_NAMES, with_opponent

        card = with_opponent(card, opponent)  # a card that is no two-player game is refused here
        if opponent not in OPPONENT_NAMES:
            opponent_spec = resolve_model(opponent)  # an unknown model is refused before any loads
    # A bad price is refused before the model is resolved or loaded.
    cli_prices = (check_price(price_input, "--price-input"), check_price(price_output, "--price-output"))
    spec = resolve_model(
        model,
        base_url=base_url,
        backend=backend,
        api_key_env=api_key_env,
        request_timeout=request_timeout,
        max_retries=max_retries,
        think_tags=think_tags,
        chat_template_kwargs=parse_template_kwargs(chat_template_kwargs),
        dtype=dtype,
    )
    # Each price given on the command line overrides the profile's.
    prices = make_prices(
        cli_prices[0] if cli_prices[0] is not None else spec.price_input,
        cli_prices[1] if cli_prices[1] is not None else spec.price_output,
        "arle eval" if spec.profile is None else f"arle eval with profile {spec.profile!r}",
    )
    from arlecli.envs import env_kind
    from arlecli.progress import Meter

    # Shown from here on: loading weights takes seconds to minutes, a sample can too.
    meter = Meter(phase=f"loading {spec.name}" if spec.kind == "hf" else "starting")
    view = ProgressView(card.name, meter, turns=env_kind(card.env).multi_turn)
    try:
        results, run_dir = _run(
            card,
            spec,
            opts,
            meter,
            view,
            output=output,
            resume=resume,
            scoring=scoring,
            prices=prices,
            opponent_spec=opponent_spec,
            batch_size=batch_size,
            concurrency=concurrency,
            max_thinking_tokens=max_thinking_tokens,
            vllm=dict(
                tensor_parallel_size=tensor_parallel_size,
                data_parallel_size=data_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                quantization=quantization,
                kv_cache_dtype=kv_cache_dtype,
            ),
        )
    finally:
        view.stop()
    if as_json:
        print_json(results)
    else:
        print_results(results, run_dir)
    # What to do next with the run; on stderr under --json, so stdout stays one JSON document.
    (err_console() if as_json else console()).print(report_hint(run_dir), highlight=False, soft_wrap=True)


def _run(
    card: Any,
    spec: Any,
    opts: Any,
    meter: Any,
    view: ProgressView,
    *,
    output: Optional[Path],
    resume: bool,
    scoring: Optional[str],
    prices: Any,
    opponent_spec: Any,
    batch_size: int,
    concurrency: int,
    max_thinking_tokens: Optional[int],
    vllm: dict[str, Any],
) -> tuple[dict[str, Any], Path]:
    """Load the engine(s) and run the eval with `view` showing `meter`; returns results.json's
    content and the run directory."""
    from arlecli import rundir
    from arlecli.engine import make_engine
    from arlecli.engine.base import EngineRequestError
    from arlecli.engine.vllm import VLLMOptions
    from arlecli.envs.textarena import model_opponent
    from arlecli.eval import legacy_ids, load_tasks, run_eval
    from arlecli.progress import metered
    from arlecli.thinking import check_budget, check_budget_before_load, thinks

    run_dir = rundir.choose_dir(output, card.name, spec.name, resume)
    vllm_options = VLLMOptions(**vllm)
    rundir.check_fresh(run_dir, resume)  # a resume of a folder that never ran is refused before any model loads
    check_budget_before_load(spec, max_thinking_tokens)  # before the tasks too: argument errors first
    prepared = None
    if (scoring or card.default_scoring) != "loglikelihood":  # its own tasks (loglik.tasks_for)
        # Loaded before the engine: a bad row (in --data too) is one line before any model loads.
        prepared = load_tasks(card, opts, generator_ids=legacy_ids(card, run_dir, resume))
    if spec.kind == "hf":
        _check_template_kwargs_first(spec)  # before any progress line: a misspelt key stays one error line
        view.start()  # loading weights takes a while; an endpoint's progress starts with its first request
    engine = make_engine(spec, batch_size=batch_size, concurrency=concurrency, vllm_options=vllm_options)
    try:
        check_budget(max_thinking_tokens, thinks(engine), spec.name)
    except UserError:
        engine.close()
        raise
    opponent_engine = None
    lent: Any = contextlib.nullcontext()
    if opponent_spec is not None:
        try:  # a model plays the other seat: its own engine, lent to the games, closed with the eval's
            opponent_engine = make_engine(opponent_spec, batch_size=batch_size, concurrency=concurrency)
        except BaseException:
            engine.close()
            raise
        lent = model_opponent(card.env_params["opponent"], opponent_engine)

    def start(total: int, done: int) -> None:
        meter.start(total, done)
        if not view.started:
            view.start()
        if done:
            view.resumed(done, total)

    try:
        # An endpoint given by --base-url alone is named by the model it serves, not its URL.
        served = getattr(engine, "served_model", None)
        model_name = served() if served is not None and spec.kind == "openai" and not spec.model else spec.name
        with lent:
            results = run_eval(
                card,
                metered(engine, meter),
                opts,
                model=model_name,
                run_dir=run_dir,
                resume=resume,
                command=["arle", *sys.argv[1:]],
                on_start=start,
                on_sample=lambda sample: meter.sample(sample["correct"]),
                prices=prices,
                scoring=scoring,
                prepared=prepared,
            )
    except EngineRequestError as exc:
        # samples.jsonl is appended as samples finish: nothing done so far is lost.
        from arlecli.records import RunDir

        samples = RunDir(run_dir).samples
        if samples.is_file() and samples.stat().st_size > 0:
            raise UserError(
                f"{exc}; the samples finished so far are kept in {run_dir}: rerun with --resume to continue"
            ) from None
        if RunDir(run_dir).meta.exists():
            raise UserError(
                f"{exc}; no sample finished before it (the run is {run_dir}): rerun with --resume once that is fixed"
            ) from None
        raise UserError(f"{exc}; nothing was started: rerun once that is fixed") from None
    finally:
        engine.close()
        if opponent_engine is not None:
            opponent_engine.close()
    return results, run_dir


def _check_template_kwargs_first(spec: Any) -> None:
    """Refuse --chat-template-kwargs the chat template of a local model folder never reads, from
    its files alone (the engine checks again once loaded, and for hub ids and adapters)."""
    import json
    from types import SimpleNamespace

    from arlecli.engine.tokens import check_template_kwargs

    folder = Path(spec.path_or_id or "")
    if not spec.chat_template_kwargs or not folder.is_dir():
        return
    template: Any = None
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8", errors="replace")
    elif (folder / "tokenizer_config.json").is_file():
        try:
            template = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
        except (ValueError, AttributeError):
            return
    if isinstance(template, (str, dict)) and template:
        check_template_kwargs(SimpleNamespace(chat_template=template), spec.chat_template_kwargs)


def print_results(results: dict[str, Any], run_dir: Path) -> None:
    """The summary: a header line, each metric with its stderr (then per-group rows if any),
    the efficiency lines, all wrapped to the terminal by whole fields."""
    out = console()
    print_lines(
        out,
        [
            str(results["benchmark"]),
            str(results["model"]),
            f"{results['n_tasks']} tasks",
            f"{results['n_samples']} samples",
        ],
    )
    columns = [
        Column("group"),
        Column("metric"),
        Column("value", justify="right"),
        Column("± stderr", "±", justify="right"),
    ]
    rows = [
        [str(group), str(name), stat_text(stat["value"]), stat_text(stat["stderr"])]
        for group, metrics in [("all", results["metrics"]), *results.get("groups", {}).items()]
        for name, stat in metrics.items()
    ]
    print_table(out, columns, rows)
    for label, parts in efficiency_parts(results):
        print_lines(out, [f"{label}: {parts[0]}", *parts[1:]])
    print_lines(out, [f"run directory: {run_dir}"])


def _num(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def _usd(x: float | None) -> str:
    # Small runs cost fractions of a cent: show enough digits to tell runs apart.
    return "n/a" if x is None else f"${x:.4f}" if x >= 0.01 else f"${x:.6f}"


def efficiency_parts(results: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """results.json's tokens/time/agents/consistency/cost blocks as a few compact lines, each
    (label, its fields) so a line wraps between whole fields (the blocks a run lacks are skipped)."""
    lines: list[tuple[str, list[str]]] = []
    tokens = results.get("tokens") or {}
    if tokens:
        parts = [f"{side} {_num(t['mean'])}/sample ({t['total']:,} total)" for side, t in tokens.items()]
        lines.append(("tokens", parts))
    t = results.get("time") or {}
    if t:
        parts = []
        if "wall_s" in t:
            parts.append(f"{_num(t['wall_s'])} s" + (f" in {t['sessions']} sessions" if t["sessions"] > 1 else ""))
            parts.append(f"{_num(t.get('samples_per_s'), 2)} samples/s")
        if t.get("completion_tokens_per_s") is not None:
            parts.append(f"{_num(t['completion_tokens_per_s'])} completion tokens/s")
        if "latency_s" in t:
            parts.append(f"latency p50 {_num(t['latency_s']['p50'], 2)} s, p95 {_num(t['latency_s']['p95'], 2)} s")
        lines.append(("time", parts))
    a = results.get("agents")
    if a:
        parts = [f"{_num(a['turns_per_episode'], 2)} turns/episode"]
        if "tool_calls_per_episode" in a:
            parts.append(
                f"{_num(a['tool_calls_per_episode'], 2)} tool calls"
                + (f" ({_num(a['tool_errors_per_episode'], 2)} errors)" if "tool_errors_per_episode" in a else "")
            )
        parts.append(f"steps-to-success {_num(a['steps_to_success'], 2)}")
        parts.append(f"{_num(a['tokens_per_success'], 0)} tokens/success")
        parts.append("ended: " + ", ".join(f"{r} {n}" for r, n in a["end_reasons"].items()))
        lines.append(("agents", parts))
    c = results.get("consistency")
    if c and c.get("all_agree") is not None:
        lines.append(
            (
                "consistency",
                [
                    f"all {c['samples_per_task']} samples agree on the outcome in {c['all_agree']:.1%} of tasks",
                    f"on the answer in {c['same_answer']:.1%}",
                ],
            )
        )
    cost = results.get("cost")
    if cost:
        lines.append(
            (
                "cost",
                [
                    f"{_usd(cost['total'])} total",
                    f"{_usd(cost['per_task'])}/task",
                    f"cost-of-pass {_usd(cost['cost_of_pass'])}"
                    + (
                        f" (token counts unknown for {cost['samples_without_counts']} samples)"
                        if cost.get("samples_without_counts")
                        else ""
                    ),
                ],
            )
        )
    return lines
