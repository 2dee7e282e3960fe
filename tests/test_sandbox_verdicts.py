"""Verdicts a program cannot forge (issue 12, item 2): hostile programs written to make the
tests say "pass" without solving the task. Each scores 0 through the real rewards, and the
honest solution of the same task scores 1.

Every hostile solution is wrong unless its attack works: it computes the wrong answer,
and answers right only with what it managed to steal (the expected values, from stdin, the
job files, the harness's memory, frames or heap) or makes the harness report a pass
(monkeypatching, fake verdict lines, writing to every fd, killing or stopping it, exiting
early, objects that compare equal to anything).
"""

from __future__ import annotations

import json
import textwrap

import pytest

import arlecli.rewards.code  # noqa: F401  (registers the code rewards)
from arlecli.rewards import REWARDS
from arlecli.types import Episode, Task, Turn

# Collects every text the program can reach and searches it for the expected answer.
# `pattern` has one group: the answer. Called lazily, from inside the solution's function,
# when the harness holds the test source in memory.
SNOOP = r"""
import ctypes, gc, os, re, sys

def _read(path, limit=1 << 22):
    try:  # non-blocking: some fds are pipes
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            return os.read(fd, limit).decode("latin-1")
        finally:
            os.close(fd)
    except BaseException:
        return ""

def _parent_memory():
    # After fork the parent's address space has our layout: try its heap and stacks
    # through ptrace, /proc/<ppid>/mem and process_vm_readv.
    ppid, out = os.getppid(), []
    libc = ctypes.CDLL(None, use_errno=True)
    attached = libc.ptrace(16, ppid, 0, 0) == 0  # PTRACE_ATTACH
    if attached:
        out.append("ATTACHED")
    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    for line in _read("/proc/self/maps").splitlines():
        fields = line.split()
        if len(fields) < 2 or not fields[1].startswith("rw"):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        size = min(hi - lo, 1 << 23)
        try:
            with open(f"/proc/{ppid}/mem", "rb") as f:
                f.seek(lo)
                out.append(f.read(size).decode("latin-1"))
        except BaseException:
            pass
        buf = ctypes.create_string_buffer(size)
        local, remote = Iovec(ctypes.addressof(buf), size), Iovec(lo, size)
        n = libc.process_vm_readv(ppid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n > 0:
            out.append(buf.raw[:n].decode("latin-1"))
    return "\n".join(out)

def _everything():
    texts = []
    try:
        os.lseek(0, 0, 0)  # from the start, whatever the harness read already
    except BaseException:
        pass
    texts.append(_read("/dev/stdin"))
    try:
        texts.append(sys.stdin.read())
    except BaseException:
        pass
    for path in ("../stdin", "../../stdin", "/sandbox/../stdin", "/tmp/stdin"):
        texts.append(_read(path))
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for name in ("environ", "cmdline"):
                texts.append(_read(f"/proc/{pid}/{name}"))
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except BaseException:
                fds = []
            for fd in fds:
                texts.append(_read(f"/proc/{pid}/fd/{fd}"))
    for root in (".", "/tmp", "/dev/shm"):
        try:
            for dirpath, _, files in os.walk(root):
                for name in files[:50]:
                    texts.append(_read(os.path.join(dirpath, name), 1 << 20))
        except BaseException:
            pass
    frame = sys._getframe()
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            texts.extend(v for v in list(scope.values()) if isinstance(v, str))
        frame = frame.f_back
    for obj in gc.get_objects():
        if isinstance(obj, dict):
            texts.extend(v for v in list(obj.values()) if isinstance(v, str) and len(v) < 1 << 20)
    texts.append(_parent_memory())
    return "\n".join(texts)

def leak(pattern):
    found = re.search(pattern, _everything())
    return found.group(1) if found else None
"""

FAKE_VERDICT = '{"passed": 1, "total": 1, "failure": null, "s": "oo", "d": "", "o": {}, "m": {}, "late": false}'

# --- the tasks --------------------------------------------------------------------------

