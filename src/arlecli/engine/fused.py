"""The forward pass of a Llama, Qwen2 or Qwen3 causal LM on CPU, with each layer's q, k and v
projections as one packed matmul and its gate and up projections as another: transformers'
own computation, bit for bit, in fewer calls.

Why: at batch 1 a decode step is ~95% linears streaming the weights, and the rest is Python
and small ops. Projections of one input are one pass over it with their weights stacked
(oneDNN gives each output column the bits it gives it alone: `_stacking_exact`, probed per
shape), so a layer runs 4 matmuls instead of 7, rotary embedding runs once over q and k
together, and no module or keyword machinery runs per layer (perf/README.md has the gain).

What makes it exact: the same ops on the same values in the same order as the model classes
of the pinned transformers (the mask from `create_causal_mask`, cos and sin from the model's
rotary module, the attention function the model is configured with, its own RMSNorm modules
unless `torch.rms_norm` gives their bits, or engine.cpu_ops's C RMSNorm and rotary where they
give torch's: `assemble`), and tests that compare logits with
`torch.equal` on each supported class. Anything else (other classes, sliding-window layers,
adapters, a GPU, a dtype oneDNN does not pack here) gets None from `build`, and the engine
calls the model itself. engine.native's models (a Llama folder loaded without the model classes)
go through `assemble` with its own mask and the attention called directly, not through `build`.
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from arlecli.engine import cpu_ops
from arlecli.engine.onednn import packable, packed_call

if TYPE_CHECKING:
    from arlecli.engine.packed_cache import PackedStore

# The causal LM classes whose computation `FusedForward` repeats, with the classes of their parts.
SUPPORTED = {
    "LlamaForCausalLM": ("LlamaModel", "LlamaDecoderLayer", "LlamaAttention", "LlamaMLP", "LlamaRMSNorm"),
    "Qwen2ForCausalLM": ("Qwen2Model", "Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP", "Qwen2RMSNorm"),
    "Qwen3ForCausalLM": ("Qwen3Model", "Qwen3DecoderLayer", "Qwen3Attention", "Qwen3MLP", "Qwen3RMSNorm"),
}


@dataclass
class _Layer:
    module: Any  # the decoder layer: its norms, o_proj, down_proj and act_fn run as they are
    qkv: Callable[[Any], Any]
    gate_up: Callable[[Any], Any]


@dataclass
class FusedForward:
    """`model`'s forward over fused projections: call it as `model(...)` is called, for the logits."""

    model: Any
    layers: list[_Layer]
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    # (an RMSNorm module, hidden states, a residual to add first or None) -> (their sum, its norm)
    norm: cpu_ops.AddNorm
    eager_attention: Callable[..., Any]  # the model's own, for attn_implementation "eager"
    # engine.native's model brings its own (transformers' computation without its model classes'
    # imports); None: transformers' `create_causal_mask` and the attention the config names.
    causal_mask: Callable[..., Any] | None = None  # as create_causal_mask(config, embeds, mask, cache, positions)
    attention: Callable[..., Any] | None = None
    # rotary of q and k: engine.cpu_ops's where it gives torch's bits, else torch's ops (`qk_rotary`);
    # None: Qwen3's per-head norms come first, then torch's ops on each
    rotary: cpu_ops.Rotary | None = None

    @property
    def calls(self) -> list[Callable[[Any], Any]]:
        """The packed calls (for `onednn.rows_are_batch_invariant`)."""
        return [f for layer in self.layers for f in (layer.qkv, layer.gate_up)]

    @property
    def modules(self) -> frozenset[int]:
        """`id`s of the linears these calls stand in for (`onednn.pack_linears` skips them)."""
        parts = ("q_proj", "k_proj", "v_proj")
        return frozenset(
            id(m)
            for layer in self.layers
            for m in (
                *(getattr(layer.module.self_attn, p) for p in parts),
                layer.module.mlp.gate_proj,
                layer.module.mlp.up_proj,
            )
        )

    def __call__(
        self,
        input_ids: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        cache: Any = None,
        keep: int = 0,
    ) -> Any:
        """The logits of `model(input_ids=..., attention_mask=..., position_ids=...,
        past_key_values=cache, logits_to_keep=keep)`; `cache` (a transformers cache) grows in place."""
        import torch
        from transformers.cache_utils import DynamicCache

        base, config = self.model.model, self.model.config
        hidden = base.embed_tokens(input_ids)
        if cache is None and getattr(config, "use_cache", False):  # what the model does with use_cache unset
            cache = DynamicCache(config=config)
        if position_ids is None:
            seen = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(hidden.shape[1], device=hidden.device) + seen).unsqueeze(0)
        if self.causal_mask is None:
            from transformers.masking_utils import create_causal_mask

            mask = create_causal_mask(
                config=config,
                inputs_embeds=hidden,
                attention_mask=attention_mask,
                position_ids=position_ids,
                **{_mask_cache_keyword(): cache},
            )
        else:
            mask = self.causal_mask(config, hidden, attention_mask, cache, position_ids)
        cos_rows, sin_rows = base.rotary_emb(hidden, position_ids)
        cos, sin = cos_rows.unsqueeze(1), sin_rows.unsqueeze(1)
        attend = self.attention
        if attend is None:
            from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

            attend = ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, self.eager_attention)
        batch, width = input_ids.shape
        h, kv = self.heads, self.kv_heads
        residual = None  # the last sublayer's output, added to `hidden` by the next norm
        for i, layer in enumerate(self.layers):
            block, attn = layer.module, layer.module.self_attn
            hidden, x = self.norm(block.input_layernorm, hidden, residual)
            qkv = layer.qkv(x).view(batch, width, h + 2 * kv, self.head_dim)
            if self.rotary is None:  # Qwen3: per-head RMSNorm of q and k, then rotary on each
                q = attn.q_norm(qkv[:, :, :h]).transpose(1, 2)
                k = attn.k_norm(qkv[:, :, h : h + kv]).transpose(1, 2)
                q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
            else:
                q, k = self.rotary(qkv, cos_rows, sin_rows)
            v = qkv[:, :, h + kv :].transpose(1, 2)
            if cache is not None:
                k, v = cache.update(k, v, i)
            extra = {"sliding_window": attn.sliding_window} if hasattr(attn, "sliding_window") else {}
            out, _ = attend(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling, **extra)
            hidden, x = self.norm(
                block.post_attention_layernorm, hidden, attn.o_proj(out.reshape(batch, width, -1).contiguous())
            )
            gate, up = layer.gate_up(x).split(self.intermediate, dim=-1)
            residual = block.mlp.down_proj(block.mlp.act_fn(gate) * up)
        hidden = self.norm(base.norm, hidden, residual)[1]
        return self.model.lm_head(hidden[:, -keep:, :] if keep else hidden)


