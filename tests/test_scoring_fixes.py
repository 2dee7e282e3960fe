"""Scoring fixes found against the real datasets (issue 14, item 3), each on rows in the
dataset's real schema: DROP's validated answers, TAT-QA's per-split files, a target that is
missing or empty refused at load. (math's infinities and mmlu_redux's correct_answer order
are tested with their rewards, in test_reward_math.py and test_reward_choice.py.)"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from arlecli.data import sources
from arlecli.data.sources import load_rows, read_rows_file, tasks_from_rows
from arlecli.data.transforms import get_transform
from arlecli.errors import UserError
from arlecli.catalog import load_card
from arlecli.rewards import get_reward
from arlecli.types import Episode, Task, Turn

FIXTURES = Path(__file__).resolve().parent.parent / "benchmarks" / "fixtures"


def score(card_name: str, task: Task, completion: str) -> Any:
    card = load_card(card_name)
    return get_reward(card.reward, card.reward_params)(task, Episode(task.id, [Turn("q", completion)]))


# ---------------------------------------------------------------------------------------------
# DROP: every validated answer is a gold answer of its own (EleutherAI/drop, as lm-eval)


def lm_eval_drop() -> Any:
    """lm-eval 0.4.13's own drop/utils.py, loaded by file path (the tasks package is slow)."""
    root = Path(importlib.util.find_spec("lm_eval").submodule_search_locations[0])
    spec = importlib.util.spec_from_file_location("lm_eval_drop_utils", root / "tasks" / "drop" / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def drop_tasks(rows: list[dict[str, Any]] | None = None) -> list[Task]:
    card = load_card("drop")
    return tasks_from_rows(card, rows or read_rows_file(FIXTURES / "drop.jsonl"), "fixture")


def test_drop_reads_eleutherai_drop_like_lm_eval():
    card = load_card("drop")
    assert card.source.path == "EleutherAI/drop"
    rows = read_rows_file(FIXTURES / "drop.jsonl")
    utils = lm_eval_drop()
    for row, task in zip(rows, drop_tasks(rows)):
        assert task.target == [list(a) for a in utils.get_answers(row) if a[0].strip()], task.id


def test_drop_a_correct_answer_that_one_validator_wrote_differently_scores_em_1():
    chaz = drop_tasks()[0]
    assert chaz.input == "Who scored the first touchdown of the game?"
    assert chaz.target == [["Chaz Schilens"], ["JaMarcus Russell"]]
    right = score("drop", chaz, "Answer: Chaz Schilens")
    assert right.correct and right.details == {"exact_match": 1, "f1": 1.0}
    wrong = score("drop", chaz, "Answer: Vonta Leach")
    assert not wrong.correct and wrong.details == {"exact_match": 0, "f1": 0.0}


PREDICTIONS = [
    "Chaz Schilens",
    "JaMarcus Russell",
    "Schilens",
    "Vonta Leach",
    "Chaz Schilens; Vonta Leach",
    "Vonta Leach; Chaz Schilens",
    "Chaz Schilens; JaMarcus Russell",
    "3",
    "3.0",
    "three",
    "2",
    "31 July 1667",
    "July 1667",
    "1667",
    "the Chaz Schilens",
    "Kris Brown; 3",
]


@pytest.mark.parametrize("prediction", PREDICTIONS)
def test_drop_em_and_f1_match_lm_eval_sample_by_sample(prediction: str):
    utils = lm_eval_drop()
    rows = read_rows_file(FIXTURES / "drop.jsonl")
    for row, task in zip(rows, drop_tasks(rows)):
        got = score("drop", task, f"Answer: {prediction}")
        # lm-eval scores its prediction as given; arle's prompt asks for spans joined by "; ".
        spans = [s.strip() for s in prediction.split(";")]
        want = utils.process_results({"answers": utils.get_answers(row)}, spans)
        assert (got.details["exact_match"], got.details["f1"]) == pytest.approx((want["em"], want["f1"])), (
            task.id,
            prediction,
        )


def test_drop_validated_answers_in_every_stored_shape(tmp_path):
    row = read_rows_file(FIXTURES / "drop.jsonl")[3]  # a date answer, two validators
    want = drop_tasks([row])[0].target
    assert want == [["31 July 1667"], ["July 1667"]]
    va = row["validated_answers"]
    as_list = [{k: va[k][i] for k in va} for i in range(len(va["number"]))]  # the source JSON's shape
    nested = {**va, "date": {k: [d[k] for d in va["date"]] for k in ("day", "month", "year")}}
    for validated in (as_list, nested):
        assert drop_tasks([{**row, "validated_answers": validated}])[0].target == want
    # `arle data pull` keeps rows as parquet; what comes back reads the same.
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "validation.parquet")
    assert drop_tasks(read_rows_file(tmp_path / "validation.parquet"))[0].target == want


