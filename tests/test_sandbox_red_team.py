"""Holes a red-team pass over the harness found (2026-12-05), each a program that got a pass
for code that does not solve its task, or read what it must not: every one fails now, and a
control shows the same test still passes an honest solution.

1. The solution named a trusted-side function for the harness to bind as its answer, through
   another module (`enum.bltns.eval` is builtins' eval; `typing.contextlib.os.system`).
2. A StopIteration raised by the solution came back into the test as one: inside
   `all(map(candidate, ...))` or a `zip(map(...))` loop it ended the iteration, and the test passed.
3. The solution's process shared the jail's stderr, a file open read-write, where the harness
   writes the test's prints and compile warnings (expected values in them): `os.pread(2, ...)`.
4. io mode: the harness reopened each test's files by path, so a program that swapped its
   stdout file for a symlink made the harness read its own stdin (the job, the verdict marker).
"""

from __future__ import annotations

import sys

import pytest

from arlecli.sandbox import run_tests

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox's guarantees are Linux's")


def script(solution: str, test: str, entry_point: str) -> dict:
    return {"mode": "script", "solution": solution, "test": test, "prompt": "", "entry_point": entry_point}


# --- 1. binding a trusted function the solution names ---------------------------------

BIND_EVAL = """
import enum
def f(s):
    return 0
f.__module__, f.__qualname__ = "enum", "bltns.eval"
enum.bltns.eval = f
"""
BIND_SYSTEM = """
import typing
def f(s):
    return -1
f.__module__, f.__qualname__ = "typing", "contextlib.os.system"
typing.contextlib.os.system = f
"""
EVAL_TEST = 'def check(candidate):\n    assert candidate("6*7") == 42\n    assert candidate("2**10") == 1024\n'
SYSTEM_TEST = 'def check(candidate):\n    assert candidate("echo RAN-IN-THE-$((1+1))-HARNESS >&2; exit 0") == 0\n'

# --- 2. StopIteration into the test's iteration -----------------------------------------

STOP = "def is_prime(n):\n    raise StopIteration\n"
PRIME = "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n"
ALL_MAP = (
    "def check(candidate):\n    assert all(map(candidate, [2, 3, 5, 7, 11]))\n"
    "    assert not any(map(candidate, [1, 4, 6, 8, 9]))\n"
)
ZIP_MAP = (
    "def check(candidate):\n    inputs, outputs = [2, 4, 9, 13], [True, False, False, True]\n"
    "    for got, want in zip(map(candidate, inputs), outputs):\n        assert got == want\n"
)

# --- 3. reading back the harness's stderr -----------------------------------------------

READ_STDERR = """
import os, re
def f(x):
    print("HELLO-FROM-THE-SOLUTION", flush=True)
    try:
        data = os.pread(2, 1 << 16, 0).decode(errors="replace")
    except OSError:
        data = ""
    found = re.search(r"EXPECTED\\D+(\\d+)", data)
    return int(found.group(1)) if found else -1
"""
PRINTS = 'def check(candidate):\n    print("EXPECTED", 12345, flush=True)\n    assert candidate(7) == 12345\n'
# A compile-time SyntaxWarning prints the offending test line, expected value and all.
WARNS = (
    "def check(candidate):\n"
    '    assert candidate(7) is not None and candidate(7) is not "x"; EXPECTED = 12345\n'
    "    assert candidate(7) == 12345\n"
)

# --- 4. io mode: a symlink where the harness reads the output ------------------------------

SWAP_OUTPUT = r"""
import gc, os, re, sys
if sys.stdin.read().strip() == "1":
    out = os.readlink("/proc/self/fd/1")
    try:
        os.unlink(out)
        os.symlink("/proc/1/fd/0", out)
    except OSError:
        pass
    sys.exit(0)
marker = re.compile("ARLE" + "-VERDICT-[0-9a-f]{32}")
found = set()
for obj in gc.get_objects():
    if isinstance(obj, str):
        found.update(marker.findall(obj))
frame = sys._getframe()
while frame is not None:
    found.update(m for v in frame.f_locals.values() if isinstance(v, str) for m in marker.findall(v))
    frame = frame.f_back
print("LEAKED " + " ".join(m[::-1] for m in found))
"""


