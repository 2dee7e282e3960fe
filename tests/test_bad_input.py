"""Bad input is one line, exit 2, nothing lost (issue 12, item 6).

Every case drives the real CLI in a subprocess against a fake OpenAI-compatible server and
asserts: exit code 2, exactly one line (on stderr, nothing on stdout) that names the problem
and what to do, no traceback, and, for a run directory that already exists, every file in it
byte-identical afterwards. Rows and cards are refused before any request reaches the model.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from helpers.cli import arle, assert_one_line_error, snapshot
from helpers.fake_openai import FakeOpenAIServer

GSM_ROWS = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(4)]
HUMANEVAL_ROW = {
    "task_id": "HumanEval/0",
    "prompt": "def f():\n",
    "canonical_solution": "    return 1\n",
    "test": "def check(c):\n    assert c() == 1\n",
    "entry_point": "f",
}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    """One fake endpoint for the module; every reply is a gsm8k-style answer."""
    with FakeOpenAIServer(lambda body: " #### 2") as srv:
        yield srv


@pytest.fixture
def gsm(server: FakeOpenAIServer, tmp_path: Path):
    """`arle eval gsm8k` on the fake endpoint, with extra args; records how many requests it made."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        before = len(server.bodies())
        proc = arle("eval", "gsm8k", "--base-url", server.base_url, "--num-fewshot", "0", *args, cwd=tmp_path)
        proc.requests = len(server.bodies()) - before  # type: ignore[attr-defined]
        return proc

    return run


@pytest.fixture
def finished_run(gsm, tmp_path: Path) -> tuple[Path, Path]:
    """A finished 4-task gsm8k run: (its directory, its --rows file)."""
    data = write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    run = tmp_path / "run"
    proc = gsm("--rows", str(data), "--output", str(run))
    assert proc.returncode == 0, proc.stderr
    assert len((run / "samples.jsonl").read_text().splitlines()) == 4
    return run, data


# ---------------------------------------------------------------------------------------------
# --rows files


@pytest.mark.parametrize(
    "name, content, shown",
    [
        ("rows.jsonl", "null\n", "is null"),
        ("rows.jsonl", json.dumps(GSM_ROWS[0]) + '\n"just text"\n', "row 2 of rows.jsonl is a string"),
        ("rows.jsonl", "3\n", "is a number (3)"),
        ("rows.json", "[[1, 2]]", "is a list ([1, 2])"),
        ("rows.json", '{"rows": [null]}', "is null"),
    ],
    ids=["null", "string", "number", "list", "json-rows-null"],
)
def test_data_rows_that_are_scalars_or_null(gsm, tmp_path, name, content, shown):
    (tmp_path / name).write_text(content)
    proc = gsm("--rows", name, "--output", "run")
    assert_one_line_error(proc, shown, "every row must be a JSON object")
    assert proc.requests == 0 and not (tmp_path / "run").exists()


def test_data_rows_given_a_folder_says_so(gsm, tmp_path):
    (tmp_path / "d").mkdir()
    proc = gsm("--rows", "d", "--output", "run")
    assert_one_line_error(proc, "data file d is a folder", "pass the rows file in it")


def test_data_jsonl_with_a_broken_line_names_the_line(gsm, tmp_path):
    (tmp_path / "rows.jsonl").write_text(json.dumps(GSM_ROWS[0]) + "\n{not json\n")
    proc = gsm("--rows", "rows.jsonl", "--output", "run")
    assert_one_line_error(proc, "rows.jsonl: line 2 is not valid JSON", "fix or remove that line")


