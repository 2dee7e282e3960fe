"""arle's C RMSNorm (with the residual add before it) and rotary embedding (engine/cpu_ops.py): torch's
bits at the widths models have, at any row and thread count; declined where they would differ; an
input they cannot take runs torch's ops; and the engine's tokens are the same with and without them
(greedy, seeded, stop strings, logprobs, a multi-turn card)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from helpers.engine_parity import assert_same_episodes, assert_same_generations_and_logliks

from arlecli.engine import cpu_gemm, cpu_ops, fused
from arlecli.engine.hf import HFEngine

pytestmark = pytest.mark.skipif(
    not (cpu_gemm._cpu_fits() and cpu_gemm._compiler() is not None),
    reason="cpu_kernels.c needs x86-64 Linux, AVX2 and FMA, and cc",
)


def _norm(width: int, eps: float = 1e-5) -> LlamaRMSNorm:
    module = LlamaRMSNorm(width, eps=eps)
    with torch.no_grad():
        module.weight.copy_(torch.randn(width, generator=torch.Generator().manual_seed(width)))
    return module


def _module(module: Any, hidden: Any) -> Any:
    return module(hidden)


def _torch_rotary(heads: int) -> Any:
    """transformers' rotary over the q and k heads of a qkv output, as engine.fused runs it."""
    return functools.partial(fused.qk_rotary, heads)


