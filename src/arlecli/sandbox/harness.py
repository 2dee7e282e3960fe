"""The test harness: verdicts on model-written programs that the programs cannot forge.

Threat model. Under RL training the model is rewarded for whatever makes its tests say
"pass", so its code is assumed to be written to cheat: to read the expected answers, to
monkeypatch whatever reports the verdict (json.dumps, os.write, builtins), to walk stack
frames or the heap for secrets, to return objects whose __eq__ always says True, to print
a fake verdict, or to exit or kill its way out. The jail (`jail`) keeps the program away
from the host; this module keeps it away from the verdict. One program runs per jail:
`_resources/harness_main.py`, stdlib only, which reads its job on stdin in two parts: a
public part (what the model's code may see: its own source, test inputs) and, after the
model's code has been forked off, a secret part (test source, prompt, the verdict's random
marker). It prints the verdict, tagged with the marker, on a copy of stdout no model
process holds.

Modes:

- "io" (code_io cards: LiveCodeBench, APPS, ...): expected outputs never enter the jail.
  The job holds the inputs only (stdin text, or call arguments with `fn_name` and a
  prelude). Each test runs in a forked child, on files the harness holds open (no path the
  child could swap for a symlink), and starts from nothing an earlier test left (every other
  process killed, the files tests wrote removed); back come, per test, a status (ran, timed
  out, raised, returned something that is not plain data), a digest of its output and,
  while they fit in the jail's captured stdout, the outputs themselves: stdout text, or
  the return value as tagged plain data (see `to_plain`). `run_tests` compares them here,
  outside the jail, as LiveCodeBench does (`same_output`, `same_value`). An output too
  long to come back is compared by digest, which is exact up to numbers equal as
  decimals: `float_tol` then does not apply to it. The harness cannot tell right from
  wrong, so it stops early only at a crash or timeout; `stop_on_failure` is applied to
  the counts here. Jobs of more than `IO_TESTS_PER_JOB` tests run as several jails, each
  with the whole `timeout_s`.
- "script" (HumanEval's `check(candidate)`, MBPP's asserts): the verdict is decided in
  a process the model's code never runs in. Inside the jail the harness (T) forks the
  solution's process (M) before it reads the secret part, and makes itself undumpable
  (M, same uid, no capabilities, cannot ptrace it or read its /proc memory, fds or
  environment). M closes every fd but its pipes, prints (stdout and stderr) into a pipe T
  relays to the jail's stderr (never the file itself: T writes the test's prints there),
  drops what privileges remain, runs the solution as __main__ and reports its top-level
  names; T runs the prompt (trusted dataset text, for helpers such as HumanEval/38's
  `encode_cyclic`), binds the names the test uses (functions as proxies that call into
  M; modules and a bindable module's own public functions and classes by importing them
  itself, never through another module or a private name; plain values by value; never
  over a builtin, nor over one of the prompt's helpers other than the entry point), runs
  the test source and `check(entry_point)`. Calls cross as plain data; an exception in M
  comes back as the builtin exception of that name (else RuntimeError; StopIteration too,
  which would end the test's own iteration).
  Costs: arguments and return values must be plain data, so a solution that returns an
  instance of a class it defines (or numpy values) fails; a test that passes such objects
  to the solution fails; in-place changes the solution makes to its arguments are not
  seen by the test; a test that reaches the solution's names by other means than their
  names in its source (globals(), eval) does not find them.
- "unittest" (BigCodeBench): the tests patch the solution's module, so they must run in
  the model's interpreter: M runs them and reports the counts, which T only checks for
  shape. THIS VERDICT CAN BE FORGED by code written to cheat (it can report passes it
  did not earn); every other mode's cannot. `run_tests` marks these verdicts
  `forgeable=True`.

In every mode an early exit (`sys.exit(0)`, `os._exit(0)`), killing the harness or
ending M fails the program: no verdict, or a failure, never a pass.
"""

from __future__ import annotations

import decimal
import json
import math
import secrets
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Sequence

from arlecli.safeio import clean_text
from arlecli.sandbox._resources.harness_main import (
    DIGEST_HEX,
    NotPlainData,
    as_json,
    canonical_output,
    dumps_plain,
    loads_plain,
    output_digest,
    value_digest,
)
from arlecli.sandbox.jail import SandboxResult, run_programs

IO_TESTS_PER_JOB = 250  # a status letter and a digest each must fit the jail's 4 KB of stdout
_LINE_BUDGET = 3900  # characters of the io result, under the jail's OUTPUT_LIMIT_BYTES
FORGEABLE_MODES = frozenset({"unittest"})

