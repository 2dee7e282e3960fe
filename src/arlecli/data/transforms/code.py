"""Transforms for code datasets: prompt text the field map cannot give, and test sources.

The tests themselves stay in their dataset columns (often megabytes, sometimes
compressed): the `code_io` reward decodes them when it scores, so loading a split does
not decode every problem's tests up front.
"""

from __future__ import annotations

from typing import Any

from arlecli import safeio
from arlecli.data.transforms import Row, transform
from arlecli.rewards.code import called_function

# LiveCodeBench's instructions (as lighteval's lcb prompt): starter code for functional
# (LeetCode) problems, stdin/stdout otherwise.
_STARTER = (
    "You will use the following starter code to write the solution to the problem and "
    "enclose your code within delimiters.\n```python\n{starter}\n```"
)
_STDIN = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not "
    "directly test on the sample inputs). Enclose your code within delimiters as follows. "
    "Ensure that when the python program runs, it reads the inputs, runs the algorithm and "
    "writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```"
)


def format_instructions(starter_code: str | None) -> str:
    """LiveCodeBench's answer-format paragraph for a problem with or without starter code."""
    starter = (starter_code or "").strip("\n")
    return _STARTER.format(starter=starter) if starter.strip() else _STDIN


def _mbpp_common(row: Row, tests: list[str], extra_test: str = "") -> Row:
    imports = list(row.get("test_imports") or [])
    setup = str(row.get("test_setup_code") or "")
    test_source = "\n".join([*imports, setup, *tests, extra_test]).strip("\n") + "\n"
    return {
        **row,
        # `text` in the full config, `prompt` in sanitized and MBPP+.
        "description": str(row.get("text") or row.get("prompt") or ""),
        "tests_text": "\n".join(tests),
        "first_test": tests[0] if tests else "",
        "test_source": test_source,
        "entry_point": called_function("\n".join(tests)),
        "prompt_code": "",
    }


@transform("mbpp")
def mbpp(row: Row) -> Row:
    """MBPP (full or sanitized): the description, the asserts shown in the prompt, and one
    test script (test imports, setup code, the `test_list` asserts) for `code_tests`."""
    return _mbpp_common(row, [str(t) for t in row.get("test_list") or []])


@transform("mbpp_plus")
def mbpp_plus(row: Row) -> Row:
    """MBPP+ (evalplus/mbppplus): as `mbpp`, with the EvalPlus `test` script (base and plus
    inputs) run after the three original asserts."""
    return _mbpp_common(row, [str(t) for t in row.get("test_list") or []], str(row.get("test") or ""))


@transform("livecodebench")
def livecodebench(row: Row) -> Row:
    """LiveCodeBench code_generation_lite: the format paragraph, the function name from the
    JSON `metadata` (functional problems), and a `difficulty`/`platform` to group by."""
    return {
        **row,
        "format_instructions": format_instructions(row.get("starter_code")),
        "fn_name": _json_get(row.get("metadata"), "func_name") or "",
        "difficulty": str(row.get("difficulty") or "unknown"),
        "platform": str(row.get("platform") or "unknown"),
        "reference": "",  # the dataset has no reference solutions
    }


@transform("apps")
def apps(row: Row) -> Row:
    """APPS: the prompt as the APPS paper builds it (question, starter code, then the
    call-based or standard-input format line); call-based problems have starter code."""
    starter = str(row.get("starter_code") or "")
    fmt = "Use Call-Based format" if starter.strip() else "Use Standard Input format"
    return {
        **row,
        "apps_prompt": f"\nQUESTION:\n{row.get('question', '')}\n{starter}\n{fmt}\nANSWER:\n",
        "difficulty": str(row.get("difficulty") or "unknown"),
        "reference": _first(row.get("solutions")),
    }


@transform("deepcoder")
def deepcoder(row: Row) -> Row:
    """DeepCoder-Preview: the problem with LiveCodeBench's format paragraph (`starter_code`
    exists only in some configs) and the function name from `metadata`, when given."""
    return {
        **row,
        "format_instructions": format_instructions(row.get("starter_code")),
        "fn_name": _json_get(row.get("metadata"), "func_name") or "",
        "reference": "",  # the dataset has no reference solutions
    }


def _first(solutions: Any) -> str:
    # APPS `solutions` is a JSON list of programs, or "" for some problems.
    if isinstance(solutions, str):
        try:
            solutions = safeio.loads(solutions) if solutions.strip() else []
        except ValueError:
            return ""
    return str(solutions[0]) if isinstance(solutions, list) and solutions else ""


def _json_get(value: Any, key: str) -> Any:
    if isinstance(value, str):
        try:
            value = safeio.loads(value) if value.strip() else {}
        except ValueError:
            return None
    return value.get(key) if isinstance(value, dict) else None
