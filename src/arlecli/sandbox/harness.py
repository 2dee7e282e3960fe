"""The test harness: verdicts on model-written programs run in the jail (see `jail`)."""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any, Sequence

from arlecli.sandbox.jail import SandboxResult, run_programs


# The test harness: the sandboxed program of `run_tests`. It reads its job from stdin
# (JSON: mode, program, tests, limits, marker) and prints one verdict line. Stdlib only.
_HARNESS = r'''
import decimal, json, linecache, math, os, sys, tempfile, threading, time, traceback, types

FILENAME = "solution.py"
MSG = 300  # characters of any message in the verdict, which must fit the captured tail


def clip(text, n=MSG):
    text = str(text)
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-n // 2 :]


def compile_program(source):
    # Registered in linecache so tracebacks show the program's lines, not the harness's.
    linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
    return compile(source, FILENAME, "exec")


def fresh_main():
    # A real __main__ module, so pickling functions the program defines works.
    module = types.ModuleType("__main__")
    module.__file__ = FILENAME
    sys.modules["__main__"] = module
    return module.__dict__


def print_error(exc):
    # Only the program's frames: the harness's are noise in an error report.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
        tb = tb.tb_next
    if tb is None and not isinstance(exc, SyntaxError):
        tb = exc.__traceback__  # raised outside the program's own lines
    traceback.print_exception(type(exc), exc, tb)
    sys.stderr.flush()
    return clip("".join(traceback.format_exception_only(type(exc), exc)).strip())


def exec_program(source, namespace):
    """None when the program compiled and ran to its end, else a failure dict."""
    try:
        compiled = compile_program(source)
    except (SyntaxError, ValueError) as exc:
        return {"kind": "compile_error", "message": print_error(exc)}
    try:
        exec(compiled, namespace)
    except SystemExit as exc:
        return {"kind": "exit", "message": f"the program called exit({exc.code!r}) before the tests ran"}
    except BaseException as exc:
        return {"kind": "runtime_error", "message": print_error(exc)}
    return None


def run_script(job):
    failure = exec_program(job["program"], fresh_main())
    return {"passed": int(failure is None), "total": 1, "failure": failure}


def run_unittest(job):
    import unittest

    namespace = fresh_main()
    failure = exec_program(job["program"], namespace)
    if failure:
        return {"passed": 0, "total": 1, "failure": failure}
    case = namespace.get(job.get("test_class") or "TestCases")
    if not (isinstance(case, type) and issubclass(case, unittest.TestCase)):
        return {"passed": 0, "total": 1, "failure": {"kind": "no_tests", "message": "no TestCase class"}}
    result = unittest.TestResult()
    unittest.TestLoader().loadTestsFromTestCase(case).run(result)
    bad = result.failures + result.errors
    for test, text in bad:
        print(f"FAIL: {test.id()}\n{text}", file=sys.stderr)
    total = max(result.testsRun, 1)
    failure = None
    if bad or not result.testsRun:
        test, text = bad[0] if bad else (None, "no tests ran")
        failure = {"kind": "test_failed", "test": test.id() if test else None,
                   "message": clip(text.strip().splitlines()[-1] if text.strip() else text)}
    return {"passed": result.testsRun - len(bad), "total": total, "failure": failure}


def same_number(a, b, tol):
    try:
        x, y = decimal.Decimal(a), decimal.Decimal(b)
    except (decimal.InvalidOperation, ValueError):
        return False
    if not (x.is_finite() and y.is_finite()):
        return False
    if x == y:
        return True
    return tol > 0 and abs(float(x) - float(y)) <= tol * max(1.0, abs(float(y)))


def same_output(got, want, tol):
    # Line by line after stripping, as LiveCodeBench compares; then token by token, with
    # numbers equal as decimals (or within tol).
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


def same_value(got, want, tol):
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


def jsonable(value):
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


def resolve(namespace, name):
    # LeetCode style (a method of `Solution`) first, then a top-level function.
    cls = namespace.get("Solution")
    if isinstance(cls, type) and hasattr(cls, name):
        return getattr(cls(), name)
    if callable(namespace.get(name)):
        return namespace[name]
    raise NameError(f"the program defines no function or Solution method named {name!r}")


def redirect(path, fd, flags):
    new = os.open(path, flags, 0o600)
    os.dup2(new, fd)
    os.close(new)


def child(compiled, prelude, test, files, fn_name):
    """Runs in the forked child: one test, verdict by exit status and files."""
    redirect(files["in"], 0, os.O_RDONLY)
    redirect(files["out"], 1, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    redirect(files["err"], 2, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    sys.stdin = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    namespace = fresh_main()
    status = 0
    try:
        if prelude is not None and test["kind"] == "call":
            exec(prelude, namespace)
        exec(compiled, namespace)
        if test["kind"] == "call":
            result = resolve(namespace, fn_name)(*test["args"])
            with open(files["result"], "w", encoding="utf-8") as f:
                json.dump(result, f, default=jsonable)
        for thread in threading.enumerate():  # programs that run main() in a big-stack thread
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
    except SystemExit as exc:
        status = 0 if exc.code in (None, 0) else 1
        if status:
            print(f"exit({exc.code!r})", file=sys.stderr)
    except BaseException as exc:
        print_error(exc)
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        status = 1
    return status


def run_child(fn, timeout_s):
    """Fork, run fn in the child, wait up to timeout_s; the exit code, or None on timeout."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(VERDICT_FD)  # the child must not be able to write a verdict
            code = fn()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    delay = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def run_case(compiled, prelude, test, files, job, timeout_s):
    with open(files["in"], "w", encoding="utf-8") as f:
        f.write(test.get("input", "") if test["kind"] == "stdin" else "")
    if os.path.exists(files["result"]):
        os.remove(files["result"])
    code = run_child(lambda: child(compiled, prelude, test, files, job.get("fn_name")), timeout_s)
    if code is None:
        return {"kind": "timeout", "message": f"no answer within {timeout_s:.1f}s"}
    if code != 0:
        err = read_text(files["err"]).strip()
        return {"kind": "runtime_error", "message": clip(err.splitlines()[-1] if err else f"exit status {code}")}
    tol = float(job.get("float_tol") or 0.0)
    if test["kind"] == "stdin":
        got = read_text(files["out"])
        if same_output(got, test["output"], tol):
            return None
        return {"kind": "wrong_answer", "message": f"expected {clip(test['output'], 120)!r}, got {clip(got, 120)!r}"}
    try:
        with open(files["result"], encoding="utf-8") as f:
            got = json.load(f)
    except (OSError, ValueError):
        return {"kind": "runtime_error", "message": "the function returned no result"}
    want = test["expected"]
    if same_value(got, want, tol) or (test.get("unwrap") and isinstance(want, list) and len(want) == 1
                                      and same_value(got, want[0], tol)):
        return None
    shown = f"expected {clip(json.dumps(want), 120)}, got {clip(json.dumps(got), 120)}"
    return {"kind": "wrong_answer", "message": shown}


def run_io(job):
    tests = job["tests"]
    try:
        compiled = compile_program(job["program"])
    except (SyntaxError, ValueError) as exc:
        return {"passed": 0, "total": len(tests), "failure": {"kind": "compile_error", "message": print_error(exc)}}
    prelude = None
    if job.get("prelude") and any(t["kind"] == "call" for t in tests):
        prelude = compile(job["prelude"], "<prelude>", "exec")
        exec(prelude, {})  # import its modules once, before the forks share them
    work = tempfile.mkdtemp()
    files = {k: os.path.join(work, k) for k in ("in", "out", "err", "result")}
    deadline = time.monotonic() + float(job["budget_s"])
    passed, failure = 0, None
    for i, test in enumerate(tests):
        left = deadline - time.monotonic()
        if left <= 0:
            failure = failure or {"kind": "timeout", "test": i, "message": "the time budget ran out"}
            break
        why = run_case(compiled, prelude, test, files, job, min(float(job["test_timeout_s"]), left))
        if why is None:
            passed += 1
            continue
        failure = failure or {**why, "test": i}
        if job.get("stop_on_failure", True):
            break
    return {"passed": passed, "total": len(tests), "failure": failure}


MODES = {"script": run_script, "unittest": run_unittest, "io": run_io}
VERDICT_FD = os.dup(1)


def main():
    job = json.loads(sys.stdin.read())
    try:
        verdict = MODES[job["mode"]](job)
    except BaseException as exc:  # a verdict even when the harness itself breaks
        verdict = {"passed": 0, "total": 1, "failure": {"kind": "harness_error", "message": clip(repr(exc))}}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    line = "\n" + job["marker"] + json.dumps(verdict, ensure_ascii=False) + "\n"
    os.write(VERDICT_FD, line.encode("utf-8", errors="replace"))
    os._exit(0)  # no atexit handlers or lingering threads of the program


main()
'''


