"""`arle eval BENCH`: score a model on a benchmark and write a run directory."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from arlecli.cli import options
from arlecli.cli.output import console, err_console, print_json
from arlecli.errors import UserError


class _Progress:
    """A Rich progress bar on a terminal; a plain line every 10% in logs and CI."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = err_console().is_terminal
        self.bar = None
        self.done = 0
        self.total = 0
        self.correct = 0  # among samples finished in this process (accuracy shown live)
        self.new = 0
        self.next_report = 0

    def start(self, total: int, done: int) -> None:
        self.total, self.done = total, done
        if done:
            err_console().print(f"resuming: {done}/{total} samples already done", highlight=False)
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("acc {task.fields[acc]}"), TimeRemainingColumn(), console=err_console())
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total, completed=done, acc="-")
        self.next_report = done + max(1, total // 10)

    def sample(self, sample: dict[str, Any]) -> None:
        self.done += 1
        self.new += 1
        self.correct += bool(sample["correct"])
        if self.bar is not None:
            self.bar.update(self.task, advance=1, acc=f"{self.correct / self.new:.3f}")
        elif self.done >= self.next_report or self.done == self.total:
            err_console().print(f"{self.label}: {self.done}/{self.total} samples", highlight=False)
            self.next_report = self.done + max(1, self.total // 10)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def eval_command(
    bench: str = typer.Argument(..., help="Benchmark name (see `arle bench list`) or a card file."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Profile name, local folder or hub id. "
                                        "Default: the default profile, else the embedded SmolLM2-135M-Instruct."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint, e.g. "
                                           "http://127.0.0.1:8000/v1 (then --model is the served model name)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="hf, vllm or openai. Default: openai for an "
                                          "endpoint; vllm on a CUDA machine with vLLM installed; hf otherwise "
                                          "(on CPU, vLLM's ~20 s start-up only pays off when asked for)."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Env var holding the endpoint's API key."),
    request_timeout: Optional[str] = options.REQUEST_TIMEOUT,
    max_retries: Optional[str] = options.MAX_RETRIES,
    split: Optional[str] = typer.Option(None, "--split", help="Split to evaluate (default: the card's)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Evaluate only the first N tasks."),
    num_samples: int = typer.Option(1, "--num-samples", "-n", min=1, help="Samples per task (pass@k)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", min=0.0,
                                                help="0 = greedy. Default: 0, or 0.8 when -n > 1."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="Default: the card's."),
    num_fewshot: Optional[int] = typer.Option(None, "--num-fewshot", min=0, help="Default: the card's."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="hf backend batch size."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, help="Concurrent requests (openai backend)."),
    tensor_parallel_size: int = options.TENSOR_PARALLEL,
    data_parallel_size: int = options.DATA_PARALLEL,
    gpu_memory_utilization: float = options.GPU_MEMORY,
    max_model_len: Optional[int] = options.MAX_MODEL_LEN,
    quantization: Optional[str] = options.QUANTIZATION,
    kv_cache_dtype: Optional[str] = options.KV_CACHE_DTYPE,
    seed: int = typer.Option(1234, "--seed"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Run directory "
                                          "(default: runs/BENCH-MODEL-TIMESTAMP)."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run (the latest matching one "
                                "when --output is not given)."),
    data: Optional[Path] = typer.Option(None, "--data", help="Local rows in the dataset's own schema "
                                        "(jsonl, json, parquet, csv) instead of the card's source."),
    as_json: bool = typer.Option(False, "--json", help="Print results.json to stdout."),
    sandbox: str = typer.Option("auto", "--sandbox", help="Where the code sandbox cannot isolate "
                                "model-written code (no user namespaces, root without a pids cgroup): "
                                "auto warns and runs it with rlimits only, require refuses."),
) -> None:
    """Score a model on a benchmark; writes meta.json, samples.jsonl and results.json."""
    from arlecli.sandbox import set_policy

    set_policy(sandbox)
    from arlecli.engine import make_engine
    from arlecli.engine.base import EngineRequestError
    from arlecli.engine.vllm import VLLMOptions
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.models import resolve_model
    from arlecli.registry import load_card
    from arlecli.cards import resolve_references
    from arlecli import rundir

    card = load_card(bench)
    resolve_references(card)
    if temperature is None:
        temperature = 0.8 if num_samples > 1 else 0.0
    opts = EvalOptions(split=split, limit=limit, num_samples=num_samples, temperature=temperature, top_p=top_p,
                       max_tokens=max_tokens, num_fewshot=num_fewshot, seed=seed,
                       data=str(data) if data else None)
    spec = resolve_model(model, base_url=base_url, backend=backend, api_key_env=api_key_env,
                         request_timeout=request_timeout, max_retries=max_retries)
    run_dir = rundir.choose_dir(output, card.name, spec.name, resume)
    vllm_options = VLLMOptions(tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
                               gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                               quantization=quantization, kv_cache_dtype=kv_cache_dtype)
    engine = make_engine(spec, batch_size=batch_size, concurrency=concurrency, vllm_options=vllm_options)
    progress = _Progress(f"{card.name}")
    try:
        results = run_eval(card, engine, opts, model=spec.name, run_dir=run_dir, resume=resume,
                           command=["arle", *sys.argv[1:]], on_start=progress.start, on_sample=progress.sample)
    except EngineRequestError as exc:
        # samples.jsonl is appended as samples finish: nothing done so far is lost.
        raise UserError(f"{exc}; the samples finished so far are kept in {run_dir}: "
                        "rerun with --resume to continue") from None
    finally:
        progress.stop()
        engine.close()
    if as_json:
        print_json(results)
    else:
        print_results(results, run_dir)


def print_results(results: dict[str, Any], run_dir: Path) -> None:
    """The summary table: each metric with its stderr, then per-group rows if any."""
    from rich.table import Table

    out = console()
    out.print(f"{results['benchmark']} · {results['model']} · {results['n_tasks']} tasks · "
              f"{results['n_samples']} samples", highlight=False)
    table = Table()
    table.add_column("group")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("± stderr", justify="right")
    rows = [("all", results["metrics"])] + list(results.get("groups", {}).items())
    for group, metrics in rows:
        for name, stat in metrics.items():
            table.add_row(group, name, f"{stat['value']:.4f}", f"{stat['stderr']:.4f}")
    out.print(table)
    out.print(f"run directory: {run_dir}", highlight=False)
