"""engine.native: a Llama folder loaded without transformers' model classes computes what the
classes compute, bit for bit, declines what it does not know, and keeps those classes (and what
they import) out of the process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers.engine_parity import assert_same_episodes, assert_same_generations_and_logliks, assert_same_logits
from helpers.tiny_model import build_tiny_model

from arlecli.engine import native
from arlecli.engine.base import GenerationRequest, LoglikRequest, SamplingParams
from arlecli.engine.hf import HFEngine, use_grouped_attention
from arlecli.engine.onednn import pack_linears


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A tiny Llama chat model folder with weights far from the init's scale (so the layers do not
    all look alike and a wrong op shows in the logits)."""
    import torch
    from transformers import LlamaForCausalLM

    folder = build_tiny_model(tmp_path_factory.mktemp("native") / "llama", arch="llama")
    model = LlamaForCausalLM.from_pretrained(folder)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 0.05)
    model.save_pretrained(folder)
    return folder


def _engines(folder: Path, monkeypatch: Any, **kw: Any) -> tuple[HFEngine, HFEngine]:
    """(an engine on engine.native's load, one on transformers' classes), the same folder."""
    import torch

    mine = HFEngine(str(folder), **kw)
    monkeypatch.setenv("ARLE_NATIVE_LOAD", "0")
    theirs = HFEngine(str(folder), **kw)
    monkeypatch.delenv("ARLE_NATIVE_LOAD")
    assert type(mine.model) is torch.nn.Module and type(theirs.model).__name__ == "LlamaForCausalLM"
    assert mine._fused is not None and theirs._fused is not None
    assert mine.packed_linears == theirs.packed_linears and mine.eos_ids == theirs.eos_ids
    assert mine._lookup_exact == theirs._lookup_exact
    return mine, theirs


