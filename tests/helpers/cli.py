"""The CLI as a user runs it: `python -m arlecli` in a subprocess or on a pseudo-terminal, and the
checks every bad-input test makes (one `error:` line, the run directory byte-identical)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

ARLE = [sys.executable, "-m", "arlecli"]


def arle(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would."""
    return subprocess.run(
        [*ARLE, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy(), cwd=cwd
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, one `error:` line on stderr holding every needle, no traceback, nothing on stdout."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout.strip(), (proc.stdout, proc.stderr)
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by relative path, with its exact bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def read_pty(master: int, proc: subprocess.Popen) -> bytes:
    """All `proc` writes to the pseudo-terminal `master` until it closes its side (then `master`
    is closed); a command silent for 120 s is killed and fails the test."""
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            proc.kill()
            raise AssertionError("the command hung: " + out.decode(errors="replace"))
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return out
