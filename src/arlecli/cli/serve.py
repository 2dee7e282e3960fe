"""`arle serve`: an OpenAI-compatible server for a model, optionally recording every request."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Optional

import typer

from arlecli.cli import options
from arlecli.errors import UserError

SERVE_BACKENDS = ("hf", "vllm")
# Batch size when --max-concurrency is not given: what a CPU handles vs what vLLM schedules.
DEFAULT_CONCURRENCY = {"hf": 16, "vllm": 256}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def serve_command(
    model: Optional[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="Profile name, local folder (a trained "
        "checkpoint or a LoRA adapter folder, served as-is) or hub id. "
        "Default: the default profile, else the embedded SmolLM2-135M-Instruct.",
    ),
    backend: Optional[str] = typer.Option(
        None, "--backend", help="hf or vllm (default: the same choice as `arle eval`, hf on CPU)."
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on (0.0.0.0: all)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    api_key_env: Optional[str] = typer.Option(
        None,
        "--api-key-env",
        help="Name of an env var holding the key clients must send as `Authorization: Bearer KEY`.",
    ),
    max_concurrency: Optional[int] = typer.Option(
        None,
        "--max-concurrency",
        min=1,
        help="Most requests generated at once, as one batch (default: 16 on hf, 256 on vllm).",
    ),
    served_model_name: Optional[str] = typer.Option(
        None,
        "--served-model-name",
        help="The model name clients send and /v1/models lists (default: the model's name).",
    ),
    think_tags: Optional[str] = options.THINK_TAGS,
    chat_template_kwargs: Optional[list[str]] = options.CHAT_TEMPLATE_KWARGS,
    dtype: Optional[str] = options.DTYPE,
    tool_call_parser: Optional[str] = typer.Option(
        None,
        "--tool-call-parser",
        help="How replies to requests with "
        "`tools` are parsed for calls: hermes (<tool_call> blocks: "
        "Qwen, SmolLM3), llama3_json or mistral (default: the one the "
        "model's chat template calls for, else hermes).",
    ),
    record: Optional[Path] = typer.Option(
        None,
        "--record",
        help="Record every request (messages, params, token "
        "ids, logprobs, text) to DIR/SESSION.jsonl. A client opens a session "
        "with POST /sessions, which answers its id and base URL (/s/ID/v1; or "
        "send the X-Arle-Session header); ids the server did not open are "
        "refused. Requests naming no session go to DIR/default.jsonl.",
    ),
    record_memory_mb: float = typer.Option(
        1024.0,
        "--record-memory-mb",
        min=1.0,
        help="Most memory (MB) all "
        "recorded sessions together may hold in replies kept to continue them "
        "with the exact token ids; past it the least recently used session's "
        "oldest replies are dropped (a later call continuing one is encoded "
        "afresh).",
    ),
    max_choices: int = typer.Option(
        256,
        "--max-choices",
        min=1,
        help="Most generations one request may ask for (prompts x n); more is answered 400.",
    ),
    max_connections: Optional[int] = typer.Option(
        None,
        "--max-connections",
        min=1,
        help="Most open connections; "
        "at the cap the longest-idle one is closed for a new one "
        "(default: what the open-file limit allows, at most 4096).",
    ),
    max_body_mb: float = typer.Option(
        32.0, "--max-body-mb", min=0.001, help="Largest request body in MB; larger is answered 413."
    ),
    header_timeout: float = typer.Option(
        10.0,
        "--header-timeout",
        min=0.1,
        help="Seconds a connection may take to send a request's headers before it is closed.",
    ),
    access_log: bool = typer.Option(
        True,
        "--access-log/--no-access-log",
        help="One line per request on stderr (client, method, path, status, seconds, tokens).",
    ),
    tensor_parallel_size: int = options.TENSOR_PARALLEL,
    data_parallel_size: int = options.DATA_PARALLEL,
    gpu_memory_utilization: float = options.GPU_MEMORY,
    max_model_len: Optional[int] = options.MAX_MODEL_LEN,
    quantization: Optional[str] = options.QUANTIZATION,
    kv_cache_dtype: Optional[str] = options.KV_CACHE_DTYPE,
) -> None:
    """Serve a model with an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models)."""
    from arlecli.cli.output import terminal_text
    from arlecli.engine import make_engine
    from arlecli.engine.vllm import VLLMOptions
    from arlecli.models import resolve_model
    from arlecli.serve import server
    from arlecli.serve.app import create_app
    from arlecli.serve.limits import ServeLimits

    if backend is not None and backend not in SERVE_BACKENDS:
        raise UserError(f"arle serve runs the hf or vllm backend, not {backend!r}: pass --backend hf or --backend vllm")
    api_key = _api_key(api_key_env)
    from arlecli.serve.tools import check_parser

    check_parser(tool_call_parser)  # before loading the model
    if record is not None:
        try:
            record.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"--record {record}: cannot create the folder ({exc.strerror or exc})") from None
    from arlecli.config import parse_template_kwargs

    # --api-key-env here is our key, not an endpoint's.
    spec = resolve_model(
        model,
        backend=backend,
        think_tags=think_tags,
        chat_template_kwargs=parse_template_kwargs(chat_template_kwargs),
        dtype=dtype,
    )
    sock = server.bind(host, port)  # before loading the model: a busy port fails at once
    vllm_options = VLLMOptions(
        tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=data_parallel_size,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
    )
    engine = make_engine(
        spec,
        batch_size=max_concurrency or DEFAULT_CONCURRENCY["hf"],
        concurrency=max_concurrency or DEFAULT_CONCURRENCY["hf"],
        vllm_options=vllm_options,
    )
    # After make_engine: the factory may pick the backend itself (vllm on a CUDA machine).
    concurrency = max_concurrency or DEFAULT_CONCURRENCY.get(engine.name, DEFAULT_CONCURRENCY["hf"])
    name = served_model_name or spec.name
    limits = ServeLimits(
        max_choices=max_choices,
        max_connections=max_connections,
        max_body_bytes=int(max_body_mb * 2**20),
        header_timeout_s=header_timeout,
        record_memory_bytes=int(record_memory_mb * 2**20),
    )
    app = create_app(
        engine,
        model_name=name,
        api_key=api_key,
        record_dir=record,
        max_concurrency=concurrency,
        limits=limits,
        max_model_len=max_model_len,
        tool_call_parser=tool_call_parser,
        access_log=access_log,
    )

    def ready() -> None:
        typer.echo(terminal_text(f"serving {name} on {server.url(sock)}"))
        if record is not None:
            root = server.url(sock).removesuffix("/v1")
            typer.echo(terminal_text(f"recording to {record}: open a session with POST {root}/sessions"))
        sys.stdout.flush()

    batcher = app.state.batcher
    server.run(app, sock, on_ready=ready, on_stop=lambda: batcher.close(timeout=0))
    if not batcher.close(timeout=1.0):
        # A generate call is still running in the batcher thread (its clients were answered
        # 503 already) and cannot be interrupted mid-batch. Leave at once: a normal exit would
        # tear down torch under that thread and abort the process. Records are already flushed.
        typer.echo("server stopped (a running batch was abandoned)", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    engine.close()
    typer.echo("server stopped", err=True)


def _api_key(api_key_env: str | None) -> str | None:
    """The key clients must send, read from the env var named `api_key_env`.

    A value that cannot be a variable name, or an unset one shaped like a secret, is most
    likely the key itself pasted in: refused without repeating it (it would land in the
    terminal's scrollback and in logs)."""
    if api_key_env is None:
        return None
    key = os.environ.get(api_key_env, "").strip()
    if not key and _looks_like_a_key(api_key_env):
        raise UserError(
            "--api-key-env takes the NAME of an environment variable, and the value given looks like "
            "a key itself (not repeated here): run `export ARLE_SERVE_KEY=<the key>` and pass "
            "--api-key-env ARLE_SERVE_KEY"
        )
    if not key:
        raise UserError(
            f"--api-key-env {api_key_env}: the environment variable is empty or not set; "
            f"export {api_key_env}=... with the key clients must send"
        )
    return key


def _looks_like_a_key(value: str) -> bool:
    """Whether `value`, given as an env var name, is more likely a secret: not a valid name
    (keys carry `-`, `.`, `/`, `+`, `=`), or long with upper and lower case and digits mixed
    (env var names are conventionally UPPER_SNAKE_CASE; keys are random)."""
    if value and not _ENV_NAME.fullmatch(value):
        return True
    mixed = any(c.islower() for c in value) and any(c.isupper() for c in value) and any(c.isdigit() for c in value)
    return len(value) >= 20 and mixed
