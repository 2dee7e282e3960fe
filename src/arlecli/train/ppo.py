"""PPO for LLM fine-tuning on a scalar end-of-sequence reward, in plain PyTorch.

Where this sits
    TRL 1.16 trains with GRPO and RLOO: critic-free methods whose baseline is the mean reward
    of a prompt's group of completions. It has no PPO (removed in TRL 1.13) and no value-head
    model class. This module is that missing piece: a learned critic, GAE and the PPO2 clipped
    objectives (the recipe of TRL's former PPOTrainer and of "N implementation details of RLHF
    with PPO"), on rollouts from the caller (arle's one producer of Episodes, train/batches.py:
    the eval's engines, stop strings and envs, multi-turn included) and the same reward the
    GRPO/RLOO glue uses. One entry point, `train_ppo`; the math lives in small pure functions.

The critic: a value head on the shared trunk
    One `nn.Linear(hidden, 1)` reads the policy's last hidden states (after the final norm).
    Chosen over a separate critic model because (1) it costs no second trunk, no second set of
    activations and no second optimizer state, which matters since a full fine-tune already
    keeps a frozen reference copy; (2) one forward pass yields both logprobs and values, in
    rollouts and in updates, so a PPO step costs about a GRPO step plus a 1-column matmul;
    (3) with LoRA the trunk still adapts to the value objective, through the adapter. The price
    is that the value loss's gradient reaches the trunk the policy uses; `vf_coef` (0.1) keeps
    it from dominating, and the head starts at zero, so early updates are almost pure policy
    gradient and early values (0) are an unbiased guess for whitened-scale rewards.

How the reward is placed
    Each model token t is an action. Its reward is -kl_coef * (logp_t - ref_logp_t), the
    per-token (k1) estimate of KL from the frozen initial policy, and the task reward is added at
    the episode's last model token. The value V_t is read at the position that predicts token t,
    i.e. the state "prompt + tokens before t". GAE runs backwards over model tokens; the state
    after the last one is terminal (value 0). Environment tokens (tool results, a game's reply:
    `env_mask` 0) are attended to but are no actions: masked out of rewards, advantages,
    whitening and every loss, as is the right padding.

Reference policy
    Full fine-tune: a frozen copy of the initial weights. LoRA: the same model with its adapter
    disabled (peft's `disable_adapter()`), so no second copy.

Sampling
    Logprobs are those of the distribution actually sampled: softmax(logits / temperature).
    The rollout engines sample exactly that (no top-k, repetition penalty or generation_config
    defaults); a top_p below 1 would make the rollout logprobs disagree with the policy being
    optimised, so PPO's rollouts use top_p 1.

Checkpoints and output
    `output_dir/checkpoint-N/` (N = steps done) holds the model (a full HF folder, or the LoRA
    adapter folder), the tokenizer, `value_head.pt` and `trainer_state.pt` (optimizer,
    scheduler, python/numpy/torch RNG states, step, data position, params). It is written
    under a temporary name and renamed, so a crash never leaves a half checkpoint that resume
    would pick. `output_dir/final/` is a plain HF model folder (or adapter folder) plus
    tokenizer that `arle eval --model output_dir/final` loads; `value_head.pt` sits beside it.

Device: CUDA if available (bf16 autocast over fp32 master weights; a LoRA base is loaded in
bf16), else CPU in fp32. One process, one device: multi-GPU is not handled here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, cast

import torch

from arlecli.records import RunDir
from arlecli.rundir import latest_checkpoint, prune_checkpoints
from arlecli.train.batches import Sequences, rescore_segments
from arlecli.train.logprobs import ForwardOptions, completion_outputs, supports_chunking
from arlecli.train.overlap import is_weights


# ---------------------------------------------------------------------------------------------
# Parameters


@dataclass
class PPOParams:
    """PPO settings beyond `train_ppo`'s arguments; override any of them through `params`.

    Defaults follow TRL's former PPOTrainer (the values of "N implementation details of RLHF").
    """

    gamma: float = 1.0  # per-token discount; 1.0 lets the end reward reach every token
    lam: float = 0.95  # GAE lambda: lower trusts the critic more (less variance, more bias)
    cliprange: float = 0.2  # policy ratio clip: the update stays within 1 +/- cliprange
    cliprange_value: float = 0.2  # value clip around the rollout-time value estimate
    vf_coef: float = 0.1  # weight of the value loss against the policy loss
    kl_coef: float = 0.05  # per-token KL penalty against the initial (reference) policy
    ppo_epochs: int = 4  # passes over each rollout batch
    prompts_per_step: int = 8  # prompts per step; the rollout batch is this x num_generations
    mini_batch_size: int | None = None  # completions per optimizer step; None: the whole rollout batch
    micro_batch_size: int | None = None  # completions per forward pass (gradient accumulation); None: mini_batch_size
    max_grad_norm: float = 1.0  # gradient clipping (global norm over policy + value head)
    whiten_advantages: bool = True  # normalise advantages over the batch's completion tokens
    whiten_rewards: bool = False  # scale per-token rewards to unit variance before GAE
    weight_decay: float = 0.0  # AdamW weight decay
    lr_scheduler: str = "constant"  # "constant" or "linear" (decays to 0 at max_steps)
    warmup_steps: int = 0  # linear warm-up steps before the schedule
    lora_alpha: int | None = None  # LoRA scaling numerator; None: 2 x lora_rank
    lora_target_modules: Any = "all-linear"  # peft target_modules (a name list or "all-linear")
    gradient_checkpointing: bool = False  # trade compute for activation memory in updates
    bf16: bool | None = None  # bf16 autocast; None: on CUDA only

    def validate(self) -> None:
        """Raise ValueError for settings PPO cannot run with."""
        checks = [
            (0.0 <= self.gamma <= 1.0, "gamma must be in [0, 1]"),
            (0.0 <= self.lam <= 1.0, "lam must be in [0, 1]"),
            (self.cliprange > 0, "cliprange must be > 0"),
            (self.cliprange_value > 0, "cliprange_value must be > 0"),
            (self.ppo_epochs >= 1, "ppo_epochs must be >= 1"),
            (self.prompts_per_step >= 1, "prompts_per_step must be >= 1"),
            (self.mini_batch_size is None or self.mini_batch_size >= 1, "mini_batch_size must be >= 1"),
            (self.micro_batch_size is None or self.micro_batch_size >= 1, "micro_batch_size must be >= 1"),
            (self.max_grad_norm > 0, "max_grad_norm must be > 0"),
            (self.lr_scheduler in ("constant", "linear"), "lr_scheduler must be 'constant' or 'linear'"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def parse_params(params: dict | None) -> PPOParams:
    """Build PPOParams from overrides; unknown keys raise a ValueError naming the known ones."""
    params = dict(params or {})
    known = [f.name for f in dataclasses.fields(PPOParams)]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"unknown PPO parameter(s): {', '.join(unknown)}; known: {', '.join(known)}")
    out = PPOParams(**params)
    out.validate()
    return out


# ---------------------------------------------------------------------------------------------
# The math: pure functions over [batch, completion_tokens] tensors; `mask` is 1.0 on real tokens.


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `x` over positions where mask is 1 (0 when the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance of `x` over the masked positions."""
    n = mask.sum()
    var = masked_mean((x - masked_mean(x, mask)) ** 2, mask)
    return var * n / (n - 1) if n > 1 else var


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Scale `x` to unit variance over the masked positions (and to zero mean if shift_mean).

    Rewards are whitened without the shift: moving their mean would change which completions
    the KL penalty favours. Masked positions come out as 0.
    """
    mean = masked_mean(x, mask)
    out = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last masked-in position."""
    positions = torch.arange(mask.shape[1], device=mask.device)
    return (positions * mask).argmax(dim=1)