def cache_keyword(function: Callable[..., Any]) -> str:
    """The name `function` (a model's forward, `create_causal_mask`) takes the KV cache under:
    transformers 5.24 renamed `past_key_values` to `cache` (the old name warns); 5.17 knows only
    the old one."""
    return "cache" if "cache" in inspect.signature(function).parameters else "past_key_values"


@functools.cache
def _mask_cache_keyword() -> str:
    from transformers.masking_utils import create_causal_mask

    return cache_keyword(create_causal_mask)


def _hooked(model: Any) -> bool:
    """Whether forward hooks would run in `model`'s own forward: on any module, or global ones."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def qk_rotary(heads: int, qkv: Any, cos_rows: Any, sin_rows: Any) -> tuple[Any, Any]:
    """Rotary embedding over the q and k heads of qkv [batch, width, heads + 2 kv, d] at once, with
    cos and sin [batch or 1, width, d], as q [batch, heads, width, d] and k: elementwise, so the same
    bits as transformers' head by head."""
    kv = (qkv.shape[2] - heads) // 2
    qk = _apply_rotary(qkv[:, :, : heads + kv].transpose(1, 2), cos_rows.unsqueeze(1), sin_rows.unsqueeze(1))
    return qk[:, :heads], qk[:, heads:]


def _apply_rotary(qk: Any, cos: Any, sin: Any) -> Any:
    """transformers' `apply_rotary_pos_emb` on one tensor of heads: the same products and sum."""
    return qk * cos + _rotate_half(qk) * sin


def _rotate_half(x: Any) -> Any:
    """transformers' `rotate_half`: the same two slices, negation and concatenation."""
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def build(model: Any, store: PackedStore | None = None) -> FusedForward | None:
    """A `FusedForward` for `model` with its stacked weights packed now (a snapshot, as
    `onednn.pack_linears`; or mapped from `store`'s file), or None where it would not compute
    the model's bits."""
    names = SUPPORTED.get(type(model).__name__)
    base, config = getattr(model, "model", None), getattr(model, "config", None)
    if names is None or base is None or config is None:
        return None
    base_cls, layer_cls, attn_cls, mlp_cls, norm_cls = names
    if type(base).__name__ != base_cls or type(base.norm).__name__ != norm_cls:
        return None
    layers = list(base.layers)
    if not layers or len(layers) != config.num_hidden_layers or getattr(config, "pretraining_tp", 1) != 1:
        return None
    if _hooked(model) or "forward" in vars(model) or "forward" in vars(base):
        return None  # hooks or a wrapped forward (autocast, offloading) would be skipped: the model runs itself
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"]):
        return None  # sliding-window layers take another mask
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, layers[0].self_attn.head_dim
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [attn.q_norm, attn.k_norm] if hasattr(attn, "q_norm") else []
        parts = [layer, attn, mlp, *norms]
        if [type(p).__name__ for p in parts] != [layer_cls, attn_cls, mlp_cls] + [norm_cls] * len(norms):
            return None
        if any("forward" in vars(p) for p in parts):
            return None  # a module with a forward of its own (a hook library's patch) computes something else
        if len({m.bias is None for m in (attn.q_proj, attn.k_proj, attn.v_proj)}) != 1 or attn.head_dim != head_dim:
            return None
        if attn.q_proj.out_features != heads * head_dim or attn.k_proj.out_features != kv_heads * head_dim:
            return None
    eager = getattr(sys.modules.get(type(layers[0].self_attn).__module__), "eager_attention_forward", None)
    if eager is None:
        return None
    return assemble(model, eager, store=store)