# SmolLM2 (576), Qwen2-0.5B (896), a width with leftover vectors and scalars, 1.5B-8B widths, and
# 8192: the first width whose sum cascades up a second level.
WIDTHS = [8, 64, 576, 896, 1003, 1536, 2048, 4096, 8192]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("width", WIDTHS)
def test_rms_norm_and_residual_add_give_transformers_bits(width, threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        module = _norm(width, eps=1e-6 if width % 2 else 1e-5)
        norm = cpu_ops.add_rms_norm(_module, module)
        assert norm is not None
        gen = torch.Generator().manual_seed(1)
        with torch.inference_mode():
            for rows in (1, 2, 7, 33, 130):
                hidden = torch.randn(rows, 1, width, generator=gen) * 3
                delta = torch.randn(rows, 1, width, generator=gen)
                total, normed = norm(module, hidden, delta)
                assert torch.equal(total, hidden + delta) and torch.equal(normed, module(hidden + delta))
                same, alone = norm(module, hidden)
                assert same is hidden and torch.equal(alone, module(hidden))
    finally:
        torch.set_num_threads(previous)


def test_rms_norm_reads_each_modules_own_weight_and_epsilon():
    """One function serves every norm of a model: the final norm has its own weight, Qwen's its own eps."""
    norm = cpu_ops.add_rms_norm(_module, _norm(64))
    assert norm is not None
    other = _norm(64, eps=0.5)
    with torch.no_grad():
        other.weight.mul_(-3)
    hidden = torch.randn(5, 64)
    with torch.inference_mode():
        assert torch.equal(norm(other, hidden)[1], other(hidden))


def test_rms_norm_is_declined_where_torch_adds_another_way_or_the_probe_differs():
    assert cpu_ops.add_rms_norm(_module, _norm(7)) is None  # fewer than 8: torch's scalar sum
    assert cpu_ops.add_rms_norm(_module, _norm(cpu_ops.MAX_WIDTH * 2)) is None  # torch splits the sum
    nudged = cpu_ops.add_rms_norm(lambda m, h: m(h) * (1 + 2**-20), _norm(64))
    assert nudged is None  # one ulp off at some row: torch kept
    half = _norm(64).to(torch.bfloat16)
    assert cpu_ops.add_rms_norm(_module, half) is None


def test_rms_norm_hands_what_it_cannot_take_to_torch():
    module = _norm(64)
    norm = cpu_ops.add_rms_norm(_module, module)
    assert norm is not None
    # another dtype
    x = torch.randn(3, 64).to(torch.bfloat16)
    total, normed = norm(module, x, x)
    want = module(x + x)  # an fp32 weight times bf16 states: fp32, as transformers gives it
    assert torch.equal(total, x + x) and normed.dtype == want.dtype and torch.equal(normed, want)
    # a layout the kernel would misread: made contiguous first
    wide = torch.randn(64, 6)
    assert torch.equal(norm(module, wide.t())[1], module(wide.t()))
    # a norm of another width than the one probed: torch's ops (another width may add in another order)
    handed: list[int] = []
    counting = cpu_ops.add_rms_norm(lambda m, h: handed.append(h.shape[-1]) or m(h), module)
    assert counting is not None
    handed.clear()
    other, x = _norm(96), torch.randn(2, 96)
    with torch.no_grad():  # no gradients wanted: only the width decides
        assert torch.equal(counting(other, x)[1], other(x)) and handed == [96]
        assert torch.equal(counting(module, torch.ones(2, 64))[1], module(torch.ones(2, 64))) and handed == [96]
    # the wrong width: torch's own error, never a read past the tensor
    with pytest.raises(RuntimeError):
        norm(module, torch.randn(2, 32))
    h, d = torch.randn(2, 64), torch.randn(1, 64)  # a delta of another shape: torch broadcasts it
    total, normed = norm(module, h, d)
    assert torch.equal(total, h + d) and torch.equal(normed, module(h + d))
    # gradients wanted (a policy's forward in training): torch's ops, so they flow
    h = torch.randn(2, 64, requires_grad=True)
    total, normed = norm(module, h, torch.randn(2, 64))
    normed.sum().backward()
    assert h.grad is not None and module.weight.grad is not None


# SmolLM2 (9 + 3 heads of 64), Qwen2-0.5B (14 + 2 of 64), a Llama-8B layout (32 + 8 of 128), no grouping.
HEADS = [(9, 3, 64), (14, 2, 64), (32, 8, 128), (4, 4, 16)]


@pytest.mark.parametrize(("heads", "kv", "d"), HEADS)
def test_rotary_gives_transformers_bits(heads, kv, d):
    rotate = cpu_ops.rotary(_torch_rotary(heads), heads, kv, d)
    assert rotate is not None
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for batch, width, rows in ((1, 1, 1), (4, 1, 4), (3, 9, 3), (2, 5, 1)):
            qkv = torch.randn(batch, width, heads + 2 * kv, d, generator=gen) * 5
            cos, sin = torch.randn(rows, width, d, generator=gen), torch.randn(rows, width, d, generator=gen)
            q, k = rotate(qkv, cos, sin)
            # transformers' own function, head by head
            q_heads, k_heads = qkv[:, :, :heads].transpose(1, 2), qkv[:, :, heads : heads + kv].transpose(1, 2)
            qk = apply_rotary_pos_emb(q_heads, k_heads, cos, sin)
            assert q.shape == (batch, heads, width, d) and k.shape == (batch, kv, width, d)
            assert torch.equal(q, qk[0]) and torch.equal(k, qk[1])


def test_rotary_is_declined_or_hands_over_where_it_would_differ():
    assert cpu_ops.rotary(_torch_rotary(4), 4, 2, 15) is None  # an odd head size has no halves
    off = cpu_ops.rotary(lambda qkv, c, s: [t + 1e-7 for t in _torch_rotary(4)(qkv, c, s)], 4, 2, 16)
    assert off is None
    rotate = cpu_ops.rotary(_torch_rotary(4), 4, 2, 16)
    assert rotate is not None
    qkv = torch.randn(2, 3, 8, 16).to(torch.bfloat16)
    cos, sin = torch.randn(2, 3, 16).to(torch.bfloat16), torch.randn(2, 3, 16).to(torch.bfloat16)
    q, k = rotate(qkv, cos, sin)
    want = apply_rotary_pos_emb(qkv[:, :, :4].transpose(1, 2), qkv[:, :, 4:6].transpose(1, 2), cos, sin)
    assert q.dtype == torch.bfloat16 and torch.equal(q, want[0]) and torch.equal(k, want[1])
    with pytest.raises(RuntimeError):  # cos for other positions: torch's broadcasting error
        rotate(qkv.float(), torch.randn(2, 4, 16), torch.randn(2, 4, 16))


def test_switched_off_means_torchs_ops(monkeypatch):
    monkeypatch.setenv("ARLE_CPU_GEMM", "0")
    cpu_gemm.library.cache_clear()
    try:
        assert cpu_ops.add_rms_norm(_module, _norm(64)) is None
        assert cpu_ops.rotary(_torch_rotary(4), 4, 2, 16) is None
    finally:
        monkeypatch.undo()
        cpu_gemm.library.cache_clear()


def _engines(tiny_model: Any, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[HFEngine, HFEngine]:
    """(an engine on the C norm and rotary, one on torch's ops), the same weights and settings."""
    ours = HFEngine(str(tiny_model), **kw)
    assert ours._fused is not None
    assert ours._fused.norm.__module__ == ours._fused.rotary.__module__ == cpu_ops.__name__
    monkeypatch.setattr(cpu_ops, "add_rms_norm", lambda *args: None)
    monkeypatch.setattr(cpu_ops, "rotary", lambda *args: None)
    theirs = HFEngine(str(tiny_model), **kw)
    assert theirs._fused is not None
    assert isinstance(theirs._fused.norm, functools.partial) and isinstance(theirs._fused.rotary, functools.partial)
    return ours, theirs


@pytest.mark.parametrize("batch_size", [1, 4])
def test_engine_tokens_are_the_same_with_and_without_them(tiny_model, monkeypatch, batch_size):
    ours, theirs = _engines(tiny_model, monkeypatch, batch_size=batch_size, prefix_cache_tokens=0)
    assert_same_generations_and_logliks(ours, theirs)


def test_multi_turn_episodes_are_the_same_with_and_without_them(tiny_model, monkeypatch):
    ours, theirs = _engines(tiny_model, monkeypatch, batch_size=3)
    assert_same_episodes(ours, theirs, "test_cpu_ops_four_turns")


def test_the_perf_script_compares_them_on_identical_tokens(tmp_path):
    import layer_ops  # perf/layer_ops.py

    result = layer_ops.main(["--quick", "--batches", "1", "--out", str(tmp_path / "layer_ops.json")])
    (row,) = result["rows"]
    assert row["same_tokens"] and row["c_tok_s"] > 0 and row["torch_tok_s"] > 0
    assert (tmp_path / "layer_ops.json").is_file()
