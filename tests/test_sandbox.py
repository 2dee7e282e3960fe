"""The sandbox contains runaway programs: time, processes, memory, files, network; its test
harness gives verdicts that a program cannot fake by exiting early."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from arlecli.sandbox import network_isolation, run_program, run_programs, run_tests


def _gone(pid: int, wait_s: float = 2.0) -> bool:
    # SIGKILL is asynchronous, and an orphan may linger as a zombie if PID 1 does not
    # reap; either way it no longer runs.
    deadline = time.monotonic() + wait_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_stdout_stdin_and_exit_status_are_reported():
    result = run_program("import sys\nprint('hello', sys.stdin.read())\n", stdin="world")
    assert result.status == "passed" and result.returncode == 0
    assert result.stdout == "hello world\n"
    failed = run_program("import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)\n")
    assert failed.status == "failed" and failed.returncode == 3
    assert failed.stderr == "oops\n"


def test_traceback_shows_only_the_program_frames():
    result = run_program("def f():\n    raise ValueError('boom')\nf()\n")
    assert result.status == "failed"
    assert 'File "main.py", line 2, in f' in result.stderr
    assert "runpy" not in result.stderr and "<string>" not in result.stderr
    assert result.stderr.strip().endswith("ValueError: boom")


def test_infinite_loop_is_killed_at_the_timeout():
    result = run_program("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout"
    assert 1.0 <= result.duration_s < 2.5


def _running_with(token: str) -> list[int]:
    """Host PIDs of live (not zombie) processes whose command line holds `token`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if token.encode() in (entry / "cmdline").read_bytes() and not _gone(int(entry.name), 0):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("parent_waits", [False, True], ids=["parent-exits", "parent-hangs"])
def test_forked_children_do_not_outlive_the_call(parent_waits):
    # PIDs inside the jail are its own namespace's: find the child on the host by a token
    # in its command line instead.
    token = f"arle-orphan-{os.getpid()}-{int(parent_waits)}"
    code = (
        "import os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {token!r}])\n"
        "time.sleep(0.5)\n"
        "print(pid, flush=True)\n" + ("time.sleep(60)\n" if parent_waits else "")
    )
    result = run_program(code, timeout_s=2.5)
    assert result.status == ("timeout" if parent_waits else "passed"), result.stderr
    deadline = time.monotonic() + 2
    while _running_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running_with(token), "a forked child still runs after the call"


def test_allocating_beyond_the_memory_limit_fails():
    result = run_program("data = b'x' * (1024 ** 3)\nprint(len(data))\n", memory_mb=256)
    assert result.status == "failed"
    assert "MemoryError" in result.stderr


def test_writing_beyond_the_file_size_limit_fails():
    code = "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (3 * 1024 * 1024))\n"
    result = run_program(code, max_file_mb=1)
    assert result.status == "failed"
    assert "File too large" in result.stderr
    assert run_program(code, max_file_mb=4).status == "passed"


def test_cwd_home_and_tmp_are_private_and_the_environment_is_empty(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("ARLE_TEST_SECRET", "hunter2")
    code = (
        "import os, tempfile\n"
        "open('scratch.txt', 'w').write('x')\n"
        "open(os.path.join(os.environ['HOME'], 'h.txt'), 'w').write('x')\n"
        "open(os.path.join(tempfile.gettempdir(), 't.txt'), 'w').write('x')\n"
        "print(os.getcwd())\n"
        "print(sorted(os.environ))\n"
    )
    result = run_program(code)
    assert result.status == "passed", result.stderr
    cwd, env_names = result.stdout.splitlines()
    assert not Path(cwd, "scratch.txt").exists()  # the jail's cwd is not the host's path
    assert "HTTPS_PROXY" not in env_names and "ARLE_TEST_SECRET" not in env_names
    # Nothing the program wrote is left on the host.
    assert not list(Path(tempfile.gettempdir()).glob("arle-sandbox-*/**/scratch.txt"))


@pytest.fixture
def listening_port():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # the kernel completes handshakes from the backlog; no accept needed
    yield server.getsockname()[1]
    server.close()


def test_connecting_to_localhost_fails_inside_the_sandbox(listening_port):
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listening_port}), timeout=2)\n"
    result = run_program(code, timeout_s=5)
    assert result.status == "failed"
    assert "network access is disabled" in result.stderr


def test_network_namespace_blocks_even_the_raw_socket_module(listening_port):
    # Our machines (and CI) allow a network namespace; if one ever doesn't, the sandbox is
    # weaker there (only the socket guard applies) and this should say so loudly.
    assert network_isolation() != "none", "no network namespace here: only the socket guard isolates code"
    # _socket bypasses the Python-level guard, so only the namespace stops this.
    code = f"import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', {listening_port}))\n"
    isolated = run_program(code, timeout_s=5)
    assert isolated.status == "failed" and "Error" in isolated.stderr
    # Control: the same program reaches the server without the namespace.
    assert run_program(code, timeout_s=5, isolate_network=False).status == "passed"