def test_drop_ucinlp_rows_split_numbers_and_dates_per_validator():
    transform = get_transform("drop")
    base = {"section_id": "nfl_2201", "query_id": "q", "passage": "P", "question": "Q"}
    # Two validators who agree: the repeat is one answer, not a two-span one.
    agreed = transform(
        {**base, "answers_spans": {"spans": ["Chaz Schilens", "Chaz Schilens"], "types": ["span", "span"]}}
    )
    assert agreed["gold_answers"] == [["Chaz Schilens"]]
    numbers = transform({**base, "answers_spans": {"spans": ["3", "4"], "types": ["number", "number"]}})
    assert numbers["gold_answers"] == [["3"], ["4"]]
    train = transform({**base, "answers_spans": {"spans": ["23-yard", "38-yard"], "types": ["span", "span"]}})
    assert train["gold_answers"] == [["23-yard", "38-yard"]]


# ---------------------------------------------------------------------------------------------
# TAT-QA: each split reads its own file


@pytest.fixture
def recorded_loads(monkeypatch) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """datasets.load_dataset replaced by a recorder that returns the TAT-QA fixture rows."""
    import datasets

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def fake_load_dataset(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        calls.append((args, kwargs))
        return read_rows_file(FIXTURES / "tatqa.jsonl")

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    return calls


@pytest.mark.parametrize(
    "card_name, split, file",
    [
        ("tatqa", "validation", "tatqa_dataset_dev.json"),
        ("tatqa", "test", "tatqa_dataset_test_gold.json"),
        ("tatqa", "train", "tatqa_dataset_train.json"),
        ("drop", "validation", "drop_validation.parquet"),
        ("drop", "train", "drop_train.parquet"),
    ],
)
def test_each_split_asks_the_hub_for_its_own_file_only(recorded_loads, card_name, split, file):
    card = load_card(card_name)
    load_rows(card, split)
    [(args, kwargs)] = recorded_loads
    assert args[0] == card.source.path and kwargs["split"] == split
    assert kwargs["data_files"] == {split: file}


def write_tatqa_repo(folder: Path) -> Path:
    """A local copy of the next-tat/TAT-QA file layout: four JSON files, no `configs:`."""
    records = read_rows_file(FIXTURES / "tatqa.jsonl")
    folder.mkdir()
    for name in ("dev", "train", "test_gold"):
        (folder / f"tatqa_dataset_{name}.json").write_text(json.dumps(records))
    unanswered = copy.deepcopy(records)  # the test file: questions without their answers
    for record in unanswered:
        for question in record["questions"]:
            for key in ("answer", "derivation", "answer_type", "answer_from", "rel_paragraphs", "scale"):
                question[key] = None
    (folder / "tatqa_dataset_test.json").write_text(json.dumps(unanswered))
    return folder


def test_tatqa_test_split_holds_only_the_gold_file_with_datasets_itself(tmp_path):
    card = load_card("tatqa")
    repo = write_tatqa_repo(tmp_path / "TAT-QA")
    local = dataclasses.replace(card, source=dataclasses.replace(card.source, path=str(repo)))
    tasks = tasks_from_rows(local, load_rows(local, "test"), "tatqa:test")
    questions = sum(len(r["questions"]) for r in read_rows_file(FIXTURES / "tatqa.jsonl"))
    assert len(tasks) == questions and all(t.target not in (None, [], "") for t in tasks)
    assert {type(t.target) for t in tasks} == {list, float}  # spans and numbers, as in the files
    # Without the per-split files, datasets builds `test` from both test files: half the
    # questions come without an answer, which is now refused instead of scoring 0.
    guessed = dataclasses.replace(local, source=dataclasses.replace(local.source, params={}))
    with pytest.raises(UserError, match=r"tatqa: row 1 of tatqa:test \(task '.*'\) has no target: column 'answer'"):
        tasks_from_rows(guessed, load_rows(guessed, "test"), "tatqa:test")


def test_tatqa_answers_survive_a_parquet_round_trip(tmp_path):
    # datasets types the mixed list/number `answer` as JSON; its parquet holds the JSON text.
    import datasets

    repo = write_tatqa_repo(tmp_path / "TAT-QA")
    ds = datasets.load_dataset(str(repo), data_files={"validation": "tatqa_dataset_dev.json"}, split="validation")
    ds.to_parquet(str(tmp_path / "validation.parquet"))
    rows = read_rows_file(tmp_path / "validation.parquet")
    card = load_card("tatqa")
    direct = tasks_from_rows(card, read_rows_file(FIXTURES / "tatqa.jsonl"), "fixture")
    pulled = tasks_from_rows(card, rows, "pulled")
    assert [t.target for t in pulled] == [t.target for t in direct]
    assert score("tatqa", pulled[1], "Answer: -12.6 million").correct


# ---------------------------------------------------------------------------------------------
# A missing or empty target is an error at load, never a silent 0


ARLE = [sys.executable, "-m", "arlecli"]


def arle(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ARLE, *args], capture_output=True, text=True, timeout=300, env=os.environ.copy(), cwd=cwd)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def endpoint():
    from helpers.fake_openai import FakeOpenAIServer

    with FakeOpenAIServer(lambda body: "\\boxed{4}") as srv:
        yield srv