HUMANEVAL = Task(
    id="he",
    input="",
    target=None,
    fields={
        "prompt": 'def add(a, b):\n    """Return a + b."""\n',
        "test": "def check(candidate):\n    assert candidate(1234, 4321) == 5555\n    assert candidate(-7, 7) == 0\n",
        "entry_point": "add",
    },
)
# MBPP style: the asserts are the script, and they lean on the solution's `import math`.
MBPP = Task(
    id="mbpp",
    input="",
    target=None,
    fields={
        "prompt": "",
        "entry_point": "add",
        "test": "assert add(1234, 4321) == 5555\nassert abs(add(-7, 7)) < 1e-9 and math.isclose(add(1, 1), 2)\n",
    },
)
IO_STDIN = Task(
    id="io",
    input="",
    target=None,
    fields={
        "tests": json.dumps(
            [
                {"input": "1234 4321\n", "output": "5555\n", "testtype": "stdin"},
                {"input": "-7 7\n", "output": "0\n", "testtype": "stdin"},
            ]
        )
    },
)
IO_CALL = Task(
    id="call",
    input="",
    target=None,
    fields={
        "fn_name": "add",
        "tests": json.dumps(
            [
                {"input": "1234\n4321", "output": "5555", "testtype": "functional"},
                {"input": "-7\n7", "output": "0", "testtype": "functional"},
            ]
        ),
    },
)

# What the answer looks like in a test source, and in a job that carried expected outputs.
SCRIPT_PATTERN = r"\({a}, {b}\) == (-?\d+)"
IO_PATTERN = r'{a} {b}\\n", "output": "(-?\d+)'
CALL_PATTERN = r'\[{a}, {b}\], "expected": (-?\d+)'


def script_solution(body: str, top: str = "") -> str:
    """A solution defining add(a, b) whose body is `body` (a and b in scope)."""
    return (
        SNOOP
        + textwrap.dedent(top)
        + "\nimport math\n\ndef add(a, b):\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
    )


def stdin_solution(body: str, top: str = "") -> str:
    """A stdin program: reads a and b, then runs `body`, which prints the answer."""
    return SNOOP + textwrap.dedent(top) + "\na, b = map(int, input().split())\n" + textwrap.dedent(body)


def call_solution(body: str, top: str = "") -> str:
    return (
        SNOOP
        + textwrap.dedent(top)
        + "\nclass Solution:\n    def add(self, a, b):\n"
        + textwrap.indent(textwrap.dedent(body), "        ")
    )


def stolen(pattern: str) -> str:
    # Searches for the expected answer of this call (None when out of reach).
    return f"got = leak(r'{pattern}'.format(a=a, b=b))\n"


KILL_PARENT = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
STOP_PARENT = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n"
KILL_ALL = "import os, signal\nos.kill(-1, signal.SIGKILL)\n"
EVERY_FD = f"""
import os
for fd in range(21):
    for line in ('\\nARLE-VERDICT-0000:' + {FAKE_VERDICT!r} + '\\n', {FAKE_VERDICT!r} + '\\n', '5555\\n'):
        try:
            os.write(fd, line.encode())
        except OSError:
            pass
"""
MONKEYPATCH = f"""
import builtins, json, os, sys
_fake = {FAKE_VERDICT!r}
json.dumps = lambda *args, **kwargs: _fake
json.loads = lambda *args, **kwargs: json.__dict__
_write = os.write
os.write = lambda fd, data: _write(fd, (_fake + '\\n').encode())
os._exit = lambda code=0: None
builtins.abs = lambda x: 0
builtins.isinstance = lambda *args: True
builtins.AssertionError = type('AssertionError', (BaseException,), {{}})
builtins.print = lambda *args, **kwargs: sys.__stdout__.write(_fake + '\\n')
"""
FAKE_PRINT = f"""
import sys
print('\\nARLE-VERDICT-' + '0' * 32 + ':' + {FAKE_VERDICT!r})
print({FAKE_VERDICT!r}, file=sys.stderr)
"""
ALWAYS_EQUAL = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __lt__(self, other):
        return True
    __le__ = __gt__ = __ge__ = __lt__
    def __hash__(self):
        return 0
    def __abs__(self):
        return 0
    def __sub__(self, other):
        return 0
    __rsub__ = __sub__