# The plain-data helpers belong to the program (`_resources/harness_main.py`); named here for the host.
__all__ = [
    "DIGEST_HEX",
    "FORGEABLE_MODES",
    "IO_TESTS_PER_JOB",
    "HarnessVerdict",
    "NotPlainData",
    "as_json",
    "canonical_output",
    "dumps_plain",
    "loads_plain",
    "output_digest",
    "run_tests",
    "same_number",
    "same_output",
    "same_value",
    "value_digest",
]


# The sandboxed program is a file of its own, `_resources/harness_main.py` (stdlib only): its
# text is what runs in every jail. The host takes the plain-data helpers from it, so both sides
# encode, decode and digest the same way; the host only ever reads its own packaged copy.
_HARNESS = files("arlecli.sandbox._resources").joinpath("harness_main.py").read_text(encoding="utf-8")


@dataclass
class HarnessVerdict:
    """The harness's verdict on one job, with the raw sandbox result.

    status is "passed" (every test passed, and there was at least one), "timeout" (the
    sandbox or a test ran out of time) or "failed". `failure` describes the first failed
    test: kind (compile_error, runtime_error, wrong_answer, timeout, exit, test_failed,
    no_tests, not_plain_data, solution_died, protocol_error, prompt_error, no_verdict,
    harness_error), its index or id as "test", and a short "message". `forgeable` is True
    for verdicts the program itself reported (unittest mode): code written to cheat can
    forge those.
    """

    status: str
    passed: int
    total: int
    failure: dict[str, Any] | None
    result: SandboxResult
    forgeable: bool = False


def run_tests(
    jobs: Sequence[dict[str, Any]],
    *,
    workers: int | None = None,
    timeout_s: float = 10.0,
    memory_mb: int = 2048,
    max_file_mb: int = 16,
    max_procs: int = 256,
) -> list[HarnessVerdict]:
    """Run each job under the test harness in its own jail (see the module docstring).

    Jobs:
      - {"mode": "script", "solution", "test", "prompt"?, "entry_point"?}: the solution
        runs in its own process; the test source (and, with an entry point, `check(entry
        point)`) runs in the harness's after the prompt.
      - {"mode": "unittest", "program", "test_class"?}: solution + unittest source.
      - {"mode": "io", "program", "tests", "fn_name"?, "prelude"?, "test_timeout_s",
        "stop_on_failure"?, "float_tol"?}: tests are {"kind": "stdin", "input", "output"}
        or {"kind": "call", "args", "expected", "unwrap"?}; only inputs enter the jail.
    Any job may carry "packages": installed packages its programs may import (see
    `jail.run_program`; from trusted text only, never from the program).
    `timeout_s` bounds one jail; the harness stops starting tests a second before it.
    """
    budget = max(0.5, timeout_s - 1.0)
    stdins: list[str] = []
    owners: list[tuple[int, int]] = []  # (job index, first test) of each jail run
    markers: list[str] = []
    for index, job in enumerate(jobs):
        for first, public, secret in split_job(job, budget):
            marker = f"ARLE-VERDICT-{secrets.token_hex(16)}:"
            # The public part is length-prefixed, so the harness can read exactly it and
            # not one byte of the secret part before the model's process forks off.
            head = json.dumps(public)
            stdins.append(f"{len(head)}\n{head}{json.dumps({**secret, 'marker': marker})}")
            owners.append((index, first))
            markers.append(marker)
    # The harness writes each test's input to a file, so the file limit must admit the
    # largest one on top of what the program itself may write.
    largest = max((len(t.get("input", "")) for job in jobs for t in job.get("tests", [])), default=0)
    file_mb = max_file_mb + math.ceil(largest * 4 / (1024 * 1024))
    results = run_programs(
        [_HARNESS] * len(stdins),
        workers=workers,
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        max_file_mb=file_mb,
        max_procs=max_procs,
        stdins=stdins,
        packages=[tuple(jobs[index].get("packages") or ()) for index, _ in owners],
    )
    runs: list[list[tuple[int, SandboxResult, dict[str, Any] | None]]] = [[] for _ in jobs]
    for (index, first), result, marker in zip(owners, results, markers):
        runs[index].append((first, result, _read_verdict(result, marker)))
    verdicts = [
        _io_verdict(job, parts) if job.get("mode") == "io" else _verdict(job, *parts[0])
        for job, parts in zip(jobs, runs)
    ]
    for verdict in verdicts:  # messages quote the program's names: a lone surrogate is not text
        if verdict.failure and isinstance(verdict.failure.get("message"), str):
            verdict.failure["message"] = clean_text(verdict.failure["message"])
    return verdicts


