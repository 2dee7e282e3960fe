"""engine.packed_cache: a model's packed weights are written once, mapped by the next load, and
give the tokens a fresh pack gives; a file that is not exactly what this run would pack (another
model, weights changed, damaged, tampered with, in a folder others can write) is never used."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from helpers.engine_parity import assert_same_episodes, assert_same_generations_and_logliks
from helpers.tiny_model import build_tiny_model

from arlecli.engine import cpu_gemm, native, packed_cache
from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.hf import HFEngine
from arlecli.errors import UserError

pytestmark = pytest.mark.skipif(cpu_gemm.library() is None, reason="cpu_kernels.c does not run on this CPU")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A tiny Llama chat model folder (engine.native loads it; the Qwen2 one transformers does)."""
    return build_tiny_model(tmp_path_factory.mktemp("packed") / "llama", arch="llama")


@pytest.fixture
def packs(monkeypatch) -> list[int]:
    """Counts the weights packed afresh (not mapped from a cached file)."""
    lib = cpu_gemm.library()
    real, count = lib.arle_pack, []

    def counting(*args: Any) -> None:
        count.append(1)
        real(*args)

    monkeypatch.setattr(lib, "arle_pack", counting)
    return count


def _cached(home: Path) -> list[Path]:
    return sorted((home / "cache" / "packed").glob("*.bin"))


def _sizes(path: Path) -> list[int]:
    """The sizes of the entries a cached file holds, from its header."""
    head = path.read_bytes()[: packed_cache.HEADER]
    return json.loads(head[len(packed_cache.MAGIC) :].split(b"\n", 1)[0])["sizes"]


def _engine(folder: Path, **kw: Any) -> HFEngine:
    """An hf engine on `folder` (assert_same_generations_and_logliks's setting: no prefix cache)."""
    return HFEngine(str(folder), **{"batch_size": 4, "prefix_cache_tokens": 0, **kw})


def test_the_second_load_maps_the_firsts_packs_and_gives_the_same_tokens(llama, isolated_home, packs, monkeypatch):
    first = _engine(llama)
    written = _cached(isolated_home)
    assert len(written) == 1 and packs  # the first load packed every weight and kept them
    assert written[0].stat().st_mode & 0o077 == 0  # this user's alone
    fresh = len(packs)

    again = _engine(llama)
    assert len(packs) == fresh  # nothing packed: every weight came from the file
    assert _cached(isolated_home) == written

    kv_kept = _engine(llama, batch_size=3, prefix_cache_tokens=None)  # episodes keep their KV across turns
    assert len(packs) == fresh
    monkeypatch.setenv(packed_cache.ENV_VAR, "0")
    plain = _engine(llama)
    assert len(packs) == fresh + len(_sizes(written[0]))  # (the first load also packed its shape probes)
    assert_same_generations_and_logliks(again, plain)
    assert_same_generations_and_logliks(first, plain)
    plain_kv = _engine(llama, batch_size=3, prefix_cache_tokens=None)
    assert_same_episodes(kv_kept, plain_kv, "test_packed_cache_four_turns")


def test_a_folder_transformers_loads_is_cached_too(tiny_model, isolated_home, packs, monkeypatch):
    """A Qwen2 folder (engine.native declines it; transformers' classes load it): the same file,
    the same checks, the same tokens."""
    _engine(tiny_model)
    assert len(_cached(isolated_home)) == 1
    fresh = len(packs)
    again = _engine(tiny_model)
    assert len(packs) == fresh
    monkeypatch.setenv(packed_cache.ENV_VAR, "0")
    assert_same_generations_and_logliks(again, _engine(tiny_model))


def test_no_cache_for_an_adapter_or_a_hub_id(tmp_path):
    """An adapter's weights are merged into its base's at load: its files do not name them."""
    from arlecli.engine.hf import _packed_store

    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert _packed_store(str(tmp_path)) is None
    assert _packed_store("HuggingFaceTB/SmolLM2-135M-Instruct") is None


def test_where_the_mapping_is_not_on_2mb_pages_the_entries_are_copied(llama, isolated_home, packs, monkeypatch):
    """A file system without large folios maps the file on 4 KB pages: the entries are copied into
    2 MB pages instead (no packing), the file is left as it is, and the tokens are the same."""
    import torch

    _engine(llama)
    [path] = _cached(isolated_home)
    fresh, inode = len(packs), path.stat().st_ino
    monkeypatch.setattr(packed_cache, "_on_huge_pages", lambda data: False)
    copied = _engine(llama)
    assert len(packs) == fresh and path.stat().st_ino == inode
    qkv = copied._fused.layers[0].qkv.holds[0]
    assert not any(qkv.data_ptr() == e.data_ptr() for e in packed_cache._mapped(path))  # a copy, not the file
    monkeypatch.setenv(packed_cache.ENV_VAR, "0")
    assert_same_generations_and_logliks(copied, _engine(llama))
    assert not packed_cache._on_huge_pages(torch.zeros(1 << 20))  # anonymous memory: not a file's pages