def kl_rewards(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, scores: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: -kl_coef * (logp - ref_logp) everywhere, plus `scores` at each row's
    last completion token. Returns (rewards, per-token kl), both zero on masked positions."""
    kl = (logprobs - ref_logprobs) * mask
    rewards = -kl_coef * kl
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    rewards[rows, last_token_index(mask)] += scores.to(rewards.dtype)
    return rewards, kl


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates over completion tokens.

    delta_t = r_t + gamma * V_{t+1} - V_t and A_t = delta_t + gamma * lam * A_{t+1}, where
    "t+1" is the next masked-in token and the state after the last one is terminal (V = 0).
    Masked positions get advantage 0 and are skipped, so padding after EOS ends the episode and
    a masked hole (e.g. environment tokens) passes the next action's value and advantage through.
    Returns are `advantages + values`.
    """
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        real = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(real, adv, torch.zeros_like(adv))
        next_adv = torch.where(real, adv, next_adv)
        next_value = torch.where(real, values[:, t], next_value)
    return advantages


def policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, as a loss: mean over tokens of max(-A r, -A clip(r, 1-e, 1+e)).

    Returns (loss, clip fraction: the share of tokens where the clipped term was taken).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).float(), mask)


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss (PPO2 / TRL-PPO): 0.5 * mean of max((V - R)^2, (V_clipped - R)^2),
    with V_clipped = V_old + clip(V - V_old, -c, c). Returns (loss, value clip fraction)."""
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped = (values - returns) ** 2
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).float(), mask)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) along the last dimension."""
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(-1)


