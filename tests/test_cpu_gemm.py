"""arle's own CPU linear (engine/cpu_kernels.c): oneDNN's bits at the shapes models have, at any row
and thread count; packed_call takes it only where it checked that; the engine's tokens are the
same with and without it (greedy, seeded, stop strings, logprobs, a multi-turn card); and it loads
no library from a folder someone else could have written to."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.engine_parity import assert_same_episodes, assert_same_generations_and_logliks

from arlecli.engine import cpu_gemm, onednn
from arlecli.engine.hf import HFEngine


def _can_build_here() -> bool:
    return cpu_gemm._cpu_fits() and cpu_gemm._compiler() is not None


pytestmark = pytest.mark.skipif(not _can_build_here(), reason="cpu_kernels.c needs x86-64 Linux, AVX2 and FMA, and cc")


@pytest.fixture
def fresh_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """library() built anew under a private ARLE_HOME; the usual one again afterwards."""
    monkeypatch.setenv("ARLE_HOME", str(tmp_path / "home"))
    cpu_gemm.library.cache_clear()
    yield tmp_path / "home" / "cache" / "kernels"
    monkeypatch.undo()
    cpu_gemm.library.cache_clear()


def _ours(call: Any) -> bool:
    """Whether a packed call runs on cpu_gemm's kernel (else oneDNN's)."""
    return call.__module__ == cpu_gemm.__name__


def _onednn(weight: Any, bias: Any) -> Any:
    """oneDNN's call as the engine makes it (a lone row run as two where oneDNN's differs)."""
    return onednn.onednn_linear(weight, bias)


# SmolLM2's projections (q/k/v stacked, o, gate/up stacked, down: 1536 restarts the sum at 1024;
# on AVX-512 576 at 512 too),
# a long input restarting twice, a small head, and Qwen2's biased q/k/v.
SHAPES = [(960, 576, False), (576, 576, False), (3072, 576, False), (576, 1536, False), (32, 2100, True), (48, 5, True)]


_NEEDS_AVX512 = pytest.mark.skipif(not cpu_gemm.has_avx512(), reason="16-wide blocks need AVX-512")


@pytest.mark.parametrize("wide", [False, pytest.param(True, marks=_NEEDS_AVX512)], ids=["8-wide", "16-wide"])
@pytest.mark.parametrize(("d_out", "d_in", "with_bias"), SHAPES)
def test_onednns_bits_at_every_row_and_thread_count(d_out, d_in, with_bias, wide, monkeypatch):
    """Both register widths' blocks (the 16-wide ones run on an AVX-512 CPU from two rows on)."""
    monkeypatch.setattr(cpu_gemm, "has_avx512", lambda: wide)
    gen = torch.Generator().manual_seed(d_out + d_in)
    weight = torch.randn(d_out, d_in, generator=gen) * 0.05
    bias = torch.randn(d_out, generator=gen) if with_bias else None
    theirs = _onednn(weight, bias)
    ours = cpu_gemm.linear(weight, bias, like=theirs)
    assert ours is not None and ours.kblock in cpu_gemm.KBLOCKS
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for rows in (1, 2, 3, 4, 5, 6, 7, 13, 16, 17, 64, 150):
                x = torch.randn(rows, d_in, generator=gen)
                assert torch.equal(ours(x), theirs(x)), (rows, n_threads)
    finally:
        torch.set_num_threads(threads)


def test_a_rows_result_is_the_same_alone_and_among_any_rows():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(960, 1200, generator=gen)
    ours = cpu_gemm.linear(weight, None)
    x = torch.randn(20, 1200, generator=gen)
    together = ours(x)
    for start, stop in ((0, 1), (5, 6), (19, 20), (3, 5), (2, 9), (7, 20)):
        assert torch.equal(ours(x[start:stop]), together[start:stop])


def test_inputs_of_any_layout_and_no_rows():
    gen = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(64, 48, generator=gen), torch.randn(64, generator=gen)
    ours = cpu_gemm.linear(weight, bias)
    x = torch.randn(2, 5, 48, generator=gen)
    want = torch.nn.functional.linear(x, weight, bias)
    assert ours(x).shape == (2, 5, 64)
    torch.testing.assert_close(ours(x), want)
    transposed = torch.randn(48, 7, generator=gen).t()  # not contiguous
    assert torch.equal(ours(transposed), ours(transposed.contiguous()))
    assert ours(torch.randn(0, 48)).shape == (0, 64)


