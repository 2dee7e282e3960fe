"""A Llama checkpoint folder loaded for CPU eval without transformers' model classes.

Why: importing transformers' model classes costs ~1.7 s on these CPUs (modeling_utils pulls in
torch.distributed.tensor, masking_utils torch._dynamo, both unconditionally), the largest part
of a warm `arle eval`'s start after torch itself (perf/startup.py), and the hf engine on CPU
does not run their forward anyway: engine.fused computes it. What the model classes still gave
it is here: modules holding the weights under transformers' names (so `pack_linears`, the
fused build and `HFEngine._weights_version` see the same structure), RMSNorm, the rotary
embedding and the causal mask, each the pinned transformers' computation op for op, and
tests/test_engine_native.py compares logits, tokens and loglikelihoods with the model classes'
bit for bit.

Only what it knows is loaded here: a local folder of a `LlamaForCausalLM` whose config states
every field the computation reads (default RoPE, no biases, silu, full attention), weights in
safetensors under exactly the expected names, a `TokenizersBackend` tokenizer, fp32 on a CPU
where oneDNN packs the projections. `load` returns None for anything else, and transformers
loads the folder as before (the same numbers, the slower start). $ARLE_NATIVE_LOAD=0 turns it
off.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arlecli.engine import packed_cache

# Config fields the computation reads, with the values this module computes them for (None: any).
REQUIRED = {
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "use_cache": True,
    "hidden_size": None,
    "intermediate_size": None,
    "num_hidden_layers": None,
    "num_attention_heads": None,
    "num_key_value_heads": None,
    "head_dim": None,
    "rms_norm_eps": None,
    "vocab_size": None,
    "max_position_embeddings": None,
    "tie_word_embeddings": None,
    "rope_parameters": None,
}
# Fields that would change the computation in ways this module does not repeat.
UNSUPPORTED = ("sliding_window", "layer_types", "attention_chunk_size", "rope_scaling", "quantization_config")


@dataclass
class Config:
    """What the engine, engine.fused and transformers' `DynamicCache` read off a model config."""

    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    use_cache: bool = True
    _attn_implementation: str = ""  # engine.attention's GROUPED_SDPA, set by `load`
    layers_config: Any = None  # a transformers config of the layer structure alone (`get_text_config`)

    def get_text_config(self, decoder: bool = False) -> Any:
        """What transformers' `DynamicCache(config=...)` reads its layers off: a transformers
        config of `num_hidden_layers` full-attention layers, so the cache is made as the installed
        transformers makes it for such a model (its reading of a config changes between releases)."""
        if self.layers_config is None:
            from transformers.configuration_utils import PreTrainedConfig

            n = self.num_hidden_layers
            self.layers_config = PreTrainedConfig(num_hidden_layers=n, layer_types=["full_attention"] * n)  # type: ignore[call-arg]
        return self.layers_config


def enabled() -> bool:
    """$ARLE_NATIVE_LOAD=0 loads every model through transformers' classes."""
    return os.environ.get("ARLE_NATIVE_LOAD", "1").strip() not in ("0", "false", "no", "off")