# ---------------------------------------------------------------------------------------------
# Policy, value head, reference


@dataclass
class Policy:
    """What a PPO run trains and samples from."""

    model: Any  # transformers causal LM, or a peft PeftModel around one
    value_head: torch.nn.Linear  # hidden -> 1, fp32
    tokenizer: Any
    ref_model: Any | None  # frozen initial model (full fine-tune); None with LoRA
    device: torch.device
    bf16: bool
    eos_ids: list[int]
    pad_id: int

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast when enabled, else a no-op."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def reference(self) -> tuple[Any, contextlib.AbstractContextManager]:
        """The reference model and the context to run it in (the adapter disabled, with LoRA)."""
        if self.ref_model is not None:
            return self.ref_model, contextlib.nullcontext()
        return self.model, self.model.disable_adapter()

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Policy parameters that train (all, or the adapter's) then the value head's, in a fixed order."""
        return [p for p in self.model.parameters() if p.requires_grad] + list(self.value_head.parameters())


def _model_source(model_path: str) -> str:
    # An absolute path, so a saved adapter's base_model_name_or_path resolves from any cwd.
    return str(Path(model_path).expanduser().resolve()) if Path(model_path).expanduser().exists() else model_path


def _disable_dropout(model: torch.nn.Module) -> None:
    # Dropout would make the update-time logprobs differ from the rollout's at ratio 1.
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def load_policy(model_path: str, lora_rank: int, p: PPOParams, checkpoint: Path | None = None) -> Policy:
    """Load tokenizer, policy (from `checkpoint` when resuming), reference and value head."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    source = _model_source(model_path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = p.bf16 if p.bf16 is not None else device.type == "cuda"
    tokenizer = AutoTokenizer.from_pretrained(source, padding_side="left")
    if checkpoint is not None and (checkpoint / "adapter_config.json").exists() != (lora_rank > 0):
        held = "a LoRA adapter" if lora_rank == 0 else "a full model"
        raise ValueError(f"cannot resume from {checkpoint}: it holds {held}, not what lora_rank={lora_rank} trains")

    model: Any  # a PeftModel or a transformers model: both are used through the same calls
    ref_model: Any
    if lora_rank > 0:
        from peft import LoraConfig, PeftModel, get_peft_model

        # The frozen base can live in bf16; peft keeps the adapter weights in fp32.
        base = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16 if bf16 else torch.float32)
        if checkpoint is not None:
            model = PeftModel.from_pretrained(base, str(checkpoint), is_trainable=True)
        else:
            config = LoraConfig(
                r=lora_rank,
                lora_alpha=p.lora_alpha or 2 * lora_rank,
                lora_dropout=0.0,
                target_modules=p.lora_target_modules,
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(base, config)
        ref_model = None
    else:
        # fp32 master weights: AdamW on bf16 weights loses small updates.
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint) if checkpoint else source, dtype=torch.float32)
        ref_model = (
            AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32) if checkpoint else copy.deepcopy(model)
        )
        ref_model.requires_grad_(False)
        ref_model.eval()
        if bf16:
            ref_model.to(torch.bfloat16)
        _disable_dropout(ref_model)
        ref_model.to(device)
    _disable_dropout(model)
    if p.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device)

    hidden = model.config.get_text_config().hidden_size
    value_head = torch.nn.Linear(hidden, 1)
    # Zero init: values start at 0 and no value gradient reaches the trunk until the head learns.
    torch.nn.init.zeros_(value_head.weight)
    torch.nn.init.zeros_(value_head.bias)
    if checkpoint is not None:
        value_head.load_state_dict(torch.load(checkpoint / "value_head.pt", map_location="cpu", weights_only=True))
    value_head.to(device)

    gen_eos = model.generation_config.eos_token_id
    eos_ids = set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    if not eos_ids:
        raise ValueError(f"model '{model_path}' defines no EOS token; PPO needs one to end completions")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    return Policy(model, value_head, tokenizer, ref_model, device, bf16, sorted(eos_ids), pad_id)


