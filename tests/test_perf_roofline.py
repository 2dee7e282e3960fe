"""perf/machine_info.py's roofline and perf/roofline.py (issue 29): the shapes it charges a
decode step with are the model's, the bound is the roofline's arithmetic, and the script runs
end to end on the tiny model with every row decoding its whole budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.tiny_model import build_tiny_model

import machine_info as mi

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n"
SAPPHIRE = "model name\t: Xeon\nflags\t\t: avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n"


def test_isa_flags_read_the_cpus_flags_line() -> None:
    assert mi.isa_flags(AVX2_ONLY) == {f: f == "avx2" for f in mi.ISA_FLAGS}
    assert all(mi.isa_flags(SAPPHIRE).values())
    assert not any(mi.isa_flags("").values())  # no /proc/cpuinfo: nothing claimed
    assert "ISA:" in mi.isa_line() and "torch dispatch" in mi.isa_line()


def test_decode_linears_are_the_models_own_linears(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(folder)
    real = sorted(tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear))
    linears = mi.decode_linears(json.loads((Path(folder) / "config.json").read_text()))
    charged = sorted((lin.d_out, lin.d_in) for lin in linears for _ in range(lin.count))
    assert charged == real
    assert mi.weight_bytes(linears) == 4 * sum(a * b for a, b in real)
    assert mi.step_flops_per_row(linears) == 2 * sum(a * b for a, b in real)


def test_smollm2_shapes_give_the_issues_figures() -> None:
    cfg = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "intermediate_size": 1536, "vocab_size": 49152}  # fmt: skip
    linears = mi.decode_linears(cfg)
    assert round(mi.weight_bytes(linears) / 1e6) == 538  # "reads 538 MB of weights"
    assert round(16 * mi.step_flops_per_row(linears) / 1e9, 1) == 4.3  # "~4.3 GFLOP at 16 rows"


def test_decode_bound_is_the_slower_of_compute_and_memory() -> None:
    # 1 GFLOP a row, 1 GB of weights, 100 GFLOP/s, 10 GB/s: memory-bound below 10 rows.
    assert mi.decode_bound(10**9, 10**9, 1, 100.0, 10.0) == pytest.approx(10.0)
    assert mi.decode_bound(10**9, 10**9, 5, 100.0, 10.0) == pytest.approx(50.0)
    assert mi.decode_bound(10**9, 10**9, 40, 100.0, 10.0) == pytest.approx(100.0)  # compute-bound
    roof = {"bound_tok_s": {"1": 30.0, "16": 200.0}}
    assert mi.bound_fraction(roof, 1, 15.0) == pytest.approx(0.5)
    assert mi.bound_fraction(roof, 8, 100.0) == pytest.approx(0.5)  # the next measured batch up
    assert mi.bound_fraction(roof, 64, 100.0) == pytest.approx(0.5)  # past the largest: the largest


def test_gemm_gflops_knows_its_kernels() -> None:
    lin = [mi.Linear("x", 64, 32, 2)]
    assert mi.gemm_gflops(lin, 4, "mkl", min_seconds=0.001) > 0
    from arlecli.engine import cpu_gemm

    if cpu_gemm._cpu_fits() and cpu_gemm._compiler():  # x86-64 Linux, AVX2, cc: CI's machines
        assert "arle" in mi.available_kernels()
        assert mi.gemm_gflops(lin, 4, "arle", min_seconds=0.001) > 0
    with pytest.raises(ValueError, match="kernel"):
        mi.gemm_gflops(lin, 4, "cublas")


def test_roofline_script_runs_on_the_tiny_model(tmp_path: Path) -> None:
    import roofline

    out = tmp_path / "r.json"
    result = roofline.main(["--quick", "--batches", "1,2", "--tokens", "2", "--extra", "3", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == result["rows"]
    assert [r["batch"] for r in result["rows"]] == [1, 2]
    for r in result["rows"]:
        assert r["arle_tok_s"] > 0 and r["transformers_tok_s"] > 0
        assert 0 < r["arle_fraction"] < 5  # a fraction of a bound, not a unit slip
    assert set(result["roofline"]["bound_tok_s"]) == {1, 2}
    assert result["roofline"]["weight_mb"] > 0 and result["roofline"]["bandwidth_gbs"] > 0
    assert all(v > 0 for by_kernel in result["roofline"]["linears_tok_s"].values() for v in by_kernel.values())
