"""`arle model ...` through the real CLI, and how --model resolves (models.resolve_model)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arlecli import config, models
from arlecli.cli import main as cli_main
from arlecli.cli import model as model_cli
from arlecli.errors import UserError

SECRET = "sk-test-0123456789-do-not-store"


@pytest.fixture(scope="module")
def app():
    cli_main.register_commands()
    return cli_main.app


def run(app, *args: str, input: str | None = None):
    return CliRunner().invoke(app, list(args), input=input, catch_exceptions=False)


def arle(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real entry point (main(): UserError -> one line on stderr, exit 2) in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "arlecli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_crud(app, isolated_home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "my model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")

    r = run(app, "model", "setup", "--name", "qwen", "--hub-id", "Qwen/Qwen2.5-0.5B-Instruct", "--default")
    assert r.exit_code == 0, r.output
    assert "saved profile qwen" in r.output and "(default)" in r.output
    r = run(app, "model", "setup", "--name", "local", "--path", str(folder), "--backend", "vllm")
    assert r.exit_code == 0 and str(folder) in r.output
    r = run(app, "model", "setup", "--name", "srv", "--base-url", "http://localhost:8000/v1", "--model", "served")
    assert r.exit_code == 0 and "served" in r.output
    assert stat.S_IMODE((isolated_home / "models.yaml").stat().st_mode) == 0o600

    # Not a terminal: plain aligned lines, one per profile, nothing folded.
    lines = run(app, "model", "list").output.splitlines()
    assert lines[0].split() == ["name", "kind", "location", "backend", "default"]
    assert lines[1].split() == ["local", "path", *str(folder).split(), "vllm"]
    assert lines[2].split() == ["qwen", "hub", "Qwen/Qwen2.5-0.5B-Instruct", "auto", "yes"]
    assert lines[3].split() == ["srv", "endpoint", "http://localhost:8000/v1", "auto"]

    listed = json.loads(run(app, "model", "list", "--json").output)
    assert [p["name"] for p in listed] == ["local", "qwen", "srv"]
    assert listed[1] == {
        "name": "qwen",
        "kind": "hub",
        "location": "Qwen/Qwen2.5-0.5B-Instruct",
        "hub_id": "Qwen/Qwen2.5-0.5B-Instruct",
        "default": True,
    }
    shown = json.loads(run(app, "model", "show", "srv", "--json").output)
    assert shown["base_url"] == "http://localhost:8000/v1" and shown["model"] == "served"
    assert "base url" in run(app, "model", "show", "srv").output

    r = run(app, "model", "remove", "qwen")
    assert r.exit_code == 0 and "it was the default" in r.output
    assert run(app, "model", "default").output.startswith("none")
    run(app, "model", "default", "srv")
    assert config.default_profile_name() == "srv"
    assert [p["name"] for p in json.loads(run(app, "model", "list", "--json").output)] == ["local", "srv"]


def test_empty_list_says_how_to_add(app) -> None:
    assert "arle model setup" in run(app, "model", "list").output
    assert json.loads(run(app, "model", "list", "--json").output) == []


def test_api_key_value_is_never_stored_or_printed(app, isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_KEY", SECRET)
    outputs = [
        arle("model", "setup", "--name", "srv", "--base-url", "http://localhost:8000/v1", "--api-key-env", "MY_KEY"),
        arle("model", "list"),
        arle("model", "list", "--json"),
        arle("model", "show", "srv"),
        arle("model", "show", "srv", "--json"),
    ]
    outputs.append(
        run(app, "model", "setup", "--name", "srv2", "--base-url", "http://h:1/v1", "--api-key-env", "MY_KEY")
    )
    for out in outputs[:5]:
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout + out.stderr
    assert SECRET not in outputs[5].output
    assert "$MY_KEY (set now)" in outputs[0].stdout
    assert json.loads(outputs[4].stdout)["api_key_env_set"] is True
    for path in isolated_home.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path

    monkeypatch.delenv("MY_KEY")
    assert "not set now" in arle("model", "show", "srv").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["model", "setup", "--name", "x"], "pass one of --path DIR, --hub-id ORG/NAME or --base-url URL"),
        (["model", "setup", "--hub-id", "a/b"], "pass --name NAME"),
        (["model", "setup", "--name", "x", "--hub-id", "a/b", "--base-url", "http://h/v1"], "exactly one of"),
        (
            ["model", "setup", "--name", "x", "--base-url", "http://h/v1", "--api-key-env", SECRET],
            "NAME of an environment",
        ),
        (["model", "show", "qwen-smal"], "did you mean qwen-small?"),
        (["model", "remove", "nope"], "unknown model profile 'nope'"),
    ],
)
def test_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    assert arle("model", "setup", "--name", "qwen-small", "--hub-id", "Qwen/Qwen2.5-0.5B-Instruct").returncode == 0
    proc = subprocess.run(
        [sys.executable, "-m", "arlecli", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr


def test_setup_checks_the_folder_and_where_it_writes(tmp_path: Path) -> None:
    """A folder whose config.json is not JSON, a file given as --path, a query-string key and an
    ARLE_HOME that cannot be made are one line and exit 2 at setup, not at the first eval; a
    folder with no config.json yet is saved with a note."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    empty = tmp_path / "empty"
    empty.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [
        (["--path", str(broken)], {}, "config.json is not valid JSON"),
        (["--path", str(afile)], {}, "a file, not a folder"),
        (["--base-url", f"http://127.0.0.1:9/v1?api_key={SECRET}"], {}, "without credentials, a query"),
        (["--hub-id", "a/b"], {"ARLE_HOME": str(afile / "home")}, "set ARLE_HOME to a writable folder"),
    ]
    for args, env, message in cases:
        proc = arle("model", "setup", "--name", "x", *args, env=env)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
        assert SECRET not in proc.stdout + proc.stderr
    assert config.load_profiles() == {}
    proc = arle("model", "setup", "--name", "later", "--path", str(empty))
    assert proc.returncode == 0 and "holds no config.json" in proc.stderr
    assert config.load_profiles()["later"].path == str(empty)