def test_long_output_is_truncated_at_both_ends():
    result = run_program("print('start')\nprint('x' * 100_000)\nprint('end')\n")
    assert result.status == "passed"
    assert len(result.stdout) < 5000
    assert result.stdout.startswith("start") and result.stdout.rstrip().endswith("end")
    assert "truncated" in result.stdout


def test_str_hashing_is_deterministic():
    code = "print(hash('arle'))\n"
    assert run_program(code).stdout == run_program(code).stdout


def test_run_programs_is_parallel_and_keeps_order():
    codes = [f"import time\ntime.sleep(0.5)\nprint({i})\n" for i in range(6)]
    start = time.monotonic()
    results = run_programs(codes, workers=6)
    elapsed = time.monotonic() - start
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(6)]
    assert all(r.passed for r in results)
    assert elapsed < 6 * 0.5, f"6 x 0.5 s sleeps took {elapsed:.1f} s: not run in parallel"


def test_run_tests_verdicts_come_from_the_harness_not_the_exit_status():
    test = "assert f() == 1\n"
    jobs = [
        {"mode": "script", "solution": "def f():\n    return 1\n", "test": test},
        {"mode": "script", "solution": "import sys\nsys.exit(0)\n", "test": test},
        {"mode": "script", "solution": "import os\nos._exit(0)\n", "test": test},
        {"mode": "script", "solution": "def f(:\n", "test": test},
        # a forged verdict line lacks the run's random marker, and goes to stderr anyway
        {
            "mode": "script",
            "test": test,
            "solution": 'print(\'ARLE-VERDICT-0000000000000000:{"passed": 1, "total": 1}\')\nraise SystemExit(0)\n',
        },
        {"mode": "script", "solution": "def f():\n    raise SystemExit(0)\n", "test": test},
    ]
    ok, exited, killed, syntax, forged, exits_in_call = run_tests(jobs, timeout_s=10)
    assert (ok.status, ok.passed, ok.total, ok.failure, ok.forgeable) == ("passed", 1, 1, None, False)
    assert exited.status == "failed" and exited.failure["kind"] == "exit"
    assert killed.status == "failed" and killed.failure["kind"] == "solution_died"
    assert syntax.status == "failed" and syntax.failure["kind"] == "compile_error"
    assert "SyntaxError" in syntax.result.stderr
    assert forged.status == "failed" and "0000000000000000" not in forged.result.stdout
    assert exits_in_call.status == "failed" and exits_in_call.failure["kind"] == "exit"


def test_run_tests_script_mode_runs_the_test_against_the_solution_across_processes():
    prompt = 'import math\n\ndef helper(x):\n    return x * 2\n\ndef f(x):\n    """Doc."""\n'
    check = (
        "def check(candidate):\n    assert candidate(2) == helper(2) + 1\n"
        "    assert candidate(0.5) == 2.0 and math.isclose(candidate(1), 3)\n"
    )
    jobs = [
        # the entry point from the solution, the prompt's helper from the prompt
        {
            "mode": "script",
            "prompt": prompt,
            "test": check,
            "entry_point": "f",
            "solution": prompt + "    return helper(x) + 1\n",
        },
        # a solution that redefines the prompt's helper cannot change what the test sees
        {
            "mode": "script",
            "prompt": prompt,
            "test": check,
            "entry_point": "f",
            "solution": "def helper(x):\n    return 0\ndef f(x):\n    return 1\n",
        },
        # MBPP style: no prompt; the test uses the solution's imports and functions
        {
            "mode": "script",
            "test": "assert math.floor(area(2)) == 12 and AREA_UNIT == 'm2'\n",
            "solution": "import math\nAREA_UNIT = 'm2'\ndef area(r):\n    return math.pi * r * r\n",
        },
        # exceptions cross as the builtin of that name
        {
            "mode": "script",
            "test": "try:\n    div(1, 0)\nexcept ZeroDivisionError:\n    pass\nelse:\n    assert False\n",
            "solution": "def div(a, b):\n    return a / b\n",
        },
        # plain data both ways, containers and big ints included
        {
            "mode": "script",
            "test": "assert echo([1, (2, 3), {4}, frozenset({5}), {6: b'7'}, 2 ** 100, None, 1.5]) == "
            "[1, (2, 3), {4}, frozenset({5}), {6: b'7'}, 2 ** 100, None, 1.5]\n",
            "solution": "def echo(x):\n    return x\n",
        },
        # an instance of the solution's own class cannot cross: the known cost
        {
            "mode": "script",
            "test": "assert make().x == 1\n",
            "solution": "class P:\n    x = 1\ndef make():\n    return P()\n",
        },
    ]
    good, helper, mbpp, raised, plain, instance = run_tests(jobs, timeout_s=10)
    assert good.status == "passed", good.failure
    assert helper.status == "failed"
    assert mbpp.status == "passed", mbpp.failure
    assert raised.status == "passed", raised.failure
    assert plain.status == "passed", plain.failure
    assert instance.status == "failed" and instance.failure["kind"] == "not_plain_data"