@pytest.mark.parametrize(
    "empty", [None, "", "   ", [], [""]], ids=["null", "blank", "spaces", "empty-list", "list-of-blank"]
)
def test_a_card_whose_row_has_an_empty_target_exits_2_naming_card_split_and_row(tmp_path, endpoint, empty):
    rows = [
        {"problem": "2 + 2?", "answer": "4"},
        {"problem": "3 + 1?", "answer": empty},
        {"problem": "1 + 3?", "answer": "4"},
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = {
        "name": "sums",
        "version": 1,
        "category": "math",
        "description": "Small sums.",
        "source": {"kind": "files", "path": "rows.jsonl", "splits": {"test": "rows.jsonl"}, "default_split": "test"},
        "fields": {"input": "problem", "target": "answer"},
        "env": "single_turn",
        "reward": {"name": "math"},
        "metrics": ["accuracy"],
    }
    (tmp_path / "sums.yaml").write_text(yaml.safe_dump(card))
    proc = arle("eval", "sums.yaml", "--base-url", endpoint.base_url, "--output", "run", cwd=tmp_path)
    assert_one_line_error(proc, "sums: row 2 of sums:test", "has no target", "column 'answer'")
    assert not endpoint.bodies() and not (tmp_path / "run").exists()


def test_a_packaged_card_with_data_rows_lacking_the_target_exits_2(tmp_path, endpoint):
    rows = read_rows_file(FIXTURES / "drop.jsonl")
    rows[2] = {
        **rows[2],
        "answer": {"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": []},
        "validated_answers": {"number": [], "date": [], "spans": []},
    }
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = arle(
        "eval", "drop", "--data", "rows.jsonl", "--base-url", endpoint.base_url, "--output", "run", cwd=tmp_path
    )
    assert_one_line_error(proc, "drop: row 3 of rows.jsonl", "column 'gold_answers' (after the transform 'drop') is []")
    assert not endpoint.bodies()


def test_cards_whose_reward_needs_no_target_still_load():
    # SQuAD v2's empty gold means "unanswerable"; code cards run tests, their target is a
    # reference solution that some datasets leave empty.
    squad = load_card("squad_v2")
    unanswerable = [
        t for t in tasks_from_rows(squad, read_rows_file(FIXTURES / "squad_v2.jsonl"), "fixture") if not t.target
    ]
    assert unanswerable
    code = load_card("livecodebench")
    tasks = tasks_from_rows(code, read_rows_file(FIXTURES / "livecodebench.jsonl"), "fixture")
    assert tasks and all(t.target == "" for t in tasks)
    assert not sources.target_required(code) and sources.target_required(load_card("gsm8k"))


def test_deepscaler_leaves_out_its_rows_without_an_answer():
    card = load_card("deepscaler")
    rows = read_rows_file(FIXTURES / "deepscaler.jsonl")
    holed = [rows[0], {**rows[1], "answer": ""}, rows[2]]
    tasks = tasks_from_rows(card, holed, "fixture")
    assert [t.target for t in tasks] == [rows[0]["answer"], rows[2]["answer"]]
