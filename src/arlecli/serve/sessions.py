"""Recording sessions: opened by the server, named by ids no client can guess.

Recorded sessions are training data, so a client must not be able to append to a session it
did not open. A client (or arle's own rollout driver, in-process) opens a session with
`POST /sessions` (`Sessions.open`), and gets an id minted with `secrets` (192 random bits);
only requests naming an open id (`/s/ID/v1/...` or the `X-Arle-Session` header) are
recorded in it, and any other id is refused (404) before anything is generated. Holding the id
is what lets a client use the session, so it is handed only to the one agent the session is
for. `DELETE /sessions/ID` (`Sessions.close`) ends a session: later requests naming it are
refused, and the replies kept to continue it are freed.

A request that names no session is recorded in the shared "default" session, as before:
that one any client may write to, so train only on opened sessions.
"""

from __future__ import annotations

import re
import secrets
import threading
from typing import Callable

from arlecli.serve.protocol import ApiError

DEFAULT_SESSION = "default"
# Open sessions cost ~200 bytes each; the cap keeps a client that opens sessions in a loop
# from growing the server without bound. arle's rollout driver closes each episode's session.
MAX_OPEN = 65536
_LABEL = re.compile(r"[A-Za-z0-9_]{1,32}")


class Sessions:
    """The sessions this server has opened (thread-safe: the rollout driver opens sessions from
    its own threads while the event loop checks them). `on_close(id)` runs when one closes
    (the server frees the replies it kept to continue it)."""

    def __init__(self, max_open: int = MAX_OPEN, on_close: Callable[[str], None] | None = None) -> None:
        self.max_open = max_open
        self.on_close = on_close
        self._open: set[str] = set()
        self._lock = threading.Lock()

    def open(self, label: str = "") -> str:
        """A new session's id: `label-` (letters, digits and `_`, for whoever reads the record
        folder) then 32 random URL-safe characters. ApiError(429) when MAX_OPEN are open."""
        if label and not _LABEL.fullmatch(label):
            raise ValueError(f"a session label is 1-32 letters, digits or _, not {label!r}")
        sid = (f"{label}-" if label else "") + secrets.token_urlsafe(24)
        with self._lock:
            if len(self._open) >= self.max_open:
                raise ApiError(
                    429,
                    f"this server has {self.max_open} sessions open, its limit: close finished "
                    "ones with DELETE /sessions/ID",
                    "too_many_sessions",
                )
            self._open.add(sid)
        return sid

    def close(self, sid: str) -> bool:
        """End session `sid`; False when it was not open."""
        with self._lock:
            if sid not in self._open:
                return False
            self._open.remove(sid)
        if self.on_close is not None:
            self.on_close(sid)
        return True

    def check(self, sid: str | None) -> str:
        """The session a request records into: `sid` when it is open, DEFAULT_SESSION when it
        is None; ApiError(404) for any other id (never opened, closed, or guessed)."""
        if sid is None:
            return DEFAULT_SESSION
        with self._lock:
            known = sid in self._open
        if not known:
            shown = sid if len(sid) <= 80 else sid[:80] + "..."
            raise ApiError(
                404,
                f"no open session {shown!r}: sessions are opened with POST /sessions, which "
                "answers the id to use (ids are made by the server, not chosen by clients)",
                "session_not_found",
            )
        return sid

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def __contains__(self, sid: object) -> bool:
        with self._lock:
            return sid in self._open
