"""Per-token logprobs, entropies and values of completion tokens, computed cheaply and exactly.

PPO's update (train/ppo.py) and GRPO's and RLOO's loss (train/grpo.py, through TRL's
`_get_per_token_logps_and_entropies`) need, for every completion token of a batch, its logprob
under the policy at a temperature, the distribution's entropy and (PPO) the critic's value. The
plain way runs the model over the padded [B, P + T] batch (prompts left-padded, completions
right-padded) and materialises [B, T, vocab] logits at once (TRL's fused head avoids that, but on
a CPU scores every position of the padded batch). Three things here make it cheaper, with the
same numbers up to float rounding (tests/test_ppo_update_fast.py, tests/test_train_grpo_forward.py):

- No padding in the forward or the backward (`unpad`). Each row's real tokens are laid out
  from column 0 (its prompt, then its completion), right-padded only, so under causal attention
  no real token sees a pad and the attention mask is all ones; rows are grouped by length so a
  forward carries at most `max_padding` pad columns (sorted, each group as wide as its longest
  row). Positions restart at 0 in every row, as the plain path's rebuilt position ids do.
  Packing every row into one sequence with restarting position ids was measured and not used:
  on CPU (and any SDPA without varlen kernels) the block-diagonal mask makes attention cost the
  square of the packed length instead of the sum of the rows' squares.
- No full-vocabulary logits of every position at once (`chunk`). The LM head, log-softmax and
  gather run on `chunk` positions at a time of the gathered hidden states of the completion
  positions only; under autograd each chunk is checkpointed, so the backward recomputes one
  chunk's logits at a time instead of keeping all of them.
- Shared prompts (`share_prompts`): rows of one forward with the same prompt (a group's
  completions) run it once, its KV cache, inside the autograd graph, handed to each completion.
  GRPO's groups share a prompt often longer than their completions: 3.0x with the rest on the
  CPU demo's batch (perf/grpo_update.py). PPO leaves it off: its shuffled micro batches split the
  groups, and where measured it did not clearly pay (perf/README.md). Not under gradient
  checkpointing, whose recompute runs without a cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a forward runs: train.grpo imports this module at start-up
    import torch


@dataclass(frozen=True)
class ForwardOptions:
    """How `completion_outputs` runs; `plain()` is the reference path (one padded batch, full logits)."""

    chunk: int | None = 512  # positions per LM-head chunk; None: every position's logits at once
    unpad: bool = True  # drop padding (right-padded rows grouped by length); False: the padded batch
    max_padding: float = 0.1  # share of a length group's token slots that may be padding
    share_prompts: bool = False  # rows with the same prompt run it once, its KV cache shared

    @classmethod
    def plain(cls) -> "ForwardOptions":
        """The reference path: the padded batch, full logits."""
        return cls(chunk=None, unpad=False, share_prompts=False)


# The config fields by which a family scales its logits after the output embedding (Cohere's
# logit_scale, Muse Glimmer's output_multiplier, Falcon-H1's lm_head_multiplier, Granite's and
# MiniCPM3's logits_scaling; TRL's fused head reads the same): the chunked head would skip them,
# as it would Gemma 2's final_logit_softcapping.
_LOGIT_SCALES = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def supports_chunking(model: Any) -> bool:
    """Whether the model's logits are just its output embedding on the last hidden state: no
    soft-capping and no scale of the kind `_LOGIT_SCALES` names."""
    config = model.config.get_text_config()
    unscaled = all(getattr(config, name, None) in (None, 1.0) for name in _LOGIT_SCALES)
    capped = bool(getattr(config, "final_logit_softcapping", None))
    return unscaled and not capped and model.get_output_embeddings() is not None


def _chunk_outputs(
    lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    logits = lm_head(hidden).float() / temperature
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if not with_entropy:
        return logprobs, logprobs.new_zeros(0)
    with torch.no_grad():  # a statistic only: no gradient, nothing kept for the backward
        entropy = torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, entropy


def token_logprobs(
    lm_head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk: int | None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(lm_head(hidden) / temperature)[targets] for [N, H] hidden states and [N]
    targets, `chunk` positions at a time (None: all at once), and the entropies if asked."""
    import torch
    from torch.utils.checkpoint import checkpoint

    size = chunk or max(1, hidden.shape[0])
    # Checkpointing only pays when a backward will run through the chunk.
    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    logprobs, entropies = [], []
    for start in range(0, hidden.shape[0], size):
        h, t = hidden[start : start + size], targets[start : start + size]
        if grad and chunk is not None:
            lp, ent = checkpoint(_chunk_outputs, lm_head, h, t, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = _chunk_outputs(lm_head, h, t, temperature, with_entropy)
        logprobs.append(lp)
        entropies.append(ent)
    if not logprobs:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty if with_entropy else None
    return torch.cat(logprobs), torch.cat(entropies) if with_entropy else None


def length_groups(lengths: list[int], max_padding: float) -> list[list[int]]:
    """Row indices grouped for padded forwards: longest first, a row joins the current group
    while the group's padding (slots beyond each row's length) stays within `max_padding` of
    its slots."""
    order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    groups: list[list[int]] = []
    for r in order:
        if groups:
            group = groups[-1]
            width = lengths[group[0]]
            slots = width * (len(group) + 1)
            if slots - sum(lengths[g] for g in group) - lengths[r] <= max_padding * slots:
                group.append(r)
                continue
        groups.append([r])
    return groups


def _hidden(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor, bf16: bool, **kw: Any
) -> Any:
    import torch

    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        # logits_to_keep=1: the head runs on the completion positions only, in token_logprobs.
        return model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids,
            output_hidden_states=True,
            logits_to_keep=1,
            **kw,
        )