def config_of(folder: Path) -> Config | None:
    """The `Config` of `folder`'s checkpoint, or None where this module would not compute it."""
    try:
        raw = json.loads((folder / "config.json").read_text())
        tok = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not isinstance(tok, dict) or raw.get("architectures") != ["LlamaForCausalLM"]:
        return None
    if any(key not in raw or (want is not None and raw[key] != want) for key, want in REQUIRED.items()):
        return None
    if any(raw.get(key) is not None for key in UNSUPPORTED) or raw.get("auto_map") or tok.get("auto_map"):
        return None
    # AutoTokenizer gives a llama folder naming this class that very class (tested against it).
    if tok.get("tokenizer_class") != "TokenizersBackend" or not (folder / "tokenizer.json").is_file():
        return None
    rope = raw["rope_parameters"]
    if not isinstance(rope, dict) or set(rope) != {"rope_theta", "rope_type"} or rope["rope_type"] != "default":
        return None
    try:
        return Config(
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=int(raw["num_attention_heads"]),
            num_key_value_heads=int(raw["num_key_value_heads"]),
            head_dim=int(raw["head_dim"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            vocab_size=int(raw["vocab_size"]),
            rms_norm_eps=float(raw["rms_norm_eps"]),
            rope_theta=float(rope["rope_theta"]),
            max_position_embeddings=int(raw["max_position_embeddings"]),
            tie_word_embeddings=bool(raw["tie_word_embeddings"]),
        )
    except (TypeError, ValueError):
        return None


def load(model: str, device: str, dtype: str | None) -> Loaded | None:
    """The model, tokenizer and `fused.FusedForward` for the folder `model`, with the fused
    weights mapped from engine.packed_cache's file where it holds them; or None where
    transformers should load it (see the module's docstring)."""
    folder = Path(model)
    if not enabled() or device != "cpu" or dtype not in (None, "float32") or not folder.is_dir():
        return None
    config = config_of(folder)
    if config is None or not (folder / "generation_config.json").is_file():
        return None  # without one transformers derives a generation config from config.json: left to it
    if (folder / "adapter_config.json").exists():
        return None  # transformers (through peft) or engine.hf's `_load` applies an adapter found here
    from transformers.generation.configuration_utils import GenerationConfig
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    from transformers.utils import logging as hf_logging

    from arlecli.engine import fused
    from arlecli.engine.attention import GROUPED_SDPA, grouped_sdpa

    hf_logging.disable_progress_bar()
    try:
        generation_config = GenerationConfig.from_pretrained(folder)
        tokenizer = TokenizersBackend.from_pretrained(str(folder), padding_side="left")
    except Exception:  # a damaged file: transformers' load says what is wrong (engine.hf `_load`)
        return None
    files = weight_files(folder)
    weights = None if files is None else _weights(files, config)
    if files is None or weights is None:
        return None
    config._attn_implementation = GROUPED_SDPA
    lm = _build(config, weights)
    lm.eval()
    lm.generation_config = generation_config
    store = packed_cache.open_store(files)
    forward = fused.assemble(lm, grouped_sdpa, causal_mask, grouped_sdpa, store)
    if forward is None:
        return None
    return Loaded(lm, tokenizer, forward, store)


@dataclass
class Loaded:
    """What `load` gives the hf engine."""

    model: Any
    tokenizer: Any
    forward: Any  # its fused.FusedForward
    store: packed_cache.PackedStore | None  # for the other linears, then `save`; None where caching is off


def weight_files(folder: Path) -> list[Path] | None:
    """The folder's safetensors files (one, or the shards its index names), or None where there
    are none or a shard is named outside the folder."""
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            if any(not isinstance(f, str) or Path(f).name != f for f in files):
                return None  # a shard named outside the folder
            return [folder / f for f in files]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else None


def _weights(files: list[Path], config: Config) -> dict[str, Any] | None:
    """The checkpoint's tensors as fp32, or None unless they are exactly the expected names and shapes."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors: dict[str, Any] = {}
        for f in files:
            tensors.update(load_file(str(f)))
    except (OSError, ValueError, KeyError, TypeError, SafetensorError):
        return None  # transformers loads it, or says what is wrong with it
    if len(tensors) != 2 + 9 * config.num_hidden_layers + (not config.tie_word_embeddings):
        return None  # checked first: a config claiming a billion layers is not walked
    expected = _shapes(config)
    if set(tensors) != set(expected):
        return None
    for name, shape in expected.items():
        t = tensors[name]
        if tuple(t.shape) != shape or not t.is_floating_point():
            return None
        if t.dtype != torch.float32:
            tensors[name] = t.to(torch.float32)  # as transformers casts a checkpoint to dtype=float32
    return tensors


def _shapes(config: Config) -> dict[str, tuple[int, ...]]:
    """Each tensor a checkpoint of `config` holds, by transformers' name, with its shape."""
    d, h, kv, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, d), "model.norm.weight": (d,)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h * hd, d),
            p + "self_attn.k_proj.weight": (kv * hd, d),
            p + "self_attn.v_proj.weight": (kv * hd, d),
            p + "self_attn.o_proj.weight": (d, h * hd),
            p + "mlp.gate_proj.weight": (config.intermediate_size, d),
            p + "mlp.up_proj.weight": (config.intermediate_size, d),
            p + "mlp.down_proj.weight": (d, config.intermediate_size),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    return shapes


