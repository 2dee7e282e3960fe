"""arle's own fp32 linear for x86-64 CPUs with AVX2 and FMA (cpu_kernels.c), run in oneDNN's place on
each weight where it gives oneDNN's bits: the same tokens, faster.

Why: a decode step is linears streaming every weight from memory, and oneDNN's kernel on one core
computes and waits for the weights in turn. cpu_kernels.c keeps a block of outputs in registers while
the next panel of weights arrives (16-wide registers from two rows on where the CPU has AVX-512): on an
AVX2 EPYC 2.4x oneDNN's linears at one row, 1.6x at 16 and 1.4x at 64; on a Zen 4 EPYC (AVX-512) 2.2x,
1.2x and 1.05x (perf/README.md has the tables). It adds in oneDNN's order, which restarts each sum at
a point that depends on the ISA and the shape: `linear` finds it per shape by checking against oneDNN
(`agrees`), and any shape where none agrees keeps oneDNN, so the kernel changes the speed, never a
number.

How it gets here (the linear and engine.cpu_ops's kernels alike): the C file is compiled once per
machine with the system's C compiler (`$CC`, else cc, gcc or clang; ~1 s) into the cache folder and
loaded with ctypes. Without a compiler, on another CPU or OS, or with ARLE_CPU_GEMM=0, oneDNN and
torch's ops run: the same numbers, slower. Only a library in a folder that no other user can write is
loaded (else it is built afresh in a private temporary folder), since loading one runs its code.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from arlecli.engine.packed_cache import PackedStore

log = logging.getLogger(__name__)

# Where oneDNN's fp32 kernels restart a sum over k (and then add the pieces), measured: every 1024
# k's on AVX2; on AVX-512 (a Zen 4 EPYC) every 512 up to 1024 k's and every 1024 beyond (a lone row:
# every 512, but onednn._row_rule runs it as two). cpu_kernels.c restarts where it is told, and
# `linear` takes the first of these with oneDNN's bits at the shape (none: oneDNN stays).
KBLOCKS = (1024, 512)
PANEL = 16  # output columns per packed panel: a weight's rows must be a multiple of it
SOURCE = "cpu_kernels.c"
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fPIC", "-shared", "-pthread")
# Every kernel shape cpu_kernels.c has (1-3 rows, 4-6, several row blocks), and onednn._row_rule's counts.
PROBE_ROWS = (1, 2, 3, 5, 9, 16)


def linear(
    weight: Any,
    bias: Any,
    other_dtype: Callable[[Any], Any] | None = None,
    *,
    kblock: int = KBLOCKS[0],
    like: Callable[[Any], Any] | None = None,
    store: PackedStore | None = None,
) -> Callable[[Any], Any] | None:
    """`F.linear(x, weight, bias)` on cpu_kernels.c with the weight packed now (a snapshot, as
    oneDNN's), or None where it cannot run here; an input in another dtype goes to `other_dtype`
    (autocast: F.linear on the module's own weights). Its sums restart every `kblock` k's; given
    `like` (oneDNN's linear of the same weight), at the first of KBLOCKS where it gives `like`'s bits
    at every count of PROBE_ROWS instead, and None where none does. The function carries its
    `kblock`. With a `store` (engine.packed_cache), the packed weight comes from its file where
    that holds it, and is kept there for the next run."""
    import torch

    lib = library()
    n, k = weight.shape
    if lib is None or weight.dtype != torch.float32 or n % PANEL or (bias is not None and bias.dtype != weight.dtype):
        return None
    packed = None if store is None else store.take(weight)
    if packed is None:
        packed = huge_paged(n * k)
        w = weight.detach().contiguous()
        lib.arle_pack(w.data_ptr(), packed.data_ptr(), n, k)
    b = None if bias is None else bias.detach().contiguous()
    # Bound once: a decode step makes ~120 of these calls, and at one row each costs ~10 us of
    # Python on top of the kernel's own time otherwise.
    call, threads, f32, wide = lib.arle_linear, torch.get_num_threads, torch.float32, int(has_avx512())
    weights, bias_at = packed.data_ptr(), None if b is None else b.data_ptr()

    def restarting_every(kblock: int) -> Callable[[Any], Any]:
        def forward(x: Any) -> Any:
            if x.dtype != f32 and other_dtype is not None:
                return other_dtype(x)
            if x.dtype != f32 or x.shape[-1] != k or not x.is_cpu:  # the kernel would read past x, or a GPU's memory
                raise RuntimeError(f"cpu_gemm: an fp32 CPU input of width {k} expected, got {x.dtype} {tuple(x.shape)}")
            if not x.is_contiguous():
                x = x.contiguous()
            out = torch.empty((*x.shape[:-1], n), dtype=f32)
            rows = x.numel() // k
            if rows:
                call(x.data_ptr(), weights, bias_at, out.data_ptr(), rows, n, k, kblock, threads(), wide)
            return out

        # What `weights` and `bias_at` point into, alive as long as `forward` is (the closure holds
        # only the addresses).
        forward.holds = (packed, b)  # type: ignore[attr-defined]
        forward.kblock = kblock  # type: ignore[attr-defined]
        return forward

    forward = (
        restarting_every(kblock)
        if like is None
        else next((f for f in map(restarting_every, KBLOCKS) if agrees(f, like, k)), None)
    )
    if forward is None:
        log.debug("cpu_gemm differs from oneDNN at %d x %d: oneDNN kept", n, k)
    elif store is not None:
        store.keep(packed)
    return forward


def huge_paged(count: int) -> Any:
    """An empty fp32 tensor of `count` elements, carved from 64 MB chunks on 2 MB pages where the
    kernel allows (advised before any page is touched): a decode step streams all the weights, and
    on 4 KB pages TLB misses cost the kernel ~7% at 16 rows (perf/README.md). Chunks, not a 2 MB
    margin per weight, because most of a small model's weights are a few MB. A chunk is freed when
    the last weight carved from it is."""
    import torch

    with _ARENA_LOCK:
        chunk, used = _ARENA
        if chunk is None or used + count > chunk.numel():
            size = max(count, _CHUNK)
            room = torch.empty(size + _HUGE // 4, dtype=torch.float32)
            skip = (-room.data_ptr() % _HUGE) // 4
            library().arle_advise_huge(room.data_ptr() + skip * 4, size * 4)
            chunk, used = room[skip : skip + size], 0
        _ARENA[:] = [chunk, used + -(-count // PANEL) * PANEL]  # the next one 64-byte aligned too
        return chunk[used : used + count]


_HUGE = 1 << 21
_CHUNK = (64 << 20) // 4  # elements
_ARENA: list[Any] = [None, 0]  # the chunk weights are carved from, and how much of it is used
_ARENA_LOCK = threading.Lock()


def agrees(ours: Callable[[Any], Any], reference: Callable[[Any], Any], d_in: int) -> bool:
    """Whether `ours` gives `reference`'s bits on random rows at each of PROBE_ROWS's counts (the
    order of the sums depends on the shapes, not the values, so random rows tell for all weights
    of the shape)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in PROBE_ROWS:
            x = torch.randn(rows, d_in, generator=gen)
            if not torch.equal(ours(x), reference(x)):
                return False
    return True


@functools.cache
def library() -> Any:
    """cpu_kernels.c's shared library (this linear, engine.cpu_ops's kernels) with its functions'
    types set, or None where it is not to be had here (switched off, not x86-64 Linux with AVX2 and
    FMA, no compiler, a failed build)."""
    if os.environ.get("ARLE_CPU_GEMM", "1").strip() in ("0", "false", "no", "off") or not _cpu_fits():
        return None
    compiler = _compiler()
    if compiler is None:
        return None
    try:
        source = _source()
        path, temporary = _cached_build(source, compiler, library_name(source, compiler))
        try:
            lib = ctypes.CDLL(str(path))
        finally:
            if temporary:  # loaded: the file is no longer needed (Linux keeps the mapping)
                shutil.rmtree(path.parent, ignore_errors=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("cpu_gemm not built (%s): oneDNN runs", exc)
        return None
    ptr, size = ctypes.c_void_p, ctypes.c_long
    lib.arle_pack.argtypes = [ptr, ptr, size, size]
    lib.arle_pack.restype = None
    lib.arle_linear.argtypes = [ptr, ptr, ptr, ptr, size, size, size, size, ctypes.c_int, ctypes.c_int]
    lib.arle_linear.restype = None
    lib.arle_advise_huge.argtypes = [ptr, size]
    lib.arle_advise_huge.restype = None
    lib.arle_rms_norm.argtypes = [ptr, ptr, ptr, ptr, ctypes.c_float, ptr, size, size]
    lib.arle_rms_norm.restype = None
    lib.arle_rotary.argtypes = [ptr, ptr, ptr, ptr, ptr, size, size, size, size, size]
    lib.arle_rotary.restype = None
    return lib


def _compiler() -> str | None:
    """The C compiler to build with: $CC, else cc, gcc or clang on the PATH."""
    return os.environ.get("CC") or next(filter(None, map(shutil.which, ("cc", "gcc", "clang"))), None)


def _source() -> bytes:
    return resources.files("arlecli.engine").joinpath(SOURCE).read_bytes()


def library_name(source: bytes, compiler: str) -> str:
    """The cached library's file name: a hash of what built it, so an edited kernel or another
    compiler builds anew."""
    return f"cpu_kernels-{hashlib.sha256(source + ' '.join((compiler, *FLAGS)).encode()).hexdigest()[:16]}.so"


@functools.cache
def has_avx512() -> bool:
    """Whether the CPU has AVX-512F: the linear then runs cpu_kernels.c's 16-wide blocks from two
    rows on (the same bits)."""
    return "avx512f" in cpu_flags()


def _cpu_fits() -> bool:
    """x86-64 Linux whose CPU has AVX2 and FMA (what cpu_kernels.c is compiled for)."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    flags = cpu_flags()
    return "avx2" in flags and "fma" in flags


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags, from /proc/cpuinfo's first flags line (or `cpuinfo`'s text);
    none where there is no such file (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return set()
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return set(line.split(":", 1)[1].split()) if ":" in line else set()


def _cached_build(source: bytes, compiler: str, name: str) -> tuple[Path, bool]:
    """The library built from `source`, from the cache folder where a private one holds it, else
    built there now; or, where the cache is not private, built in a new private temporary folder
    (True: the caller removes that folder once the library is loaded)."""
    from arlecli.config import cache_dir

    folder = cache_dir() / "kernels"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        private = private_path(folder) and private_path(folder.parent)
    except OSError:
        private = False
    if not private:
        folder = Path(tempfile.mkdtemp(prefix="arle-kernels-"))
    target = folder / name
    if private and target.exists() and private_path(target):
        return target, False
    with tempfile.TemporaryDirectory(dir=folder) as work:
        built = Path(work) / name
        (Path(work) / SOURCE).write_bytes(source)
        subprocess.run(
            [compiler, *FLAGS, str(Path(work) / SOURCE), "-o", str(built)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(built, target)  # atomic: a process beside this one loads a whole file or builds its own
    return target, not private


def private_path(path: Path) -> bool:
    """Whether `path` is this user's and no one else can write it (what makes loading code from it safe)."""
    st = path.lstat()
    return st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not stat.S_ISLNK(st.st_mode)
