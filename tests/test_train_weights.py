"""The weights training rollouts generate with (train.weights): a LoRA policy's adapter merged
exactly as `arle eval` merges its saved checkpoint, without touching the policy.

The hostile cases: peft's merge/unmerge round trip (what the vLLM sync did) moves frozen base
weights by an ulp; generating through the adapter layers (what the hf engine did) rounds
differently from the merged weights eval loads. Each test below fails on one of those."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def lora_policy(model_dir: Path, seed: int = 0, **lora: object):
    """The tiny model under a LoRA adapter whose B is not zero (a trained adapter's state)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", **lora}
    policy = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **config))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    return policy


def eval_merged(policy, folder: Path):
    """What `arle eval` computes with for the adapter saved in `folder` (engine.hf `_load`)."""
    from peft import AutoPeftModelForCausalLM

    policy.save_pretrained(str(folder))
    return AutoPeftModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).merge_and_unload()


def state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "lora",
    [
        {},  # every linear
        {"target_modules": ["q_proj", "v_proj"], "lora_bias": True},  # the bias is adapted too
        {"use_dora": True},  # a variant: peft's own merge on a copy
    ],
    ids=["lora", "lora_bias", "dora"],
)
def test_policy_weights_are_the_checkpoint_eval_merges_and_leave_the_policy_alone(tmp_path, tiny_model, lora):
    from arlecli.train.weights import policy_weights

    policy = lora_policy(tiny_model, **lora)
    before = state(policy)
    got = {name: t.clone() for name, t in policy_weights(policy)}
    expected = dict(eval_merged(policy, tmp_path / "adapter").named_parameters())
    assert got.keys() == expected.keys()
    different = [name for name in got if not torch.equal(got[name], expected[name])]
    assert not different, f"not the merged checkpoint's bits: {different[:3]}"
    moved = [k for k, v in state(policy).items() if not torch.equal(v, before[k])]
    assert not moved, f"reading the weights changed the policy: {moved[:3]}"
    base = dict(policy.get_base_model().named_parameters())
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], base[q.replace("q_proj.", "q_proj.base_layer.")])  # the adapter is in


def test_the_generation_copy_follows_the_policy_and_is_not_it(tmp_path, tiny_model):
    from arlecli.train.weights import GenerationCopy

    policy = lora_policy(tiny_model)
    copy_of = GenerationCopy()
    first = copy_of.of(policy)
    assert not hasattr(first, "merge_and_unload") and first is not policy
    with torch.no_grad():  # an optimizer step on the adapter
        for name, param in policy.named_parameters():
            if "lora_A" in name:
                param.add_(0.05)
    again = copy_of.of(policy)
    assert again is first  # refilled in place, not copied again
    expected = dict(eval_merged(policy, tmp_path / "adapter").named_parameters())
    assert all(torch.equal(p, expected[n]) for n, p in again.named_parameters())
    with torch.no_grad():  # the next optimizer step, named by its version as the backend names it
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    versioned = copy_of.of(policy, version=2)
    assert versioned is first
    expected = dict(eval_merged(policy, tmp_path / "adapter-2").named_parameters())
    assert all(torch.equal(p, expected[n]) for n, p in versioned.named_parameters())
    kept = state(again)
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(1.0)
    assert all(torch.equal(v, kept[k]) for k, v in again.state_dict().items())  # no aliasing

    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    other = GenerationCopy()
    snapshot = other.of(plain)
    with torch.no_grad():
        plain.model.norm.weight.add_(0.5)
    assert not torch.equal(snapshot.model.norm.weight, plain.model.norm.weight)
    assert torch.equal(other.of(plain).model.norm.weight, plain.model.norm.weight)


def test_no_copy_where_it_would_not_fit(tiny_model, monkeypatch):
    from arlecli.train import weights

    policy = lora_policy(tiny_model)
    monkeypatch.setattr(weights, "available_memory", lambda: 1024)
    assert weights.for_generation(policy, weights.GenerationCopy()) is policy