def _build(config: Config, weights: dict[str, Any]) -> Any:
    """The module tree of transformers' `LlamaForCausalLM` (the same names) around `weights`.

    The modules are made around the loaded tensors, not initialised and then overwritten:
    initialising 135M random values costs ~0.5 s, and on the meta device it imports torch._dynamo
    (~1 s), which is what this module is for avoiding."""
    from torch import nn

    def module(**children: Any) -> nn.Module:
        m = nn.Module()
        for name, value in children.items():
            setattr(m, name, value)
        return m

    def linear(name: str) -> nn.Linear:
        weight = weights[name]
        m = nn.Linear.__new__(nn.Linear)  # nn.Linear's own __init__ would fill the weight with random values
        nn.Module.__init__(m)
        m.out_features, m.in_features = weight.shape
        m.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight)
        m.register_parameter("bias", None)
        return m

    def rms_norm(name: str) -> nn.Module:
        m = _classes()["RMSNorm"]()
        m.weight = nn.Parameter(weights[name])
        m.variance_epsilon = config.rms_norm_eps
        return m

    h, kv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    layers = nn.ModuleList()
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        attn = module(
            q_proj=linear(p + "self_attn.q_proj.weight"),
            k_proj=linear(p + "self_attn.k_proj.weight"),
            v_proj=linear(p + "self_attn.v_proj.weight"),
            o_proj=linear(p + "self_attn.o_proj.weight"),
            head_dim=hd,
            scaling=hd**-0.5,
            num_key_value_groups=h // kv,
            is_causal=True,
        )
        mlp = module(
            gate_proj=linear(p + "mlp.gate_proj.weight"),
            up_proj=linear(p + "mlp.up_proj.weight"),
            down_proj=linear(p + "mlp.down_proj.weight"),
            act_fn=nn.SiLU(),  # transformers' SiLUActivation is F.silu
        )
        norms = {n: rms_norm(p + n + ".weight") for n in ("input_layernorm", "post_attention_layernorm")}
        layers.append(module(self_attn=attn, mlp=mlp, **norms))
    rotary = _classes()["Rotary"]()
    rotary.register_buffer("inv_freq", _inv_freq(config), persistent=False)
    embed = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weights["model.embed_tokens.weight"])
    base = module(embed_tokens=embed, layers=layers, norm=rms_norm("model.norm.weight"), rotary_emb=rotary)
    if config.tie_word_embeddings:  # as transformers ties them: one parameter
        weights = {**weights, "lm_head.weight": embed.weight}
    return module(model=base, lm_head=linear("lm_head.weight"), config=config)


def _inv_freq(config: Config) -> Any:
    """transformers' `compute_default_rope_parameters`: the same ops in the same order."""
    import torch

    dim = config.head_dim
    return 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


_CLASSES: dict[str, type] = {}


def _classes() -> dict[str, type]:
    """The two module classes with a computation of their own, made on first use (torch is not
    imported with this module)."""
    if _CLASSES:
        return _CLASSES
    import torch
    from torch import nn

    class _RMSNorm(nn.Module):
        def forward(self, hidden_states: Any) -> Any:
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)

    class _Rotary(nn.Module):
        attention_scaling = 1.0  # default RoPE's

        @torch.no_grad()
        def forward(self, x: Any, position_ids: Any) -> tuple[Any, Any]:
            inv_freq: Any = self.inv_freq
            inv_freq = inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
            inv_freq = inv_freq.to(dtype=torch.float, device=x.device)
            positions = position_ids[:, None, :].float()
            with torch.autocast(device_type=x.device.type, enabled=False):
                freqs = (inv_freq @ positions).transpose(1, 2)
                emb = torch.cat((freqs, freqs), dim=-1)
                cos = emb.cos() * self.attention_scaling
                sin = emb.sin() * self.attention_scaling
            return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)

    _CLASSES.update(RMSNorm=_RMSNorm, Rotary=_Rotary)
    return _CLASSES


def causal_mask(config: Config, embeds: Any, attention_mask: Any, cache: Any, position_ids: Any) -> Any:
    """transformers' `create_causal_mask` for SDPA on full-attention layers with a cache (what
    engine.fused always passes here): None where SDPA's own causal flag gives the same attention,
    else the boolean [batch, 1, queries, keys] mask, True where a query attends."""
    import torch

    if attention_mask is not None and attention_mask.ndim == 4:
        return attention_mask
    if attention_mask is not None:
        attention_mask = attention_mask.to(device=embeds.device, dtype=torch.bool)
    batch, q_length = embeds.shape[0], embeds.shape[1]
    q_offset = cache.get_query_offset(0)
    kv_length, kv_offset = cache.get_mask_sizes(q_length, 0)
    padding = attention_mask
    if padding is not None and (missing := kv_length + kv_offset - padding.shape[-1]) > 0:
        padding = torch.nn.functional.pad(padding, (0, missing))
    if _causal_flag_suffices(padding, q_length, kv_length, q_offset, kv_offset):
        return None
    device = embeds.device
    q_idx = (torch.arange(q_length, device=device) + q_offset)[None, None, :, None]
    kv_idx = (torch.arange(kv_length, device=device) + kv_offset)[None, None, None, :]
    mask = kv_idx <= q_idx
    if padding is not None:
        mask = mask & padding[torch.arange(batch, device=device)[:, None, None, None], kv_idx]
    return mask.expand(batch, -1, q_length, kv_length)


def _causal_flag_suffices(padding: Any, q_length: int, kv_length: int, q_offset: int, kv_offset: int) -> bool:
    """transformers' `_ignore_causal_mask_sdpa` (no local attention, not tracing)."""
    import torch

    if padding is not None and padding.shape[-1] > kv_length:
        padding = padding[:, torch.arange(kv_length, device=padding.device) + kv_offset]

    def all_true(t: Any) -> bool:
        return bool(t.sum() == t.numel())

    if (q_length == 1 or kv_length == q_length) and (padding is None or all_true(padding)):
        return True
    return q_offset == 0 and (padding is None or (all_true(padding[:, :q_length]) and all_true(~padding[:, q_length:])))
