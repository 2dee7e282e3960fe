"""What every perf script records about the machine it ran on (imported by the scripts in perf/)."""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows (may be empty)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def package_versions(packages: tuple[str, ...]) -> dict[str, str]:
    """Python's version and each installed package's (missing ones are left out)."""
    versions = {"python": platform.python_version()}
    for pkg in packages:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return versions


def perf_model(quick: bool, work: Path, model: str | None = None) -> tuple[str, str]:
    """(path, display name) of the model a script runs: `model` when given, else the tests'
    tiny model (built under `work`) for --quick, else the embedded SmolLM2-135M-Instruct."""
    if model:
        return model, model
    if quick:
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers.tiny_model import build_tiny_model

        return str(build_tiny_model(work / "tiny-model")), "tiny Qwen2 test model (random weights)"
    from arlecli.models import EMBEDDED_NAME, embedded_default_model

    return str(embedded_default_model()), EMBEDDED_NAME


def process_seconds(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of `cmd` in a fresh process, start to exit, its output kept off the table;
    a failure ends the script with the end of the command's stderr."""
    import subprocess

    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} ... exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return elapsed


def decode_result(model: str, threads: int, load_at_start: list[float], tokens: int, extra: int, **fields: Any) -> dict:
    """A decode benchmark's result: when and where it ran (the model, the CPU's ISA line, torch
    threads, the load average at its start and now, the short call's tokens and the long call's
    extra ones, package versions), then `fields`."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "model": model,
        "isa": isa_line(),
        "threads": threads,
        "load_avg_at_start": load_at_start,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
        "tokens": tokens,
        "extra": extra,
        "versions": package_versions(("arle", "torch", "transformers")),
        **fields,
    }


def write_result(result: dict, out: Path, work: Path, keep: bool) -> None:
    """Write a script's result JSON to `out`, then remove its scratch dir `work` unless `keep`."""
    import json
    import shutil

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwrote {out}" + (f"; run directories in {work}" if keep else ""))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the roofline (issue 29)
#
# A decode step of a dense transformer is its linears at `rows` rows (one per sequence in the
# batch): 2 * rows * sum(d_in * d_out) FLOPs, reading every weight once. Its time is bounded by
# max(FLOPs / the GEMM rate at those shapes, weight bytes / memory bandwidth); the bound in
# tokens/s is rows over that. Attention over a short context and sampling are left out of the
# bound (they are what separates a real step from it).

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
# F.linear (MKL's sgemm), oneDNN on a prepacked weight, and arle's own (engine.cpu_gemm: x86-64 with
# AVX2 and a C compiler; the hf engine runs it wherever it gives oneDNN's bits, else oneDNN).
KERNELS = ("mkl", "onednn", "arle")


def isa_flags(cpuinfo: str | None = None) -> dict[str, bool]:
    """Which of ISA_FLAGS the CPU has, from /proc/cpuinfo's flags (or `cpuinfo`'s text); all
    False where there is no such file (not Linux)."""
    from arlecli.engine.cpu_gemm import cpu_flags

    flags = cpu_flags(cpuinfo)
    return {f: f in flags for f in ISA_FLAGS}


def isa_line() -> str:
    """One line for a perf table: the CPU model, which ISA flags it has and the kernel level
    torch dispatches to here."""
    have = [f for f, on in isa_flags().items() if on]
    try:
        import torch

        dispatch = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        dispatch = "?"
    isa = " ".join(have) or "none of " + " ".join(ISA_FLAGS)
    return f"{cpu_model() or 'unknown CPU'} · ISA: {isa} · torch dispatch {dispatch}"


@dataclass(frozen=True)
class Linear:
    """One linear layer shape of a decode step, and how many of it the step runs."""

    name: str
    d_in: int
    d_out: int
    count: int


