"""`arle train` refusing what it cannot do, and leaving nothing in the way of the fixed rerun: a
resume of a finished run (it says so and trains nothing), a learning rate that is not > 0 and
other optimizer settings torch would refuse only once the run directory exists, a
--machine-rank that names no machine, and a fresh run that fails before its first step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arlecli.errors import UserError

from helpers.cli import arle, assert_one_line_error, snapshot
from helpers.train import TINY, train_in_process


def _quick(tiny_model: Path, run: Path, *extra: str) -> list[str]:
    """A one-step countdown run on the tiny model, checkpointed at its last step, no held-out eval."""
    return [
        "countdown",
        "--model",
        str(tiny_model),
        *TINY,
        "--max-steps",
        "1",
        "--save-steps",
        "1",
        "--eval-limit",
        "0",
        "--output",
        str(run),
        *extra,
    ]


def test_resuming_a_finished_run_trains_nothing_and_changes_nothing(tmp_path, tiny_model, capsys):
    run = tmp_path / "run"
    train_in_process(*_quick(tiny_model, run))
    before = snapshot(run)
    capsys.readouterr()

    train_in_process(*_quick(tiny_model, run, "--resume"))

    out = capsys.readouterr()
    assert f"{run} is already complete (1 steps; final model {run / 'final'})" in out.err, out.err
    assert "resuming from" not in out.err and "step 2" not in out.err
    assert f"final model: {run / 'final'}" in out.out  # the summary, as the finished run printed it
    after = snapshot(run)
    # Nothing trained: no new step, no new checkpoint, final/ and summary.json untouched; only
    # meta.json records the resume (as `arle eval --resume` of a finished eval does).
    assert sorted(after) == sorted(before)
    assert {name for name in after if after[name] != before[name]} == {"meta.json"}
    assert len(json.loads(after["meta.json"])["resumed"]) == 1

    # A higher --max-steps still continues it.
    train_in_process(*_quick(tiny_model, run, "--resume", "--max-steps", "2"))
    assert json.loads((run / "summary.json").read_text())["global_step"] == 2
    # A run that returned gives the run directory back: another process (a terminal's
    # `arle eval` of it, a later --resume) may take it while this one goes on.
    import subprocess
    import sys

    take = [sys.executable, "-c", f"from arlecli import rundir; rundir.hold({str(run)!r}); print('took it')"]
    took = subprocess.run(take, capture_output=True, text=True, timeout=120)
    assert took.returncode == 0 and took.stdout.strip() == "took it", took.stderr[-300:]


def test_a_finished_run_is_complete_in_its_own_unit(tmp_path):
    from arlecli.train.algorithm import algorithm
    from arlecli.train.config import resolve
    from arlecli.train.run import finished

    # rft counts rounds (its summary's global_step is the last round), the others max_steps.
    rft = algorithm("rft")
    cfg = resolve({}, {"algo": "rft"}, {"rounds": 2, "max_steps": 9})

    def run_with(name: str, step: int) -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({"global_step": step, "final_model": "F"}))
        return tmp_path / name

    assert finished(run_with("done", 2), cfg, rft) == {"global_step": 2, "final_model": "F"}
    assert finished(run_with("short", 1), cfg, rft) is None  # resumed with more rounds: it trains on
    assert finished(tmp_path / "none", cfg, rft) is None  # interrupted: no summary.json yet


@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo", "rft", "sft", "dpo"])
@pytest.mark.parametrize(
    "flags, sets, shown",
    [
        ({"learning_rate": 0.0}, {}, "learning_rate (--lr) must be a number > 0, got 0.0"),
        ({}, {"learning_rate": -1}, "learning_rate (--lr) must be a number > 0, got -1"),
        ({}, {"learning_rate": "fast"}, "learning_rate"),
        ({}, {"weight_decay": -0.1}, "weight_decay must be a number >= 0"),
    ],
    ids=["lr-0", "lr-negative", "lr-text", "weight-decay"],
)
def test_optimizer_settings_are_checked_when_they_resolve(algo, flags, sets, shown):
    from arlecli.train.config import resolve

    data = {"data": "rows.jsonl"} if algo in ("sft", "dpo") else {}
    with pytest.raises(UserError) as err:
        resolve({}, {"algo": algo, **data, **flags}, sets)
    assert shown in str(err.value)
    resolve({}, {"algo": algo, **data}, {"learning_rate": 1e-5, "weight_decay": 0.0})


def test_trl_adam_settings_are_checked_when_they_resolve():
    from arlecli.train.config import resolve

    for sets, shown in [
        ({"adam_beta2": 1.0}, "adam_beta2 must be a number in [0, 1), got 1.0"),
        ({"adam_beta1": -0.5}, "adam_beta1 must be a number in [0, 1)"),
        ({"adam_epsilon": -1e-8}, "adam_epsilon must be a number >= 0"),
    ]:
        with pytest.raises(UserError, match=shown.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            resolve({}, {}, sets)


def test_a_bad_learning_rate_is_one_line_before_the_run_directory(tmp_path, tiny_model):
    proc = arle(
        "train", "countdown", "--model", str(tiny_model), "--max-steps", "1", "--set", "learning_rate=-1", "-o", "run",
        cwd=tmp_path,
    )  # fmt: skip
    assert_one_line_error(proc, "learning_rate (--lr) must be a number > 0, got -1")
    assert not (tmp_path / "run").exists()


def test_a_machine_rank_without_machines_is_one_line(tmp_path, tiny_model):
    proc = arle("train", *_quick(tiny_model, Path("run"), "--machine-rank", "3"), cwd=tmp_path)
    assert_one_line_error(proc, "--machine-rank 3 needs --num-machines")
    assert not (tmp_path / "run").exists()


def test_machine_rank_must_name_a_machine():
    from arlecli.train.launch import LaunchOptions, check_ranks

    for opts, shown in [
        (LaunchOptions(machine_rank=3), "--machine-rank 3 needs --num-machines"),
        (LaunchOptions(machine_rank=2, num_machines=2), "--machine-rank 2 is not one of --num-machines 2's ranks"),
    ]:
        with pytest.raises(UserError, match=shown):
            check_ranks(opts)
    check_ranks(LaunchOptions(machine_rank=1, num_machines=2))
    check_ranks(LaunchOptions(machine_rank=0))  # rank 0 of one machine: what a plain run is
    check_ranks(LaunchOptions(machine_rank=1, accelerate_config=Path("cluster.yaml")))  # its file counts the machines


def _fail_building_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    import arlecli.train.grpo as grpo

    def broken(*args, **kwargs):
        raise ValueError("Invalid learning rate: -1.0")  # as torch's optimizer refused one

    monkeypatch.setattr(grpo, "build_trainer", broken)


def test_a_fresh_run_that_fails_before_its_first_step_leaves_no_run_behind(tmp_path, tiny_model, monkeypatch, capsys):
    _fail_building_the_trainer(monkeypatch)
    run = tmp_path / "run"
    with pytest.raises(ValueError, match="Invalid learning rate"):
        train_in_process(*_quick(tiny_model, run))
    assert not run.exists()  # so the fixed command runs again as it is, without --resume
    assert f"nothing was trained: removed what this run wrote in {run}" in capsys.readouterr().err

    # A folder that was there before (with the user's own file) keeps what it held.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ValueError):
        train_in_process(*_quick(tiny_model, mine))
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_a_failed_start_keeps_a_run_that_holds_work(tmp_path):
    from arlecli.train.algorithm import TrainView
    from arlecli.train.run import undo_start

    said: list[str] = []
    view = TrainView(message=said.append)
    for work in ["checkpoint-1/trainer_state.json", "metrics.jsonl", "eval/step-0/samples.jsonl"]:
        run = tmp_path / work.replace("/", "_")
        (run / work).parent.mkdir(parents=True)
        (run / work).write_text('{"step": 1}\n')
        (run / "meta.json").write_text("{}")
        undo_start(run, None, view)
        assert (run / "meta.json").exists() and (run / work).exists(), work  # resumable as it is
    assert not said


@pytest.mark.parametrize(
    "recipe, shown",
    [
        ({"benchmark": 5}, "recipe r.yaml: benchmark must be text, got 5"),
        ({"model": {"a": 1}}, "recipe r.yaml: model must be text, got {'a': 1}"),
        ({"beta": {"a": 1}}, "recipe r.yaml: beta must be a finite number, got {'a': 1}"),
        ({"learning_rate": float("inf")}, "recipe r.yaml: learning_rate must be a finite number, got inf"),
        ({"num_generations": 0}, "num_generations must be a whole number >= 1, got 0"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be a whole number >= 1, got 0"),
    ],
    ids=["benchmark-number", "model-mapping", "beta-mapping", "lr-inf", "generations-0", "accumulation-0"],
)
def test_a_recipes_values_of_the_wrong_kind_are_one_line(recipe, shown):
    """Each was a traceback (AttributeError, TypeError, ZeroDivisionError, or `dict * Tensor` once
    training had started), or, for an infinite learning rate, a run that finished on nonsense."""
    from arlecli.train.config import resolve

    with pytest.raises(UserError) as err:
        resolve(recipe, {}, {}, recipe_name="r.yaml")
    assert shown in str(err.value) and "\n" not in str(err.value)
