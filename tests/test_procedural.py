"""Procedural generators and their rewards: countdown and reasoning-gym checkers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from arlecli.data import generators as g
from arlecli.errors import UserError
from arlecli.rewards import REWARDS
from arlecli.rewards import procedural as p
from arlecli.types import Episode, Score, Task, Turn


def task_from(row: dict[str, Any], target: Any = None) -> Task:
    return Task(row["id"], row["question"], row.get("answer") if target is None else target, row)


def run(name: str, row_task: Task, completion: str, **params: object) -> Score:
    return REWARDS[name](**params)(row_task, Episode(row_task.id, [Turn("q", completion)]))


# Generators -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["countdown", "reasoning_gym:gsm_symbolic", "reasoning_gym:chain_sum"])
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


def test_reasoning_gym_rows_come_back_from_the_cache_without_the_package(tmp_path) -> None:
    # The second run of a card skips `import reasoning_gym` (1-2 s) and gets the same rows.
    import os
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from arlecli.data.generators import generate_rows\n"
        "rows = generate_rows('reasoning_gym:chain_sum', seed=3, size=7, params={'max_terms': 2})\n"
        "print(json.dumps({'imported': 'reasoning_gym' in sys.modules, 'rows': rows}))\n"
    )
    env = {**os.environ, "ARLE_HOME": str(tmp_path)}
    runs = [
        json.loads(
            subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True).stdout
        )
        for _ in range(2)
    ]
    assert [r["imported"] for r in runs] == [True, False]
    assert runs[0]["rows"] == runs[1]["rows"]
    assert len(list((tmp_path / "cache" / "rows" / "reasoning_gym").glob("chain_sum-*.json"))) == 1


def test_a_damaged_row_cache_is_made_again() -> None:
    fresh = g.generate_rows("reasoning_gym:chain_sum", seed=5, size=4)
    path = g._rg_cache_path("chain_sum", seed=5, size=4, params={})
    assert path is not None and path.exists()
    assert path != g._rg_cache_path("chain_sum", seed=5, size=4, params={"max_terms": 3})  # params are in the key
    assert path != g._rg_cache_path("chain_sum", seed=6, size=4, params={})
    for damage in ["{not json", "[]", json.dumps(fresh[:3]), json.dumps([{"id": "x"}] * 4)]:
        path.write_text(damage)
        assert g.generate_rows("reasoning_gym:chain_sum", seed=5, size=4) == fresh
        assert json.loads(path.read_text()) == fresh  # rewritten whole


def test_the_row_cache_keeps_to_its_cap_dropping_the_least_recently_used(tmp_path, monkeypatch) -> None:
    """Past ROW_CACHE_MAX_BYTES the oldest-used cache files go; a read counts as a use, and
    the rows just made always stay."""
    import os
    import time

    monkeypatch.setenv("ARLE_HOME", str(tmp_path))
    folder = tmp_path / "cache" / "rows" / "reasoning_gym"
    first = g.generate_rows("reasoning_gym:chain_sum", seed=1, size=3)
    [one] = folder.glob("*.json")
    monkeypatch.setattr(g, "ROW_CACHE_MAX_BYTES", 2 * one.stat().st_size + 8)  # room for two such files
    past = time.time() - 100
    os.utime(one, (past, past))
    g.generate_rows("reasoning_gym:chain_sum", seed=2, size=3)
    assert len(list(folder.glob("*.json"))) == 2
    for file in folder.glob("*.json"):  # seed 1's file the older, both well before the hit below
        os.utime(file, (past, past) if file == one else (past + 50, past + 50))
    assert g.generate_rows("reasoning_gym:chain_sum", seed=1, size=3) == first  # a hit: seed 1 used last now
    g.generate_rows("reasoning_gym:chain_sum", seed=3, size=3)  # over the cap: seed 2's file goes
    names = sorted(json.loads(file.read_text())[0]["id"] for file in folder.glob("*.json"))
    assert names == ["chain_sum-1-0", "chain_sum-3-0"]


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
        REWARDS["reasoning_gym"](task="gsm_symbolc")


# reasoning_gym reward: eval()-based checkers run in the sandbox ---------------------------


@pytest.mark.parametrize(
    "answer, inert",
    [
        ("9 + 1 + 7 + 7", True),
        ("-(3 - 5) * 2 / 4", True),
        ("[[1, 0], [0, 1]]", True),
        ("[['Q', '_'], ('_', 'Q')]", True),
        ("'__import__(\"os\")'", True),  # a string literal only evaluates to itself
        ("'a' * 999999999", False),  # would allocate a gigabyte
        ("[0] * 999999999", False),
        ("2 ** 3", False),
        ("x + 1", False),
        ("any(iter(int, 1))", False),
        ("[c for c in 'ab']", False),
        ("[1][0]", False),
        ("1 + " * 1500 + "1", False),  # over MAX_INERT_CHARS
        ("", False),
        ("1 +", False),
    ],
)
def test_is_inert(answer: str, inert: bool) -> None:
    assert p.is_inert(answer) is inert


def _nq_task() -> Task:
    return task_from(g.generate_rows("reasoning_gym:n_queens", seed=0, size=1)[0])


def test_sandboxed_answer_never_runs_in_this_process(tmp_path, monkeypatch) -> None:
    # Bypasses the regex screen on purpose: this is what it would let through if it missed.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ARLE_PWNED", raising=False)
    entry = p.rg_entry(_nq_task(), "n_queens")
    evil = "[open('pwned', 'w').write('x'), __import__('os').environ.__setitem__('ARLE_PWNED', '1')]"
    assert p.sandbox_checks([("n_queens", evil, entry)], timeout_s=20) == [0.0]
    assert not (tmp_path / "pwned").exists()
    assert "ARLE_PWNED" not in __import__("os").environ


def test_a_looping_answer_that_passes_the_screen_times_out_as_wrong() -> None:
    import time

    answer = "any(iter(int, 1))"  # eval() would spin forever; nothing in it looks like code
    assert not p.looks_unsafe(answer)
    start = time.monotonic()
    score = run("reasoning_gym", _nq_task(), f"<answer>{answer}</answer>", timeout_s=4)
    assert (score.reward, score.correct, score.details) == (0.0, False, {"accuracy": 0})
    assert time.monotonic() - start < 30


def test_an_answer_cannot_print_its_own_score() -> None:
    # Prints a perfect score and exits before the checker could: the nonce gives it away.
    fake = "[print('1.0'), print('deadbeef 1.0'), exit(0)]"
    assert not p.looks_unsafe(fake)
    assert run("reasoning_gym", _nq_task(), f"<answer>{fake}</answer>", timeout_s=20).reward == 0.0


def test_honest_non_literal_answers_are_checked_in_the_sandbox_in_a_batch() -> None:
    rows = json.loads(json.dumps(g.generate_rows("reasoning_gym:polynomial_multiplication", seed=3, size=2)))
    tasks = [task_from(r) for r in rows]
    assert not p.is_inert(rows[0]["answer"])  # names and powers: the sandbox path
    score = p.reasoning_gym(timeout_s=30)
    episodes = [Episode(t.id, [Turn("q", f"<answer>{r['answer']}</answer>")]) for t, r in zip(tasks, rows)]
    episodes.append(Episode(tasks[0].id, [Turn("q", "<answer>x**2 + 1</answer>")]))
    results = score.batch(tasks + [tasks[0]], episodes)
    assert [s.correct for s in results] == [True, True, False]
    assert results[0].extracted == rows[0]["answer"]


def test_puzzle24_literal_answers_stay_in_process(monkeypatch) -> None:
    # Plain arithmetic never pays for a sandbox start.
    monkeypatch.setattr(p, "sandbox_checks", lambda *a, **k: pytest.fail("sandbox used"))
    row = g.generate_rows("reasoning_gym:puzzle24", seed=2, size=1)[0]
    assert run("reasoning_gym", task_from(row), f"<answer>{row['answer']}</answer>").correct
    assert run("reasoning_gym", task_from(row), "<answer>1 + 1</answer>").reward < 1.0
    assert run("reasoning_gym", task_from(row), "").reward == 0.0


# ARC-AGI ------------------------------------------------------------------------------------


def test_arc_agi_rows_are_seeded_and_subsets_disjoint() -> None:
    rows = g.generate_rows("arc_agi", seed=3, size=20)
    assert rows == g.generate_rows("arc_agi", seed=3, size=20)
    assert g.generate_rows("arc_agi", seed=3, size=5) == rows[:5]
    assert rows != g.generate_rows("arc_agi", seed=4, size=20)
    every = g.generate_rows("arc_agi", seed=0, size=10_000)
    training = g.generate_rows("arc_agi", seed=0, size=10_000, params={"subset": "training"})
    assert (len(every), len(training)) == (419, 416)
    assert not {r["task_id"] for r in every} & {r["task_id"] for r in training}
    row = rows[0]
    assert set(row) == {"id", "task_id", "train", "test"} and len(row["test"]) == 1
    assert set(row["train"][0]) == {"input", "output"}
    assert json.loads(json.dumps(rows)) == rows


@pytest.mark.parametrize("params", [{"subset": "dev"}, {"colour": 1}, {"version": "arc9"}])
def test_arc_agi_bad_params(params: dict[str, Any]) -> None:
    with pytest.raises(UserError):
        g.generate_rows("arc_agi", seed=0, size=1, params=params)


def test_arc_agi_card_splits_are_the_two_sets() -> None:
    # Needs the split spec's `subset` to reach the generator (sources._generator_rows).
    from arlecli.data.sources import load_rows
    from arlecli.catalog import load_card

    card = load_card("arc_agi")
    test = {r["task_id"] for r in load_rows(card, "test", limit=30)}
    train = {r["task_id"] for r in load_rows(card, "train", limit=30)}
    assert not test & train


def test_arc_agi_transform_and_reward_on_generated_rows() -> None:
    from arlecli.data.transforms import get_transform

    row = get_transform("arc_agi")(g.generate_rows("arc_agi", seed=1, size=1)[0])
    out = row["test"][0]["output"]
    assert row["answer"] == "\n".join(" ".join(map(str, r)) for r in out)
    assert "Example 1\nInput (" in row["question"] and "Test input (" in row["question"]
    assert row["question"].count("Output (") == len(row["train"])
    task = Task(row["id"], row["question"], row["answer"], row)
    assert run("arc_grid", task, f"<answer>\n{row['answer']}\n</answer>").correct
    assert run("arc_grid", task, f"<answer>{json.dumps(out)}</answer>").correct


ARC = Task("arc", "q", "1 2 0\n0 3 3", {})


@pytest.mark.parametrize(
    "completion, accuracy, valid, shape",
    [
        ("Rule: recolour.\n<answer>\n1 2 0\n0 3 3\n</answer>", 1, 1, 1),
        ("<answer>[[1, 2, 0], [0, 3, 3]]</answer>", 1, 1, 1),
        ("The grid is\n```\n120\n033\n```\nDone.", 1, 1, 1),  # no tags: the last digit block
        ("Input:\n1 1 1\n\nOutput:\n[1, 2, 0]\n[0, 3, 3]", 1, 1, 1),
        ("<answer>\n1 2 0\n0 3 4\n</answer>", 0, 1, 1),  # one cell off
        ("<answer>\n1 2 0\n0 3 3\n0 0 0\n</answer>", 0, 1, 0),  # an extra row
        ("<answer>\n1 2\n0 3 3\n</answer>", 0, 0, 0),  # ragged
        ("<answer>no idea</answer>", 0, 0, 0),
        ("", 0, 0, 0),
    ],
)
def test_arc_grid(completion: str, accuracy: int, valid: int, shape: int) -> None:
    score = run("arc_grid", ARC, completion)
    assert score.details == {"accuracy": accuracy, "valid_grid": valid, "shape_match": shape}
    assert score.reward == float(accuracy) and score.correct is bool(accuracy)


def test_arc_grid_target_as_list_and_bad_target() -> None:
    assert run("arc_grid", Task("a", "q", [[1, 2, 0], [0, 3, 3]], {}), "<answer>120\n033</answer>").correct
    with pytest.raises(ValueError):
        run("arc_grid", Task("a", "q", "no grid", {}), "<answer>1</answer>")
