"""The small per-layer ops around a decode step's linears, on arle's CPU kernels (cpu_kernels.c):
RMSNorm with the residual add before it, and rotary embedding of the q and k heads. engine.fused
calls them where they give torch's bits (checked here, per shape, against the torch computation
they stand in for); elsewhere it runs torch's ops.

Why: at one row a layer's RMSNorm is ~20 us of torch dispatch over six ops (46 us a call inside a
decode step, whose weights have flushed the caches) and its rotary ~10 ops, for a few
microseconds of arithmetic: ~10% of a batch-1 step on one core (perf/README.md). One C call each
does the same additions and multiplications in the same order.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from arlecli.engine import cpu_gemm

log = logging.getLogger(__name__)

# Beyond 32768 elements torch splits one row's sum between threads (another order): widths this
# kernel takes stay well under it (16384 is the widest hidden size of current models).
MAX_WIDTH = 16384
PROBE_ROWS = (1, 3, 16, 67)

# (module -> hidden, delta or None) -> (hidden + delta, its RMSNorm)
AddNorm = Callable[[Any, Any, Any], tuple[Any, Any]]
# (qkv [batch, width, heads + 2 kv, d], cos, sin [batch or 1, width, d]) -> (q [b, heads, w, d], k [b, kv, w, d])
Rotary = Callable[[Any, Any, Any], tuple[Any, Any]]


def add_rms_norm(reference: Callable[[Any, Any], Any], module: Any) -> AddNorm | None:
    """The C residual add and RMSNorm for RMSNorm modules like `module` (its width, epsilon and an
    fp32 weight), or None where it is not to be had or differs from `reference(module, hidden)` (the
    torch computation it replaces) on random rows. The returned function reads each module's weight
    and epsilon when called, and hands an input it cannot take (another dtype, a tensor that needs
    gradients) to `reference`."""
    import torch

    lib = cpu_gemm.library()
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", None)
    if lib is None or weight is None or eps is None or weight.dtype != torch.float32 or weight.dim() != 1:
        return None
    width = weight.shape[0]
    if not 8 <= width <= MAX_WIDTH or not weight.is_cpu:
        return None
    call, f32, grad_enabled = lib.arle_rms_norm, torch.float32, torch.is_grad_enabled

    def norm(module: Any, hidden: Any, delta: Any = None) -> tuple[Any, Any]:
        w = module.weight
        if (
            hidden.dtype != f32
            or w.dtype != f32
            or w.shape != (width,)  # the width probed: another would be another order of sums
            or hidden.shape[-1] != width
            or not (hidden.is_cpu and w.is_cpu and w.is_contiguous())
            or (delta is not None and (delta.dtype != f32 or delta.shape != hidden.shape or not delta.is_cpu))
            or (
                grad_enabled()
                and (hidden.requires_grad or w.requires_grad or (delta is not None and delta.requires_grad))
            )
        ):
            total = hidden if delta is None else hidden + delta
            return total, reference(module, total)
        hidden = hidden.contiguous()
        out = torch.empty_like(hidden)
        total = hidden
        if delta is not None:
            delta, total = delta.contiguous(), torch.empty_like(hidden)
        call(
            hidden.data_ptr(),
            None if delta is None else delta.data_ptr(),
            None if delta is None else total.data_ptr(),
            w.data_ptr(),
            module.variance_epsilon,
            out.data_ptr(),
            hidden.numel() // width,
            width,
        )
        return total, out

    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for rows in PROBE_ROWS:
            hidden = torch.randn(rows, 1, width, generator=gen) * 4
            delta = torch.randn(rows, 1, width, generator=gen)
            total, normed = norm(module, hidden, delta)
            alone = norm(module, hidden)[1]
            if not (
                torch.equal(total, hidden + delta)
                and torch.equal(normed, reference(module, hidden + delta))
                and torch.equal(alone, reference(module, hidden))
            ):
                log.debug("cpu_ops: RMSNorm of width %d differs from torch's: torch kept", width)
                return None
    return norm


def rotary(reference: Rotary, heads: int, kv_heads: int, head_dim: int) -> Rotary | None:
    """The C rotary embedding of the q and k heads of a packed qkv projection's output, or None where
    it is not to be had or differs from `reference` (torch's computation of the same) on random
    values. The returned function hands an input it cannot take to `reference`."""
    import torch

    lib = cpu_gemm.library()
    if lib is None or head_dim % 2:
        return None
    call, f32 = lib.arle_rotary, torch.float32
    h, kv, d = heads, kv_heads, head_dim

    def rotate(qkv: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
        batch, width = qkv.shape[:2]
        if (
            qkv.dtype != f32
            or cos.dtype != f32
            or sin.dtype != f32
            or tuple(qkv.shape[2:]) != (h + 2 * kv, d)
            or tuple(cos.shape[1:]) != (width, d)
            or cos.shape != sin.shape
            or cos.shape[0] not in (1, batch)
            or not (qkv.is_cpu and cos.is_cpu and sin.is_cpu)
            or qkv.requires_grad
        ):
            return reference(qkv, cos, sin)
        if cos.shape[0] != batch:  # one row of positions for the whole batch
            cos, sin = cos.expand(batch, width, d), sin.expand(batch, width, d)
        qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
        q = torch.empty((batch, h, width, d), dtype=f32)
        k = torch.empty((batch, kv, width, d), dtype=f32)
        call(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(), k.data_ptr(), batch, width, h, kv, d)
        return q, k

    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for batch, width, rows in ((1, 1, 1), (3, 1, 3), (2, 7, 2), (3, 5, 1)):
            qkv = torch.randn(batch, width, h + 2 * kv, d, generator=gen) * 4
            cos, sin = torch.randn(2, rows, width, d, generator=gen)
            (q, k), (want_q, want_k) = rotate(qkv, cos, sin), reference(qkv, cos, sin)
            if not (torch.equal(q, want_q) and torch.equal(k, want_k)):
                log.debug("cpu_ops: rotary of %d + %d heads of %d differs from torch's: torch kept", h, kv, d)
                return None
    return rotate
