"""perf/gpu.py's CPU mode: the same code paths the GPU run takes, on a tiny shape (behaviour only, no timings)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location("perf_gpu", ROOT / "perf" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tokenizer_has_exactly_the_configs_vocab(gpu):
    tok = gpu.build_tokenizer(1000)
    assert len(tok) == 1000
    ids = tok.apply_chat_template([{"role": "user", "content": "4 - 9 ="}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) else ids
    assert tok.decode(ids) == "<|im_start|>user\n4 - 9 =<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2


def test_quick_cpu_run_writes_every_part(gpu, tmp_path):
    out = tmp_path / "gpu.json"
    gpu.main(
        [
            "--device",
            "cpu",
            "--quick",
            "--batches",
            "1",
            "3",
            "--max-tokens",
            "4",
            "--no-grpo",
            "--bandwidth",
            "1e11",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert result["dtype"] == "torch.float32"
    assert result["shape"]["vocab_size"] == 8192
    for e, r in zip(result["eval_engine"], result["raw_decode"], strict=True):
        assert e["completed"] == e["rows"] == max(2 * e["batch"], 4)
        assert e["generated_tokens"] == 4 * e["rows"]  # random weights: no EOS, every row runs to max_tokens
        assert e["tokens_per_s"] > 0 and r["tokens_per_s"] > 0
        assert 0 < e["fraction_of_bandwidth_bound"]
    assert result["grpo"] == {"skipped": "--no-grpo"}


def test_grpo_step_is_skipped_with_a_message_without_trl(gpu, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl now raises ImportError
    assert "not installed" in gpu.grpo_step(None, None, "cpu", True, tmp_path)["skipped"]


def test_real_shape_matches_qwen25_05b(gpu):
    import torch

    tok = gpu.build_tokenizer(gpu.QWEN25_05B["vocab_size"])
    with torch.device("meta"):  # shape only: no memory, no time
        model = gpu.build_model(gpu.QWEN25_05B, tok, "meta", torch.bfloat16)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6) == 494  # Qwen2.5-0.5B: 494M
