"""`--dtype` (issue 29): bf16 weights are opt-in on a CPU (they change the numbers), recorded
in meta.json so a resume never mixes dtypes, and refused in one line where they cannot apply."""

from __future__ import annotations

import json

import pytest
from helpers.cli import arle, assert_one_line_error, snapshot
from helpers.perf import run_quick

from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.hf import HFEngine
from arlecli.engine.onednn import onednn_linear_works


def test_the_default_is_fp32_on_cpu_and_bfloat16_is_taken_when_asked(tiny_model):
    import torch

    plain, bf16 = HFEngine(str(tiny_model)), HFEngine(str(tiny_model), dtype="bfloat16")
    assert plain.model.dtype == torch.float32 and plain.dtype is None
    assert bf16.model.dtype == torch.bfloat16 and bf16.dtype == "bfloat16"
    # bf16 linears are prepacked too wherever oneDNN has bf16 kernels (the probe says), like fp32's.
    assert bf16.packed_linears == (plain.packed_linears if onednn_linear_works("bfloat16") else 0)
    out = dict(bf16.generate([GenerationRequest(prompt="count count", params=SamplingParams(max_tokens=6))]))[0]
    assert len(out.token_ids) == 6


def test_an_eval_records_the_dtype_asked_for_and_a_resume_with_another_is_refused(tmp_path, tiny_model):
    run = tmp_path / "run"
    args = ["eval", "one_digit_sums", "--model", str(tiny_model), "--limit", "2", "--max-tokens", "4"]
    done = arle(*args, "--dtype", "bfloat16", "--output", str(run))
    assert done.returncode == 0, done.stderr
    meta = json.loads((run / "meta.json").read_text())
    assert meta["model_options"]["dtype"] == "bfloat16"
    before = snapshot(run)
    refused = arle(*args, "--dtype", "float32", "--output", str(run), "--resume")
    assert refused.returncode == 2 and "dtype: 'bfloat16' -> 'float32'" in refused.stderr, refused.stderr
    assert snapshot(run) == before
    default = tmp_path / "default"
    assert arle(*args, "--output", str(default)).returncode == 0
    assert "dtype" not in json.loads((default / "meta.json").read_text())["model_options"]


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--dtype", "int4"], ("--dtype 'int4'", "bfloat16")),
        (["--dtype", "bfloat16", "--base-url", "http://127.0.0.1:9/v1"], ("--dtype", "endpoint")),
    ],
)
def test_a_dtype_that_cannot_apply_is_one_line_exit_2(tiny_model, extra, needles):
    model = [] if "--base-url" in extra else ["--model", str(tiny_model)]
    proc = arle("eval", "one_digit_sums", *model, "--limit", "1", *extra)
    assert_one_line_error(proc, *needles)


def test_serve_refuses_a_dtype_it_cannot_load_in_one_line(tiny_model):
    proc = arle("serve", "--model", str(tiny_model), "--dtype", "fp4", "--port", "0")
    assert_one_line_error(proc, "--dtype 'fp4'")


def test_the_perf_script_compares_both_dtypes_on_both_workloads(tmp_path):
    """perf/dtype.py --quick (no timing is asserted): both workloads run on both engines and
    the comparison counts every sample."""
    table = run_quick("dtype", tmp_path / "dtype.json")["table"]
    assert [r["workload"] for r in table] == ["gsm8k 0-shot", "humaneval"]
    for r in table:
        assert r["samples"] == 4 and 0 <= r["identical_completions"] <= 4
        assert set(r["score"]) == {"float32", "bfloat16"} and all(v is not None for v in r["score"].values())