def assemble(
    model: Any,
    eager_attention: Callable[..., Any],
    causal_mask: Callable[..., Any] | None = None,
    attention: Callable[..., Any] | None = None,
    store: PackedStore | None = None,
) -> FusedForward | None:
    """The `FusedForward` of a Llama-shaped `model` whose parts `build` (or engine.native, which
    made them) vouches for, its stacked weights packed now (or mapped from `store`'s file:
    engine.packed_cache); None where oneDNN cannot pack them or stacking would not give each
    output its own bits."""
    layers = list(model.model.layers)
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)
        if not all(packable(m) for m in linears) or len({m.weight.dtype for m in linears}) != 1:
            return None
    first = layers[0]
    if not (
        _stacking_exact(first.self_attn.q_proj, first.self_attn.k_proj, first.self_attn.v_proj)
        and _stacking_exact(first.mlp.gate_proj, first.mlp.up_proj)
    ):
        return None
    fused = [
        _Layer(
            module=layer,
            qkv=packed_call([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], store),
            gate_up=packed_call([layer.mlp.gate_proj, layer.mlp.up_proj], store),
        )
        for layer in layers
    ]
    config = model.config
    torch_norm = _rms_norm if _rms_norm_exact(first.input_layernorm) else _module_norm
    norm = cpu_ops.add_rms_norm(torch_norm, first.input_layernorm) or functools.partial(_add_norm, torch_norm)
    head_dim = first.self_attn.head_dim
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    return FusedForward(
        model,
        fused,
        heads,
        kv_heads,
        head_dim,
        first.mlp.gate_proj.out_features,
        norm,
        eager_attention,
        causal_mask,
        attention,
        None if hasattr(first.self_attn, "q_norm") else _rotary(heads, kv_heads, head_dim),
    )


def _rotary(heads: int, kv_heads: int, head_dim: int) -> cpu_ops.Rotary:
    """engine.cpu_ops's rotary where it gives torch's bits here, else torch's ops."""
    torch_rotary = functools.partial(qk_rotary, heads)
    return cpu_ops.rotary(torch_rotary, heads, kv_heads, head_dim) or torch_rotary


def _add_norm(norm: Callable[[Any, Any], Any], module: Any, hidden: Any, residual: Any) -> tuple[Any, Any]:
    """torch's residual add, then `norm`: what cpu_ops.add_rms_norm does in one call."""
    if residual is not None:
        hidden = hidden + residual
    return hidden, norm(module, hidden)


def _module_norm(module: Any, hidden: Any) -> Any:
    return module(hidden)


def _rms_norm(module: Any, hidden: Any) -> Any:
    import torch

    return torch.rms_norm(hidden, (hidden.shape[-1],), module.weight, module.variance_epsilon)


def _rms_norm_exact(module: Any) -> bool:
    """Whether `torch.rms_norm` gives the bits of the model's RMSNorm `module` here (one op
    instead of six), probed on random rows of its width."""
    import torch

    gen = torch.Generator().manual_seed(0)
    weight = module.weight
    with torch.inference_mode():
        for rows in (1, 3, 16, 67):
            x = (torch.randn(rows, 1, weight.shape[-1], generator=gen) * 4).to(weight.dtype)
            if not torch.equal(_rms_norm(module, x), module(x)):
                return False
    return True


_STACKING: dict[tuple[Any, ...], bool] = {}


def _stacking_exact(*linears: Any) -> bool:
    """Whether one packed matmul over the stacked weights of `linears` gives every output the
    bits their own packed matmuls give it, at 1 to 512 rows: the kernel oneDNN picks depends on
    the shapes, not the values, so random weights of these shapes tell (once per shape set)."""
    import torch

    first = linears[0]
    key = (first.in_features, tuple(m.out_features for m in linears), first.bias is not None, first.weight.dtype)
    if key not in _STACKING:
        gen = torch.Generator().manual_seed(0)
        probes = []
        for m in linears:
            probe = torch.nn.Linear(m.in_features, m.out_features, bias=m.bias is not None).to(m.weight.dtype)
            with torch.no_grad():
                probe.weight.copy_(torch.randn(probe.weight.shape, generator=gen))
            probes.append(probe)
        alone = [packed_call([p]) for p in probes]
        stacked = packed_call(probes)
        x = torch.randn(512, first.in_features, generator=gen).to(first.weight.dtype)
        with torch.inference_mode():
            _STACKING[key] = all(
                torch.equal(stacked(x[:rows]), torch.cat([f(x[:rows]) for f in alone], dim=-1))
                for rows in (1, 2, 5, 16, 64, 512)
            )
    return _STACKING[key]