# How forward_pass computes its outputs: the padding-free, chunked path by default;
# `ForwardOptions.plain()` is the reference path (perf/ppo_update.py compares them).
FORWARD = ForwardOptions()


def forward_pass(
    model: Any,
    value_head: torch.nn.Linear | None,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    temperature: float,
    bf16: bool = False,
    with_entropy: bool = False,
    segment: torch.Tensor | None = None,
    options: ForwardOptions | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Logprobs (at `temperature`) of the completion tokens `sequences[:, prompt_len:]`, their
    values (if a head is given) and entropies (if asked), each [batch, completion_len].

    Position ids are rebuilt from the attention mask so left-padded prompts see the same
    positions as in `generate`. `segment` ([batch, completion_len], train.batches): tokens of a
    segment after a seam are scored on that segment's own context (its prompt and what follows),
    one more forward pass per segment. `options` (default: the module's FORWARD) chooses the
    padding-free, chunked-logits path (train.logprobs) or the plain one; both give the same
    numbers on real tokens, the fast one 0 on padding.
    """
    options = FORWARD if options is None else options
    out = _forward_rows(
        model, value_head, sequences, attention_mask, prompt_len, temperature, bf16, with_entropy, options
    )
    if segment is None:
        return out

    def score(ids: torch.Tensor) -> list[torch.Tensor | None]:
        ones = torch.ones_like(ids)
        return list(_forward_rows(model, value_head, ids, ones, 1, temperature, bf16, with_entropy, options))

    logprobs, values, entropy = rescore_segments(list(out), sequences[:, prompt_len:], segment, score)
    return logprobs, values, entropy  # type: ignore[return-value]


def _forward_rows(
    model: Any,
    value_head: torch.nn.Linear | None,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    temperature: float,
    bf16: bool,
    with_entropy: bool,
    options: ForwardOptions | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`forward_pass` of whole rows, each token on everything before it in its row."""
    if options is not None and (options.unpad or options.chunk or options.share_prompts) and supports_chunking(model):
        return completion_outputs(
            model, value_head, sequences, attention_mask, prompt_len, temperature, bf16, with_entropy, options
        )
    completion_len = sequences.shape[1] - prompt_len
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.autocast(sequences.device.type, dtype=torch.bfloat16, enabled=bf16):
        # logits_to_keep: the LM head only runs on the positions that predict completion tokens.
        out = model(
            input_ids=sequences,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=value_head is not None,
            logits_to_keep=completion_len + 1,
            use_cache=False,
        )
    logits = out.logits[:, :-1].float() / temperature
    targets = sequences[:, prompt_len:]
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    values = None
    if value_head is not None:
        hidden = out.hidden_states[-1][:, prompt_len - 1 : -1].float()
        values = value_head(hidden).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits)
    return logprobs, values, entropy


# ---------------------------------------------------------------------------------------------
# Rollouts


@dataclass
class Rollout:
    """One step's sampled episodes and everything PPO needs about them (on the device)."""

    sequences: torch.Tensor  # [B, P+T] left-padded prompt ids then right-padded completion ids
    attention_mask: torch.Tensor  # [B, P+T] 1 on every real token (the env's included)
    prompt_len: int  # P
    mask: torch.Tensor  # [B, T] 1.0 on the model's own tokens: the actions
    logprobs: torch.Tensor  # [B, T] under the rollout policy
    ref_logprobs: torch.Tensor  # [B, T] under the reference policy
    values: torch.Tensor  # [B, T] critic estimates
    prompt_indices: list[int]  # the task index of each row
    episodes: list[Any]  # what the reward scores (arlecli.types.Episode)
    segment: torch.Tensor | None = None  # [B, T] the context each token was generated in (train.batches)


def _left_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        attn[i, width - len(r) :] = 1
    return ids.to(device), attn.to(device)


def _right_pad(rows: list[list[Any]], pad: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), pad, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out.to(device)


@torch.no_grad()
def score_rollout(
    policy: Policy,
    episodes: list[Any],
    indices: list[int],
    temperature: float,
    micro_batch_size: int,
    no_loss: Callable[[Any], bool] | None = None,
) -> Rollout:
    """Turn sampled episodes into PPO's batch: their token sequences (train.batches.Sequences)
    and the policy's, reference's and critic's view of every completion token. An episode for
    which `no_loss` is True (overlong filtering) keeps its tokens with no action among them."""
    seqs = Sequences.of(episodes, policy.eos_ids[0]).without_loss([no_loss(e) for e in episodes] if no_loss else None)
    prompt_ids, prompt_attn = _left_pad(seqs.prompt_ids, policy.pad_id, policy.device)
    completions = _right_pad(seqs.completion_ids, policy.pad_id, torch.long, policy.device)
    real = _right_pad([[1] * len(c) for c in seqs.completion_ids], 0, torch.long, policy.device)
    mask = _right_pad(seqs.env_mask, 0, torch.float32, policy.device)
    sequences = torch.cat([prompt_ids, completions], dim=1)
    attention_mask = torch.cat([prompt_attn, real], dim=1)
    prompt_len = prompt_ids.shape[1]
    segment = _right_pad(seqs.segment, 0, torch.long, policy.device) if seqs.seamed else None

    logprobs, ref_logprobs, values = [], [], []
    model = policy.model
    model.eval()
    ref_model, ref_context = policy.reference()
    for s in range(0, len(episodes), micro_batch_size):
        seq, attn = sequences[s : s + micro_batch_size], attention_mask[s : s + micro_batch_size]
        seg = segment[s : s + micro_batch_size] if segment is not None else None
        lp, v, _ = forward_pass(model, policy.value_head, seq, attn, prompt_len, temperature, policy.bf16, segment=seg)
        assert v is not None  # the policy has a value head
        logprobs.append(lp)
        values.append(v)
    with ref_context:
        for s in range(0, len(episodes), micro_batch_size):
            seq, attn = sequences[s : s + micro_batch_size], attention_mask[s : s + micro_batch_size]
            seg = segment[s : s + micro_batch_size] if segment is not None else None
            ref_logprobs.append(
                forward_pass(ref_model, None, seq, attn, prompt_len, temperature, policy.bf16, segment=seg)[0]
            )
    return Rollout(
        sequences,
        attention_mask,
        prompt_len,
        mask,
        torch.cat(logprobs) * mask,
        torch.cat(ref_logprobs) * mask,
        torch.cat(values) * mask,
        list(indices),
        list(episodes),
        segment,
    )


# ---------------------------------------------------------------------------------------------
# The update


def ppo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: Rollout,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    p: PPOParams,
    temperature: float,
) -> dict[str, float]:
    """`ppo_epochs` passes over the batch in shuffled minibatches; returns mean loss statistics."""
    size = batch.sequences.shape[0]
    mini = min(p.mini_batch_size or size, size)
    micro = min(p.micro_batch_size or mini, mini)
    params = policy.trainable_parameters()
    totals: dict[str, float] = {}
    updates = 0
    policy.model.train()
    for _ in range(p.ppo_epochs):
        order = torch.randperm(size).to(policy.device)
        for start in range(0, size, mini):
            mini_idx = order[start : start + mini]
            mini_tokens = batch.mask[mini_idx].sum().clamp(min=1)
            stats = dict.fromkeys(
                ("policy_loss", "value_loss", "clip_fraction", "value_clip_fraction", "approx_kl", "entropy"), 0.0
            )
            for m_start in range(0, len(mini_idx), micro):
                idx = mini_idx[m_start : m_start + micro]
                mask = batch.mask[idx]
                logprobs, values, entropy = forward_pass(
                    policy.model,
                    policy.value_head,
                    batch.sequences[idx],
                    batch.attention_mask[idx],
                    batch.prompt_len,
                    temperature,
                    policy.bf16,
                    with_entropy=True,
                    segment=batch.segment[idx] if batch.segment is not None else None,
                )
                assert values is not None and entropy is not None  # a value head and with_entropy
                pg, clip_frac = policy_loss(logprobs, batch.logprobs[idx], advantages[idx], mask, p.cliprange)
                vf, vf_clip_frac = value_loss(values, batch.values[idx], returns[idx], mask, p.cliprange_value)
                # Weight each micro batch by its token share: the sum is the minibatch's token mean.
                weight = mask.sum() / mini_tokens
                ((pg + p.vf_coef * vf) * weight).backward()
                with torch.no_grad():
                    approx_kl = 0.5 * masked_mean((logprobs - batch.logprobs[idx]) ** 2, mask)
                for key, value in (
                    ("policy_loss", pg),
                    ("value_loss", vf),
                    ("clip_fraction", clip_frac),
                    ("value_clip_fraction", vf_clip_frac),
                    ("approx_kl", approx_kl),
                    ("entropy", masked_mean(entropy, mask)),
                ):
                    stats[key] += float(value.detach() * weight)
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, p.max_grad_norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            for key, total in stats.items():
                totals[key] = totals.get(key, 0.0) + total
            updates += 1
    policy.model.eval()
    return {key: value / updates for key, value in totals.items()}


