"""`arle serve` as a subprocess for the serve benchmarks (serve_streaming.py, serve_tools.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def serve_env(work: Path) -> dict[str, str]:
    """The environment the benchmarks serve under: offline, one vLLM process, a small KV cache
    unless the caller sets one, and an ARLE_HOME of its own under `work`."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "ARLE_HOME": os.environ.get("ARLE_HOME", str(work / "home")),
    }


def start_server(
    model: Path,
    backend: str,
    concurrency: int,
    env: dict[str, str],
    log: Path,
    *,
    served: str,
    extra: tuple[str, ...] = (),
) -> tuple[subprocess.Popen, str]:
    """`arle serve` on a free port as `served` (with `extra` flags); returns the process and its
    API root once it serves. Its output goes to `log` (a pipe nobody drains would fill with the
    access log and stall it)."""
    out = open(log, "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "arlecli",
            "serve",
            "--model",
            str(model),
            "--backend",
            backend,
            "--port",
            "0",
            "--max-concurrency",
            str(concurrency),
            "--served-model-name",
            served,
            *extra,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        for line in log.read_text().splitlines():
            if line.startswith("serving "):
                return proc, line.rsplit(" on ", 1)[1].strip()
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"arle serve did not start:\n{log.read_text()[-3000:]}")
