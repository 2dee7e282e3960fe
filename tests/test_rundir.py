"""The run-directory module shared by eval and train: naming, meta.json and resume, checkpoints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from arlecli import rundir
from arlecli.errors import UserError
from arlecli.train.run import COMPARED, RESUMABLE

from helpers.fake_openai import FakeOpenAIServer

EVAL_COMPARED = ("card_hash", "model", "options")


def _meta(**changes: object) -> dict:
    """A train-shaped meta.json; `options__eval_every=5` sets a field inside a group."""
    meta = {
        "command": ["arle", "train"],
        "benchmark": "gsm8k",
        "card_hash": "abc",
        "model": "tiny",
        "algo": "grpo",
        "train_split": "train",
        "eval_split": "test",
        "options": {"lora_rank": 0, "eval_every": 0},
        "trainer": {"max_steps": 2, "learning_rate": 1e-5, "save_steps": 1},
        "versions": rundir.versions(),
        "created": "2025-01-01T00:00:00+0000",
    }
    for key, value in changes.items():
        group, _, field = key.partition("__")
        if field:
            meta[group] = {**meta[group], field: value}
        else:
            meta[key] = value
    return meta


def _error(excinfo: pytest.ExceptionInfo[UserError]) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------------------------------------
# Naming


def test_slug_keeps_the_last_path_part_and_safe_characters():
    assert rundir.slug("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen2.5-0.5B-Instruct"
    assert rundir.slug("/models/my model:v2/") == "my_model_v2"
    assert rundir.slug("") == "model"
    assert len(rundir.slug("x" * 100)) == 60


def test_default_dir_is_runs_bench_model_timestamp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    new = rundir.choose_dir(None, "gsm8k", "Qwen/Qwen2.5-0.5B", resume=False)
    assert re.fullmatch(r"runs/gsm8k-Qwen2\.5-0\.5B-\d{8}-\d{6}", new.as_posix())
    train = rundir.choose_dir(None, "train-gsm8k", "tiny", resume=False)
    assert re.fullmatch(r"runs/train-gsm8k-tiny-\d{8}-\d{6}", train.as_posix())
    assert rundir.choose_dir(tmp_path / "mine", "gsm8k", "tiny", resume=True) == tmp_path / "mine"


def test_resume_without_output_picks_the_latest_matching_run(tmp_path):
    base = tmp_path / "runs"
    for name in ("gsm8k-tiny-20250101-000000", "gsm8k-tiny-20250301-000000", "gsm8k-other-20251231-000000"):
        (base / name).mkdir(parents=True)
        (base / name / "meta.json").write_text("{}")
    (base / "gsm8k-tiny-20250401-000000").mkdir()  # no meta.json: never held a run
    assert rundir.latest_dir("gsm8k", "org/tiny", base=base).name == "gsm8k-tiny-20250301-000000"
    with pytest.raises(UserError) as excinfo:
        rundir.choose_dir(None, "mmlu", "tiny", resume=True, base=base)
    assert "nothing to resume" in _error(excinfo) and "--output" in str(excinfo.value)


def test_versions_name_arle_and_python():
    versions = rundir.versions()
    assert versions["arle"] and versions["python"]


# ---------------------------------------------------------------------------------------------
# meta.json and resume


def test_prepare_writes_meta_and_refuses_a_second_run_without_resume(tmp_path):
    run = tmp_path / "a" / "run"
    rundir.prepare(run, _meta(), resume=False, compare=COMPARED, may_change=RESUMABLE)
    assert json.loads((run / "meta.json").read_text()) == _meta()
    with pytest.raises(UserError) as excinfo:
        rundir.prepare(run, _meta(), resume=False, compare=COMPARED, may_change=RESUMABLE)
    assert "already holds a run; pass --resume" in _error(excinfo)


def test_resume_may_change_the_resumable_keys_and_records_them(tmp_path):
    run = tmp_path / "run"
    rundir.prepare(run, _meta(), resume=False, compare=COMPARED, may_change=RESUMABLE)
    later = _meta(
        trainer__max_steps=5,
        options__eval_every=2,
        created="2025-01-02T00:00:00+0000",
        command=["arle", "train", "--resume"],
    )
    rundir.prepare(run, later, resume=True, compare=COMPARED, may_change=RESUMABLE)
    stored = json.loads((run / "meta.json").read_text())
    assert stored["trainer"] == {"max_steps": 5, "learning_rate": 1e-5, "save_steps": 1}
    assert stored["options"]["eval_every"] == 2
    assert stored["command"] == ["arle", "train"] and stored["created"] == "2025-01-01T00:00:00+0000"
    assert stored["resumed"] == ["2025-01-02T00:00:00+0000"]
    rundir.prepare(run, _meta(trainer__max_steps=5, created="t3"), resume=True, compare=COMPARED, may_change=RESUMABLE)
    assert json.loads((run / "meta.json").read_text())["resumed"] == ["2025-01-02T00:00:00+0000", "t3"]


def test_resume_names_every_setting_that_may_not_change(tmp_path):
    run = tmp_path / "run"
    rundir.prepare(run, _meta(), resume=False, compare=COMPARED, may_change=RESUMABLE)
    before = (run / "meta.json").read_text()
    changed = _meta(
        model="other", trainer__learning_rate=1e-4, trainer__max_steps=9, options__lora_rank=4, trainer__beta=0.1
    )
    with pytest.raises(UserError) as excinfo:
        rundir.prepare(run, changed, resume=True, compare=COMPARED, may_change=RESUMABLE)
    text = _error(excinfo)
    assert text.startswith(f"cannot resume {run}: settings differ from the original run (")
    assert text.endswith("); rerun with the original settings or use a new --output")
    for diff in (
        "model: 'tiny' -> 'other'",
        "learning_rate: 1e-05 -> 0.0001",
        "lora_rank: 0 -> 4",
        "beta: None -> 0.1",
    ):
        assert diff in text
    assert "max_steps" not in text  # allowed to change, so not named
    assert (run / "meta.json").read_text() == before  # a refused resume records nothing


def test_eval_resume_compares_card_model_and_every_option(tmp_path):
    run = tmp_path / "run"
    meta = {
        "card_hash": "abc",
        "model": "m",
        "engine": "hf",
        "options": {"max_tokens": None, "seed": 1},
        "created": "t1",
    }
    rundir.prepare(run, meta, resume=False, compare=EVAL_COMPARED)
    rundir.prepare(run, {**meta, "engine": "vllm", "created": "t2"}, resume=True, compare=EVAL_COMPARED)
    with pytest.raises(UserError) as excinfo:
        rundir.prepare(run, {**meta, "options": {"max_tokens": 7, "seed": 1}}, resume=True, compare=EVAL_COMPARED)
    assert "(max_tokens: None -> 7)" in _error(excinfo)


def test_resume_of_a_folder_that_never_held_a_run_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(UserError) as excinfo:
        rundir.prepare(run, _meta(), resume=True, compare=COMPARED, may_change=RESUMABLE)
    assert f"cannot resume {run}: it has no meta.json" in _error(excinfo)
    assert not (run / "meta.json").exists()
    # An empty folder never held a run either; nor does one that does not exist (a typo in
    # --output must not quietly start a fresh run): both refused, and nothing is created.
    (tmp_path / "empty").mkdir()
    for folder, why in ((tmp_path / "empty", "it has no meta.json"), (tmp_path / "new", "no such directory")):
        with pytest.raises(UserError) as excinfo:
            rundir.prepare(folder, _meta(), resume=True, compare=COMPARED, may_change=RESUMABLE)
        assert f"cannot resume {folder}: {why}" in _error(excinfo)
        assert not (folder / "meta.json").exists()
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "{not json"], ids=["list", "string", "broken"])
def test_resume_with_a_meta_json_that_is_not_an_object_is_one_line(tmp_path, content):
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(content)
    with pytest.raises(UserError) as excinfo:
        rundir.prepare(run, _meta(), resume=True, compare=COMPARED, may_change=RESUMABLE)
    text = _error(excinfo)
    assert text.startswith("cannot ") and "meta.json" in text


def _arle(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arlecli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ.copy(),
        cwd=cwd,
    )


def test_eval_cli_resume_errors_are_one_line_exit_2(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "What is 1 plus 1?", "answer": "#### 2"}) + "\n")
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "meta.json").write_text("[]")
    with FakeOpenAIServer(lambda body: "#### 2") as srv:
        common = ["eval", "gsm8k", "--data", str(data), "--base-url", srv.base_url, "--num-fewshot", "0", "--resume"]
        results = {
            name: _arle(*common, *extra, cwd=tmp_path)
            for name, extra in [("stray", ["--output", str(stray)]), ("bad", ["--output", str(bad)]), ("none", [])]
        }
    for name, proc in results.items():
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (name, proc.stderr)
    assert "it has no meta.json" in results["stray"].stderr
    assert "is not a JSON object" in results["bad"].stderr
    assert "nothing to resume: no runs/gsm8k-" in results["none"].stderr


def test_an_output_that_cannot_be_made_is_refused_before_any_model_loads(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for output, said in [
        (afile, "is a file, not a run directory"),
        (afile / "sub", f"{afile} is a file"),
        (afile / "a" / "b", f"{afile} is a file"),
    ]:
        with pytest.raises(UserError, match=re.escape(said)):
            rundir.check_fresh(output, resume=False)
        proc = _arle("eval", "one_digit_sums", "--limit", "1", "--max-tokens", "1", "-o", str(output), cwd=tmp_path)
        assert proc.returncode == 2 and said in proc.stderr and "loading" not in proc.stderr, proc.stderr
    rundir.check_fresh(tmp_path / "new" / "run", resume=False)  # a path that can be made: fine, nothing made
    assert not (tmp_path / "new").exists()


def test_a_second_process_cannot_write_a_run_that_is_running(tmp_path):
    """Two runs appending to one samples.jsonl interleave and duplicate samples: the second is
    refused at once, naming the first's pid; a kill -9 of the first frees the run, and the
    resume completes it with each sample once."""
    import signal
    import time

    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(12))
    )
    run = tmp_path / "run"
    with FakeOpenAIServer(lambda body: "#### 2", delay_s=0.5) as srv:
        common = ["eval", "gsm8k", "--data", str(data), "--base-url", srv.base_url, "--num-fewshot", "0"]
        first = subprocess.Popen(
            [sys.executable, "-m", "arlecli", *common, "--output", str(run), "--concurrency", "1"],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not (run / "samples.jsonl").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            second = _arle(*common, "--output", str(run), "--resume", cwd=tmp_path)
            assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
            assert f"in use by another arle process (pid {first.pid})" in second.stderr
            assert first.poll() is None  # still running, untouched
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        third = _arle(*common, "--output", str(run), "--resume", cwd=tmp_path)
    assert third.returncode == 0, third.stderr
    ids = [json.loads(line)["id"] for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 12


# ---------------------------------------------------------------------------------------------
# Checkpoints


def _checkpoint(run: Path, step: int, state: str | None, content: bytes | None = None) -> Path:
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    if state and content is not None:
        (folder / state).write_bytes(content)
    elif state == "trainer_state.pt":
        with zipfile.ZipFile(folder / state, "w") as z:  # what torch.save writes
            z.writestr("archive/data.pkl", b"state")
    elif state:
        (folder / state).write_text('{"global_step": %d}' % step)
    return folder


def test_checkpoints_are_complete_ones_in_step_order(tmp_path):
    run = tmp_path / "run"
    _checkpoint(run, 2, "trainer_state.json")  # TRL
    _checkpoint(run, 9, "trainer_state.pt")  # arle's PPO
    _checkpoint(run, 10, "trainer_state.json")
    _checkpoint(run, 12, None)  # cut short mid-save: ignored
    # Killed while the state file itself was being written: it exists, but not whole.
    _checkpoint(run, 13, "trainer_state.json", b"")
    _checkpoint(run, 14, "trainer_state.json", b'{"global_step": 1')
    _checkpoint(run, 15, "trainer_state.pt", b"PK\x03\x04 a zip cut short")
    (run / "checkpoint-20").write_text("a file, not a folder")
    (run / "checkpoint-x").mkdir()
    assert [p.name for p in rundir.checkpoints(run)] == ["checkpoint-2", "checkpoint-9", "checkpoint-10"]
    latest = rundir.latest_checkpoint(run)
    assert latest is not None and latest.name == "checkpoint-10" and rundir.checkpoint_step(latest) == 10
    assert rundir.latest_checkpoint(tmp_path / "missing") is None
    assert rundir.latest_checkpoint(tmp_path) is None


def test_prune_keeps_the_newest_complete_checkpoints(tmp_path):
    run = tmp_path / "run"
    for step in (1, 2, 3):
        _checkpoint(run, step, "trainer_state.pt")
    _checkpoint(run, 4, None)
    rundir.prune_checkpoints(run, None)
    assert len(list(run.iterdir())) == 4
    rundir.prune_checkpoints(run, 2)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]


def test_a_damaged_meta_json_says_what_to_do(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text('{"benchmark": "gsm8k",\n')  # cut short, as by a full disk
    with pytest.raises(UserError) as excinfo:
        rundir.read_meta(run)
    text = _error(excinfo)
    assert text.startswith(f"cannot read {run / 'meta.json'}: ") and "restore it, or start again" in text


def test_a_refused_resume_gives_the_run_back(tmp_path):
    """A resume refused in a process that goes on (a notebook) must not keep the run from the
    next process: the lock goes with the refusal; a run under way keeps it."""
    run = tmp_path / "run"
    rundir.prepare(run, _meta(), resume=False, compare=COMPARED, may_change=RESUMABLE)
    take = [sys.executable, "-c", f"from arlecli import rundir; rundir.hold({str(run)!r}); print('took it')"]
    held = subprocess.run(take, capture_output=True, text=True, timeout=60)
    assert held.returncode != 0 and f"(pid {os.getpid()})" in held.stderr  # under way: ours
    rundir.release(run)
    changed = {**_meta(), "model": "another-model"}
    with pytest.raises(UserError, match="model"):
        rundir.prepare(run, changed, resume=True, compare=COMPARED, may_change=RESUMABLE)
    free = subprocess.run(take, capture_output=True, text=True, timeout=60)
    assert free.returncode == 0 and free.stdout.strip() == "took it", free.stderr