def test_data_gz_that_is_cut_off(gsm, tmp_path):
    import gzip

    packed = gzip.compress("".join(json.dumps(r) + "\n" for r in GSM_ROWS * 200).encode())
    (tmp_path / "rows.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    proc = gsm("--rows", "rows.jsonl.gz", "--output", "run")
    assert_one_line_error(proc, "cannot read rows.jsonl.gz: ", "repair or replace the file")
    assert proc.requests == 0


@pytest.mark.parametrize("how", ["not-parquet", "truncated"])
def test_corrupt_parquet(gsm, tmp_path, how):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    if how == "not-parquet":
        path.write_text("question,answer\n1,2\n")
    else:
        pq.write_table(pa.Table.from_pylist(GSM_ROWS), path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    proc = gsm("--rows", str(path), "--output", "run")
    assert_one_line_error(proc, f"cannot read {path}: not a readable parquet file", "pass rows as .jsonl")
    assert proc.requests == 0


def test_rows_missing_the_id(server, tmp_path):
    # humaneval's card maps `id` to the dataset's task_id column; the third row lacks it.
    rows = [{**HUMANEVAL_ROW, "task_id": f"HumanEval/{i}"} for i in range(2)]
    rows.append({k: v for k, v in HUMANEVAL_ROW.items() if k != "task_id"})
    write_jsonl(tmp_path / "rows.jsonl", rows)
    proc = arle(
        "eval", "humaneval", "--rows", "rows.jsonl", "--base-url", server.base_url, "--output", "run", cwd=tmp_path
    )
    assert_one_line_error(
        proc,
        "field 'fields.id': column 'task_id' is not in the rows of rows.jsonl",
        "row 3",
        "fix the card or give rows",
    )
    assert not (tmp_path / "run").exists()


def test_rows_missing_a_field_the_reward_needs_are_refused_before_generation(server, tmp_path):
    # Input and target are there, so the prompt renders; code_tests needs `test` to score.
    rows = [{**HUMANEVAL_ROW, "task_id": f"HumanEval/{i}"} for i in range(3)]
    del rows[2]["test"]
    write_jsonl(tmp_path / "rows.jsonl", rows)
    before = len(server.bodies())
    proc = arle(
        "eval", "humaneval", "--rows", "rows.jsonl", "--base-url", server.base_url, "--output", "run", cwd=tmp_path
    )
    assert_one_line_error(
        proc, "task 'HumanEval/2' of rows.jsonl has no field 'test'", "reward 'code_tests'", "param test_field"
    )
    assert len(server.bodies()) == before, "no sample may be generated before the rows are checked"
    assert not (tmp_path / "run").exists()


def test_each_rewards_declared_fields_name_real_params_of_it():
    # Each reward declares the task fields it needs at @register(fields=...); a "{param}" there
    # must be one of the reward's own params (a renamed param would silently check nothing).
    import inspect

    from arlecli.rewards import REWARDS, declared_fields, reward_fields, reward_names, spec_params

    checked = {}
    for name in reward_names():
        factory = REWARDS.get(name)
        declared = declared_fields(factory)
        takes = set(inspect.signature(factory).parameters)
        specs = [] if callable(declared) else list(declared)
        for spec in specs:
            assert isinstance(spec, str) and spec.strip(), f"reward {name!r} declares field {spec!r}"
            assert set(spec_params(spec)) <= takes, f"reward {name!r}: field {spec!r} names a param it does not take"
        for field in reward_fields(name, {}):  # callables and defaults resolve to real column names
            assert field.names and all(n and "{" not in n for n in field.names), (name, field)
            assert field.param is None or field.param in takes or field.param.startswith("reward_params."), field
        checked[name] = [f.names for f in reward_fields(name, {})]
    # Every reward that reads a task field it cannot score without declares it.
    assert checked["code_tests"] == [("prompt",), ("test",), ("entry_point",)]
    assert checked["code_unittest"] == [("complete_prompt",), ("test",), ("entry_point",)]
    assert checked["code_io"] == [("tests",)]
    assert checked["countdown"] == [("numbers", "metadata")]
    assert checked["solver_judge"] == checked["countdown"]  # its inner reward's, countdown by default
    assert checked["reasoning_gym"] == [("metadata",)] and reward_fields("reasoning_gym", {"task": "maze"}) == []
    assert checked["frozenlake"] == [("map",)] and checked["ifeval"] == [("instruction_id_list",)]
    assert reward_fields("code_io", {"tests_fields": ["public", "private"]})[0].names == ("public", "private")


def test_a_countdown_row_without_numbers_is_refused_before_generation(server, tmp_path):
    # Scoring reads `numbers` (or a reasoning-gym `metadata` holding them): without either the
    # reward would fail at scoring, after every sample was generated.
    rows = [
        {"question": "Make 10 from 2 3 5", "numbers": [2, 3, 5], "target": 10},
        {"question": "Make 24 from 1 2 3 4", "target": 24},
    ]
    write_jsonl(tmp_path / "rows.jsonl", rows)
    before = len(server.bodies())
    proc = arle(
        "eval", "countdown", "--rows", "rows.jsonl", "--base-url", server.base_url, "--output", "run", cwd=tmp_path
    )
    assert_one_line_error(
        proc,
        "task '1' of rows.jsonl has no field 'numbers' or 'metadata'",
        "reward 'countdown' needs",
        "give rows with that column",
    )
    assert len(server.bodies()) == before, "no sample may be generated before the rows are checked"
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# Cards

BASE_CARD: dict[str, Any] = {
    "name": "mine",
    "category": "math",
    "source": {"kind": "files", "path": "rows.jsonl"},
    "fields": {"input": "question", "target": "answer"},
    "prompt": {
        "format": "completion",
        "template": "Question: {input}\nAnswer:",
        "stop": ["Question:"],
        "max_tokens": 32,
    },
    "reward": {"name": "gsm8k"},
}
CODE_REWARD = {"name": "code_tests", "params": {"timeout_s": 10}}
GENERATOR_CARD: dict[str, Any] = {
    **BASE_CARD,
    "category": "procedural",
    "reward": {"name": "countdown"},
    "source": {"kind": "generator", "path": "countdown", "splits": {"test": {"seed": 1, "size": 5}}},
}


def _card(changes: dict[str, Any], base: dict[str, Any] = BASE_CARD) -> dict[str, Any]:
    """A copy of `base` with `changes` applied ("prompt.max_tokens": 0 sets that nested key)."""
    card = json.loads(json.dumps(base))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = card
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return card


CARD_CASES = {
    "stop-number": ({"prompt.stop": ["Question:", 7]}, "'prompt.stop[1]': must be a non-empty string"),
    "stop-null": ({"prompt.stop": [None]}, "'prompt.stop[0]': must be a non-empty string"),
    "stop-not-a-list": ({"prompt.stop": "Question:"}, "'prompt.stop': must be list"),
    "max-tokens-zero": ({"prompt.max_tokens": 0}, "'prompt.max_tokens': must be at least 1, got 0"),
    "max-tokens-negative": ({"prompt.max_tokens": -5}, "'prompt.max_tokens': must be at least 1, got -5"),
    "max-tokens-text": ({"prompt.max_tokens": "many"}, "'prompt.max_tokens': must be int, got str"),
    "max-tokens-bool": ({"prompt.max_tokens": True}, "'prompt.max_tokens': must be int, got bool"),
    "fewshot-negative": ({"prompt.fewshot": {"split": "train", "n": -2}}, "'prompt.fewshot.n': must be 0 or more"),
    "size-text": (
        {"source.splits.test.size": "ten"},
        "'source.splits.test.size': must be a whole number, got str ('ten')",
    ),
    "size-float": ({"source.splits.test.size": 2.5}, "'source.splits.test.size': must be a whole number, got float"),
    "size-zero": ({"source.splits.test.size": 0}, "'source.splits.test.size': must be at least 1"),
    "seed-missing": ({"source.splits.test": {"size": 5}}, "'source.splits.test': a generator split needs {seed, size}"),
    "timeout-negative": (
        {"reward": {**CODE_REWARD, "params": {"timeout_s": -1}}},
        "'reward.params.timeout_s': must not be negative, got -1",
    ),
    "timeout-zero": (
        {"reward": {**CODE_REWARD, "params": {"timeout_s": 0}}},
        "'reward.params.timeout_s': must be greater than 0",
    ),
    "param-text": (
        {"reward": {**CODE_REWARD, "params": {"timeout_s": "ten"}}},
        "'reward.params.timeout_s': must be a number, got str ('ten')",
    ),
    "param-bool-not-number": (
        {"reward": {**CODE_REWARD, "params": {"memory_mb": True}}},
        "'reward.params.memory_mb': must be a whole number, got bool",
    ),
    "param-number-not-bool": (
        {"reward": {**CODE_REWARD, "params": {"call_check": 1}}},
        "'reward.params.call_check': must be true or false, got int (1)",
    ),
    "param-list-of-numbers": (
        {"reward": {"name": "code_io", "params": {"tests_fields": [1]}}},
        "'reward.params.tests_fields': must be a string or a list of strings",
    ),
    "param-unknown": (
        {"reward": {**CODE_REWARD, "params": {"timout_s": 10}}},
        "'reward.params.timout_s': is not a param of reward 'code_tests'; did you mean 'timeout_s'?",
    ),
    "param-number-not-str": (
        {"reward": {"name": "gsm8k", "params": {"primary": 3}}},
        "'reward.params.primary': must be a string, got int (3)",
    ),
}


@pytest.mark.parametrize("case", list(CARD_CASES))
def test_bad_card_values_name_the_file_and_field(gsm, tmp_path, case):
    changes, message = CARD_CASES[case]
    card = _card(changes, GENERATOR_CARD if any(k.startswith("source.") for k in changes) else BASE_CARD)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(card))
    write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    proc = arle("eval", str(path), "--base-url", "http://127.0.0.1:9/v1", "--output", "run", cwd=tmp_path)
    assert_one_line_error(proc, f"{path}: field {message}")
    assert not (tmp_path / "run").exists()


def test_a_broken_card_breaks_only_itself_in_bench_list(isolated_home, tmp_path):
    user = isolated_home / "benchmarks"
    user.mkdir()
    (user / "mine.yaml").write_text(yaml.safe_dump(_card({"name": "mine", "prompt.max_tokens": 0})))
    (user / "notyaml.yaml").write_text("name: [unclosed\n")
    (user / "good.yaml").write_text(yaml.safe_dump(_card({"name": "good"})))
    out = arle("bench", "list", cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "gsm8k" in out.stdout and "good" in out.stdout  # packaged and user cards still listed
    broken = [line for line in out.stdout.splitlines() if line.startswith("broken: ")]
    assert len(broken) == 2, out.stdout
    assert broken[0].startswith(f"broken: mine: {user / 'mine.yaml'}: field 'prompt.max_tokens': must be at least 1")
    assert broken[1].startswith(f"broken: notyaml: {user / 'notyaml.yaml'}:") and "is not valid YAML" in broken[1]

    as_json = arle("bench", "list", "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    entries = {e["name"]: e for e in json.loads(as_json.stdout)}
    assert "must be at least 1" in entries["mine"]["broken"] and "broken" not in entries["good"]
    assert entries["gsm8k"]["category"] == "math"
    # Running the broken card itself is the usual one-line error.
    assert_one_line_error(
        arle("eval", "mine", "--base-url", "http://127.0.0.1:9/v1", cwd=tmp_path), "field 'prompt.max_tokens'"
    )


# ---------------------------------------------------------------------------------------------
# --output


def test_output_that_is_a_file(gsm, tmp_path):
    write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    (tmp_path / "taken").write_text("mine")
    proc = gsm("--rows", "rows.jsonl", "--output", "taken")
    assert_one_line_error(proc, "taken is a file, not a run directory; choose another --output")
    assert (tmp_path / "taken").read_text() == "mine" and proc.requests == 0


def test_output_that_cannot_be_created(gsm, tmp_path):
    # Under a file, so even root cannot create it (a read-only folder stops only other users).
    write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    (tmp_path / "taken").write_text("mine")
    proc = gsm("--rows", "rows.jsonl", "--output", "taken/run")
    assert_one_line_error(proc, "cannot write the run directory taken/run", "choose another --output")
    assert (tmp_path / "taken").read_text() == "mine" and proc.requests == 0


def test_output_in_a_read_only_folder(gsm, tmp_path):
    # Root writes into a chmod-555 folder, but not into sysfs: each user gets a folder it cannot write.
    write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    if os.geteuid() == 0:
        target, why = "/sys/arle-run/run", "Operation not permitted"
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        target, why = "locked/run", "Permission denied"
    try:
        proc = gsm("--rows", "rows.jsonl", "--output", target)
    finally:
        if os.geteuid() != 0:
            (tmp_path / "locked").chmod(0o755)
    assert_one_line_error(proc, f"cannot write the run directory {target}: {why}", "choose another --output")


# ---------------------------------------------------------------------------------------------
# --resume: the run directory is left byte for byte as it was


@pytest.mark.parametrize(
    "content",
    ["[1, 2]", '"text"', "{not json", "", '{"a": ' + "[" * 20_000 + "]" * 20_000 + "}", b'{"model": "\xff"}'],
    ids=["list", "string", "broken", "empty", "20k-deep", "not-utf8"],
)
def test_resume_with_a_meta_json_that_is_not_an_object(gsm, finished_run, content):
    run, data = finished_run
    (run / "meta.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    before = snapshot(run)
    proc = gsm("--rows", str(data), "--output", str(run), "--resume")
    assert_one_line_error(proc, f"cannot resume {run}: its meta.json is not", "choose a new --output")
    assert snapshot(run) == before and proc.requests == 0


def test_resume_on_a_directory_that_never_held_a_run(gsm, tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    (stray / "samples.jsonl").write_text("not a sample\n")
    before = snapshot(stray)
    proc = gsm("--rows", str(data), "--output", str(stray), "--resume")
    assert_one_line_error(proc, f"cannot resume {stray}: it has no meta.json", "drop --resume or choose another")
    assert snapshot(stray) == before and proc.requests == 0


@pytest.mark.parametrize(
    "bad_line",
    ["{not json", "", "[1, 2]", '{"id": "x"}', "\udcff"],
    ids=["broken-json", "blank", "not-an-object", "not-a-sample", "bad-utf8"],
)
def test_resume_with_a_corrupt_line_in_the_middle_of_samples(gsm, finished_run, bad_line):
    run, data = finished_run
    samples = run / "samples.jsonl"
    lines = samples.read_bytes().split(b"\n")
    lines[1] = bad_line.encode("utf-8", "surrogateescape")
    samples.write_bytes(b"\n".join(lines))
    before = snapshot(run)
    proc = gsm("--rows", str(data), "--output", str(run), "--resume")
    assert_one_line_error(proc, f"{samples}: line 2 is not a sample", "repair that line or delete it")
    assert snapshot(run) == before and proc.requests == 0


def test_resume_redoes_a_torn_last_line(gsm, finished_run):
    run, data = finished_run
    samples = run / "samples.jsonl"
    full = samples.read_bytes()
    results = json.loads((run / "results.json").read_text())
    samples.write_bytes(full[: len(full) - 20])  # a kill in the middle of writing the 4th sample
    proc = gsm("--rows", str(data), "--output", str(run), "--resume", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.requests == 1  # only the torn sample is generated again
    ids = [json.loads(line)["id"] for line in samples.read_text().splitlines()]
    assert sorted(ids) == sorted(f"{i}#0" for i in range(4))
    assert json.loads(proc.stdout)["metrics"] == results["metrics"]


def test_resume_compares_the_content_of_data_not_only_its_path(gsm, finished_run):
    run, data = finished_run
    meta = json.loads((run / "meta.json").read_text())
    assert len(meta["data_hash"]) == 16
    write_jsonl(data, [*GSM_ROWS[:3], {"question": "What is 9 plus 9?", "answer": "#### 18"}])  # same path
    before = snapshot(run)
    proc = gsm("--rows", str(data), "--output", str(run), "--resume")
    assert_one_line_error(
        proc,
        f"cannot resume {run}: settings differ",
        "data_hash: ",
        "rerun with the original settings or use a new --output",
    )
    assert snapshot(run) == before and proc.requests == 0

    write_jsonl(data, GSM_ROWS)  # the original content again: the resume goes ahead
    again = gsm("--rows", str(data), "--output", str(run), "--resume")
    assert again.returncode == 0, again.stderr
    assert again.requests == 0


def test_resume_of_a_run_that_predates_data_hash_records_it(gsm, finished_run):
    run, data = finished_run
    meta = json.loads((run / "meta.json").read_text())
    recorded = meta.pop("data_hash")
    (run / "meta.json").write_text(json.dumps(meta))
    proc = gsm("--rows", str(data), "--output", str(run), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "meta.json").read_text())["data_hash"] == recorded


def test_resume_of_an_output_that_never_ran(gsm, tmp_path):
    # A typo in --output with --resume must not quietly start a fresh run somewhere else.
    data = write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    proc = gsm("--rows", str(data), "--output", "runz", "--resume")
    assert_one_line_error(proc, "cannot resume runz: no such directory", "check the --output path", "drop --resume")
    assert proc.requests == 0 and not (tmp_path / "runz").exists()
    (tmp_path / "empty").mkdir()
    proc = gsm("--rows", str(data), "--output", "empty", "--resume")
    assert_one_line_error(proc, "cannot resume empty: it has no meta.json", "drop --resume")
    assert proc.requests == 0 and not any((tmp_path / "empty").iterdir())


def test_train_resume_of_an_output_that_never_ran(tmp_path):
    proc = arle("train", "countdown", "--model", "nowhere/model", "--output", "runz", "--resume", cwd=tmp_path)
    assert_one_line_error(proc, "cannot resume runz: no such directory", "drop --resume")
    assert not (tmp_path / "runz").exists()


# ---------------------------------------------------------------------------------------------
# YAML and JSON that would expand, nest or decode past what a reader can hold

# A "billion laughs": 9 levels of 9 aliases each, ~387 M strings once expanded.
ALIAS_BOMB = (
    "["
    + ", ".join([f"&a0 [{', '.join(['lol'] * 9)}]"] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)])
    + "]"
)
DEEP_YAML = "[" * 20_000 + "]" * 20_000


def _card_text(description: str) -> str:
    """BASE_CARD as YAML with `description` spliced in as raw YAML (an alias bomb, deep nesting)."""
    return f"description: {description}\n" + yaml.safe_dump(BASE_CARD)


@pytest.mark.parametrize("command", [["bench", "show"], ["eval"]], ids=["bench-show", "eval"])
@pytest.mark.parametrize(
    "description, shown",
    [(ALIAS_BOMB, "YAML aliases (*name) are not accepted here"), (DEEP_YAML, "nested more than 200 deep")],
    ids=["alias-bomb", "20k-deep"],
)
def test_a_card_that_would_expand_or_nest_without_end(tmp_path, command, description, shown):
    card = tmp_path / "mine.yaml"
    card.write_text(_card_text(description))
    write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    extra = ["--base-url", "http://127.0.0.1:9/v1", "--output", "run"] if command == ["eval"] else []
    proc = arle(*command, str(card), *extra, cwd=tmp_path, timeout=60)
    line = assert_one_line_error(proc, f"{card}: line 1 is not valid YAML: {shown}")
    assert len(line) < 300 and not (tmp_path / "run").exists()


def test_a_card_or_recipe_that_gives_a_key_twice(tmp_path):
    card = tmp_path / "mine.yaml"
    card.write_text(yaml.safe_dump(BASE_CARD) + "category: code\n")
    proc = arle("bench", "show", str(card), cwd=tmp_path)
    assert_one_line_error(proc, f"{card}: line ", "is not valid YAML: the key 'category' appears twice: keep one")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("algo: grpo\nbeta: 0.1\nbeta: 0.2\n")
    proc = arle("train", "countdown", "--recipe", str(recipe), "--output", "run", cwd=tmp_path, timeout=60)
    assert_one_line_error(proc, f"{recipe}: line 3 is not valid YAML: the key 'beta' appears twice: keep one")
    assert not (tmp_path / "run").exists()


def test_a_card_that_is_not_utf8(tmp_path):
    card = tmp_path / "mine.yaml"
    card.write_bytes(yaml.safe_dump({**BASE_CARD, "description": "caf\u00e9"}, allow_unicode=True).encode("latin-1"))
    proc = arle("bench", "show", str(card), cwd=tmp_path)
    assert_one_line_error(proc, f"card {card} is not UTF-8 text (byte ", "save it as UTF-8")


@pytest.mark.parametrize(
    "base_url, shown",
    [(ALIAS_BOMB, "YAML aliases (*name) are not accepted here"), (DEEP_YAML, "nested more than 200 deep")],
    ids=["alias-bomb", "20k-deep"],
)
def test_a_profile_that_would_expand_or_nest_without_end(gsm, isolated_home, tmp_path, base_url, shown):
    profiles = isolated_home / "models.yaml"
    profiles.write_text(f"default: mine\nprofiles:\n  mine:\n    backend: openai\n    base_url: {base_url}\n")
    write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    proc = arle("eval", "gsm8k", "--model", "mine", "--rows", "rows.jsonl", "--output", "run", cwd=tmp_path, timeout=60)
    line = assert_one_line_error(proc, f"{profiles}: not valid YAML (line 5; {shown}", "fix the file or delete it")
    assert len(line) < 300 and not (tmp_path / "run").exists()
    assert_one_line_error(arle("model", "list", cwd=tmp_path, timeout=60), f"{profiles}: not valid YAML")


def test_a_profiles_file_that_is_not_utf8(isolated_home, tmp_path):
    profiles = isolated_home / "models.yaml"
    profiles.write_bytes("default: caf\u00e9\nprofiles: {}\n".encode("latin-1"))
    write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    proc = arle("eval", "gsm8k", "--rows", "rows.jsonl", "--output", "run", cwd=tmp_path)
    assert_one_line_error(proc, f"model profiles file {profiles} is not UTF-8 text (byte 12)", "save it as UTF-8")
    assert not (tmp_path / "run").exists()


def test_a_recipe_with_an_alias_bomb(tmp_path):
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(f"algo: grpo\nbeta: {ALIAS_BOMB}\n")
    proc = arle("train", "countdown", "--recipe", str(recipe), "--output", "run", cwd=tmp_path, timeout=60)
    assert_one_line_error(proc, f"{recipe}: line 2 is not valid YAML: YAML aliases (*name) are not accepted here")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "name, content, shown",
    [
        (
            "rows.jsonl",
            json.dumps(GSM_ROWS[0]) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n",
            "rows.jsonl: line 2 is not valid JSON (JSON nested more than 200 deep); fix or remove that line",
        ),
        (
            "rows.json",
            '{"rows": ' + "[" * 100_000 + "]" * 100_000 + "}",
            "cannot read rows.json: JSON nested more than 200 deep; repair or replace the file",
        ),
        ("rows.jsonl", b'{"question": "caf\xe9", "answer": "#### 1"}\n', "data file rows.jsonl is not UTF-8 text"),
        ("rows.json", b'[{"question": "caf\xe9", "answer": "#### 1"}]', "data file rows.json is not UTF-8 text"),
    ],
    ids=["jsonl-100k-deep", "json-100k-deep", "jsonl-not-utf8", "json-not-utf8"],
)
def test_data_that_nests_without_end_or_is_not_utf8(gsm, tmp_path, name, content, shown):
    (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    proc = gsm("--rows", name, "--output", "run")
    assert_one_line_error(proc, shown)
    assert proc.requests == 0 and not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# What a sample holds never stops the run


def test_a_data_row_with_a_lone_surrogate_evaluates_to_the_end(gsm, tmp_path):
    # `"\ud800"` is valid JSON but no UTF-8 text: the prompt (and samples.jsonl) would not encode.
    rows = [dict(r) for r in GSM_ROWS]
    rows[1]["question"] = "What is \ud800 plus 1?"
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # ASCII: the escape
    proc = gsm("--rows", "rows.jsonl", "--output", "run", "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.requests == 4
    lines = (tmp_path / "run" / "samples.jsonl").read_bytes().decode("utf-8").splitlines()  # valid UTF-8
    samples = {s["task_id"]: s for s in map(json.loads, lines)}
    assert sorted(samples) == ["0", "1", "2", "3"]
    assert "What is \ufffd plus 1?" in samples["1"]["prompt"]
    assert json.loads(proc.stdout)["n_samples"] == 4


FLAKY_REWARD = """\
from arlecli.types import Score


def score():
    def fn(task, episode):
        if task.id == "2":
            raise ZeroDivisionError("no luck with \\ud800 " + "x" * 2000)
        if task.id == "3":
            return "not a Score"
        return Score(1.0, True, episode.completion, {})
    return fn
"""


def test_a_reward_that_raises_on_one_sample_scores_it_wrong_and_the_run_goes_on(server, tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY_REWARD)
    card = tmp_path / "mine.yaml"
    card.write_text(yaml.safe_dump({**BASE_CARD, "reward": {"name": "flaky.py:score"}}))
    write_jsonl(tmp_path / "rows.jsonl", GSM_ROWS)
    proc = arle("eval", str(card), "--base-url", server.base_url, "--output", "run", "--json", cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"warning: reward '{(tmp_path / 'flaky.py').resolve()}:score' raised on 2 of 4 samples" in proc.stderr
    lines = (tmp_path / "run" / "samples.jsonl").read_bytes().decode("utf-8").splitlines()
    samples = {s["task_id"]: s for s in map(json.loads, lines)}
    assert sorted(samples) == ["0", "1", "2", "3"]
    assert [samples[t]["correct"] for t in "0123"] == [True, True, False, False]
    error = samples["2"]["details"]["reward_error"]
    assert samples["2"]["reward"] == 0.0 and error.startswith("ZeroDivisionError: no luck with \ufffd xxx")
    assert len(error) < 400  # clipped
    assert samples["3"]["details"] == {"reward_error": "TypeError: the reward returned str, not a Score"}
    results = json.loads(proc.stdout)
    assert results["reward_errors"] == 2 and results["metrics"]["accuracy"]["value"] == 0.5


def test_score_samples_lets_interrupts_and_user_errors_through():
    from arlecli.errors import UserError
    from arlecli.rewards import score_samples
    from arlecli.types import Episode, Task

    tasks, episodes = [Task("a", "q", "1"), Task("b", "q", "2")], [Episode("a", []), Episode("b", [])]

    def raising(exc: BaseException):
        def fn(task, episode):
            raise exc

        return fn

    with pytest.raises(KeyboardInterrupt):  # Ctrl-C still stops the run
        score_samples(raising(KeyboardInterrupt()), tasks, episodes)
    with pytest.raises(UserError, match="judge unreachable"):  # a mistake the user must fix stops it too
        score_samples(raising(UserError("judge unreachable")), tasks, episodes)

    class Batched:
        """A batch that raises for one sample is scored again one by one: only that one is wrong."""

        def score_batch(self, ts, es):
            raise ValueError("one bad sample")

        def __call__(self, task, episode):
            if task.id == "b":
                raise ValueError("bad b")
            from arlecli.types import Score

            return Score(1.0, True)

    scores = score_samples(Batched(), tasks, episodes)
    assert [s.correct for s in scores] == [True, False]
    assert scores[1].details == {"reward_error": "ValueError: bad b"}
