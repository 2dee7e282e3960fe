"""Typed run records (arlecli.records) over run directories written before them.

tests/data/runs_v0 holds an eval run (one_digit_sums, 4 tasks x 2 samples, against the fake
endpoint) and a 1-step GRPO run of the tiny model (its final/ and checkpoint left out), written
by arle before meta.json carried a schema. Each record reads back to the very object the file
holds, and the commands read, report, compare and resume them. (A change to the
one_digit_sums card changes its hash, and the resume is then rightly refused: regenerate the
run with the arle of the day.)
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from arlecli import rundir
from arlecli.records import SCHEMA, Meta, Results, RewardRow, RunDir, Sample, TrainSummary
from arlecli.report import BROWSER_SCHEMA

from helpers.cli import arle
from helpers.fake_openai import FakeOpenAIServer

OLD = Path(__file__).resolve().parent / "data" / "runs_v0"
EVAL, TRAIN = OLD / "eval-one_digit_sums", OLD / "train-countdown"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_old_files_read_back_as_written() -> None:
    """Every record of the old runs, read and written back, is the object its file holds (keys in order)."""
    for run in (EVAL, TRAIN / "eval" / "step-0", TRAIN / "eval" / "step-1"):
        for line in _lines(RunDir(run).samples):
            assert list(Sample.from_json(line).to_json().items()) == list(line.items())
        results = json.loads(RunDir(run).results.read_text())
        assert list(Results.from_json(results).to_json().items()) == list(results.items())
    for line in _lines(RunDir(TRAIN).rewards):
        assert list(RewardRow.from_json(line).to_json().items()) == list(line.items())
    summary = json.loads(RunDir(TRAIN).summary.read_text())
    assert TrainSummary.from_json(summary).to_json() == summary and TrainSummary.from_json(summary).global_step == 1
    for run in (EVAL, TRAIN):
        meta = json.loads(RunDir(run).meta.read_text())
        assert "schema" not in meta and list(Meta.from_json(meta).to_json().items()) == list(meta.items())
    # No unit recorded (runs before the schema): a GRPO run counts steps.
    assert rundir.read_meta(TRAIN).steps == ("steps", "max_steps")


def test_turns_read_as_num_turns_in_samples_and_rewards() -> None:
    """samples.jsonl's `turns` is the list of turns (its count num_turns), rewards.jsonl's an int:
    both read as `.num_turns`, and each file keeps its own shape when written."""
    sample = Sample.from_json(
        {
            "id": "t#0",
            "task_id": "t",
            "correct": True,
            "details": {},
            "num_turns": 2,
            "turns": [{"completion": "a", "observation": []}, {"completion": "b"}],
            "end_reason": "done",
            "env_info": {},
            "tools": None,
        }
    )
    row = RewardRow.from_json(
        {"step": 3, "task_id": "t", "task_index": 0, "turns": 2, "end_reason": "done", "env_info": {}}
    )
    assert sample.num_turns == row.num_turns == 2 and [t.completion for t in sample.turns or []] == ["a", "b"]
    assert isinstance(sample.to_json()["turns"], list) and row.to_json()["turns"] == 2
    assert sample.has_tools and not Sample.from_json({"id": "t#0", "task_id": "t", "correct": 1}).has_tools


def test_the_page_schema_names_sample_fields() -> None:
    """The fields the report's JavaScript shows apart are Sample fields (and the report's `question`)."""
    fields = {f.name for f in dataclasses.fields(Sample)}
    assert set(BROWSER_SCHEMA["shown"]) - {"question"} <= fields


def test_old_runs_list_report_and_compare(tmp_path) -> None:
    listed = arle("runs", "list", str(OLD), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {Path(r["path"]).name: r for r in json.loads(listed.stdout)}
    assert rows["eval-one_digit_sums"]["status"] == rows["train-countdown"]["status"] == "complete"
    assert rows["eval-one_digit_sums"]["value"] == 0.75 and rows["train-countdown"]["unit"] == "steps"
    shown = arle("runs", "show", str(TRAIN))
    assert shown.returncode == 0 and "held-out evaluations" in shown.stdout, shown.stderr
    page = tmp_path / "report.html"
    report = arle("report", str(EVAL), str(TRAIN), "-o", str(page))
    assert report.returncode == 0, report.stderr
    text = page.read_text(encoding="utf-8")
    assert "one_digit_sums-1000-0#1" in text and '"schema":{"shown":' in text
    compared = arle("compare", str(TRAIN / "eval" / "step-0"), str(TRAIN / "eval" / "step-1"), "--json")
    assert compared.returncode == 0, compared.stderr
    assert json.loads(compared.stdout)["shared"] == 2


def test_old_eval_run_resumes_complete(tmp_path) -> None:
    """`arle eval ... --resume` over the old run finds every sample done (the endpoint is never
    asked) and recomputes the same results.json; a new run's meta.json carries the schema."""
    run = tmp_path / "old"
    shutil.copytree(EVAL, run)

    def never(body: dict) -> str:
        raise AssertionError("a finished run asked the model")

    with FakeOpenAIServer(never) as srv:
        out = arle(
            "eval",
            "one_digit_sums",
            "--base-url",
            srv.base_url,
            "--limit",
            "4",
            "--num-samples",
            "2",
            "--output",
            str(run),
            "--resume",
            "--json",
        )
    assert out.returncode == 0, out.stderr
    assert (run / "samples.jsonl").read_bytes() == (EVAL / "samples.jsonl").read_bytes()
    # The same results, key for key and value for value; a stderr over one task, NaN in the old
    # file, is written null now (NaN is not JSON).
    old = json.loads((EVAL / "results.json").read_text(), parse_constant=lambda c: None if c == "NaN" else c)
    assert "NaN" in (EVAL / "results.json").read_text() and "NaN" not in (run / "results.json").read_text()
    assert json.dumps(json.loads((run / "results.json").read_text())) == json.dumps(old)  # order too
    meta = json.loads((run / "meta.json").read_text())
    assert "schema" not in meta and len(meta["resumed"]) == 1  # an old run stays as it was, resumed once

    with FakeOpenAIServer(lambda body: "2") as srv:
        new = arle(
            "eval", "one_digit_sums", "--base-url", srv.base_url, "--limit", "1", "--output", str(tmp_path / "new")
        )
    assert new.returncode == 0, new.stderr
    assert json.loads((tmp_path / "new" / "meta.json").read_text())["schema"] == SCHEMA
