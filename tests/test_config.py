"""config.py: where arle keeps files, and model profiles on disk."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from arlecli import config
from arlecli.config import ModelProfile
from arlecli.errors import UserError


def test_home_and_cache_follow_arle_home(isolated_home: Path) -> None:
    assert config.arle_home() == isolated_home
    assert config.cache_dir() == isolated_home / "cache"
    assert config.profiles_path() == isolated_home / "models.yaml"


def test_home_and_cache_default_to_platformdirs(monkeypatch: pytest.MonkeyPatch) -> None:
    from platformdirs import user_cache_dir, user_config_dir

    monkeypatch.delenv("ARLE_HOME")
    assert config.arle_home() == Path(user_config_dir("arle"))
    assert config.cache_dir() == Path(user_cache_dir("arle"))


def test_roundtrip_default_and_file_mode(isolated_home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    config.save_profile(ModelProfile(name="local", path=str(folder), backend="vllm"))
    config.save_profile(ModelProfile(name="hub", hub_id="Qwen/Qwen2.5-0.5B-Instruct"), make_default=True)
    config.save_profile(
        ModelProfile(name="srv", base_url="http://localhost:8000/v1/", model="qwen", api_key_env="MY_KEY")
    )

    profiles = config.load_profiles()
    assert sorted(profiles) == ["hub", "local", "srv"]
    assert profiles["local"] == ModelProfile(name="local", path=str(folder.resolve()), backend="vllm")
    assert profiles["srv"].base_url == "http://localhost:8000/v1"  # trailing slash dropped
    assert profiles["srv"].kind == "endpoint" and profiles["hub"].kind == "hub" and profiles["local"].kind == "path"
    assert config.default_profile() == profiles["hub"]
    assert config.default_profile_name() == "hub"

    path = isolated_home / "models.yaml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in isolated_home.iterdir()] == ["models.yaml"]  # no temp files left

    config.set_default("srv")
    assert config.default_profile().name == "srv"
    assert config.remove_profile("srv") is True
    assert config.default_profile() is None
    assert config.remove_profile("local") is False
    assert sorted(config.load_profiles()) == ["hub"]
    config.set_default(None)
    assert config.default_profile_name() is None


def test_save_replaces_same_name(tmp_path: Path) -> None:
    config.save_profile(ModelProfile(name="m", hub_id="a/b"))
    config.save_profile(ModelProfile(name="m", base_url="http://x:1/v1"))
    assert config.get_profile("m") == ModelProfile(name="m", base_url="http://x:1/v1")


def test_no_file_means_no_profiles() -> None:
    assert config.load_profiles() == {}
    assert config.default_profile() is None


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (ModelProfile(name="x"), "exactly one of --path, --hub-id or --base-url (got none)"),
        (ModelProfile(name="x", hub_id="a/b", base_url="http://h/v1"), "(got --hub-id and --base-url)"),
        (ModelProfile(name="bad name", hub_id="a/b"), "invalid profile name"),
        (ModelProfile(name="a/b", hub_id="a/b"), "invalid profile name"),
        (ModelProfile(name="x", hub_id="a/b", backend="tgi"), "unknown backend 'tgi'"),
        (ModelProfile(name="x", hub_id="nohub"), "pass it as org/name"),
        (ModelProfile(name="x", path="/no/such/dir"), "no such folder"),
        (ModelProfile(name="x", path=__file__), "a file, not a folder"),
        (ModelProfile(name="x", base_url="localhost:8000"), "not an http(s) URL"),
        (ModelProfile(name="x", base_url="https://u:sk-123@h/v1"), "without credentials"),
        (ModelProfile(name="x", base_url="https://h/v1?api_key=sk-123"), "without credentials, a query"),
        (ModelProfile(name="x", base_url="h/v1?api_key=sk-123"), "without credentials, a query"),
        (ModelProfile(name="x", base_url="https://h/v1#sk-123"), "or a fragment"),
        (ModelProfile(name="x", base_url="http://h/v1", api_key_env="sk-abc123"), "NAME of an environment variable"),
        (ModelProfile(name="x", base_url="http://h/v1", backend="vllm"), "openai backend"),
        (ModelProfile(name="x", hub_id="a/b", backend="openai"), "needs --base-url"),
        (ModelProfile(name="x", hub_id="a/b", model="served"), "only applies with --base-url"),
        (ModelProfile(name="x", hub_id="a/b", api_key_env="K"), "only applies with --base-url"),
    ],
)
def test_validation_says_what_to_pass(profile: ModelProfile, message: str) -> None:
    with pytest.raises(UserError) as info:
        config.save_profile(profile)
    assert message in str(info.value) and "sk-" not in str(info.value)  # a key is never printed
    assert config.load_profiles() == {}


def test_unknown_profile_suggests_near_names() -> None:
    config.save_profile(ModelProfile(name="qwen-small", hub_id="Qwen/Qwen2.5-0.5B-Instruct"))
    config.save_profile(ModelProfile(name="llama", hub_id="meta/llama"))
    with pytest.raises(UserError, match="did you mean qwen-small"):
        config.get_profile("qwen-smal")
    with pytest.raises(UserError, match="did you mean qwen-small"):
        config.remove_profile("qwen_small")
    with pytest.raises(UserError, match="profiles: llama, qwen-small"):
        config.set_default("zzz")


def test_malformed_file_is_a_user_error(isolated_home: Path) -> None:
    (isolated_home / "models.yaml").write_text("profiles: [unclosed\n")
    with pytest.raises(UserError, match="models.yaml: not valid YAML"):
        config.load_profiles()
    (isolated_home / "models.yaml").write_text("profiles:\n  m: {hub_id: a/b, secret: x}\n")
    with pytest.raises(UserError, match=r"profile 'm' is malformed \(unknown keys \['secret'\]\)"):
        config.load_profiles()
