"""The jail's launcher: `python -s -c <this file's text> '<json config>'`, run in the program's
cwd, applies the limits (`arlecli.sandbox.jail` writes the config) and then runs main.py as
__main__. Stdlib only and as short as possible: it is on the path of every program run.
Importing it runs nothing.
"""

import json
import os
import resource
import runpy
import sys


def enter_netns():
    # Degraded mode only: under bubblewrap the jail already has its own network namespace.
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
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
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


def watch_memory(budget):
    # Become the jail's pid 1 and run the program in a child: reap every process, and kill
    # them all when their memory together passes `budget` (where arle has no memory cgroup).
    # Returns in the child only. A PID namespace's init ignores every signal it has no handler
    # for, so the program cannot kill it; it is undumpable and holds nothing of the job.
    import ctypes
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        return
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.closerange(3, 1 << 16)
    page = os.sysconf("SC_PAGE_SIZE")
    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(0)
            if pid == 0:
                break
            if pid == child:  # the namespace dies with us: the program's strays go too
                code = os.waitstatus_to_exitcode(status)
                os._exit(code if code >= 0 else 128 - code)
        used = 0
        for name in os.listdir("/proc"):  # the jail's own /proc: only its processes
            if name.isdigit() and name != "1":
                try:
                    with open(f"/proc/{name}/statm", "rb") as f:
                        fields = f.read().split()
                    used += (int(fields[1]) - int(fields[2])) * page  # resident, not file-backed
                except (OSError, ValueError, IndexError):
                    pass
        if used > budget:
            os.write(
                2,
                b"\narle sandbox: the program's processes together used more than %d MB of memory; "
                b"all were killed\n" % (budget >> 20),
            )
            os.kill(-1, 9)
            os._exit(137)
        signal.sigtimedwait([signal.SIGCHLD], 0.02)


def _no_network(*args, **kwargs):
    raise PermissionError("network access is disabled in the arle sandbox")


def _excepthook(kind, exc, tb):
    # Show the program's frames only, not the launcher's and runpy's.
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename != "main.py":
        first = first.tb_next
    if first is None and not issubclass(kind, SyntaxError):
        first = tb  # not raised in the program (a SyntaxError carries its own location)
    sys.__excepthook__(kind, exc.with_traceback(first), first)


def main():
    del sys.path[0]  # '' (the cwd): the program's own files must not shadow the stdlib
    cfg = json.loads(sys.argv[1])
    sys.path += [p for p in cfg["path"] if p not in sys.path]  # where the bound packages are
    if cfg["enter_netns"]:
        os.environ["ARLE_SANDBOX_NET"] = enter_netns()
    limit("RLIMIT_AS", cfg["memory_bytes"])
    limit("RLIMIT_CPU", cfg["cpu_s"], cfg["cpu_s"] + 1)
    limit("RLIMIT_FSIZE", cfg["file_bytes"])
    limit("RLIMIT_CORE", 0)
    if cfg["nproc"]:
        limit("RLIMIT_NPROC", cfg["nproc"])
    if cfg["watch_memory"]:
        watch_memory(cfg["watch_memory"])
    import socket  # only now: the memory watchdog (pid 1) never needs it

    for name in ("connect", "connect_ex", "sendto", "sendmsg"):
        setattr(socket.socket, name, _no_network)
    sys.excepthook = _excepthook
    sys.argv = ["main.py"]
    runpy.run_path("main.py", run_name="__main__")


if __name__ == "__main__":
    main()