def split_job(job: dict[str, Any], budget: float) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(first test, public part, secret part) of each jail run a job needs: the public part
    enters the jail, the secret part (expected outputs, tests) stays with the harness."""
    mode = job.get("mode")
    if mode == "script":
        public = {"mode": "script", "program": job["solution"], "budget_s": budget}
        secret = {"test": job["test"], "prompt": job.get("prompt") or "", "entry_point": job.get("entry_point")}
        return [(0, public, secret)]
    if mode == "unittest":
        return [
            (
                0,
                {
                    "mode": "unittest",
                    "program": job["program"],
                    "test_class": job.get("test_class"),
                    "budget_s": budget,
                },
                {},
            )
        ]
    if mode != "io":
        raise ValueError(f"unknown harness mode {mode!r}")
    tests = job["tests"]
    inputs = [
        {"kind": "stdin", "input": t.get("input", "")} if t["kind"] == "stdin" else {"kind": "call", "args": t["args"]}
        for t in tests
    ]
    parts: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
    for first in range(0, max(len(inputs), 1), IO_TESTS_PER_JOB):
        public = {
            "mode": "io",
            "program": job["program"],
            "tests": inputs[first : first + IO_TESTS_PER_JOB],
            "fn_name": job.get("fn_name"),
            "prelude": job.get("prelude"),
            "test_timeout_s": job["test_timeout_s"],
            "stop_on_failure": job.get("stop_on_failure", True),
            "budget_s": budget,
            "line_budget": _LINE_BUDGET,
        }
        parts.append((first, public, {}))
    return parts


def _read_verdict(result: SandboxResult, marker: str) -> dict[str, Any] | None:
    # Exactly one marked line: the harness writes one; a second can only be a forgery.
    if result.stdout.count(marker) != 1:
        return None
    try:
        data = json.loads(result.stdout[result.stdout.index(marker) + len(marker) :].splitlines()[0])
    except (ValueError, IndexError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _no_verdict(result: SandboxResult, total: int, forgeable: bool = False) -> HarnessVerdict:
    if result.status == "timeout":
        return HarnessVerdict(
            "timeout",
            0,
            total,
            {"kind": "timeout", "message": f"timed out after {result.duration_s:.1f}s"},
            result,
            forgeable,
        )
    return HarnessVerdict(
        "failed",
        0,
        total,
        {"kind": "no_verdict", "message": "the program ended the harness before the tests finished"},
        result,
        forgeable,
    )


def _verdict(job: dict[str, Any], _first: int, result: SandboxResult, data: dict[str, Any] | None) -> HarnessVerdict:
    forgeable = job.get("mode") in FORGEABLE_MODES
    if data is None:
        return _no_verdict(result, 1, forgeable)
    passed, total, failure = data.get("passed"), data.get("total"), data.get("failure")
    if type(passed) is not int or type(total) is not int or not isinstance(failure, (dict, type(None))):
        return _no_verdict(result, 1, forgeable)
    if failure is None and passed == total and total > 0:
        status = "passed"
    elif (failure or {}).get("kind") == "timeout":
        status = "timeout"
    else:
        status = "failed"
    return HarnessVerdict(status, passed, total, failure, result, forgeable)


def _io_verdict(job: dict[str, Any], parts: list[tuple[int, SandboxResult, dict[str, Any] | None]]) -> HarnessVerdict:
    """Compare each test's output with the expected one, here, outside the jail."""
    tests = job["tests"]
    tol = float(job.get("float_tol") or 0.0)
    stop = job.get("stop_on_failure", True)
    passed, failure, result = 0, None, parts[0][1]
    for first, run, data in parts:
        chunk = tests[first : first + IO_TESTS_PER_JOB]
        outcomes = _io_outcomes(chunk, run, data, tol)
        for i, why in enumerate(outcomes):
            if why is None:
                if failure is None or not stop:
                    passed += 1
                continue
            if failure is None:
                failure, result = {**why, "test": first + i}, run
        if failure is not None and stop:
            break
    if not tests:
        return HarnessVerdict("failed", 0, 0, {"kind": "no_tests", "message": "no tests"}, result)
    status = (
        "passed"
        if failure is None and passed == len(tests)
        else ("timeout" if (failure or {}).get("kind") == "timeout" else "failed")
    )
    return HarnessVerdict(status, passed, len(tests), failure, result)