def test_a_staleness_queue_that_would_not_fit_is_refused_in_one_line(tiny_model, monkeypatch):
    """--max-staleness N keeps N copies of the policy's weights; the same 80% rule as one copy."""
    from transformers import AutoModelForCausalLM

    from arlecli.errors import UserError
    from arlecli.train import weights
    from arlecli.train.overlap import Ahead

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    need = weights.weight_bytes(model)
    ahead = Ahead(rollouts=None, max_staleness=2, plan=lambda step: None, max_step=3)  # type: ignore[arg-type]
    try:
        monkeypatch.setattr(weights, "available_memory", lambda: int(2.4 * need))  # 80%: 1.92 copies
        with pytest.raises(UserError, match=r"^--max-staleness 2 keeps 2 copies .*: lower --max-staleness$"):
            ahead.check_memory(model)
        monkeypatch.setattr(weights, "available_memory", lambda: int(2.6 * need))  # 80%: 2.08 copies
        ahead.check_memory(model)
        monkeypatch.setattr(weights, "available_memory", lambda: None)  # unknown: not refused
        ahead.check_memory(model)
        assert weights.copies_fit(model, 1) == (True, need, None)
    finally:
        ahead.close()


@pytest.mark.parametrize("card_name", ["countdown", "math_tool"])
def test_hf_rollouts_of_a_lora_policy_are_the_eval_of_its_checkpoint(tmp_path, tiny_model, monkeypatch, card_name):
    """Token ids and sampling logprobs, bit for bit: the logprobs differ in their last bits
    when the rollout generates through the adapter layers instead of the merged weights."""
    from transformers import AutoTokenizer

    from arlecli.catalog import load_card, resolve_references
    from arlecli.engine import hf
    from arlecli.engine.hf import HFEngine
    from arlecli.envs.episodes import Sampling, collect
    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.train.batches import PolicyBackend

    from helpers.tool_model import first_turn_calls_a_tool
    from helpers.train import ROOT, math_tool_card
    from arlecli.train.run import train_split

    card_path = math_tool_card(tmp_path) if card_name == "math_tool" else ROOT / "benchmarks" / "countdown.yaml"
    if card_name == "math_tool":
        first_turn_calls_a_tool(monkeypatch, hf.HFEngine)
    card = load_card(str(card_path))
    resolve_references(card)
    tasks, _ = load_tasks(card, EvalOptions(split=train_split(card, None), limit=3, num_fewshot=0))
    draws = [(i, k) for i in range(len(tasks)) for k in range(2)]
    sampling = Sampling(temperature=1.0, max_tokens=12, seed=7, logprobs=True)
    policy = lora_policy(tiny_model, seed=3)
    folder = tmp_path / "adapter"
    policy.save_pretrained(str(folder))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model), padding_side="left")
    tokenizer.save_pretrained(str(folder))

    def turns(engine) -> list:
        out = dict(collect(card, engine, tasks, [], draws, sampling))
        return [[(t.prompt_token_ids, t.token_ids, t.logprobs) for t in out[j].turns] for j in range(len(draws))]

    evaluated = turns(HFEngine(str(folder)))
    backend = PolicyBackend("hf", str(folder))
    with backend.over(policy, tokenizer, 1) as engine:
        assert engine.model is not policy and engine.model is backend._copy._model
        trained = turns(engine)
    backend.close()
    assert all(t[2] for ep in trained for t in ep)  # logprobs recorded
    assert trained == evaluated
    assert any(len(t) > 1 for t in trained) if card_name == "math_tool" else True


def test_the_hf_backend_generates_with_a_copy_on_cpu_and_with_a_snapshot_as_it_is(tiny_model):
    """A plain policy on a CPU is copied too (the fast paths a trainer's wrapped forward rules
    out on the live module), and an --max-staleness snapshot, a copy already, is not copied again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlecli.train.batches import PolicyBackend
    from arlecli.train.weights import GenerationCopy, is_generation_copy

    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    plain.forward = plain.forward  # an instance-level forward, as TRL's fused LM head installs
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model), padding_side="left")
    backend = PolicyBackend("hf", str(tiny_model))
    with backend.over(plain, tokenizer, 1) as engine:
        assert engine.model is not plain and is_generation_copy(engine.model)
        assert "forward" not in vars(engine.model)
    snapshot = GenerationCopy().of(plain)
    with backend.over(snapshot, tokenizer, 1) as engine:
        assert engine.model is snapshot
    backend.close()
