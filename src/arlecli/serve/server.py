"""Running the app on uvicorn: in the foreground (`arle serve`) or in a background thread.

We bind the socket ourselves so a busy port is a one-line UserError before the model loads,
and so `port=0` (any free port) reports the port actually taken.

Connections are guarded (`guarded_protocol`, over uvicorn's h11 protocol, whose header size
limit is settable): a connection must send its request headers within a deadline, idle ones
close, and at the connection cap a new connection pushes out the longest-idle one, so
clients that open sockets and send nothing (or trickle bytes) cannot use up the process's
file descriptors and lock everyone out.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from typing import Any, Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from arlecli.errors import UserError
from arlecli.serve.limits import ServeLimits

# How long Ctrl-C waits for in-flight requests before cutting them off.
GRACEFUL_SHUTDOWN_S = 5.0
# File descriptors kept free of connections: model files, the record files, pipes, vLLM.
FD_RESERVE = 256
MAX_AUTO_CONNECTIONS = 4096
_log = logging.getLogger("uvicorn.error")


def raise_fd_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit (as vLLM's server does);
    returns the soft limit now in force (0 where there is no such limit)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return 0 if soft == resource.RLIM_INFINITY else soft


def connection_cap(limits: ServeLimits) -> int:
    """The most connections to hold open: the configured cap, else what the file-descriptor
    limit leaves after FD_RESERVE (at most MAX_AUTO_CONNECTIONS, at least 16)."""
    if limits.max_connections is not None:
        return max(1, limits.max_connections)
    soft = raise_fd_limit()
    if not soft:
        return MAX_AUTO_CONNECTIONS
    return max(16, min(MAX_AUTO_CONNECTIONS, soft - FD_RESERVE))


def guarded_protocol(limits: ServeLimits, cap: int) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with a header deadline and a connection cap (see the module
    docstring); uvicorn's own keep-alive timeout closes connections idle after a response."""
    warned = [0.0]

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _idle_since: float = 0.0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._idle_since = time.monotonic()
            self._arm_header_timer()
            if len(self.connections) > cap:
                # Connections already closed (a header deadline, a push-out, a keep-alive end)
                # stay in the set until their connection_lost runs: counted out now.
                for c in [c for c in self.connections if _closing(c)]:
                    self.connections.discard(c)
                if len(self.connections) > cap:
                    self._make_room()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._busy():  # a request is in (its headers complete): the app owns the time now
                self._disarm_header_timer()
            elif self._header_timer is None and not self.transport.is_closing():
                # Bytes of a next request on a kept-alive connection (uvicorn disarmed its
                # keep-alive timer): its headers get the same deadline as a new connection's.
                self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._idle_since = time.monotonic()

        def _busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if not self._busy():
                self.transport.close()

        def _make_room(self) -> None:
            # Push out the longest-idle connection (no request in flight); if every one is
            # busy, this newest one goes instead. Either way the count stays at the cap.
            idle = [
                c
                for c in self.connections
                if isinstance(c, GuardedH11Protocol) and not c._busy() and not c.transport.is_closing()
            ]
            victim = min(idle, key=lambda c: c._idle_since) if idle else self
            victim.transport.close()
            victim.connections.discard(victim)  # counted out now, not when the close lands
            now = time.monotonic()
            if now - warned[0] > 60:  # once a minute: a flood must not flood the log too
                warned[0] = now
                _log.warning(
                    f"connection cap reached ({cap} open connections): closing idle ones (arle serve --max-connections)"
                )

    return GuardedH11Protocol


def _closing(protocol: Any) -> bool:
    transport = getattr(protocol, "transport", None)
    return transport is not None and transport.is_closing()


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on host:port (port 0: any free port)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise UserError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): pass another --port or --host"
        ) from None
    sock.set_inheritable(True)
    return sock


def url(sock: socket.socket) -> str:
    """The API root clients use for the server on `sock`, e.g. http://127.0.0.1:8000/v1."""
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


class _Server(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        on_ready: Callable[[], None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
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
    # The app's limits (create_app keeps them on app.state); defaults for any other app.
    state = getattr(app, "state", None)
    limits = getattr(state, "limits", None) or ServeLimits()
    # Our own ready line replaces uvicorn's banner; warnings and errors still show.
    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        # uvicorn annotates it int but waits any number of seconds
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,  # type: ignore[arg-type]
        http=guarded_protocol(limits, connection_cap(limits)),
        ws="none",
        timeout_keep_alive=max(1, int(limits.keep_alive_s)),
        h11_max_incomplete_event_size=limits.max_header_bytes,
    )


def run(
    app: Any, sock: socket.socket, on_ready: Callable[[], None] | None = None, on_stop: Callable[[], None] | None = None
) -> None:
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

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, on_stop: Callable[[], None] | None = None
    ) -> None:
        self.sock = bind(host, port)
        self.base_url = url(self.sock)
        self._server = _Server(_config(app), on_stop=on_stop)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self.sock]}, name="arle-serve", daemon=True
        )

    @property
    def connections(self) -> Any:
        """The server's open connections (uvicorn's live set: its size is how many are open now)."""
        return self._server.server_state.connections

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
