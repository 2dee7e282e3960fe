"""GRPO's and RLOO's loss forward on train.logprobs' path (no padding, the LM head on the
completion positions only, a group's shared prompt run once) trains as TRL's own forward does:
the same losses and the same weights, full fine-tune and LoRA, single-turn and multi-turn rows;
and TRL's forward runs wherever arle's would not give its numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import arlecli.train.grpo as grpo
import arlecli.train.logprobs as logprobs
from helpers.tool_model import first_turn_calls_a_tool
from helpers.train import TINY, math_tool_card, train_in_process, varied_card

ROOT = Path(__file__).resolve().parents[1]


def _count_fast_calls(monkeypatch) -> list[int]:
    """How many row chunks went through train.logprobs' forward (not TRL's)."""
    calls: list[int] = []
    real = grpo.completion_outputs

    def counting(*args, **kwargs):
        calls.append(args[2].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo, "completion_outputs", counting)
    return calls


def _train(tmp_path: Path, name: str, tiny_model, *args: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    run = tmp_path / name
    train_in_process(
        *args,
        "--model",
        str(tiny_model),
        "--max-steps",
        "2",
        "--learning-rate",
        "0.1",
        "--set",
        "optim=sgd",  # a step is the gradient times the rate: the weights compare as the gradients do
        "--eval-limit",
        "0",
        "--seed",
        "7",
        "--output",
        str(run),
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    final = run / "final"
    weights = final / "adapter_model.safetensors"
    if not weights.exists():
        weights = final / "model.safetensors"
    from safetensors.torch import load_file

    return rows, load_file(str(weights))


def _assert_same_training(fast: tuple, trl: tuple, tiny_model: Path) -> None:
    fast_rows, fast_weights = fast
    trl_rows, trl_weights = trl
    assert [r["step"] for r in fast_rows] == [r["step"] for r in trl_rows] == [1, 2]
    for a, b in zip(fast_rows, trl_rows, strict=True):
        assert a["reward"] == b["reward"]  # the same rollouts were trained on
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-3, abs_tol=1e-6), (a["loss"], b["loss"])
        assert math.isclose(a["grad_norm"], b["grad_norm"], rel_tol=1e-3, abs_tol=1e-6), (a, b)
    assert fast_weights.keys() == trl_weights.keys()
    from safetensors.torch import load_file

    start = load_file(str(tiny_model / "model.safetensors"))  # an adapter's lora_B starts at 0
    moved = max(
        float((w - start.get(k, torch.zeros_like(w))).abs().max()) for k, w in trl_weights.items() if "lora_A" not in k
    )
    assert moved > 1e-4, moved  # the steps trained: the comparison below is not of untouched weights
    for key, value in trl_weights.items():
        torch.testing.assert_close(fast_weights[key], value, atol=1e-6, rtol=1e-4, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.parametrize("algo", ["grpo", "rloo"])
@pytest.mark.parametrize("lora", ["0", "4"], ids=["full", "lora"])
def test_arle_forward_trains_as_trl_forward_does(tmp_path, tiny_model, monkeypatch, algo, lora):
    """Two steps, 2 prompts x 4 completions a step (each group's prompt shared), arle's forward
    against TRL's: per-step losses and gradient norms, and the final weights, agree to float
    rounding; the arle side really ran its own forward (the loss's and, for RLOO, the old
    logprobs'), TRL's never did."""
    card = str(varied_card(tmp_path))
    group = ["--limit", "8", "--num-generations", "4", "--set", "max_completion_length=8"]
    args = (card, "--algo", algo, "--lora-rank", lora, *group, "--set", "per_device_train_batch_size=8")
    calls = _count_fast_calls(monkeypatch)
    fast = _train(tmp_path, "fast", tiny_model, *args)
    assert len(calls) >= 2 and all(rows == 8 for rows in calls), calls

    calls.clear()
    monkeypatch.setattr(grpo, "FORWARD", None)
    trl = _train(tmp_path, "trl", tiny_model, *args)
    assert calls == []
    _assert_same_training(fast, trl, tiny_model)


def test_shared_prompts_run_once_per_group(tmp_path, tiny_model, monkeypatch):
    """The loss's forward runs each group's prompt once: one prompt forward per group and one
    completions forward per length group, not a forward per row."""
    seen: list[tuple[int, int]] = []
    real = logprobs._hidden

    def spying(model, ids, *args, **kwargs):
        seen.append(tuple(ids.shape))
        return real(model, ids, *args, **kwargs)

    monkeypatch.setattr(logprobs, "_hidden", spying)
    card = str(varied_card(tmp_path))
    group = ["--limit", "8", "--num-generations", "4", "--set", "max_completion_length=8"]
    args = (card, "--algo", "grpo", *group, "--set", "per_device_train_batch_size=8")
    _train(tmp_path, "run", tiny_model, *args, "--set", "gradient_checkpointing=false")
    prompt_forwards = [shape for shape in seen if shape[0] == 1]
    assert seen and len(prompt_forwards) >= 2
    # Every row of a step is in a forward of several rows (the group's completions), none alone
    # with its prompt: the prompt ran once per group.
    assert sum(rows for rows, _ in seen if rows > 1) >= 8


def test_multi_turn_rows_train_as_trl_does(tmp_path, tiny_model, monkeypatch):
    """math_tool with the first turn calling the tool: each row is a 2-turn episode (the tool's
    reply inside the completion, masked out of the loss); arle's forward and TRL's give the
    same losses and weights."""
    first_turn_calls_a_tool(monkeypatch)
    path = math_tool_card(tmp_path)
    args = (str(path), "--algo", "grpo", "--num-generations", "2", "--max-tokens", "8")
    args = (*args, "--set", "per_device_train_batch_size=2", "--lora-rank", "4")
    calls = _count_fast_calls(monkeypatch)
    fast = _train(tmp_path, "fast", tiny_model, *args)
    assert calls
    monkeypatch.setattr(grpo, "FORWARD", None)
    trl = _train(tmp_path, "trl", tiny_model, *args)
    _assert_same_training(fast, trl, tiny_model)


def test_trl_forward_where_arle_would_not_give_its_numbers(tmp_path, tiny_model, monkeypatch):
    """An entropy bonus needs the entropies' gradient, which arle's forward does not keep:
    TRL's forward runs, and the run trains."""
    calls = _count_fast_calls(monkeypatch)
    card = str(varied_card(tmp_path))
    rows, _ = _train(tmp_path, "run", tiny_model, card, "--algo", "grpo", *TINY, "--set", "entropy_coef=0.01")
    assert calls == [] and all(math.isfinite(r["loss"]) for r in rows)


@pytest.mark.parametrize(
    "field,value",
    [
        ("logits_scaling", 8.0),  # Granite, MiniCPM3
        ("logit_scale", 0.5),  # Cohere
        ("lm_head_multiplier", 2.0),  # Falcon-H1
        ("output_multiplier", 2.0),
        ("final_logit_softcapping", 30.0),  # Gemma 2
    ],
)
def test_a_model_that_scales_its_logits_is_not_chunked(tiny_model, field, value):
    """The chunked head computes lm_head(hidden) alone: a model that scales or caps its logits
    after it keeps its own forward (PPO's and GRPO's)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    assert logprobs.supports_chunking(model)
    setattr(model.config, field, value)
    assert not logprobs.supports_chunking(model)
    setattr(model.config, field, 1.0 if field != "final_logit_softcapping" else None)
    assert logprobs.supports_chunking(model)