def decode_linears(config: dict[str, Any]) -> list[Linear]:
    """The linears of one decode step of a Llama/Qwen2/Mistral-shaped model, from its
    config.json (SmolLM2-135M: 30 layers of 576-wide attention with 3 KV heads, 1536-wide MLP,
    and a 49152-row lm_head)."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    ff = config["intermediate_size"]
    return [
        Linear("q", h, heads * head_dim, layers),
        Linear("k", h, kv * head_dim, layers),
        Linear("v", h, kv * head_dim, layers),
        Linear("o", heads * head_dim, h, layers),
        Linear("gate", h, ff, layers),
        Linear("up", h, ff, layers),
        Linear("down", ff, h, layers),
        Linear("lm_head", h, config["vocab_size"], 1),
    ]


def step_flops_per_row(linears: list[Linear]) -> int:
    """FLOPs of one decode step's linears per row (a multiply and an add per weight)."""
    return 2 * sum(lin.d_in * lin.d_out * lin.count for lin in linears)


def weight_bytes(linears: list[Linear], bytes_per_weight: int = 4) -> int:
    """Bytes of weight one decode step reads (fp32 unless said)."""
    return bytes_per_weight * sum(lin.d_in * lin.d_out * lin.count for lin in linears)


def _best_seconds(fn: Callable[[], Any], min_seconds: float) -> float:
    """The fastest of a few timed calls of `fn` (after one warm-up), each call repeated until
    it has run `min_seconds`; per call."""
    fn()
    best = float("inf")
    for _ in range(3):
        n, start = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            took = time.perf_counter() - start
            if took >= min_seconds:
                break
        best = min(best, took / n)
    return best


def gemm_gflops(linears: list[Linear], rows: int, kernel: str, min_seconds: float = 0.05) -> float:
    """GFLOP/s of one decode step's linears at `rows` rows with `kernel` ("mkl": F.linear;
    "onednn": oneDNN's linear on a prepacked weight; "arle": engine.cpu_gemm's), each shape timed
    hot on its own (its weight in cache as far as it fits): the compute side of the roofline."""
    import torch

    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    total_flops, total_s = 0.0, 0.0
    with torch.inference_mode():
        for lin in linears:
            w = torch.randn(lin.d_out, lin.d_in)
            x = torch.randn(rows, lin.d_in)
            total_s += _best_seconds(_linear_call(kernel, x, w), min_seconds) * lin.count
            total_flops += 2.0 * rows * lin.d_in * lin.d_out * lin.count
    return total_flops / total_s / 1e9


def _linear_call(kernel: str, x: Any, w: Any) -> Callable[[], Any]:
    """x @ w.T with `kernel`, as a call to time (oneDNN's weight packed now, outside the call)."""
    import torch

    if kernel == "mkl":
        return lambda: torch.nn.functional.linear(x, w)
    if kernel == "arle":
        from arlecli.engine import cpu_gemm

        ours = cpu_gemm.linear(w, None)
        if ours is None:
            raise ValueError("arle's kernel does not run here (x86-64 Linux, AVX2 and FMA, a C compiler)")
        return lambda: ours(x)
    packed = torch.ops.mkldnn._reorder_linear_weight(w)
    return lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def step_linears_seconds(linears: list[Linear], rows: int, kernel: str) -> float:
    """Seconds of one decode step's linears alone at `rows` rows with `kernel`, every layer's
    own weight in turn (cold, from memory, as in a real step): what the kernel makes of the
    bound, before attention, norms, sampling and Python add theirs. Allocates the weights."""
    import torch

    calls = []
    for lin in linears:
        x = torch.randn(rows, lin.d_in)
        calls += [_linear_call(kernel, x, torch.randn(lin.d_out, lin.d_in)) for _ in range(lin.count)]
    with torch.inference_mode():
        return _best_seconds(lambda: [call() for call in calls], 0.0)


