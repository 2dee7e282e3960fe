"""CPU linears on oneDNN with prepacked weights: packing a model's `nn.Linear`s, one packed
call per weight, and what oneDNN does with a row's bits at different row counts.

Why oneDNN: decode is matmuls of 1-16 rows, where MKL's `F.linear` reaches 35-90 GFLOP/s on
one core and oneDNN on a prepacked weight 130-220 (2-3x on a 49k-row lm_head). And oneDNN's
result for a row does not depend on how many rows share the matmul (MKL's moves by ~1e-5;
where oneDNN runs a lone row on another kernel, it runs as two: `_row_rule`), so batching
never changes a sample. bf16 weights (--dtype): 1.4-2x over bf16 `F.linear` at SmolLM2's
shapes on an AMX CPU.

Where arle's own kernel (engine.cpu_gemm) gives a shape oneDNN's bits, an fp32 packed call runs on
it instead: the same numbers, faster.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from arlecli.engine import cpu_gemm

if TYPE_CHECKING:
    from arlecli.engine.packed_cache import PackedStore


def pack_linears(model: Any, skip: frozenset[int] = frozenset(), store: PackedStore | None = None) -> list[Any]:
    """Run each fp32 or bf16 CPU `nn.Linear` of `model` on oneDNN with its weight prepacked
    now; returns the modules changed (`unpack_linears` undoes it). Nothing where oneDNN is
    missing or disagrees with `F.linear` here (per dtype: bf16 needs its kernels too), nor
    for the modules whose `id` is in `skip` (ones engine.fused runs from a fused weight).
    `store`: packed weights cached between runs (`packed_call`).

    Costs one copy of the weights in memory. The packed copy is a snapshot: weights changed
    later are not seen until the modules are unpacked and packed again."""
    linears = [m for m in model.modules() if id(m) not in skip and packable(m)]
    for m in linears:
        # An instance attribute over the class's method, on purpose (unpack_linears deletes it).
        m.forward = packed_call([m], store)
    return linears


def packable(m: Any) -> bool:
    """Whether `m` is an unpacked CPU `nn.Linear` whose weight oneDNN can pack here."""
    import torch

    return (
        isinstance(m, torch.nn.Linear)
        and "forward" not in vars(m)
        and m.weight.device.type == "cpu"
        and m.weight.dtype in (torch.float32, torch.bfloat16)
        and m.weight.shape == (m.out_features, m.in_features)  # a ZeRO-3 shard has another shape
        and onednn_linear_works(str(m.weight.dtype).removeprefix("torch."))
    )


def unpack_linears(modules: list[Any]) -> None:
    """Give `modules` (from `pack_linears`) their own `nn.Linear.forward` back."""
    for m in modules:
        vars(m).pop("forward", None)


def packed_call(linears: list[Any], store: PackedStore | None = None) -> Callable[[Any], Any]:
    """One packed call computing the outputs of `linears` (one, or several reading the same
    input: their weights stacked, outputs side by side), with the weights packed now, on oneDNN
    or on engine.cpu_gemm's kernel where that gives oneDNN's bits; an input in another dtype than
    the packed weight's (autocast) runs `F.linear` on each instead. The function carries its
    `row_rule`. `store` (engine.packed_cache): the kernel's packed weight from the file where it
    holds it, and kept there for the next run."""
    import torch

    first = linears[0]
    with torch.no_grad():
        weight = first.weight.detach() if len(linears) == 1 else torch.cat([m.weight.detach() for m in linears])
        biases = [m.bias for m in linears]
        bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    d_out = sum(m.out_features for m in linears)
    key = (first.in_features, d_out, bias is not None, str(first.weight.dtype))

    def other_dtype(x: Any) -> Any:  # e.g. under autocast: the packed weight has one dtype
        outs = [torch.nn.functional.linear(x, m.weight, m.bias) for m in linears]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    # arle's own kernel where it gives the bits oneDNN's call below would (checked once per shape,
    # which also finds where the kernel restarts its sums): then oneDNN never keeps this weight.
    kblock = _KBLOCKS.get(key, 0)
    if kblock:
        faster = cpu_gemm.linear(weight, bias, other_dtype, kblock=kblock, store=store)
        if faster is not None:
            return _batch_invariant(faster)

    forward = onednn_linear(weight, bias, other_dtype)
    if key not in _KBLOCKS and cpu_gemm.library() is not None:
        faster = cpu_gemm.linear(weight, bias, other_dtype, like=forward, store=store)
        _KBLOCKS[key] = getattr(faster, "kblock", None)
        if faster is not None:
            return _batch_invariant(faster)
    return forward


def onednn_linear(weight: Any, bias: Any, other_dtype: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """oneDNN's `F.linear(x, weight, bias)` on the weight packed now, a lone row run as two where
    oneDNN would give it other bits than in a batch (`_row_rule`); an input in another dtype goes to
    `other_dtype`. The function carries its `row_rule`."""
    import torch

    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    dtype = weight.dtype  # not the weight itself: the packed copy is all the call keeps
    rule = _row_rule(packed, bias, weight.shape[1], weight.shape[0], dtype)

    def forward(x: Any) -> Any:
        if x.dtype != dtype and other_dtype is not None:
            return other_dtype(x)
        if rule.pad_single and x.numel() == x.shape[-1]:
            # One row runs as two (the same cost: the weights are read once), on the kernel
            # every other row count uses, so a lone row gets the bits it would get in a batch.
            two = torch.ops.mkldnn._linear_pointwise(x.reshape(1, -1).expand(2, -1), packed, bias, "none", [], "")
            return two[:1].reshape(*x.shape[:-1], -1)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    forward.row_rule = rule  # type: ignore[attr-defined]
    return forward


def _batch_invariant(faster: Any) -> Any:
    """cpu_gemm's call with its row rule: its rows never depend on each other, and agreeing with
    oneDNN's call at 1 to 16 rows, oneDNN's did not either there (what _row_rule probed)."""
    faster.row_rule = RowRule(pad_single=False, stable=True)
    return faster


def _onednn(packed: Any, bias: Any) -> Callable[[Any], Any]:
    """oneDNN's linear on a weight it packed."""
    import torch

    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@dataclass(frozen=True)
