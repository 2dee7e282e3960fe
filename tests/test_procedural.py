"""Procedural generators and their rewards: countdown and reasoning-gym checkers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from arlecli.data import generators as g
from arlecli.errors import UserError
from arlecli.rewards import _REWARDS
from arlecli.rewards import procedural as p
from arlecli.types import Episode, Score, Task, Turn


def task_from(row: dict[str, Any], target: Any = None) -> Task:
    return Task(row["id"], row["question"], row.get("answer") if target is None else target, row)


def run(name: str, row_task: Task, completion: str, **params: object) -> Score:
    return _REWARDS[name](**params)(row_task, Episode(row_task.id, [Turn("q", completion)]))


# Generators -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["countdown", "reasoning_gym:gsm_symbolic", "reasoning_gym:chain_sum"]
)
def test_generators_are_seeded_and_prefix_stable(name: str) -> None:
    rows = g.generate_rows(name, seed=7, size=12)
    assert rows == g.generate_rows(name, seed=7, size=12)
    assert g.generate_rows(name, seed=7, size=5) == rows[:5]
    assert rows != g.generate_rows(name, seed=8, size=12)
    assert json.loads(json.dumps(rows)) == rows
    assert len({r["id"] for r in rows}) == 12


def test_nearby_seeds_share_no_rows() -> None:
    # reasoning-gym alone would give seed 1 and seed 2 eleven rows in common.
    one = g.generate_rows("reasoning_gym:chain_sum", seed=1, size=12)
    two = g.generate_rows("reasoning_gym:chain_sum", seed=2, size=12)
    assert not {r["question"] for r in one} & {r["question"] for r in two}


def test_reasoning_gym_row_schema() -> None:
    row = g.generate_rows("reasoning_gym:gsm_symbolic", seed=0, size=1)[0]
    assert set(row) == {"id", "question", "answer", "metadata"}
    assert row["id"] == "gsm_symbolic-0-0"
    assert row["metadata"]["source_dataset"] == "gsm_symbolic"


def test_countdown_rows() -> None:
    params = {"min_numbers": 4, "max_numbers": 4}
    rows = g.generate_rows("countdown", seed=0, size=50, params=params)
    for row in rows:
        assert set(row) == {"id", "numbers", "target", "question", "answer"}
        assert len(row["numbers"]) == 4 and 10 <= row["target"] <= 999
        value, used = p.safe_arithmetic(row["answer"])
        assert value == row["target"] and sorted(used) == sorted(row["numbers"])


def test_json_safe() -> None:
    from fractions import Fraction

    assert g.json_safe({1: (1, 2), "f": Fraction(1, 4), "s": {3, 1}}) == {
        "1": [1, 2],
        "f": "1/4",
        "s": [1, 3],
    }


@pytest.mark.parametrize(
    "name, params",
    [
        ("nope", None),
        ("reasoning_gym:gsm_symbolc", None),
        ("countdown", {"colour": 1}),
        ("reasoning_gym:countdown", {"colour": 1}),
        ("countdown", {"min_numbers": 1}),
    ],
)
def test_generator_errors_are_for_people(name: str, params: dict[str, Any] | None) -> None:
    with pytest.raises(UserError):
        g.generate_rows(name, seed=0, size=1, params=params)


# Countdown reward -------------------------------------------------------------------------

CD = Task("cd", "q", None, {"numbers": [25, 3, 7, 2], "target": 80})


@pytest.mark.parametrize(
    "completion, accuracy, valid",
    [
        ("<answer>25 * 3 + 7 - 2</answer>", 1, 1),
        ("Thinking...\n<answer>(25 * 3) + (7 - 2)</answer>\n", 1, 1),
        ("<answer>25 * 3 + 7 - 2 = 80</answer>", 1, 1),  # a trailing "= target" is fine
        ("<answer>25 * 3 + 3 + 2</answer>", 0, 1),  # 80, but 3 reused and 7 missing
        ("<answer>25 * 3 + 7 - 2 - 1 + 1</answer>", 0, 1),  # 80, but 1 is not given
        ("<answer>25 * 3 + 7 + 2</answer>", 0, 1),  # every number once, value 84
        ("<answer>__import__('os').system('echo hi')</answer>", 0, 0),
        ("<answer>abs(-80)</answer>", 0, 0),
        ("<answer>25 ** 3</answer>", 0, 0),  # no powers
        ("<answer>3.5 * 2</answer>", 0, 0),  # decimals would let "3.5" spend 3 and 5
        ("<answer>25 / (3 - 3)</answer>", 0, 0),
        ("<answer>eighty</answer>", 0, 0),
    ],
)
def test_countdown_cases(completion: str, accuracy: int, valid: int) -> None:
    score = run("countdown", CD, completion)
    assert score.details == {"accuracy": accuracy, "valid_expression": valid}
    assert score.reward == float(accuracy) and score.correct == bool(accuracy)


def test_countdown_missing_number() -> None:
    task = Task("m", "q", None, {"numbers": [10, 8, 1], "target": 80})
    assert not run("countdown", task, "<answer>10 * 8</answer>").correct
    assert run("countdown", task, "<answer>10 * 8 * 1</answer>").correct


def test_countdown_division_is_exact() -> None:
    task = Task("d", "q", None, {"numbers": [8, 2, 4, 3], "target": 7})
    assert run("countdown", task, "<answer>8 / (4 / 2) + 3</answer>").correct
    # 2 / 8 * 4 is exactly 1 (no float drift), and non-integer steps are allowed.
    task = Task("f", "q", None, {"numbers": [2, 8, 4, 6], "target": 7})
    assert run("countdown", task, "<answer>2 / 8 * 4 + 6</answer>").correct
    task = Task("g", "q", None, {"numbers": [1, 3, 9], "target": 3})
    assert run("countdown", task, "<answer>(1 / 3) * 9</answer>").correct


def test_countdown_extraction_without_tags() -> None:
    task = Task("n", "q", None, {"numbers": [8, 2, 3], "target": 7})
    score = run("countdown", task, "We need 7.\nTry **8 / 2 + 3 = 7**.\n")
    assert score.correct and score.extracted == "8 / 2 + 3"
    assert run("countdown", task, "8 × 2 ÷ 2 ... no.\nSo: 8/2 + 3").correct
    nothing = run("countdown", task, "I give up.")
    assert nothing.extracted is None and nothing.details == {"accuracy": 0, "valid_expression": 0}


def test_countdown_on_generated_rows_and_rg_rows() -> None:
    for row in g.generate_rows("countdown", seed=3, size=5):
        assert run("countdown", task_from(row), f"<answer>{row['answer']}</answer>").correct
    rg_row = g.generate_rows("reasoning_gym:countdown", seed=3, size=1)[0]
    assert run("countdown", task_from(rg_row), f"<answer>{rg_row['answer']}</answer>").correct


def test_safe_arithmetic_rejects() -> None:
    for expr in ["x + 1", "abs(-3)", "2 ** 3", "1e3", "10**100", "9" * 20, "(1)" * 200, "[1][0]"]:
        with pytest.raises(p.UnsafeExpression):
            p.safe_arithmetic(expr)
    assert p.safe_arithmetic("-(3 - 5) * 2")[0] == 4


# reasoning_gym reward ---------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["gsm_symbolic", "countdown"])
def test_reasoning_gym_reward_scores_the_rows_own_answer(dataset: str) -> None:
    rows = json.loads(json.dumps(g.generate_rows(f"reasoning_gym:{dataset}", seed=5, size=3)))
    for row in rows:
        task = task_from(row)
        right = run("reasoning_gym", task, f"Reasoning...\n<answer>{row['answer']}</answer>")
        assert (right.reward, right.correct, right.details) == (1.0, True, {"accuracy": 1})
        wrong = run("reasoning_gym", task, "Reasoning...\n<answer>123456789</answer>", task=dataset)
        assert not wrong.correct and wrong.reward < 1.0 and wrong.details == {"accuracy": 0}


def test_reasoning_gym_reward_last_line_and_wrong_value() -> None:
    row = g.generate_rows("reasoning_gym:gsm_symbolic", seed=1, size=1)[0]
    task = task_from(row)
    assert run("reasoning_gym", task, f"Working...\n\n  {row['answer']}  \n\n").correct
    off = str(int(float(row["answer"])) + 1)
    assert run("reasoning_gym", task, f"<answer>{off}</answer>").reward < 1.0


def test_reasoning_gym_reward_screens_code_for_eval_checkers() -> None:
    row = g.generate_rows("reasoning_gym:countdown", seed=0, size=1)[0]
    score = run("reasoning_gym", task_from(row), "<answer>__import__('os').getcwd()</answer>")
    assert score.reward == 0.0
    assert p.looks_unsafe("9**9**9") and p.looks_unsafe("2**99999")
    assert not p.looks_unsafe("x**2 + x**3")


def test_reasoning_gym_reward_unknown_dataset() -> None:
    with pytest.raises(UserError):
        _REWARDS["reasoning_gym"](task="gsm_symbolc")
