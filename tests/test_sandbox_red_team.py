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
from helpers import red_team

from arlecli.sandbox import run_tests

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox's guarantees are Linux's")


def test_every_hole_fails_and_the_honest_solutions_pass():
    """As root here; tests/test_sandbox_attacks.py runs the same jobs as uid 65534."""
    jobs = red_team.jobs()
    verdicts = run_tests(list(jobs.values()), timeout_s=20, workers=2)
    red_team.check({name: red_team.summary(v) for name, v in zip(jobs, verdicts)})


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
