"""Running untrusted, model-written Python programs with limits.

Threat model. The code comes from a model under evaluation or training: it is usually
wrong rather than malicious. It loops forever, allocates without bound, forks, fills
the disk, deletes files near its working directory, or tries to fetch something from
the internet. The sandbox contains those accidents so that one bad sample cannot stall
or damage a run of thousands. It is NOT a security boundary against code written to
escape: for adversarial code, run arle itself inside a throwaway container or VM.

What each run gets (Linux; macOS gets the subset its kernel supports):

- a fresh temporary directory as cwd, with its own HOME and TMPDIR inside it; the whole
  tree is removed afterwards;
- a minimal environment (PATH, HOME, TMPDIR, LANG, PYTHONHASHSEED=0, one-thread BLAS):
  no proxies, tokens or other secrets from the parent's environment;
- `python -s` with the cwd removed from sys.path: no user site-packages and no
  shadowing of stdlib modules by files the program writes. (Not `-I`: it implies `-E`,
  which would ignore PYTHONHASHSEED and make str hashing, and so set order in printed
  output, differ run to run. The environment is built from scratch, so `-E` adds
  nothing else.);
- a wall-clock timeout; on expiry, and in any case once the program exits, its whole
  process group is SIGKILLed, so forked children do not outlive the call;
- rlimits: RLIMIT_AS (memory), RLIMIT_CPU (backstop for the wall clock), RLIMIT_FSIZE
  (largest file, stdout/stderr included), RLIMIT_CORE=0, and RLIMIT_NPROC for non-root
  users (the kernel ignores it for root; it counts all processes of the user, so the
  limit is set to the user's current count plus `max_procs`);
- no network where the kernel allows: the program enters a new network namespace (root,
  or an unprivileged user namespace otherwise), whose only interface is a loopback that
  is down, so even 127.0.0.1 is unreachable. Where that fails it runs with the host
  network. In both cases `socket.socket.connect`/`connect_ex`/`sendto`/`sendmsg` are
  replaced by a function that raises: defence in depth only, since `_socket` or ctypes
  reach the real calls.

What is not enforced: the filesystem outside the temp dir is visible and writable with
the caller's permissions (as root, that is everything); a process that calls setsid()
leaves the process group and survives the cleanup; as root, the program could raise its
own hard rlimits or re-enter the host network namespace. Killed children are reparented
to PID 1, which in some containers does not reap zombies.

The limits are applied by a small launcher inside the child interpreter before the
program runs, not by `preexec_fn`, which is unsafe with threads and `run_programs`
spawns from a thread pool.

Test verdicts. `run_tests` runs a fixed harness as the sandboxed program and hands it
the model's code and the tests on stdin, so the model's code never sees them as source.
The harness reports how many tests passed on a line tagged with a random marker, written
to a copy of stdout taken before any model code runs. A program that exits early
(`sys.exit(0)`, `os._exit(0)`) therefore produces no verdict and fails, instead of
passing on its exit code. Modes:

- "script": run the program (solution + tests, e.g. HumanEval's `check`); it passes when
  it runs to the end without an exception;
- "unittest": run the program, then every test of its `unittest.TestCase` class;
- "io": for each test, fork a child that runs the program with the test's input as
  its stdin (or calls `fn_name` with the test's arguments) under a per-test time limit,
  and compare its stdout (or return value) with the expected one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

OUTPUT_LIMIT_BYTES = 4096

# Runs as `python -s -c _LAUNCHER '<json config>'` in the sandbox dir. Kept to the stdlib
# and as short as possible: it is on the path of every program run.
_LAUNCHER = r"""
import json, os, resource, runpy, sys

del sys.path[0]  # '' (the cwd): the program's own files must not shadow the stdlib
cfg = json.loads(sys.argv[1])

def enter_netns():
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x40000000) == 0:  # CLONE_NEWNET
            return "netns"
        if os.geteuid() == 0:
            return "none"
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(0x10000000 | 0x40000000) != 0:  # CLONE_NEWUSER | CLONE_NEWNET
            return "none"
        # Map our own ids so files the program creates keep their owner.
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        return "userns+netns"
    except Exception:
        return "none"

def limit(name, soft, hard=None):
    res = getattr(resource, name, None)
    if res is None:
        return
    hard = soft if hard is None else hard
    _, cur_hard = resource.getrlimit(res)
    if cur_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, cur_hard), min(hard, cur_hard)
    try:
        resource.setrlimit(res, (soft, hard))
    except (ValueError, OSError):
        pass

os.environ["ARLE_SANDBOX_NET"] = enter_netns() if cfg["isolate_net"] else "none"
limit("RLIMIT_AS", cfg["memory_bytes"])
limit("RLIMIT_CPU", cfg["cpu_s"], cfg["cpu_s"] + 1)
limit("RLIMIT_FSIZE", cfg["file_bytes"])
limit("RLIMIT_CORE", 0)
if cfg["nproc"]:
    limit("RLIMIT_NPROC", cfg["nproc"])

import socket

def _no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the arle sandbox")

for _name in ("connect", "connect_ex", "sendto", "sendmsg"):
    setattr(socket.socket, _name, _no_network)
del _name

def _excepthook(kind, exc, tb):
    # Show the program's frames only, not the launcher's and runpy's.
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename != "main.py":
        first = first.tb_next
    if first is None and not issubclass(kind, SyntaxError):
        first = tb  # not raised in the program (a SyntaxError carries its own location)
    sys.__excepthook__(kind, exc.with_traceback(first), first)