def test_the_packed_weight_and_bias_outlive_what_they_were_made_from():
    """The C code gets addresses: the weight and bias it reads must live as long as the call does,
    though the tensors they came from (a stacked weight, a concatenated bias) are temporaries."""
    import gc

    weight, bias = torch.randn(64, 48), torch.randn(64)
    ours = cpu_gemm.linear(weight.clone(), bias.clone() + 0)
    gc.collect()
    litter = [torch.full((64 * 48,), 1e30) for _ in range(200)]  # reuses freed memory, if any was
    x = torch.randn(5, 48)
    torch.testing.assert_close(ours(x), torch.nn.functional.linear(x, weight, bias))
    assert litter


def test_an_input_the_kernel_would_misread_is_refused():
    """The C code trusts its sizes: a wrong width would read past the input (a crash or garbage),
    another dtype would be read as fp32."""
    ours = cpu_gemm.linear(torch.randn(32, 48), None)
    for bad in (torch.randn(3, 47), torch.randn(3, 96), torch.randn(3, 48, dtype=torch.float64)):
        with pytest.raises(RuntimeError, match="cpu_gemm"):
            ours(bad)


def test_packed_call_takes_the_kernel_only_where_it_gives_onednns_bits(monkeypatch):
    """Checked per shape against oneDNN: restarting its sums at a point oneDNN does not (a kernel
    that would change numbers), the 1536-wide shape stays on oneDNN, and where a later choice gives
    oneDNN's bits, that one runs; the 256-wide one, where no restart happens, takes the first.
    Weights carved one after another from the same chunk keep their own values."""
    monkeypatch.setattr(onednn, "_KBLOCKS", {})
    layers = [torch.nn.Linear(1536, 576, bias=False), torch.nn.Linear(576, 576, bias=False)]
    layers.append(torch.nn.Linear(576, 576, bias=False))
    calls = [onednn.packed_call([m]) for m in layers]
    assert all(_ours(f) for f in calls)
    x1536, x576 = torch.randn(9, 1536), torch.randn(9, 576)
    for f, m, x in zip(calls, layers, (x1536, x576, x576)):
        assert torch.equal(f(x), _onednn(m.weight.detach(), None)(x))
        assert torch.equal(f(x[:1]), _onednn(m.weight.detach(), None)(x[:1]))
    assert onednn.rows_are_batch_invariant(calls)

    wide, narrow = torch.nn.Linear(1536, 576, bias=False), torch.nn.Linear(256, 576, bias=False)
    monkeypatch.setattr(onednn, "_KBLOCKS", {})
    monkeypatch.setattr(cpu_gemm, "KBLOCKS", (768,))
    assert (_ours(onednn.packed_call([wide])), _ours(onednn.packed_call([narrow]))) == (False, True)
    assert onednn._KBLOCKS == {(1536, 576, False, "torch.float32"): None, (256, 576, False, "torch.float32"): 768}
    assert torch.equal(onednn.packed_call([wide])(x1536), _onednn(wide.weight.detach(), None)(x1536))

    monkeypatch.setattr(onednn, "_KBLOCKS", {})
    monkeypatch.setattr(cpu_gemm, "KBLOCKS", (768, 1024))  # oneDNN: 1024 past 1024 k's, AVX2 and AVX-512
    f = onednn.packed_call([wide])
    assert _ours(f) and f.kblock == 1024 and onednn._KBLOCKS == {(1536, 576, False, "torch.float32"): 1024}
    assert torch.equal(f(x1536), _onednn(wide.weight.detach(), None)(x1536))
    again = onednn.packed_call([wide])  # the shape's k-block known: no probing
    assert again.kblock == 1024 and torch.equal(again(x1536), f(x1536))


