"""The fused forward (engine.fused): Llama, Qwen2 and Qwen3 logits bit for bit those of the model's
own forward on packed linears (prefill with padding, decode steps, scoring without a mask or a
cache), the engine's tokens equal with and without it (greedy, seeded, stop strings, a
multi-turn card), and `build` declines what it would not compute exactly."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.engine_parity import assert_same_episodes, assert_same_generations_and_logliks, assert_same_logits

from arlecli.engine import fused
from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.hf import GROUPED_SDPA, HFEngine, use_grouped_attention
from arlecli.engine.onednn import onednn_linear_works, pack_linears


def _model(kind: str, dtype: str = "float32", attention: str = "sdpa", **extra: Any) -> Any:
    """A tiny random causal LM of class `kind`: grouped heads, biases where the class has them."""
    import torch
    import transformers

    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
    }[kind]
    shape = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=kind != "llama",
    )
    if kind == "gpt2":
        shape = dict(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    config = config_cls(**shape, **extra)
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = model_cls(config).to(getattr(torch, dtype)).eval()
    with torch.no_grad():  # weights far from the init's scale, so the layers do not all look alike
        for p in model.parameters():
            p.add_(torch.randn(p.shape, dtype=p.dtype) * 0.05)
    if attention == "sdpa":
        assert use_grouped_attention(model) and model.config._attn_implementation == GROUPED_SDPA
    return model


def _dtypes() -> list[str]:
    return ["float32", *(["bfloat16"] if onednn_linear_works("bfloat16") else [])]


@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize(
    ("kind", "attention"), [("llama", "sdpa"), ("qwen2", "sdpa"), ("qwen3", "sdpa"), ("llama", "eager")]
)
def test_logits_and_cache_are_the_models_own_bit_for_bit(kind, attention, dtype):
    """`assert_same_logits` against the model's forward with every linear packed (the path the
    engine ran before)."""
    model = _model(kind, dtype, attention)
    forward = fused.build(model)
    assert forward is not None
    pack_linears(model)  # the reference: transformers' forward on packed linears

    assert_same_logits(forward, model, model.config, lengths=[9, 5, 2], scored_width=7)


@pytest.mark.parametrize("stacked", [1, 3])
def test_a_packed_call_given_another_dtype_runs_each_linear_as_f_linear(stacked):
    """Under autocast an input comes in another dtype than the packed weight's: the call (one
    linear, or several stacked) returns what `F.linear` on each gives, side by side."""
    import torch

    from arlecli.engine.onednn import packed_call

    torch.manual_seed(0)
    linears = [torch.nn.Linear(16, 8 + 4 * i) for i in range(stacked)]
    x = torch.randn(3, 16).to(torch.bfloat16)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.cat([torch.nn.functional.linear(x, m.weight, m.bias) for m in linears], dim=-1)
        got = packed_call(linears)(x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_build_declines_what_it_would_not_compute_exactly():
    """Another architecture, sliding-window layers, a module whose forward was replaced, a forward
    hook and linears packed already get None: the engine runs the model's own forward there."""
    assert fused.build(_model("gpt2", attention="eager")) is None
    sliding = _model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert "sliding_attention" in sliding.config.layer_types
    assert fused.build(sliding) is None
    patched = _model("llama")
    patched.model.layers[1].mlp.forward = lambda x: x
    assert fused.build(patched) is None
    packed = _model("llama")
    pack_linears(packed)
    assert fused.build(packed) is None
    hooked = _model("qwen2")
    handle = hooked.model.layers[0].mlp.register_forward_hook(lambda module, args, out: out * 2)
    assert fused.build(hooked) is None  # the fused forward would skip the hook
    handle.remove()
    assert fused.build(hooked) is not None
    wrapped = _model("llama")
    wrapped.forward = wrapped.forward  # as accelerate's autocast wrapper sits on the instance
    assert fused.build(wrapped) is None
    assert fused.build(_model("llama")) is not None


def _engines(tiny_model: Any, monkeypatch: Any, **kw: Any) -> tuple[HFEngine, HFEngine]:
    """(an engine on the fused forward, one on the model's own), the same weights and settings."""
    with_fused = HFEngine(str(tiny_model), **kw)
    monkeypatch.setattr(fused, "build", lambda model, store=None: None)
    plain = HFEngine(str(tiny_model), **kw)
    monkeypatch.undo()
    assert with_fused._fused is not None and plain._fused is None
    assert with_fused.packed_linears == plain.packed_linears  # every linear packed either way
    return with_fused, plain


@pytest.mark.parametrize("batch_size", [1, 4])
def test_engine_tokens_equal_the_models_own_forward(tiny_model, monkeypatch, batch_size):
    """Generations of every kind, batched and alone (with prompt lookup), and lm-eval's
    loglikelihoods: all the same with and without the fused forward."""
    a_engine, b_engine = _engines(tiny_model, monkeypatch, batch_size=batch_size, prefix_cache_tokens=0)
    assert_same_generations_and_logliks(a_engine, b_engine)


def test_multi_turn_episodes_are_the_same_with_and_without_the_fused_forward(tiny_model, monkeypatch):
    with_fused, plain = _engines(tiny_model, monkeypatch, batch_size=3)
    assert_same_episodes(with_fused, plain, "test_fused_four_turns")


def test_a_live_policy_runs_fused_per_call_and_gets_its_modules_back(tiny_model):
    """A policy in training is fused and packed for each call only: its own modules afterwards,
    and what it samples is what an engine that loaded the same weights samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    tok = AutoTokenizer.from_pretrained(str(tiny_model), padding_side="left")
    live = HFEngine("", model_obj=model, tokenizer=tok, batch_size=2)
    built: list[Any] = []
    real = fused.build

    def spy(m: Any) -> Any:
        built.append(real(m))
        return built[-1]

    reqs = [GenerationRequest(prompt=p, params=SamplingParams(max_tokens=8)) for p in ("hello", "def f(x):")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fused, "build", spy)
        got = {i: c.token_ids for i, c in live.generate(reqs)}
    assert built and built[0] is not None and live._fused is None
    assert all("forward" not in vars(m) for m in model.modules() if isinstance(m, torch.nn.Linear))
    owned = HFEngine(str(tiny_model), batch_size=2)
    assert {i: c.token_ids for i, c in owned.generate(reqs)} == got
