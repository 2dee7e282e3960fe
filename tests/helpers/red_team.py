"""The red-team pass's hostile programs (2026-12-05: tests/test_sandbox_red_team.py's module doc
names each hole) as sandbox jobs, with what their verdicts must show: run as root in that file and as
uid 65534 in tests/test_sandbox_attacks.py."""

from __future__ import annotations

from typing import Any


def script(solution: str, test: str, entry_point: str) -> dict:
    """A script-mode job: `solution`'s `entry_point` checked by `test`'s `check`."""
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


def jobs() -> dict[str, dict]:
    """Each hole's program as a `run_tests` job, and honest controls for the same tests."""
    return {
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


def summary(verdict: Any) -> dict[str, Any]:
    """What `check` reads of a verdict, as JSON (a verdict from another process comes back so)."""
    return {
        "status": verdict.status,
        "passed": verdict.passed,
        "total": verdict.total,
        "failure": verdict.failure,
        "stdout": verdict.result.stdout,
        "stderr": verdict.result.stderr,
    }


def check(verdicts: dict[str, dict[str, Any]]) -> None:
    """Every hole failed and scored nothing, nothing it reached for leaked, the controls passed."""
    for name in ("bind-eval", "bind-system", "stop-all-map", "stop-zip-map", "stderr-prints", "stderr-warning"):
        v = verdicts[name]
        assert v["status"] == "failed" and v["passed"] == 0, (name, v["failure"], v["stderr"][-500:])
    assert "RAN-IN-THE-2-HARNESS" not in verdicts["bind-system"]["stderr"]  # os.system never ran
    assert "RuntimeError: StopIteration" in verdicts["stop-all-map"]["failure"]["message"]
    # The solution's own prints still reach the run's stderr (relayed), the harness's are out of its reach.
    assert "HELLO-FROM-THE-SOLUTION" in verdicts["stderr-prints"]["stderr"]
    io = verdicts["io-symlink"]
    assert "-VERDICT-" not in io["stdout"].replace(io["stdout"].strip().split(":")[0], "")
    assert "TCIDREV" not in io["stdout"] + io["stderr"] + str(io["failure"])  # the marker, reversed
    for name in ("honest-all-map", "honest-zip-map", "honest-prints"):
        v = verdicts[name]
        assert v["status"] == "passed" and v["passed"] == v["total"], (name, v["failure"], v["stderr"][-500:])