@dataclass
class HarnessVerdict:
    """The harness's verdict on one job, with the raw sandbox result.

    status is "passed" (every test passed, and there was at least one), "timeout" (the
    sandbox or a test ran out of time) or "failed". `failure` describes the first failed
    test: kind (compile_error, runtime_error, wrong_answer, timeout, exit, test_failed,
    no_tests, no_verdict), its index or id as "test", and a short "message".
    """

    status: str
    passed: int
    total: int
    failure: dict[str, Any] | None
    result: SandboxResult


def run_tests(
    jobs: Sequence[dict[str, Any]],
    *,
    workers: int | None = None,
    timeout_s: float = 10.0,
    memory_mb: int = 2048,
    max_file_mb: int = 16,
    max_procs: int = 256,
) -> list[HarnessVerdict]:
    """Run each job under the test harness in its own sandbox (see the module docstring).

    A job is {"mode": "script" | "unittest" | "io", "program": source, ...}; "io" jobs add
    "tests" (dicts: {"kind": "stdin", "input", "output"} or {"kind": "call", "args",
    "expected", "unwrap"?}), "fn_name", "test_timeout_s", "stop_on_failure", "float_tol"
    and "prelude" (source run before the program for "call" tests). `timeout_s` bounds a
    whole job; the harness stops starting tests a second before it.
    """
    markers = [f"ARLE-VERDICT-{secrets.token_hex(8)}:" for _ in jobs]
    stdins = [
        json.dumps({**job, "marker": marker, "budget_s": max(0.5, timeout_s - 1.0)})
        for job, marker in zip(jobs, markers)
    ]
    # The harness writes each test's input to a file, so the file limit must admit the
    # largest one on top of what the program itself may write.
    largest = max((len(t.get("input", "")) for job in jobs for t in job.get("tests", [])), default=0)
    file_mb = max_file_mb + math.ceil(largest * 4 / (1024 * 1024))
    results = run_programs(
        [_HARNESS] * len(jobs), workers=workers, timeout_s=timeout_s, memory_mb=memory_mb,
        max_file_mb=file_mb, max_procs=max_procs, stdins=stdins,
    )
    return [_verdict(result, marker, job) for result, marker, job in zip(results, markers, jobs)]


def _verdict(result: SandboxResult, marker: str, job: dict[str, Any]) -> HarnessVerdict:
    total = len(job["tests"]) if job.get("mode") == "io" else 1
    at = result.stdout.rfind(marker)
    data: dict[str, Any] | None = None
    if at >= 0:
        try:
            data = json.loads(result.stdout[at + len(marker):].splitlines()[0])
        except (ValueError, IndexError):
            data = None
    if data is None:
        kind = "timeout" if result.status == "timeout" else "no_verdict"
        message = (f"timed out after {result.duration_s:.1f}s" if kind == "timeout"
                   else "the program ended the process before the tests finished")
        return HarnessVerdict("timeout" if kind == "timeout" else "failed", 0, total,
                           {"kind": kind, "message": message}, result)
    passed, total = int(data.get("passed", 0)), int(data.get("total", total))
    failure = data.get("failure")
    if failure is None and passed == total and total > 0:
        status = "passed"
    elif (failure or {}).get("kind") == "timeout":
        status = "timeout"
    else:
        status = "failed"
    return HarnessVerdict(status, passed, total, failure, result)