def test_logits_and_cache_are_the_model_classes_own_bit_for_bit(llama):
    """`assert_same_logits` against LlamaForCausalLM's own forward, the parameters the same."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded = native.load(str(llama), "cpu", None)
    assert loaded is not None
    lm, forward = loaded.model, loaded.forward
    pack_linears(lm, skip=forward.modules)  # as the engine packs the linears the fused forward does not stack
    model = AutoModelForCausalLM.from_pretrained(llama).eval()
    assert use_grouped_attention(model)
    pack_linears(model)
    for (name, p), (their_name, q) in zip(lm.named_parameters(), model.named_parameters(), strict=True):
        assert name == their_name and torch.equal(p, q)
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # tied as transformers ties them

    assert_same_logits(forward, model, lm.config, lengths=[11, 6, 2, 11], scored_width=9)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_engine_tokens_and_loglikelihoods_equal_the_model_classes(llama, monkeypatch, batch_size):
    """Generations of every kind, batched and alone (prompt lookup's guesses), and lm-eval's
    loglikelihoods: the same on both loads."""
    mine, theirs = _engines(llama, monkeypatch, batch_size=batch_size, prefix_cache_tokens=0)
    assert_same_generations_and_logliks(mine, theirs)


def test_multi_turn_episodes_are_the_same_on_both_loads(llama, monkeypatch):
    mine, theirs = _engines(llama, monkeypatch, batch_size=3)
    assert_same_episodes(mine, theirs, "test_native_four_turns")


def test_the_tokenizer_is_the_one_autotokenizer_gives(llama):
    from transformers import AutoTokenizer

    loaded = native.load(str(llama), "cpu", None)
    assert loaded is not None
    _same_tokenizer(loaded.tokenizer, AutoTokenizer.from_pretrained(str(llama), padding_side="left"))


def _same_tokenizer(mine: Any, theirs: Any) -> None:
    assert type(mine) is type(theirs)
    assert mine.init_kwargs == theirs.init_kwargs and mine.padding_side == theirs.padding_side == "left"
    assert mine.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 + 4?"}]
    assert mine.apply_chat_template(chat, add_generation_prompt=True) == theirs.apply_chat_template(
        chat, add_generation_prompt=True
    )
    text = "def f(x):\n    return x  # 12 plus 30 <|im_end|>"
    assert mine(text).input_ids == theirs(text).input_ids
    assert mine.decode(mine(text).input_ids) == theirs.decode(theirs(text).input_ids)
    assert (mine.eos_token_id, mine.pad_token_id, mine.all_special_ids) == (
        theirs.eos_token_id,
        theirs.pad_token_id,
        theirs.all_special_ids,
    )


def test_a_checkpoint_saved_in_bfloat16_is_cast_as_transformers_casts_it(tmp_path, monkeypatch):
    folder = build_tiny_model(tmp_path / "bf16", arch="llama", dtype="bfloat16", seed=5)
    mine, theirs = _engines(folder, monkeypatch, batch_size=2)
    assert all(str(p.dtype) == "torch.float32" for p in mine.model.parameters())
    reqs = [GenerationRequest(prompt=p, params=SamplingParams(max_tokens=10)) for p in ("hello there", "def f(x):")]
    assert {i: c.token_ids for i, c in mine.generate(reqs)} == {i: c.token_ids for i, c in theirs.generate(reqs)}


def _edit_json(folder: Path, name: str, change: Any) -> None:
    path = folder / name
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _rewrite_weights(folder: Path, change: Any) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _sharded_outside(folder: Path) -> None:
    """An index whose shard lies outside the folder (a hostile checkpoint reaching for other files)."""
    shutil.copy(folder / "model.safetensors", folder.parent / "elsewhere.safetensors")
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}})
    )


DECLINED = {
    "a Qwen2 model": lambda f: _edit_json(f, "config.json", lambda c: c.update(architectures=["Qwen2ForCausalLM"])),
    "a field left to its default": lambda f: _edit_json(f, "config.json", lambda c: c.pop("head_dim")),
    "scaled RoPE": lambda f: _edit_json(
        f, "config.json", lambda c: c.update(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8})
    ),
    "sliding windows": lambda f: _edit_json(f, "config.json", lambda c: c.update(sliding_window=8)),
    "biases": lambda f: _edit_json(f, "config.json", lambda c: c.update(attention_bias=True)),
    "a billion layers": lambda f: _edit_json(f, "config.json", lambda c: c.update(num_hidden_layers=10**9)),
    "remote code": lambda f: _edit_json(f, "config.json", lambda c: c.update(auto_map={"AutoModel": "x.Y"})),
    "config.json not JSON": lambda f: (f / "config.json").write_text("{not json"),
    "another tokenizer class": lambda f: _edit_json(
        f, "tokenizer_config.json", lambda c: c.update(tokenizer_class="LlamaTokenizer")
    ),
    "no generation config": lambda f: (f / "generation_config.json").unlink(),
    "a generation config that is not JSON": lambda f: (f / "generation_config.json").write_text("[1, 2"),
    "a tokenizer that is not JSON": lambda f: (f / "tokenizer.json").write_text("{broken"),
    "a tensor too many": lambda f: _rewrite_weights(f, lambda t: t.update(extra=t["model.norm.weight"].clone())),
    "a tensor missing": lambda f: _rewrite_weights(f, lambda t: t.pop("model.layers.0.mlp.up_proj.weight")),
    "a tensor of another shape": lambda f: _rewrite_weights(
        f, lambda t: t.update({"model.norm.weight": t["model.norm.weight"][:-1].clone()})
    ),
    "integer weights": lambda f: _rewrite_weights(
        f, lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(dtype=__import__("torch").int32)})
    ),
    "weights not safetensors": lambda f: (f / "model.safetensors").write_bytes(b"\x00" * 64),
    "an adapter folder": lambda f: (f / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"})),
    "a shard outside the folder": _sharded_outside,
}


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_load_declines_what_it_does_not_compute_exactly(llama, tmp_path, case):
    folder = tmp_path / "model"
    shutil.copytree(llama, folder)
    DECLINED[case](folder)
    assert native.load(str(folder), "cpu", None) is None


def test_load_declines_other_devices_dtypes_hub_ids_and_the_switch(llama, monkeypatch):
    assert native.load(str(llama), "cpu", "float32") is not None
    assert native.load(str(llama), "cpu", "bfloat16") is None
    assert native.load(str(llama), "cuda", None) is None
    assert native.load("HuggingFaceTB/SmolLM2-135M-Instruct", "cpu", None) is None
    monkeypatch.setenv("ARLE_NATIVE_LOAD", "0")
    assert native.load(str(llama), "cpu", None) is None


def test_a_declined_folder_still_loads_through_transformers(llama, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(llama, folder)
    _edit_json(folder, "config.json", lambda c: c.pop("head_dim"))
    engine = HFEngine(str(folder), batch_size=2)
    assert type(engine.model).__name__ == "LlamaForCausalLM" and engine._fused is not None
    (done,) = engine.generate([GenerationRequest(prompt="hello", params=SamplingParams(max_tokens=4))])
    assert done[1].token_ids


def test_an_eval_load_imports_none_of_transformers_model_classes(llama):
    """The point of the module: neither the model classes nor what they import (torch._dynamo,
    torch.distributed.tensor) are in a process that loaded a folder and generated from it."""
    code = (
        "import sys\n"
        "from arlecli.engine.base import GenerationRequest, SamplingParams\n"
        "from arlecli.engine.hf import HFEngine\n"
        f"e = HFEngine({str(llama)!r}, batch_size=2)\n"
        "chat = [{'role': 'user', 'content': 'hi'}]\n"
        "reqs = [GenerationRequest(messages=chat, params=SamplingParams(max_tokens=3))]\n"
        "assert dict(e.generate(reqs))[0].token_ids\n"
        "heavy = ('transformers.modeling_utils', 'transformers.masking_utils', 'torch._dynamo',\n"
        "         'torch.distributed.tensor', 'sklearn')\n"
        "print(type(e.model).__name__, sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "Module []"


@pytest.mark.slow
def test_the_embedded_smollm2_loads_natively_with_the_same_tokens(smollm2_path, monkeypatch):
    """The real model README command 1 runs: native load, its tokenizer AutoTokenizer's, and
    greedy and seeded chat completions and loglikelihoods the same as on transformers' classes."""
    from transformers import AutoTokenizer

    mine, theirs = _engines(smollm2_path, monkeypatch, batch_size=4)
    _same_tokenizer(mine.tokenizer, AutoTokenizer.from_pretrained(str(smollm2_path), padding_side="left"))
    questions = ["What is 3 + 4?", "Name a prime number.", "Write a haiku about rain.", "What is 17 - 9?", "Hi!"]
    reqs = [
        GenerationRequest(
            messages=[{"role": "user", "content": q}],
            params=SamplingParams(max_tokens=24, temperature=0.8 * (i % 2), seed=i, logprobs=True),
        )
        for i, q in enumerate(questions)
    ]
    a, b = dict(mine.generate(reqs)), dict(theirs.generate(reqs))
    assert {i: (c.token_ids, c.logprobs) for i, c in a.items()} == {i: (c.token_ids, c.logprobs) for i, c in b.items()}
    scoring = [LoglikRequest(context="The capital of France is", continuation=c) for c in (" Paris", " Rome")]
    assert dict(mine.loglikelihood(scoring)) == dict(theirs.loglikelihood(scoring))


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: (f / "model.safetensors").write_bytes(b"\x00" * 100),
        lambda f: (f / "config.json").write_text("{not json"),
        lambda f: _edit_json(f, "config.json", lambda c: c.update(model_type="no_such_model")),
        lambda f: (f / "tokenizer.json").write_text("{broken"),
    ],
    ids=["weights", "config not JSON", "unknown model type", "tokenizer not JSON"],
)
def test_a_damaged_folder_gets_a_one_line_error(llama, tmp_path, damage):
    """Declined by engine.native, then refused by transformers: the user gets one line naming the
    folder and what to do, not transformers' traceback."""
    from arlecli.errors import UserError

    folder = tmp_path / "model"
    shutil.copytree(llama, folder)
    damage(folder)
    with pytest.raises(UserError) as caught:
        HFEngine(str(folder), batch_size=1)
    message = str(caught.value)
    assert "\n" not in message and str(folder) in message and message.startswith("cannot load model")