def _unpack_rewards(out: Any, expected: int) -> tuple[list[float], list[bool] | None]:
    # Plain floats, or Score-like objects (.reward, .correct), which also give accuracy.
    out = list(out)
    if len(out) != expected:
        raise ValueError(f"reward_fn returned {len(out)} rewards for {expected} completions")
    if out and all(hasattr(x, "reward") and hasattr(x, "correct") for x in out):
        return [float(x.reward) for x in out], [bool(x.correct) for x in out]
    return [0.0 if x is None else float(x) for x in out], None


# ---------------------------------------------------------------------------------------------
# Checkpoints


def _rng_state() -> dict:
    import numpy as np

    kind, keys, pos, has_gauss, cached = cast(tuple[str, Any, int, int, float], np.random.get_state())
    # Plain types and tensors only, so the state loads with torch.load(weights_only=True).
    state = {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    import numpy as np

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed_everything(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _save_model(folder: Path, policy: Policy) -> None:
    policy.model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    torch.save(policy.value_head.state_dict(), folder / "value_head.pt")


def _write_atomically(folder: Path, write: Callable[[Path], None]) -> None:
    # Written beside its final name, then renamed: resume never sees a half-written folder.
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def save_checkpoint(
    output_dir: Path,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    data_position: int,
    p: PPOParams,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write `output_dir/checkpoint-{step}` with everything resume needs (and what `extra`
    writes into the folder: the rollouts queued ahead)."""
    folder = RunDir(output_dir).checkpoint(step)

    def write(tmp: Path) -> None:
        if extra is not None:
            extra(tmp)
        _save_model(tmp, policy)
        torch.save(
            {
                "step": step,
                "data_position": data_position,
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": _rng_state(),
                "params": dataclasses.asdict(p),
            },
            tmp / "trainer_state.pt",
        )

    _write_atomically(folder, write)
    return folder


def step_indices(step: int, num_tasks: int, prompts_per_step: int, num_generations: int) -> list[int]:
    """The task indices PPO's step `step` samples: the next `prompts_per_step` tasks in order
    (cycling over `num_tasks`), each `num_generations` times."""
    first = step * prompts_per_step
    return [(first + k) % num_tasks for k in range(prompts_per_step) for _ in range(num_generations)]


def sampled_logprobs(batch: Rollout, policy: Policy) -> torch.Tensor:
    """[B, T] the logprob each completion token had under the policy that sampled it (the
    engine's, recorded in the episodes; 0 on the environment's tokens), laid out like batch.mask."""
    seqs = Sequences.of(batch.episodes, policy.eos_ids[0])
    out = _right_pad(seqs.logprobs, 0.0, torch.float32, policy.device)
    return out[:, : batch.mask.shape[1]] * batch.mask


def _make_scheduler(optimizer: torch.optim.Optimizer, p: PPOParams, max_steps: int) -> Any:
    def factor(step: int) -> float:
        if step < p.warmup_steps:
            return (step + 1) / (p.warmup_steps + 1)
        if p.lr_scheduler == "linear":
            return max(0.0, (max_steps - step) / max(1, max_steps - p.warmup_steps))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------------------------
# Entry point


def train_ppo(
    model_path: str,
    num_tasks: int,
    rollout_fn: Callable[[Policy, list[int], int], list[Any]],
    reward_fn: Callable[[list[Any], list[int]], list[Any]],
    *,
    output_dir: Path,
    max_steps: int,
    learning_rate: float,
    lora_rank: int,
    num_generations: int,
    temperature: float,
    seed: int,
    save_steps: int,
    resume: bool,
    params: dict,
    on_log: Callable[[dict], None],
    save_total_limit: int | None = None,
    on_step_end: Callable[[int, Policy], None] | None = None,
    no_loss: Callable[[Any], bool] | None = None,
    is_cap: float | None = None,
    on_save: Callable[[Path], None] | None = None,
) -> Path:
    """Train `model_path` with PPO and return `output_dir/final`.

    Each step takes the next `prompts_per_step` task indices (in order, cycling over
    `num_tasks`), each repeated `num_generations` times, and asks `rollout_fn(policy, indices,
    step)` for one sampled Episode per entry (sampled from `policy` at `temperature`, top_p 1);
    an episode for which `no_loss(episode)` is True (overlong filtering) takes no action.
    `reward_fn(episodes, indices)` scores them (floats, or Score-like objects with `.reward`
    and `.correct`, which also give accuracy); then `ppo_epochs` PPO passes run. `lora_rank` 0
    is a full fine-tune. `params` overrides PPOParams. `on_log` gets one dict per step: step,
    reward, reward_std, [accuracy], kl (per-sequence sum, mean), policy_loss, value_loss,
    clip_fraction, value_clip_fraction, approx_kl, entropy, value, completion_length (model
    tokens), grad_norm, learning_rate, step_seconds. Checkpoints go to
    `output_dir/checkpoint-N` every `save_steps` steps (0: none), keeping the newest
    `save_total_limit` (None: all); `resume` continues from the latest one (a fresh start when
    there is none). `on_step_end(step, policy)` runs before the first step (with the starting
    step) and after each step's log and checkpoint (held-out evaluation hooks in here).
    Rollouts sampled ahead by an older policy (--max-staleness, train.overlap): `is_cap` weighs
    each action's advantage by min(pi_old / pi_sampler, is_cap) from the episodes' own
    sampling logprobs (None: no correction), logged as is_weight/mean and /clip_fraction;
    `on_save(folder)` writes the queued rollouts into each checkpoint before it is complete.
    """
    p = parse_params(params)
    if num_tasks < 1:
        raise ValueError("no prompts to train on")
    if temperature <= 0:
        raise ValueError("PPO samples its rollouts: temperature must be > 0")
    if num_generations < 1 or max_steps < 0:
        raise ValueError("num_generations must be >= 1, max_steps >= 0")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = latest_checkpoint(output_dir) if resume else None

    _seed_everything(seed)
    policy = load_policy(model_path, lora_rank, p, checkpoint)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=learning_rate, weight_decay=p.weight_decay)
    scheduler = _make_scheduler(optimizer, p, max_steps)
    step, position = 0, 0
    if checkpoint is not None:
        state = torch.load(checkpoint / "trainer_state.pt", map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, position = state["step"], state["data_position"]
        _set_rng_state(state["rng"])

    batch_size = p.prompts_per_step * num_generations
    micro = min(p.micro_batch_size or p.mini_batch_size or batch_size, batch_size)
    if on_step_end is not None and step < max_steps:
        on_step_end(step, policy)
    while step < max_steps:
        started = time.perf_counter()
        indices = step_indices(step, num_tasks, p.prompts_per_step, num_generations)
        position = (position + p.prompts_per_step) % num_tasks
        episodes = rollout_fn(policy, indices, step)
        batch = score_rollout(policy, episodes, indices, temperature, micro, no_loss=no_loss)

        rewards_list, correct = _unpack_rewards(reward_fn(batch.episodes, batch.prompt_indices), len(indices))
        scores = torch.tensor(rewards_list, dtype=torch.float32, device=policy.device)
        rewards, kl = kl_rewards(batch.logprobs, batch.ref_logprobs, batch.mask, scores, p.kl_coef)
        if p.whiten_rewards:
            rewards = whiten(rewards, batch.mask, shift_mean=False)
        advantages = gae(rewards, batch.values, batch.mask, p.gamma, p.lam)
        returns = (advantages + batch.values) * batch.mask
        if p.whiten_advantages:
            advantages = whiten(advantages, batch.mask)
        is_stats: dict[str, float] = {}
        if is_cap is not None:  # after the returns: the critic learns the sampled returns as they are
            weights, is_stats = is_weights(batch.logprobs, sampled_logprobs(batch, policy), batch.mask, is_cap)
            advantages = advantages * weights

        learning_rate_now = scheduler.get_last_lr()[0]
        stats = ppo_update(policy, optimizer, batch, advantages, returns, p, temperature)
        scheduler.step()
        step += 1

        log = {
            "step": step,
            "reward": float(scores.mean()),
            "reward_std": float(scores.std()) if len(scores) > 1 else 0.0,
        }
        if correct is not None:
            log["accuracy"] = sum(correct) / len(correct)
        log.update(
            {
                "kl": float(kl.sum(1).mean()),
                **stats,
                **is_stats,
                "value": float(masked_mean(batch.values, batch.mask)),
                "completion_length": float(batch.mask.sum(1).mean()),
                "learning_rate": learning_rate_now,
                "step_seconds": time.perf_counter() - started,
            }
        )
        if not all(math.isfinite(v) for v in log.values()):
            raise FloatingPointError(f"PPO step {step} produced non-finite metrics: {log}")
        # Logged before the checkpoint, as TRL's Trainer does: a run killed between the two resumes
        # from the step before and drops this line (metrics.truncate_metrics); the other order lost
        # the line of a checkpointed step for good.
        if on_log is not None:
            on_log(log)
        if save_steps > 0 and step % save_steps == 0:
            save_checkpoint(output_dir, policy, optimizer, scheduler, step, position, p, extra=on_save)
            prune_checkpoints(output_dir, save_total_limit)
        if on_step_end is not None:
            on_step_end(step, policy)

    final = RunDir(output_dir).final
    _write_atomically(final, lambda tmp: _save_model(tmp, policy))
    return final