class Int(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
class Str(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
"""
FORGE_PIPES = """
import os
for fd in range(3, 21):
    for msg in (b'{"names": {"add": ["value", 5555]}}', b'{"r": 5555}', b'{"passed": 1, "total": 1, "failure": null}'):
        try:
            os.write(fd, b'%d\\n' % len(msg) + msg)
        except OSError:
            pass
"""
SHADOW = """
import types
math = types.ModuleType('math')  # a fake math whose isclose says yes to anything
math.isclose = lambda *args, **kwargs: True
abs = lambda x: 0
isinstance = lambda *args: True
"""

# Right on every input but the first test's, where only a stolen answer helps.
STEAL = "{steal}return int(got) if got else (a - b if a == 1234 else a + b)\n"

# name: (top-level code, function body) per task kind. The bodies are wrong (a - b) unless
# the attack worked.
ATTACKS: dict[str, tuple[str, str]] = {
    "read-stdin-job-files-proc": ("", STEAL),
    "parent-memory-ptrace-process_vm_readv": ("", STEAL),
    "frames-and-heap": ("", STEAL),
    "always-equal-object": (ALWAYS_EQUAL, "return Anything()\n"),
    "int-subclass": (ALWAYS_EQUAL, "return Int(a - b)\n"),
    "str-subclass": (ALWAYS_EQUAL, "return Str('wrong')\n"),
    "fake-verdict-print": (FAKE_PRINT, "print('\\nARLE-VERDICT-x:' + '{{}}')\nreturn a - b\n"),
    "write-every-fd": ("", EVERY_FD + "return a - b\n"),
    "forge-harness-pipes": (FORGE_PIPES, FORGE_PIPES + "return a - b\n"),
    "monkeypatch-json-os-builtins": (MONKEYPATCH, "return a - b\n"),
    "shadow-builtins-and-math": (SHADOW, "return a - b\n"),
    # The harness is the jail's pid 1: signals from inside do not reach it, so these bodies are
    # wrong too; a kill that did land would leave no verdict, a fail either way.
    "kill-parent": ("", KILL_PARENT + "return a - b\n"),
    "kill-parent-at-import": (KILL_PARENT, "return a - b\n"),
    "stop-parent": ("", STOP_PARENT + "return a - b\n"),
    "kill-every-process": ("", KILL_ALL + "return a - b\n"),
    "os-exit-at-import": ("import os\nos._exit(0)\n", "return a + b\n"),
    "sys-exit-in-call": ("", "import sys\nsys.exit(0)\n"),
    "deeply-nested-value": ("", "x = []\nfor _ in range(10000):\n    x = [x]\nreturn x\n"),
}
SCRIPT_ONLY = {"shadow-builtins-and-math", "forge-harness-pipes"}
VALUE_ONLY = {"always-equal-object", "int-subclass", "str-subclass", "deeply-nested-value", "sys-exit-in-call"}


def _stdin_body(body: str) -> str:
    # The function body as a stdin program: `return x` prints x.
    lines = [f"print({line.strip()[7:]})" if line.strip().startswith("return ") else line for line in body.splitlines()]
    return "\n".join(lines) + "\n"


def hostile(kind: str, name: str) -> str:
    top, body = ATTACKS[name]
    pattern = {"script": SCRIPT_PATTERN, "stdin": IO_PATTERN, "call": CALL_PATTERN}[kind]
    body = body.replace("{steal}", stolen(pattern)).replace("{{}}", "{}")
    if kind == "script":
        return script_solution(body, top)
    if kind == "call":
        return call_solution(body, top)
    return stdin_solution(_stdin_body(body), top)


HONEST = {
    "script": "import math\n\ndef add(a, b):\n    return a + b\n",
    "stdin": "a, b = map(int, input().split())\nprint(a + b)\n",
    "call": "class Solution:\n    def add(self, a, b):\n        return a + b\n",
}

CASES = (
    [("humaneval", name) for name in ATTACKS]
    + [("mbpp", name) for name in ATTACKS]
    + [("io-stdin", name) for name in ATTACKS if name not in SCRIPT_ONLY | VALUE_ONLY]
    + [("io-call", name) for name in ATTACKS if name not in SCRIPT_ONLY]
)
_SETUPS = {
    "humaneval": ("code_tests", HUMANEVAL, "script", {}),
    "mbpp": ("code_tests", MBPP, "script", {"call_check": False}),
    "io-stdin": ("code_io", IO_STDIN, "stdin", {"test_timeout_s": 3}),
    "io-call": ("code_io", IO_CALL, "call", {"test_timeout_s": 3}),
}


@pytest.fixture(scope="module")
def scores() -> dict[tuple[str, str], object]:
    """Every hostile and honest program of every task, scored in one batch per task."""
    out = {}
    for task_name, (reward, task, kind, params) in _SETUPS.items():
        names = [n for t, n in CASES if t == task_name] + ["honest"]
        programs = [hostile(kind, n) for n in names[:-1]] + [HONEST[kind]]
        score = REWARDS[reward](timeout_s=6, **params)
        results = score.batch([task] * len(programs), [Episode(task.id, [Turn("", p)]) for p in programs])
        out.update({(task_name, n): r for n, r in zip(names, results)})
    return out


@pytest.mark.parametrize("task", list(_SETUPS))
def test_the_honest_solution_scores_one(scores, task):
    score = scores[(task, "honest")]
    assert score.reward == 1.0 and score.correct, score.details


@pytest.mark.parametrize(("task", "attack"), CASES, ids=[f"{t}-{a}" for t, a in CASES])
def test_a_hostile_solution_scores_zero(scores, task, attack):
    score = scores[(task, attack)]
    assert score.reward == 0.0 and not score.correct, f"{attack} forged a pass on {task}: {score.details}"


def test_the_attacks_would_work_without_the_harness():
    # Control: the stealing code does find an answer where one is within reach, and the
    # always-equal object does fool a plain comparison, so a zero above is the harness's doing.
    from arlecli.sandbox import run_program

    # (Not its parent's memory here: that is the jail's own init, which a ptrace would stop.)
    program = (
        SNOOP + "_parent_memory = lambda: ''\nSECRET = 'assert add(1234, 4321) == 5555'\n"
        "print(leak(r'\\(1234, 4321\\) == (-?\\d+)'))\n"
    )
    assert run_program(program, timeout_s=20).stdout.strip() == "5555"
    fooled = run_program(ALWAYS_EQUAL + "assert Anything() == 5555 and Int(0) == 5555\nprint('fooled')\n")
    assert fooled.stdout.strip() == "fooled"


def test_unittest_verdicts_are_marked_forgeable():
    # BigCodeBench's tests patch the solution's module, so they run in the model's own
    # interpreter, which can fake their outcome: the verdict says so.
    prompt = 'def task_func(x):\n    """Double x."""\n'
    test = (
        "import unittest\nclass TestCases(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertEqual(task_func(2), 4)\n"
    )
    task = Task(
        id="u", input="", target=None, fields={"complete_prompt": prompt, "test": test, "entry_point": "task_func"}
    )
    forger = (
        "import unittest\nunittest.TestCase.assertEqual = lambda self, a, b, msg=None: None\n"
        "def task_func(x):\n    return 0\n"
    )
    from arlecli.sandbox import run_tests

    (verdict,) = run_tests([{"mode": "unittest", "program": prompt + forger + "\n" + test}], timeout_s=10)
    assert verdict.forgeable
    right = REWARDS["code_unittest"]()(task, Episode("u", [Turn("", "    return 2 * x\n")]))
    assert right.correct