def test_setup_asks_when_interactive(app, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_cli, "stdin_is_tty", lambda: True)
    r = run(app, "model", "setup", input="myserver\nendpoint\nhttp://h:9/v1\nserved-name\nMY_KEY\n")
    assert r.exit_code == 0, r.output
    assert config.get_profile("myserver") == config.ModelProfile(
        name="myserver", base_url="http://h:9/v1", model="served-name", api_key_env="MY_KEY"
    )
    r = run(app, "model", "setup", "--name", "hubby", input="hub\norg/model\n")
    assert r.exit_code == 0 and config.get_profile("hubby").hub_id == "org/model"


# ---------------------------------------------------------------- resolution precedence


def _model_dir(path: Path, adapter: bool = False) -> Path:
    path.mkdir(parents=True)
    (path / ("adapter_config.json" if adapter else "config.json")).write_text("{}")
    return path


def test_base_url_wins_and_model_is_the_served_name() -> None:
    config.save_profile(config.ModelProfile(name="qwen", hub_id="Qwen/Qwen2.5-0.5B-Instruct"))
    spec = models.resolve_model("qwen", base_url="http://localhost:8000/v1/", api_key_env="MY_KEY")
    assert (spec.kind, spec.base_url, spec.model, spec.api_key_env, spec.backend) == (
        "openai",
        "http://localhost:8000/v1",
        "qwen",
        "MY_KEY",
        "openai",
    )
    spec = models.resolve_model(None, base_url="http://localhost:8000/v1")
    assert spec.kind == "openai" and spec.model is None  # the engine asks GET /models
    with pytest.raises(UserError, match="openai backend"):
        models.resolve_model(None, base_url="http://h/v1", backend="hf")


def test_profile_beats_a_folder_of_the_same_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _model_dir(tmp_path / "mine")
    config.save_profile(config.ModelProfile(name="mine", base_url="http://h:1/v1", model="m", api_key_env="K"))
    spec = models.resolve_model("mine")
    assert (spec.kind, spec.profile, spec.model, spec.api_key_env) == ("openai", "mine", "m", "K")
    assert models.resolve_model("mine", api_key_env="OTHER").api_key_env == "OTHER"  # flags override
    with pytest.raises(UserError, match="openai backend, not 'hf'"):
        models.resolve_model("mine", backend="hf")
    spec = models.resolve_model("./mine")
    assert (spec.kind, spec.path_or_id, spec.is_adapter) == ("hf", str(tmp_path / "mine"), False)


def test_local_folders(tmp_path: Path) -> None:
    adapter = _model_dir(tmp_path / "lora", adapter=True)
    spec = models.resolve_model(str(adapter), backend="vllm")
    assert (spec.kind, spec.path_or_id, spec.is_adapter, spec.backend) == ("hf", str(adapter), True, "vllm")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json or adapter_config.json"):
        models.resolve_model(str(tmp_path / "empty"))
    (tmp_path / "w.gguf").write_text("x")
    with pytest.raises(UserError, match="is a file"):
        models.resolve_model(str(tmp_path / "w.gguf"))
    with pytest.raises(UserError, match="no such folder"):
        models.resolve_model("runs/finqa-grpo/final")
    config.save_profile(config.ModelProfile(name="lp", path=str(adapter), backend="hf"))
    spec = models.resolve_model("lp")
    assert (spec.path_or_id, spec.is_adapter, spec.backend, spec.profile) == (str(adapter), True, "hf", "lp")
    assert models.resolve_model("lp", backend="vllm").backend == "vllm"


def test_hub_ids_and_unknown_names() -> None:
    spec = models.resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    assert (spec.kind, spec.path_or_id, spec.backend, spec.name) == (
        "hf",
        "Qwen/Qwen2.5-0.5B-Instruct",
        None,
        "Qwen/Qwen2.5-0.5B-Instruct",
    )
    config.save_profile(config.ModelProfile(name="qwen-small", hub_id="Qwen/Qwen2.5-0.5B-Instruct"))
    with pytest.raises(UserError) as info:
        models.resolve_model("qwen-smal")
    assert "did you mean qwen-small?" in str(info.value)
    assert "a local folder" in str(info.value) and "--base-url" in str(info.value)
    with pytest.raises(UserError, match="needs --base-url"):
        models.resolve_model("Qwen/Qwen2.5-0.5B-Instruct", backend="openai")
    with pytest.raises(UserError, match="--api-key-env only applies to endpoints"):
        models.resolve_model("Qwen/Qwen2.5-0.5B-Instruct", api_key_env="K")
    with pytest.raises(UserError, match="unknown backend 'tgi'"):
        models.resolve_model("Qwen/Qwen2.5-0.5B-Instruct", backend="tgi")


def test_no_model_uses_default_profile_else_embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    embedded = _model_dir(tmp_path / "smol")
    monkeypatch.setattr(models, "embedded_default_model", lambda: embedded)
    spec = models.resolve_model(None)
    assert (spec.kind, spec.path_or_id, spec.name, spec.profile) == ("hf", str(embedded), "SmolLM2-135M-Instruct", None)

    config.save_profile(config.ModelProfile(name="srv", base_url="http://h:1/v1"), make_default=True)
    spec = models.resolve_model(None)
    assert (spec.kind, spec.base_url, spec.profile) == ("openai", "http://h:1/v1", "srv")