def test_every_hole_fails_and_the_honest_solutions_pass():
    jobs = {
        "bind-eval": script(BIND_EVAL, EVAL_TEST, "f"),
        "bind-system": script(BIND_SYSTEM, SYSTEM_TEST, "f"),
        "stop-all-map": script(STOP, ALL_MAP, "is_prime"),
        "stop-zip-map": script(STOP, ZIP_MAP, "is_prime"),
        "stderr-prints": script(READ_STDERR, PRINTS, "f"),
        "stderr-warning": script(READ_STDERR, WARNS, "f"),
        "io-symlink": {
            "mode": "io",
            "program": SWAP_OUTPUT + "\n#" + "x" * 5000 + "\n",
            "tests": [{"kind": "stdin", "input": "1\n", "output": ""}, {"kind": "stdin", "input": "2\n", "output": ""}],
            "test_timeout_s": 5,
            "stop_on_failure": False,
        },
        "honest-all-map": script(PRIME, ALL_MAP, "is_prime"),
        "honest-zip-map": script(PRIME, ZIP_MAP, "is_prime"),
        "honest-prints": script("def f(x):\n    return 12345\n", PRINTS, "f"),
    }
    verdicts = dict(zip(jobs, run_tests(list(jobs.values()), timeout_s=20, workers=2)))
    for name in ("bind-eval", "bind-system", "stop-all-map", "stop-zip-map", "stderr-prints", "stderr-warning"):
        v = verdicts[name]
        assert v.status == "failed" and v.passed == 0, (name, v.failure, v.result.stderr[-500:])
    assert "RAN-IN-THE-2-HARNESS" not in verdicts["bind-system"].result.stderr  # os.system never ran
    assert "RuntimeError: StopIteration" in verdicts["stop-all-map"].failure["message"]
    # The solution's own prints still reach the run's stderr (relayed), the harness's are out of its reach.
    assert "HELLO-FROM-THE-SOLUTION" in verdicts["stderr-prints"].result.stderr
    io = verdicts["io-symlink"]
    assert "-VERDICT-" not in io.result.stdout.replace(io.result.stdout.strip().split(":")[0], "")
    assert "TCIDREV" not in io.result.stdout + io.result.stderr + str(io.failure)  # the marker, reversed
    for name in ("honest-all-map", "honest-zip-map", "honest-prints"):
        v = verdicts[name]
        assert v.status == "passed" and v.passed == v.total, (name, v.failure, v.result.stderr[-500:])


# --- 5. EvalPlus's float checks: numpy bound, and no answer of another shape -----------------

EVALPLUS_ASSERTION = """import numpy as np

def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    return False

def assertion(out, exp, atol):
    exact_match = out == exp
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        {check}
    else:
        assert exact_match
"""
HUMANEVAL_PLUS = EVALPLUS_ASSERTION.format(check="np.testing.assert_allclose(out, exp, atol=atol)") + (
    "\ndef check(candidate):\n    for inp, exp in zip([[1], [0.5], [2.25]], [6.283185307179586, 3.141592653589793, "
    "14.137166941154069]):\n        assertion(candidate(*inp), exp, 0)\n"
)
MBPP_PLUS = EVALPLUS_ASSERTION.format(check="assert np.allclose(out, exp, rtol=1e-07, atol=atol)") + (
    "\nfor inp, exp in zip([[1], [0.5], [2.25]], [6.283185307179586, 3.141592653589793, 14.137166941154069]):\n"
    "    assertion(circle_perimeter(*inp), exp, 0)\n"
)