def _io_outcomes(
    tests: list[dict[str, Any]], run: SandboxResult, data: dict[str, Any] | None, tol: float
) -> list[dict[str, Any] | None]:
    """None (passed) or a failure dict for each test of one jail run."""
    if data is None:
        nothing = _no_verdict(run, len(tests)).failure
        return [nothing] * len(tests)
    if isinstance(data.get("failure"), dict):  # the program did not compile, or the harness broke
        whole = data["failure"]
        return [{"kind": str(whole.get("kind")), "message": str(whole.get("message"))}] * len(tests)
    statuses, digests = data.get("s"), data.get("d")
    texts, messages = data.get("o"), data.get("m")
    if not (
        isinstance(statuses, str)
        and isinstance(digests, str)
        and isinstance(texts, dict)
        and isinstance(messages, dict)
        and len(digests) == DIGEST_HEX * len(statuses) <= DIGEST_HEX * len(tests)
    ):
        return [{"kind": "no_verdict", "message": "the harness's results were malformed"}] * len(tests)
    out: list[dict[str, Any] | None] = []
    for i, test in enumerate(tests):
        if i >= len(statuses):
            why = "the time budget ran out" if data.get("late") else "not run after an earlier test failed"
            out.append({"kind": "timeout" if data.get("late") else "not_run", "message": why})
            continue
        status, message = statuses[i], str(messages.get(str(i), ""))
        if status == "t":
            out.append({"kind": "timeout", "message": message or "timed out"})
        elif status == "e":
            out.append({"kind": "runtime_error", "message": message or "the program failed"})
        elif status == "p":
            out.append({"kind": "not_plain_data", "message": message or "the return value is not plain data"})
        elif status == "o":
            text = texts.get(str(i))
            out.append(
                _compare(
                    test, text if isinstance(text, str) else None, digests[i * DIGEST_HEX : (i + 1) * DIGEST_HEX], tol
                )
            )
        else:
            out.append({"kind": "no_verdict", "message": "the harness's results were malformed"})
    return out


def _compare(test: dict[str, Any], text: str | None, digest: str, tol: float) -> dict[str, Any] | None:
    """None when the output (its text, or else its digest) matches the expected one."""
    if test["kind"] == "stdin":
        want = test["output"]
        if text is not None:
            if same_output(text, want, tol):
                return None
            shown = f"expected {_clip(want)!r}, got {_clip(text)!r}"
        else:
            if output_digest(want) == digest:
                return None
            shown = f"expected {_clip(want)!r}, got a different (long) output"
        return {"kind": "wrong_answer", "message": shown}
    want = test["expected"]
    wants = [want] + ([want[0]] if test.get("unwrap") and isinstance(want, list) and len(want) == 1 else [])
    if text is not None:
        try:
            got = as_json(loads_plain(text))
        except (ValueError, TypeError, RecursionError):
            return {"kind": "not_plain_data", "message": "the return value is not plain data"}
        if any(same_value(got, w, tol) for w in wants):
            return None
        shown = f"expected {_clip(json.dumps(want))}, got {_clip(json.dumps(got))}"
    else:
        if any(value_digest(w) == digest != "nan" for w in wants):
            return None
        shown = f"expected {_clip(json.dumps(want))}, got a different (long) value"
    return {"kind": "wrong_answer", "message": shown}


def _clip(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-n // 2 :]


def same_number(a: str, b: str, tol: float) -> bool:
    """Two tokens equal as finite decimals, or within `tol` (relative beyond 1)."""
    try:
        x, y = decimal.Decimal(a), decimal.Decimal(b)
    except (decimal.InvalidOperation, ValueError):
        return False
    if not (x.is_finite() and y.is_finite()):
        return False
    if x == y:
        return True
    return tol > 0 and abs(float(x) - float(y)) <= tol * max(1.0, abs(float(y)))


def same_output(got: str, want: str, tol: float) -> bool:
    """LiveCodeBench's comparison: line by line after stripping, then token by token, with
    numbers equal as decimals (or within tol)."""
    got_lines = [line.strip() for line in got.strip().splitlines()]
    want_lines = [line.strip() for line in want.strip().splitlines()]
    if got_lines == want_lines:
        return True
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines):
        if g == w:
            continue
        gt, wt = g.split(), w.split()
        if len(gt) != len(wt) or not all(x == y or same_number(x, y, tol) for x, y in zip(gt, wt)):
            return False
    return True


def same_value(got: Any, want: Any, tol: float) -> bool:
    """A return value (as JSON carries it, see `as_json`) against the expected one: numbers
    by value (floats within tol), lists and dicts element by element."""
    if isinstance(got, bool) or isinstance(want, bool):
        return got == want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        if got == want:
            return True
        return tol > 0 and isinstance(got, float) and math.isclose(got, want, rel_tol=tol, abs_tol=tol)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same_value(g, w, tol) for g, w in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k], tol) for k in want)
    return got == want
