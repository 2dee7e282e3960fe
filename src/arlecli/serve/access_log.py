"""One line per request on stderr: who, method, path, status, latency and tokens.

    127.0.0.1 POST /v1/chat/completions 200 0.412s tokens=31+16

(`tokens=PROMPT+COMPLETION` where the request generated; a stream's line comes when its last
chunk has gone). An ASGI middleware inside the app (starlette's `Middleware`), so every route,
error and 404 is logged alike; `arle serve --no-access-log` leaves it out, as uvicorn's own flag does. The path is
escaped (safeio.terminal_text): a client's bytes must not drive the log's terminal.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from arlecli.safeio import terminal_text

# Where a handler leaves the request's token counts (request.state.arle_tokens).
TOKENS = "arle_tokens"


def set_tokens(request: Any, usage: dict[str, Any]) -> None:
    """Record a request's usage for its access-log line."""
    request.state.arle_tokens = (usage.get("prompt_tokens"), usage.get("completion_tokens"))


class AccessLog:
    """Wraps an ASGI `app`; writes each HTTP request's line to `write` (stderr) when it ends."""

    def __init__(self, app: Any, write: Callable[[str], Any] | None = None) -> None:
        self.app = app
        self.write = write or (lambda line: (sys.stderr.write(line), sys.stderr.flush()))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [0]

        async def send_logged(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        finally:
            self.write(line(scope, status[0] or 500, time.perf_counter() - started))


def line(scope: dict[str, Any], status: int, seconds: float) -> str:
    """The log line of one request (see the module docstring)."""
    client = scope.get("client") or ("-", 0)
    path = scope.get("path", "")
    tokens = (scope.get("state") or {}).get(TOKENS)
    counts = f" tokens={tokens[0]}+{tokens[1]}" if tokens else ""
    return terminal_text(f"{client[0]} {scope.get('method', '-')} {path} {status} {seconds:.3f}s{counts}") + "\n"