def test_evalplus_float_checks_bind_numpy_and_refuse_an_empty_answer():
    """EvalPlus's tests import numpy (bound into the jail from the task's own imports: without it
    every answer failed) and compare floats with np.allclose / assert_allclose, which broadcast:
    `return []` passed every float test. Now an answer of another shape fails first."""
    import arlecli.rewards.code  # noqa: F401  (registers the code rewards)
    from arlecli.rewards import REWARDS
    from arlecli.types import Episode, Task, Turn

    honest = "```python\nimport math\ndef circle_perimeter(r):\n    return 2 * math.pi * r\n```"
    empty = "```python\ndef circle_perimeter(r):\n    return []\n```"
    cards = {
        "humaneval_plus": ({"prompt": "", "test": HUMANEVAL_PLUS, "entry_point": "circle_perimeter"}, {}),
        "mbpp_plus": ({"prompt": "", "test": MBPP_PLUS, "entry_point": "circle_perimeter"}, {"call_check": False}),
    }
    for name, (fields, params) in cards.items():
        task = Task(id=name, input="", target=None, fields=fields)
        score = REWARDS["code_tests"](timeout_s=20, **params)
        right, wrong = score.batch([task, task], [Episode(name, [Turn("", c)]) for c in (honest, empty)])
        assert right.reward == 1.0 and right.correct, (name, right.details)
        assert wrong.reward == 0.0 and not wrong.correct, (name, wrong.details)
        assert "shape (0,) is not the expected ()" in str(wrong.details), (name, wrong.details)


# --- 6. io mode: the per-test limit holds against work carried between tests ----------------

CARRY_OVER = r"""
import gc, os, sys, time
def solve(n):
    if n >= 100:  # the too-slow algorithm: over the per-test limit
        start = time.time()
        while time.time() - start < 2.0:
            pass
    return n * 2
n = int(sys.stdin.read())
if not os.path.exists("helper-started"):
    open("helper-started", "w").close()
    todo = [int(t["input"]) for o in gc.get_objects() if isinstance(o, list)
            for t in o if isinstance(t, dict) and t.get("kind") == "stdin"]
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()  # out of the test's process group: it outlived the test
        os.write(w, b"x")
        for k in todo:
            if k >= 100:
                open("part", "w").write(str(solve(k)))
                os.rename("part", "answer-%d" % k)
        os._exit(0)
    os.read(r, 1)
if n < 100:
    print(solve(n), flush=True)
    time.sleep(1.2)  # lends the rest of its time to the helper
else:
    while not os.path.exists("answer-%d" % n):
        time.sleep(0.01)
    print(open("answer-%d" % n).read())
"""


def test_io_tests_start_from_nothing_an_earlier_test_left():
    """A test's child that leaves its process group (setsid) worked on later tests' inputs in the
    background and left answers in files: the per-test limit became a limit on the total. Every
    process but the harness is killed and the files tests wrote are removed between tests."""
    import json

    import arlecli.rewards.code  # noqa: F401  (registers the code rewards)
    from arlecli.rewards import REWARDS
    from arlecli.types import Episode, Task, Turn

    tests = [{"input": f"{k}\n", "output": f"{2 * k}\n", "testtype": "stdin"} for k in (1, 2, 100)]
    task = Task(id="io", input="", target=None, fields={"tests": json.dumps(tests)})
    fast = "import sys\nn = int(sys.stdin.read())\nprint(n * 2)\n"
    writes_files = "import os, sys\nn = int(sys.stdin.read())\nopen('scratch-%d' % n, 'w').write('x')\nprint(n * 2)\n"
    score = REWARDS["code_io"](test_timeout_s=1.5, timeout_s=30, workers=1)
    results = score.batch(
        [task] * 3, [Episode("io", [Turn("", f"```python\n{p}```")]) for p in (CARRY_OVER, fast, writes_files)]
    )
    attack, honest, scratch = results
    assert attack.reward == 0.0 and "test 2" in str(attack.details), attack.details
    assert honest.reward == 1.0 and scratch.reward == 1.0, (honest.details, scratch.details)


def test_many_short_outputs_still_fit_the_verdict_line():
    """The outputs sent back "while they fit" were counted 2 characters short each: 200 tests of a
    one-letter answer overflowed the jail's 4 KB of stdout, and an honest program had no verdict."""
    import json

    import arlecli.rewards.code  # noqa: F401  (registers the code rewards)
    from arlecli.rewards import REWARDS
    from arlecli.types import Episode, Task, Turn

    tests = [{"input": f"{k}\n", "output": "x\n", "testtype": "stdin"} for k in range(200)]
    task = Task(id="io", input="", target=None, fields={"tests": json.dumps(tests)})
    reward = REWARDS["code_io"](test_timeout_s=5, timeout_s=120, workers=1)
    score = reward(task, Episode("io", [Turn("", "print('x')\n")]))
    assert score.reward == 1.0, score.details
