"""The policy's weights as the rollout engines take them: a LoRA adapter merged, as `arle eval`
merges it when it loads the checkpoint, and never written into the policy itself.

`arle eval` of a LoRA checkpoint runs peft's `merge_and_unload` (engine.hf `_load`): every
adapted weight becomes W + delta (peft's `get_delta_weight`) in W's dtype. Training rollouts
must sample what that eval would (the parity contract of train.batches), so both engines get
those same bits:

- vLLM (`policy_weights`): the merged tensors, one layer at a time, computed beside the
  policy. peft's `merge_adapter` / `unmerge_adapter` round trip, used before, left about 1% of
  the frozen base weights an ulp off at every sync (W + d - d != W in floats), so the weights
  trained drifted from those a resumed run reloads.
- hf (`GenerationCopy`, `for_generation`): a plain model of the policy's architecture holding
  the merged weights, refilled before each rollout. The adapter's own forward (W x + s B A x)
  rounds differently from the merged weight's, and the engine's fast paths (engine.fused,
  oneDNN packing, grouped-query SDPA) run on plain modules only: a LoRA policy's multi-turn
  rollouts took 1.74x as long through its adapter layers (perf/README.md). A plain policy on a
  CPU gets a copy too: a trainer's wrapped forward (TRL's fused LM head) and hooks rule the
  fused forward out on the live module.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import torch


def detached_copy(model: Any) -> Any:
    """A deep copy of `model` that shares nothing with it: a trainer may patch a module's
    `forward` on the instance (TRL's fused LM head wraps the original bound method), and a copy
    of that attribute would still call the original module, with its live weights. The copy's
    modules get their class's forward back, and no gradients."""
    out = copy.deepcopy(model)
    for module in out.modules():
        module.__dict__.pop("forward", None)
    out.requires_grad_(False)
    return out


def available_memory() -> int | None:
    """Bytes of memory free for new allocations (Linux's MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def weight_bytes(model: Any) -> int:
    """Bytes of `model`'s parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _plain_name(name: str, prefix: str) -> str | None:
    """A peft model's parameter name as a plain checkpoint names it; None for the adapter's own
    weights and the originals that modules_to_save replaced."""
    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
    if prefix in name or "original_module" in name:
        return None
    return name.replace("modules_to_save.default.", "")


def _vanilla_lora(layer: Any) -> bool:
    """Whether peft's merge of `layer` is `weight += get_delta_weight(adapter)` per active
    adapter (and the LoRA bias added to the bias): no DoRA-like variant, not merged already."""
    return not getattr(layer, "merged_adapters", None) and not any(
        a in getattr(layer, "lora_variant", {}) for a in layer.active_adapters
    )


def _merged(layer: Any, which: str, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (the base layer's weight or bias) plus what peft's merge adds to it, in the
    order and dtype peft's in-place merge adds it: the same bits, out of place."""
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        if which == "weight":
            tensor = tensor + layer.get_delta_weight(adapter)
        elif layer.lora_bias.get(adapter):
            tensor = tensor + (layer.lora_B[adapter].bias * layer.scaling[adapter]).to(tensor.dtype)
    return tensor


def policy_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every weight under the names a plain HF checkpoint (and vLLM's
    `load_weights`) uses. A peft model's adapter comes merged into the weights it adapts, the
    policy untouched (module docstring)."""
    import torch

    if not hasattr(model, "merge_adapter"):
        for name, param in model.named_parameters():
            yield name, param.data
        return
    from peft.tuners.lora import LoraLayer

    owners: dict[int, tuple[Any, str]] = {}
    for module in model.modules():
        if isinstance(module, LoraLayer):
            base = module.get_base_layer()
            for which in ("weight", "bias"):
                param = getattr(base, which, None)
                if param is not None:
                    owners[id(param)] = (module, which)
    if not all(_vanilla_lora(layer) for layer, _ in owners.values()):
        yield from _merged_copy_weights(model)  # peft's own merge for the variants, on a copy
        return
    with torch.no_grad():
        for name, param in model.named_parameters():
            plain = _plain_name(name, model.prefix)
            if plain is None:
                continue
            owner = owners.get(id(param))
            yield plain, _merged(owner[0], owner[1], param.data) if owner else param.data


def _merged_copy_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    import torch

    with torch.no_grad():
        merged = detached_copy(model).merge_and_unload()
        for name, param in merged.named_parameters():
            yield name, param.data


def _drop_input_grad_hooks(model: Any) -> None:
    """Remove transformers' `enable_input_require_grads` hooks (gradient checkpointing with an
    adapter marks the embeddings' output as needing grad): generation runs without gradients,
    and any hook keeps engine.fused from standing in for the model's forward."""
    for module in model.modules():
        for key, hook in list(module._forward_hooks.items()):
            if getattr(hook, "__name__", "") == "make_inputs_require_grads":
                del module._forward_hooks[key]


class GenerationCopy:
    """A copy of a policy for generation, kept from one rollout to the next so that only the
    weights are copied (`of`): for a peft policy a plain model with the adapter merged
    (module docstring), else a detached copy."""

    def __init__(self) -> None:
        self._of: int | None = None  # id() of the policy module the copy was made from
        self._version: int | None = None  # the version of the weights it holds, where named
        self._model: Any = None
        self._params: dict[str, torch.Tensor] = {}

    def holds(self, model: Any) -> bool:
        """Whether the copy was made from `model`."""
        return self._of == id(model)

    def of(self, model: Any, version: int | None = None) -> Any:
        """The copy, holding `model`'s current weights (merged). `version` names the weights
        (the optimizer step, as PolicyBackend's vLLM sync takes it): the copy already made from
        `model` at that version is not refilled; None refills it always."""
        import torch

        if self.holds(model) and version is not None and version == self._version:
            return self._model
        with torch.no_grad():
            if not self.holds(model):
                self._model = detached_copy(model)
                if hasattr(model, "merge_and_unload"):
                    self._model = self._model.merge_and_unload()
                    _drop_input_grad_hooks(self._model)
                self._model.eval()
                self._model._arle_generation_copy = True
                # The attention a loaded engine runs (the same bits as sdpa's): the copy only generates.
                from arlecli.engine.hf import use_grouped_attention

                use_grouped_attention(self._model)
                self._params = dict(self._model.named_parameters())
                self._of, self._version = id(model), version
                return self._model
            names = set()
            for name, tensor in policy_weights(model):
                self._params[name].copy_(tensor)
                names.add(name)
        if names != self._params.keys():
            raise RuntimeError(f"the policy gave no weights for {sorted(self._params.keys() - names)[:3]}")
        self._version = version
        return self._model

    def close(self) -> None:
        """Drop the copy."""
        self._of, self._version, self._model, self._params = None, None, None, {}


def is_generation_copy(model: Any) -> bool:
    """Whether `model` is a `GenerationCopy`'s model (an --max-staleness snapshot)."""
    return bool(getattr(model, "_arle_generation_copy", False))


def for_generation(model: Any, copy_of: GenerationCopy, version: int | None = None) -> Any:
    """What the hf engine generates with for `model`: `copy_of` refilled with its weights (a
    peft adapter merged) where the copy fits in 80% of the device's free memory, else `model`
    itself. A plain policy is generated with directly on a GPU (no fast paths there to gain, and
    a full fine-tune's memory goes to the optimizer); on a CPU its copy runs the engine's fused
    forward and grouped attention, which a trainer's wrapped forward and hooks rule out.
    `version`: as `GenerationCopy.of` takes it."""
    peft = hasattr(model, "merge_and_unload")
    if not peft and next(model.parameters()).device.type != "cpu":
        return model
    if not copy_of.holds(model) and not copies_fit(model)[0]:
        return model
    return copy_of.of(model, version)


def copies_fit(model: Any, copies: int = 1) -> tuple[bool, int, int | None]:
    """Whether `copies` copies of `model`'s weights fit in 80% of the free memory of the device
    they would be made on (its own: CUDA's free memory there, else the host's); with the bytes
    they need and the bytes free (None where unknown: then they are taken to fit). The 20% is
    left for what generating with them allocates (KV cache, activations)."""
    import torch

    need = copies * weight_bytes(model)
    device = next(model.parameters()).device
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_memory()
    return free is None or need <= 0.8 * free, need, free