def _prompt_groups(real: torch.Tensor, sequences: torch.Tensor, prompt_len: int, model: Any) -> list[list[int]]:
    """Rows that share their (non-empty) prompt, two or more a group, whose completion tokens
    are contiguous from column 0; none when the model cannot hand a plain KV cache on (the
    activations of gradient checkpointing are recomputed without a cache)."""
    if model.training and getattr(model, "is_gradient_checkpointing", False):
        return []
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for r in range(sequences.shape[0]):
        completion = real[r, prompt_len:]
        count = int(completion.sum())
        if count == 0 or not bool(completion[:count].all()):
            continue
        key = tuple(sequences[r, :prompt_len][real[r, :prompt_len]].tolist())
        if key:
            by_prompt.setdefault(key, []).append(r)
    return [rows for rows in by_prompt.values() if len(rows) > 1]


def _shared_prompt_hidden(
    model: Any,
    sequences: torch.Tensor,
    real: torch.Tensor,
    prompt_len: int,
    rows: list[int],
    bf16: bool,
    max_padding: float,
) -> list[tuple[int, torch.Tensor]] | None:
    """(row, [c_r, H] hidden states predicting each completion token) for rows sharing one
    prompt: the prompt runs once and its KV cache (in the autograd graph: the gradient of
    every completion reaches it) is handed to the completions, grouped by length. None when
    the model's cache is not a plain one (sliding windows and the like)."""
    import torch
    from transformers.cache_utils import DynamicCache, DynamicLayer

    device = sequences.device
    prompt = sequences[rows[0], :prompt_len][real[rows[0], :prompt_len]].unsqueeze(0)
    p = prompt.shape[1]
    ones = torch.ones_like(prompt)
    out = _hidden(model, prompt, ones, torch.arange(p, device=device)[None], bf16, use_cache=True)
    cache = out.past_key_values
    if not isinstance(cache, DynamicCache):
        return None
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    for layer in cache.layers:
        if type(layer) is not DynamicLayer or layer.keys is None or layer.values is None:
            return None
        kv.append((layer.keys, layer.values))
    last = out.hidden_states[-1][0, -1:]  # predicts every row's first completion token
    lengths = [int(real[r, prompt_len:].sum()) for r in rows]
    result = []
    for group in length_groups(lengths, max_padding):
        width = max(1, max(lengths[k] for k in group))
        n = len(group)
        ids = sequences[[rows[k] for k in group], prompt_len : prompt_len + width]
        past = DynamicCache(ddp_cache_data=[(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in kv])
        position_ids = torch.arange(p, p + width, device=device).expand(n, -1)
        mask = torch.ones((n, p + width), dtype=torch.long, device=device)
        hidden = _hidden(model, ids, mask, position_ids, bf16, past_key_values=past, use_cache=True).hidden_states[-1]
        for j, k in enumerate(group):
            result.append((rows[k], torch.cat([last, hidden[j, : lengths[k] - 1]])))
    return result


def completion_outputs(
    model: Any,
    value_head: torch.nn.Linear | None,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    temperature: float,
    bf16: bool,
    with_entropy: bool,
    options: ForwardOptions,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """train.ppo's `_forward_rows` (logprobs, values, entropies of `sequences[:, prompt_len:]`,
    each [B, T]) without the padding, the full logits and/or the shared prompts' repeats, as
    `options` say. Padded positions of the completions (attention mask 0) come out as 0."""
    import torch

    batch, width = sequences.shape
    completion_len = width - prompt_len
    device = sequences.device
    real = attention_mask.bool()
    hidden_size = model.config.get_text_config().hidden_size
    # Per part: the (row, completion column) of each real completion token and the hidden
    # state that predicts it.
    rows_out: list[torch.Tensor] = []
    cols_out: list[torch.Tensor] = []
    hidden_out: list[torch.Tensor] = []
    todo = list(range(batch))
    if options.share_prompts:
        for group_rows in _prompt_groups(real, sequences, prompt_len, model):
            shared = _shared_prompt_hidden(model, sequences, real, prompt_len, group_rows, bf16, options.max_padding)
            if shared is None:
                break
            for r, hidden in shared:
                cols = torch.arange(hidden.shape[0], device=device)
                rows_out.append(torch.full_like(cols, r))
                cols_out.append(cols)
                hidden_out.append(hidden)
                todo.remove(r)
    lengths = real.sum(1).tolist()
    groups = (
        length_groups([lengths[r] for r in todo], options.max_padding) if options.unpad else [list(range(len(todo)))]
    )
    for group in ([todo[k] for k in g] for g in groups if todo):
        if options.unpad:
            group_width = max(1, max(lengths[r] for r in group))
            ids = torch.zeros((len(group), group_width), dtype=sequences.dtype, device=device)
            for k, r in enumerate(group):
                ids[k, : lengths[r]] = sequences[r][real[r]]
            position_ids = torch.arange(group_width, device=device).expand(len(group), -1)
            out = _hidden(model, ids, torch.ones_like(ids), position_ids, bf16, use_cache=False)
        else:
            group_width = width
            mask = attention_mask[group]
            position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
            out = _hidden(model, sequences[group], mask, position_ids, bf16, use_cache=False)
        flat = out.hidden_states[-1].reshape(-1, hidden_size)
        for k, r in enumerate(group):
            cols = torch.nonzero(real[r, prompt_len:]).squeeze(-1)
            # Compact layout: completion column c sits at (real prompt tokens + c).
            at = (int(real[r, :prompt_len].sum()) if options.unpad else prompt_len) + cols
            keep = at > 0  # a token with nothing before it (an empty prompt) has no prediction
            cols, at = cols[keep], at[keep]
            rows_out.append(torch.full_like(cols, r))
            cols_out.append(cols)
            hidden_out.append(flat[k * group_width + at - 1])
    hidden = torch.cat(hidden_out)
    rows, cols = torch.cat(rows_out), torch.cat(cols_out)
    targets = sequences[rows, prompt_len + cols]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        flat_logprobs, flat_entropy = token_logprobs(
            model.get_output_embeddings(), hidden, targets, temperature, options.chunk, with_entropy
        )

    def place(flat: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((batch, completion_len), dtype=torch.float32, device=device)
        return out.index_put((rows, cols), flat.float())

    logprobs = place(flat_logprobs)
    values = place(value_head(hidden.float()).squeeze(-1)) if value_head is not None else None
    entropy = place(flat_entropy) if flat_entropy is not None else None
    return logprobs, values, entropy
