"""The attention the hf engine runs on CPU (engine.hf registers it with transformers as
GROUPED_SDPA; engine.native calls it directly): transformers' SDPA attention, bit for bit,
without its copies of grouped key/value heads, and attended one query at a time where a
prompt-lookup guess is verified."""

from __future__ import annotations

import contextvars
from typing import Any

GROUPED_SDPA = "arle_grouped_sdpa"


def grouped_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' `sdpa_attention_forward`, but with a mask on CPU the key/value heads go
    to SDPA unrepeated (`enable_gqa`); every other case is handed to transformers as is."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] > 1 and ROWWISE_ATTENTION.get():
        return _rowwise_sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    if (
        attention_mask is None
        or getattr(module, "num_key_value_groups", 1) == 1
        or query.device.type != "cpu"
        or kwargs.get("position_bias") is not None
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # With a mask transformers runs non-causal SDPA on the mask alone: the same call here.
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous(), None


# Set while a prompt-lookup guess is verified (HFEngine._verify): its query positions are attended
# one at a time, as the decode steps they stand for would attend them.
ROWWISE_ATTENTION: contextvars.ContextVar[bool] = contextvars.ContextVar("arle_rowwise_attention", default=False)


def _rowwise_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float,
    scaling: float | None,
    is_causal: bool | None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention of the last `n` positions of the cache, each query on its own over exactly the
    keys a decode step at its position saw, with the mask that step had (none where nothing is
    masked: transformers skips an all-ones mask for one query).

    Why: SDPA over several queries blocks its sums differently from one query at a time (~3e-7
    apart, ~5e-5 in SmolLM2's logits), enough to flip greedy's choice at a near tie; the linears
    already give each row the same bits at any row count (`pack_linears`, `_row_rule`). So a
    verified guess is bit for bit what single steps compute."""
    import torch

    n, width = query.shape[2], key.shape[2]
    outs = []
    for j in range(n):
        seen = width - n + j + 1
        mask = attention_mask[:, :, j : j + 1, :seen] if attention_mask is not None else None
        if mask is not None and mask.dtype == torch.bool and bool(mask.all()):
            mask = None
        out, _ = grouped_sdpa(
            module,
            query[:, :, j : j + 1],
            key[:, :, :seen],
            value[:, :, :seen],
            mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
        outs.append(out)
    return torch.cat(outs, dim=1), None