class RowRule:
    """How oneDNN treats rows of one linear's shape on this CPU (measured by `_row_rule`)."""

    pad_single: bool  # one row takes another kernel than two or more (SmolLM2's 1536 -> 576 on AVX-512)
    stable: bool  # from two rows on, a row's bits do not depend on how many rows share the matmul


_ROW_RULES: dict[tuple[int, int, bool, str], RowRule] = {}
# Per shape: where cpu_gemm's kernel restarts its sums to give oneDNN's bits, None where it cannot
# (measured by packed_call, once).
_KBLOCKS: dict[tuple[int, int, bool, str], int | None] = {}


def _row_rule(packed: Any, bias: Any, d_in: int, d_out: int, dtype: Any) -> RowRule:
    """Probe, once per shape, whether a row's result depends on the matmul's row count: the
    kernel oneDNN picks depends on the shapes, not the values, so random rows through one
    weight of the shape tell for all. Costs a few small matmuls per distinct shape."""
    import torch

    key = (d_in, d_out, bias is not None, str(dtype))
    if key not in _ROW_RULES:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(16, d_in, generator=gen).to(dtype)
        with torch.inference_mode():

            def run(rows: int) -> Any:
                return _onednn(packed, bias)(x[:rows])

            full = run(16)
            _ROW_RULES[key] = RowRule(
                pad_single=not torch.equal(run(1)[0], full[0]),
                stable=all(torch.equal(run(n), full[:n]) for n in (2, 3, 9)),
            )
    return _ROW_RULES[key]


def rows_are_batch_invariant(calls: list[Any]) -> bool:
    """Whether every packed call in `calls` (modules from `pack_linears`, or `packed_call`
    functions) gives a row the same bits at any row count (one row padded to two where that
    differs): what prompt lookup's exactness and "batching never changes a sample" rest on."""
    rules = [getattr(vars(c).get("forward", c), "row_rule", None) for c in calls]
    return bool(rules) and all(rule is not None and rule.stable for rule in rules)


@functools.cache
def onednn_linear_works(dtype: str = "float32") -> bool:
    """Whether oneDNN's packed linear runs here in `dtype` and matches `F.linear` on a probe
    (a guard for builds and CPUs without it, where it would fail far from here)."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return False
    kind = getattr(torch, dtype)
    probe = torch.nn.Linear(64, 48).to(kind)
    x = torch.randn(3, 64).to(kind)
    tolerance = 1e-4 if kind == torch.float32 else 2e-2  # bf16 keeps 8 significant bits
    try:
        with torch.inference_mode():
            got = packed_call([probe])(x)
            want = probe(x)
    except (RuntimeError, AttributeError):
        return False
    return bool(torch.allclose(got.float(), want.float(), rtol=tolerance, atol=tolerance))