@pytest.mark.parametrize("stacked", [1, 3])
def test_an_input_in_another_dtype_runs_each_linear_as_f_linear(monkeypatch, stacked):
    """Under autocast (a policy's forward in training) the input is bf16, the packed weight fp32."""
    monkeypatch.setattr(onednn, "_KBLOCKS", {})
    linears = [torch.nn.Linear(64, 32 + 16 * i) for i in range(stacked)]
    f = onednn.packed_call(linears)
    assert _ours(f)
    x = torch.randn(3, 64).to(torch.bfloat16)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.cat([torch.nn.functional.linear(x, m.weight, m.bias) for m in linears], dim=-1)
        got = f(x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def _engines(tiny_model: Any, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> tuple[HFEngine, HFEngine]:
    """(an engine on cpu_gemm's kernel, one on oneDNN's), the same weights and settings."""
    taken: list[Any] = []
    real = cpu_gemm.linear
    monkeypatch.setattr(onednn, "_KBLOCKS", {})
    monkeypatch.setattr(cpu_gemm, "linear", lambda *args, **kw: taken.append(real(*args, **kw)) or taken[-1])
    ours = HFEngine(str(tiny_model), **kw)
    monkeypatch.setattr(cpu_gemm, "linear", lambda *args, **kw: None)
    theirs = HFEngine(str(tiny_model), **kw)
    assert len(taken) >= 6 and all(taken)  # every projection of the tiny model's layers ran on it
    assert any(v for v in onednn._KBLOCKS.values())
    return ours, theirs


@pytest.mark.parametrize("batch_size", [1, 4])
def test_engine_tokens_are_the_same_with_and_without_the_kernel(tiny_model, monkeypatch, batch_size):
    ours, theirs = _engines(tiny_model, monkeypatch, batch_size=batch_size, prefix_cache_tokens=0)
    assert_same_generations_and_logliks(ours, theirs)


def test_multi_turn_episodes_are_the_same_with_and_without_the_kernel(tiny_model, monkeypatch):
    ours, theirs = _engines(tiny_model, monkeypatch, batch_size=3)
    assert_same_episodes(ours, theirs, "test_cpu_gemm_four_turns")


def test_it_is_built_once_and_then_loaded(fresh_library):
    lib = cpu_gemm.library()
    assert lib is not None
    built = list(fresh_library.glob("cpu_kernels-*.so"))
    assert [p.name for p in built] == [cpu_gemm.library_name(cpu_gemm._source(), cpu_gemm._compiler())]
    stamp = built[0].stat().st_mtime_ns
    cpu_gemm.library.cache_clear()
    assert cpu_gemm.library() is not None and built[0].stat().st_mtime_ns == stamp


def _planted_library(tmp_path: Path, marker: Path) -> Path:
    """A library that, once loaded, writes `marker`: what an attacker would leave in the cache."""
    source = tmp_path / "evil.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void run(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) fclose(f);\n'
        "}\n"
        "void arle_pack(void) {}\nvoid arle_linear(void) {}\nvoid arle_advise_huge(void) {}\n"
    )
    out = tmp_path / "evil.so"
    subprocess.run([cpu_gemm._compiler(), "-shared", "-fPIC", str(source), "-o", str(out)], check=True)
    return out


@pytest.mark.parametrize("how", ["folder others can write", "a link"])
def test_a_library_someone_else_could_have_written_is_never_loaded(fresh_library, tmp_path, how):
    marker = tmp_path / "ran"
    evil = _planted_library(tmp_path, marker)
    fresh_library.mkdir(parents=True)
    target = fresh_library / cpu_gemm.library_name(cpu_gemm._source(), cpu_gemm._compiler())
    if how == "a link":
        target.symlink_to(evil)
    else:
        fresh_library.chmod(0o777)
        target.write_bytes(evil.read_bytes())
    lib = cpu_gemm.library()
    assert not marker.exists()
    assert lib is not None  # built afresh where no one else writes, and it computes
    weight = torch.randn(32, 16)
    assert torch.equal(cpu_gemm.linear(weight, None)(torch.ones(2, 16)), _onednn(weight, None)(torch.ones(2, 16)))


def test_a_cache_folder_that_cannot_be_made_builds_in_a_private_temporary_one(tmp_path, monkeypatch):
    """An unwritable home (a service account, HOME=/nonexistent): the kernel still runs, built in
    a folder of this process's own that is gone once the library is loaded."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("ARLE_HOME", str(blocker))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    cpu_gemm.library.cache_clear()
    try:
        assert cpu_gemm.library() is not None
        assert list((tmp_path / "tmp").iterdir()) == []
    finally:
        monkeypatch.undo()
        cpu_gemm.library.cache_clear()


@pytest.mark.parametrize(("variable", "value"), [("ARLE_CPU_GEMM", "0"), ("CC", "/nonexistent/cc"), ("CC", "false")])
def test_switched_off_or_no_working_compiler_means_onednn(fresh_library, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(onednn, "_KBLOCKS", {})
    assert cpu_gemm.library() is None
    m = torch.nn.Linear(64, 32)
    f = onednn.packed_call([m])
    assert not _ours(f)
    x = torch.randn(3, 64)
    torch.testing.assert_close(f(x), m(x))