def test_run_tests_unittest_verdicts_are_marked_forgeable():
    program = (
        "def f():\n    return 1\nimport unittest\nclass TestCases(unittest.TestCase):\n"
        "    def test_one(self):\n        self.assertEqual(f(), 1)\n"
        "    def test_two(self):\n        self.assertEqual(f(), 2)\n"
    )
    (verdict,) = run_tests([{"mode": "unittest", "program": program}], timeout_s=10)
    assert (verdict.status, verdict.passed, verdict.total, verdict.forgeable) == ("failed", 1, 2, True)
    assert verdict.failure["kind"] == "test_failed" and "test_two" in verdict.failure["test"]


def test_run_tests_io_mode_forks_each_test_with_its_own_limits():
    stdin_tests = [
        {"kind": "stdin", "input": "2\n", "output": "4"},
        {"kind": "stdin", "input": "-3\n", "output": "-6\n"},
    ]
    jobs = [
        {"mode": "io", "program": "n = int(input())\nprint(2 * n)\n", "tests": stdin_tests, "test_timeout_s": 5},
        # state left by one test does not leak into the next: each test is a fresh fork
        {
            "mode": "io",
            "program": "import builtins\nbuiltins.seen = getattr(builtins, 'seen', 0) + 1\n"
            "print(2 * int(input()) * builtins.seen)\n",
            "tests": stdin_tests,
            "test_timeout_s": 5,
        },
        {
            "mode": "io",
            "program": "import time, sys\nn = int(input())\nif n < 0:\n    time.sleep(60)\nprint(2 * n)\n",
            "tests": stdin_tests,
            "test_timeout_s": 0.5,
            "stop_on_failure": False,
        },
        {
            "mode": "io",
            "program": "import os\nos.write(1, b'4')\nos._exit(0)\n",
            "tests": stdin_tests[:1],
            "test_timeout_s": 5,
        },
    ]
    start = time.monotonic()
    doubled, fresh, slow, raw_fd = run_tests(jobs, timeout_s=20)
    assert time.monotonic() - start < 15
    assert (doubled.status, doubled.passed, doubled.total) == ("passed", 2, 2)
    assert fresh.status == "passed"
    assert (slow.status, slow.passed, slow.total) == ("timeout", 1, 2)
    assert slow.failure["kind"] == "timeout" and slow.failure["test"] == 1
    assert raw_fd.status == "passed"  # a stdin program may exit however it likes once it has answered


def test_run_tests_io_mode_admits_test_inputs_larger_than_the_file_limit():
    big = "x" * (3 * 1024 * 1024)
    job = {
        "mode": "io",
        "program": "import sys\nprint(len(sys.stdin.read()))\n",
        "tests": [{"kind": "stdin", "input": big, "output": str(len(big))}],
        "test_timeout_s": 10,
    }
    (verdict,) = run_tests([job], timeout_s=20, max_file_mb=1)
    assert verdict.status == "passed", verdict.failure


def test_the_harness_is_a_packaged_module_whose_text_runs_in_the_jail():
    # A real file: importable (running nothing), its helpers callable, and the very text in
    # the package is what each jail runs as its main.py.
    import hashlib
    from importlib.resources import files

    from arlecli.sandbox import harness
    from arlecli.sandbox._resources import harness_main as program

    assert not hasattr(program, "PROGRAM_CWD")  # imported, not run
    assert program.names_in("assert f(x) == y\n") == {"f", "x", "y"}
    value = (1, {2}, b"\x00", 2**70, {"k": [None, 1.5]})
    assert program.from_plain(program.to_plain(value)) == value
    assert type(program.rebuilt_exception("ValueError", "bad")) is ValueError
    assert type(program.rebuilt_exception("SystemExit", "bye")) is RuntimeError  # never a BaseException
    assert harness.dumps_plain is program.dumps_plain  # one owner: the host takes the program's helpers
    packaged = files("arlecli.sandbox._resources").joinpath("harness_main.py").read_bytes()
    assert packaged == Path(program.__file__).read_bytes()
    # The solution's cwd holds the harness as main.py (read-only): what it reads is the package's file.
    reads = "import hashlib\nprint(hashlib.sha256(open('main.py', 'rb').read()).hexdigest(), flush=True)\n"
    (verdict,) = run_tests([{"mode": "script", "solution": reads, "test": "pass\n"}], timeout_s=10)
    assert verdict.status == "passed", verdict.failure
    assert hashlib.sha256(packaged).hexdigest() in verdict.result.stderr


def test_the_launcher_is_the_packaged_file():
    import hashlib
    import importlib
    import sys
    from importlib.resources import files

    path = list(sys.path)
    importlib.import_module("arlecli.sandbox._resources.launcher")
    assert sys.path == path  # importing it runs nothing
    launcher = files("arlecli.sandbox._resources").joinpath("launcher.py").read_bytes()
    # python -s -c <launcher> <config>: the program's own command line holds the text that ran.
    result = run_program(
        "import hashlib\nargv = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
        "print(hashlib.sha256(argv[3]).hexdigest())\n"
    )
    assert result.stdout.strip() == hashlib.sha256(launcher).hexdigest()
