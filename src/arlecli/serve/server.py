"""Running the app on uvicorn: in the foreground (`arle serve`) or in a background thread.

We bind the socket ourselves so a busy port is a one-line UserError before the model loads,
and so `port=0` (any free port) reports the port actually taken.
"""

from __future__ import annotations

import signal
import socket
import threading
from typing import Any, Callable

import uvicorn

from arlecli.errors import UserError

# How long Ctrl-C waits for in-flight requests before cutting them off.
GRACEFUL_SHUTDOWN_S = 5.0


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on host:port (port 0: any free port)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): pass another --port "
                        "or --host") from None
    sock.set_inheritable(True)
    return sock


def url(sock: socket.socket) -> str:
    """The API root clients use for the server on `sock`, e.g. http://127.0.0.1:8000/v1."""
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] | None = None,
                 on_stop: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.on_ready = on_ready
        self.on_stop = on_stop

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Before uvicorn waits for open requests: let the app answer them now (503) instead
        # of leaving them to be cancelled when the graceful-shutdown timeout runs out.
        if self.on_stop is not None:
            self.on_stop()
        await super().shutdown(sockets=sockets)


def _config(app: Any) -> uvicorn.Config:
    # Our own ready line replaces uvicorn's banner; warnings and errors still show.
    return uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                          timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)


def run(app: Any, sock: socket.socket, on_ready: Callable[[], None] | None = None,
        on_stop: Callable[[], None] | None = None) -> None:
    """Serve `app` on `sock` until Ctrl-C or SIGTERM, then shut down and return.

    `on_ready()` is called once the server accepts connections, `on_stop()` as shutdown begins
    (before open connections are waited for).
    """
    server = _Server(_config(app), on_ready, on_stop)
    # uvicorn re-raises the signal it caught once it has shut down; a no-op handler for that
    # moment turns the re-raise into a plain return, so the caller can close the engine.
    main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        sock.close()


class BackgroundServer:
    """Serve an app from a daemon thread (tests, notebooks, a gateway inside a training run).

        with BackgroundServer(app) as srv:
            httpx.get(srv.base_url + "/models")
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 on_stop: Callable[[], None] | None = None) -> None:
        self.sock = bind(host, port)
        self.base_url = url(self.sock)
        self._server = _Server(_config(app), on_stop=on_stop)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.sock]},
                                        name="arle-serve", daemon=True)

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread died during startup")
            self._thread.join(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self.sock.close()