def memory_bandwidth_gbs(mib: int = 512, min_seconds: float = 0.3) -> float:
    """Read bandwidth in GB/s: the fastest of summing an fp32 tensor of `mib` MiB (far past any
    cache) and matrix-vector products over the same bytes (BLAS's gemv, and arle's kernel at one
    row where it runs: the ways decode at one row streams its weights). A bound must not be
    beaten: on a Xeon (AVX-512) one core's sum read 10.2 GB/s while the model's own gemv linears
    read 11.3; on an AVX2 EPYC arle's kernel read 28 GB/s where the sum read 15.5."""
    import torch

    x = torch.ones(mib * 2**20 // 4)
    m, v = x.view(-1, 4096), torch.ones(4096)
    with torch.inference_mode():
        seconds = min(_best_seconds(lambda: x.sum(), min_seconds), _best_seconds(lambda: m @ v, min_seconds))
        if "arle" in available_kernels():
            seconds = min(seconds, _best_seconds(_linear_call("arle", v.view(1, -1), m), min_seconds))
    return x.numel() * 4 / seconds / 1e9


def available_kernels() -> list[str]:
    """The KERNELS that run here."""
    import torch

    from arlecli.engine import cpu_gemm

    runs = {"mkl": True, "onednn": torch.backends.mkldnn.is_available(), "arle": cpu_gemm.library() is not None}
    return [k for k in KERNELS if runs[k]]


def decode_bound(flops_per_row: int, weight_bytes_: int, rows: int, gflops: float, bandwidth_gbs: float) -> float:
    """Tokens/s a decode step at `rows` rows cannot beat: rows / max(compute time, weight-read time)."""
    seconds = max(rows * flops_per_row / (gflops * 1e9), weight_bytes_ / (bandwidth_gbs * 1e9))
    return rows / seconds


def roofline(model_dir: str | Path, rows: tuple[int, ...] = (1, 16, 64)) -> dict[str, Any]:
    """The machine's decode roofline for the model at `model_dir` (its config.json) on the torch
    threads set now: ISA, bandwidth, GEMM GFLOP/s per row count and kernel, and the bound in
    tokens/s per row count (with the best kernel). Takes a few seconds."""
    import json

    import torch

    linears = decode_linears(json.loads((Path(model_dir) / "config.json").read_text()))
    flops, nbytes = step_flops_per_row(linears), weight_bytes(linears)
    bandwidth = memory_bandwidth_gbs()
    kernels = available_kernels()
    gemm = {r: {k: round(gemm_gflops(linears, r, k), 1) for k in kernels} for r in rows}
    # tokens/s of the linears alone (weights cold) per kernel: the best any step could do with it
    alone = {r: {k: round(r / step_linears_seconds(linears, r, k), 1) for k in kernels} for r in rows}
    # A bound must not be beaten: where a step's linears alone read the weights faster than the
    # probe did (it moves by ~10% from run to run on a shared VM), their rate is the bandwidth.
    streamed = max((nbytes * tok_s / r / 1e9 for r in rows for tok_s in alone[r].values()), default=0.0)
    bandwidth = max(bandwidth, streamed)
    return {
        "isa": isa_line(),
        "isa_flags": isa_flags(),
        "threads": torch.get_num_threads(),
        "bandwidth_gbs": round(bandwidth, 1),
        "step_gflop_per_row": round(flops / 1e9, 3),
        "weight_mb": round(nbytes / 1e6, 1),
        "gemm_gflops": gemm,
        "bound_tok_s": {r: round(decode_bound(flops, nbytes, r, max(gemm[r].values()), bandwidth), 1) for r in rows},
        "linears_tok_s": alone,
    }


def roofline_lines(r: dict[str, Any]) -> list[str]:
    """A roofline (from `roofline`) as the lines every perf table prints."""
    lines = [
        r["isa"],
        f"roofline ({r['threads']} thread{'s' if r['threads'] != 1 else ''}): memory read {r['bandwidth_gbs']} GB/s; "
        f"a decode step reads {r['weight_mb']} MB of fp32 weights and does {r['step_gflop_per_row']} GFLOP a row",
    ]
    for rows, by_kernel in r["gemm_gflops"].items():
        kernels = ", ".join(f"{k} {v}" for k, v in by_kernel.items())
        alone = ", ".join(f"{k} {v}" for k, v in r["linears_tok_s"][rows].items())
        lines.append(
            f"  batch {rows:>3}: GEMM GFLOP/s {kernels}; bound {r['bound_tok_s'][rows]} tok/s; "
            f"the linears alone (cold) tok/s {alone}"
        )
    return lines


def bound_fraction(r: dict[str, Any], rows: int, tok_s: float) -> float:
    """`tok_s` as a fraction of the roofline's bound at `rows` rows (the nearest measured row
    count at or above it, else the largest)."""
    bounds = {int(k): v for k, v in r["bound_tok_s"].items()}
    at = min((k for k in bounds if k >= rows), default=max(bounds))
    return tok_s / bounds[at]