def _zero_an_entry(path: Path, entry: int) -> None:
    raw, sizes = bytearray(path.read_bytes()), _sizes(path)
    at = packed_cache.HEADER + 4 * sum(sizes[:entry])
    raw[at : at + 4 * sizes[entry]] = bytes(4 * sizes[entry])
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("how", ["an entry differs", "cut short", "not arle's", "a link"])
def test_a_file_that_is_not_what_this_load_packs_is_not_used(llama, isolated_home, packs, how, tmp_path, monkeypatch):
    _engine(llama)
    path = _cached(isolated_home)[0]
    fresh, weights = len(packs), len(_sizes(path))
    if how == "an entry differs":  # as another packing order or layout would
        _zero_an_entry(path, 1)
    elif how == "cut short":
        os.truncate(path, path.stat().st_size - 64)
    elif how == "not arle's":
        path.write_bytes(b"#!/bin/sh\n" + bytes(100))
    else:
        target = tmp_path / "elsewhere.bin"
        path.rename(target)
        path.symlink_to(target)
    engine = _engine(llama)
    repacked = 1 if how == "an entry differs" else weights  # the one bad entry, or every weight
    assert len(packs) == fresh + repacked
    # The file now holds what this load used: the next load packs nothing.
    assert not path.is_symlink()
    _engine(llama)
    assert len(packs) == fresh + repacked
    monkeypatch.setenv(packed_cache.ENV_VAR, "0")
    assert_same_generations_and_logliks(engine, _engine(llama))


def test_changed_weights_get_a_file_of_their_own(tmp_path, isolated_home, packs):
    import torch
    from safetensors.torch import load_file, save_file

    folder = build_tiny_model(tmp_path / "llama", arch="llama")
    _engine(folder)
    fresh = len(packs)
    [cached] = _cached(isolated_home)
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.layers.0.mlp.down_proj.weight"] += 0.5
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    changed = _engine(folder)
    assert len(packs) == fresh + len(_sizes(cached)) and len(_cached(isolated_home)) == 2
    down = changed.model.model.layers[0].mlp.down_proj  # runs on its packed weight: the new one
    x = torch.randn(3, down.in_features)
    assert torch.allclose(down(x), torch.nn.functional.linear(x, down.weight), atol=1e-4)


def test_a_cache_folder_others_can_write_is_not_used(llama, isolated_home, packs):
    _engine(llama)
    fresh, [cached] = len(packs), _cached(isolated_home)
    folder = isolated_home / "cache" / "packed"
    folder.chmod(0o777)
    _engine(llama)
    assert len(packs) == fresh + len(_sizes(cached))  # not read
    folder.chmod(0o700)


def test_the_budget_keeps_the_most_recent_models_and_skips_one_too_large(tmp_path, isolated_home, packs, monkeypatch):
    first, second = (build_tiny_model(tmp_path / name, arch="llama", seed=i) for i, name in enumerate("ab"))
    _engine(first)
    [older] = _cached(isolated_home)
    size = older.stat().st_size
    monkeypatch.setenv(packed_cache.ENV_VAR, str(size + size // 2))  # room for one
    _engine(second)
    kept = _cached(isolated_home)
    assert len(kept) == 1 and kept != [older]  # the first evicted for the second
    fresh = len(packs)
    _engine(second)
    assert len(packs) == fresh

    monkeypatch.setenv(packed_cache.ENV_VAR, str(size - 1))
    _engine(first)
    assert _cached(isolated_home) == kept  # too large to keep: nothing written or evicted


def test_a_bad_budget_is_a_one_line_error(llama, monkeypatch):
    monkeypatch.setenv(packed_cache.ENV_VAR, "lots")
    with pytest.raises(UserError, match=packed_cache.ENV_VAR):
        _engine(llama)


def test_a_half_written_file_of_a_killed_run_is_cleaned_up(llama, isolated_home, monkeypatch):
    folder = isolated_home / "cache" / "packed"
    folder.mkdir(parents=True, mode=0o700)
    stale, recent = folder / ".writing-stale", folder / ".writing-recent"
    for p in (stale, recent):
        p.write_bytes(b"half")
    os.utime(stale, (1, 1))
    _engine(llama)
    assert not stale.exists() and recent.exists() and len(_cached(isolated_home)) == 1


def test_weight_files_names_the_shards_and_refuses_one_outside(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-2.safetensors", "b": "model-1.safetensors", "c": "model-2.safetensors"}})
    )
    assert native.weight_files(tmp_path) == [tmp_path / "model-1.safetensors", tmp_path / "model-2.safetensors"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
    assert native.weight_files(tmp_path) is None


@pytest.mark.slow
def test_the_embedded_smollm2_maps_its_packed_weights_with_the_same_tokens(
    smollm2_path, isolated_home, packs, monkeypatch
):
    """The model README command 1 runs: mapped from the file the first load wrote, the same
    greedy and seeded tokens and logprobs as packed afresh."""
    monkeypatch.setenv(packed_cache.ENV_VAR, str(1 << 30))
    _engine(smollm2_path)
    fresh = len(packs)
    mapped = _engine(smollm2_path)
    assert len(packs) == fresh and len(_sizes(_cached(isolated_home)[0])) == 121  # 30 layers' 4 calls, the head
    monkeypatch.setenv(packed_cache.ENV_VAR, "0")
    plain = _engine(smollm2_path)
    reqs = [
        GenerationRequest(
            messages=[{"role": "user", "content": q}],
            params=SamplingParams(max_tokens=24, temperature=0.8 * (i % 2), seed=i, logprobs=True),
        )
        for i, q in enumerate(["What is 3 + 4?", "Name a prime number.", "Write a haiku about rain.", "Hi!"])
    ]
    a, b = dict(mapped.generate(reqs)), dict(plain.generate(reqs))
    assert {i: (c.token_ids, c.logprobs) for i, c in a.items()} == {i: (c.token_ids, c.logprobs) for i, c in b.items()}
    for path in _cached(isolated_home):  # 540 MB that pytest's kept temporary folders need not hold
        path.unlink()