sys.excepthook = _excepthook
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
"""


@dataclass
class SandboxResult:
    """The outcome of one program run.

    status is "passed" (exit code 0), "failed" (any other exit, including being killed
    for memory or file size) or "timeout" (wall clock or CPU limit). stdout and stderr
    keep the first and last `OUTPUT_LIMIT_BYTES / 2` bytes of longer output.
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def passed(self) -> bool:
        """True when the program exited with code 0 in time."""
        return self.status == "passed"


def run_program(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 2048,
    max_file_mb: int = 16,
    max_procs: int = 256,
    stdin: str | None = None,
    isolate_network: bool = True,
) -> SandboxResult:
    """Run Python source `code` in a fresh sandbox (see the module docstring) and wait.

    Args:
        code: the whole program, run as `__main__`.
        timeout_s: wall-clock limit, interpreter start-up included.
        memory_mb: address-space limit (RLIMIT_AS).
        max_file_mb: largest file the program may write, stdout and stderr included.
        max_procs: processes/threads the program may add (non-root users only).
        stdin: text fed to the program's stdin; None means an empty stdin.
        isolate_network: try to run in a new network namespace (the socket guard stays).
    """
    root = Path(tempfile.mkdtemp(prefix="arle-sandbox-"))
    try:
        work, home, tmp = root / "work", root / "home", root / "tmp"
        for d in (work, home, tmp):
            d.mkdir()
        (work / "main.py").write_text(code, encoding="utf-8")
        (root / "stdin").write_text(stdin or "", encoding="utf-8")
        cfg = {
            "memory_bytes": memory_mb * 1024 * 1024,
            "cpu_s": max(1, math.ceil(timeout_s)),
            "file_bytes": max_file_mb * 1024 * 1024,
            "nproc": _nproc_limit(max_procs),
            "isolate_net": isolate_network,
        }
        argv = [sys.executable, "-s", "-c", _LAUNCHER, json.dumps(cfg)]
        with open(root / "stdin", "rb") as fin, open(root / "stdout", "wb") as fout, open(
            root / "stderr", "wb"
        ) as ferr:
            # Files, not pipes: a forked child holding a pipe open would block reading
            # until it exits, and files never fill up and deadlock the writer.
            start = time.monotonic()
            proc = subprocess.Popen(
                argv, cwd=work, env=_minimal_env(home, tmp), stdin=fin, stdout=fout,
                stderr=ferr, start_new_session=True, close_fds=True,
            )
        timed_out = False
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            returncode = proc.wait()
        duration = time.monotonic() - start
        _kill_group(proc.pid)  # children that outlived a program which exited on its own
        # SIGXCPU: the CPU budget ran out first, as it can when several threads spin.
        if timed_out or returncode == -signal.SIGXCPU:
            status = "timeout"
        else:
            status = "passed" if returncode == 0 else "failed"
        return SandboxResult(
            status=status,
            returncode=returncode,
            stdout=_read_capped(root / "stdout"),
            stderr=_read_capped(root / "stderr"),
            duration_s=duration,
        )
    finally:
        _remove_tree(root)


def run_programs(
    codes: Sequence[str],
    *,
    workers: int | None = None,
    timeout_s: float = 10.0,
    memory_mb: int = 2048,
    max_file_mb: int = 16,
    max_procs: int = 256,
    stdins: Sequence[str | None] | None = None,
    isolate_network: bool = True,
) -> list[SandboxResult]:
    """Run many programs concurrently (`workers` at a time, default os.cpu_count()).

    Results come back in the order of `codes`. Each program gets its own sandbox and
    the same limits as `run_program`.
    """
    if stdins is not None and len(stdins) != len(codes):
        raise ValueError(f"got {len(codes)} programs but {len(stdins)} stdins")
    inputs = list(stdins) if stdins is not None else [None] * len(codes)

    def one(i: int) -> SandboxResult:
        return run_program(
            codes[i], timeout_s=timeout_s, memory_mb=memory_mb, max_file_mb=max_file_mb,
            max_procs=max_procs, stdin=inputs[i], isolate_network=isolate_network,
        )

    if len(codes) <= 1:
        return [one(i) for i in range(len(codes))]
    # Threads suffice: each one only waits on its subprocess.
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        return list(pool.map(one, range(len(codes))))


def network_isolation() -> str:
    """How the sandbox cuts the network here: "netns", "userns+netns" or "none".

    Runs one tiny program, so call it for diagnostics, not per sample.
    """
    result = run_program("import os; print(os.environ['ARLE_SANDBOX_NET'])", timeout_s=30)
    return result.stdout.strip() or "none"


def _minimal_env(home: Path, tmp: Path) -> dict[str, str]:
    # Built from scratch so no proxy, token or credential in the caller's env leaks in.
    return {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        # Many programs run side by side; a BLAS pool per program would oversubscribe.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _nproc_limit(max_procs: int) -> int:
    # RLIMIT_NPROC counts every task of the real user, not just the sandbox's, so the
    # limit is relative to what the user already runs. Root is exempt in the kernel.
    if os.geteuid() == 0 or not os.path.isdir("/proc"):
        return 0
    uid, count = str(os.getuid()), 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [uid]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count + max_procs


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _read_capped(path: Path, limit: int = OUTPUT_LIMIT_BYTES) -> str:
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= limit:
            data = f.read()
        else:
            # Keep both ends: the start says what ran, the end holds the traceback.
            head = f.read(limit // 2)
            f.seek(size - limit // 2)
            marker = f"\n...[{size - limit} bytes truncated]...\n".encode()
            data = head + marker + f.read()
    return data.decode("utf-8", errors="replace")


def _remove_tree(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        # The program may have chmod-ed a directory unreadable; give it back and retry.
        os.chmod(root, 0o700)
        for dirpath, dirnames, _ in os.walk(root):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o700)
        shutil.rmtree(root, ignore_errors=True)
