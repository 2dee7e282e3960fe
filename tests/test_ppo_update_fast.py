"""PPO's fast update path (train.logprobs: no padding in the forward, the LM head in chunks)
gives the plain padded path's logprobs, values, entropies, gradients and update, on the tiny
model: full fine-tune, LoRA, and rows with seams rescored on their own context."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from arlecli.train import ppo
from arlecli.train.logprobs import ForwardOptions, length_groups
from arlecli.train.ppo import PPOParams
from arlecli.types import Episode, Turn

PLAIN = ForwardOptions.plain()
# Tiny chunks force several per batch; max_padding 0 gives one row per group, 0.5 mixed groups.
FAST = [
    ForwardOptions(chunk=7, unpad=True, max_padding=0.0),
    ForwardOptions(chunk=7, unpad=True, max_padding=0.5),
    ForwardOptions(chunk=5, unpad=False),
    ForwardOptions(chunk=None, unpad=True),
    ForwardOptions(chunk=7, unpad=True, max_padding=0.5, share_prompts=True),
    ForwardOptions(chunk=None, unpad=False, share_prompts=True),
]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _policy(tiny_model, lora_rank: int = 0, gradient_checkpointing: bool = False) -> ppo.Policy:
    torch.manual_seed(0)
    policy = ppo.load_policy(str(tiny_model), lora_rank, PPOParams(gradient_checkpointing=gradient_checkpointing))
    # A critic that reads the hidden states (the zero init would make every value 0).
    torch.nn.init.normal_(policy.value_head.weight, std=0.5)
    with torch.no_grad():  # an adapter that already moved (peft starts lora_B at 0: no gradient for lora_A)
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)
    return policy


def _episodes(seed: int = 0, rows: int = 6, seams: bool = False) -> list[Episode]:
    """Rows of varied prompt and completion lengths (so both paddings occur), env tokens in
    the middle of some; with `seams`, a second turn whose prompt does not extend the first's."""
    rng = random.Random(seed)
    out = []
    for r in range(rows):
        if r % 3 != 1:  # rows 0 and 1 share a prompt (a group of completions), row 2 has its own, ...
            prompt = [rng.randrange(5, 1500) for _ in range(rng.randint(3, 12))]
        first = [rng.randrange(5, 1500) for _ in range(rng.randint(2, 20))]
        turns = [Turn("p", "c", prompt_token_ids=prompt, token_ids=first, logprobs=[-1.0] * len(first))]
        if seams and r % 2 == 0 or r == 1:
            # r == 1 continues its prompt (env tokens, no seam); even rows open a new segment.
            head = prompt + first if r == 1 else prompt[:2]
            second_prompt = head + [rng.randrange(5, 1500) for _ in range(4)]
            second = [rng.randrange(5, 1500) for _ in range(rng.randint(2, 9))]
            turns.append(
                Turn("p", "c", prompt_token_ids=second_prompt, token_ids=second, logprobs=[-1.0] * len(second))
            )
        out.append(Episode(str(r), turns))
    return out


def _score(policy, episodes, options: ForwardOptions, monkeypatch) -> ppo.Rollout:
    monkeypatch.setattr(ppo, "FORWARD", options)
    return ppo.score_rollout(policy, episodes, list(range(len(episodes))), temperature=0.7, micro_batch_size=4)


def _assert_rollouts_equal(plain: ppo.Rollout, fast: ppo.Rollout) -> None:
    assert torch.equal(plain.mask, fast.mask) and plain.mask.sum() > 0
    for name in ("logprobs", "ref_logprobs", "values"):
        torch.testing.assert_close(getattr(fast, name), getattr(plain, name), atol=2e-5, rtol=1e-5, msg=name)


def _real(batch: ppo.Rollout) -> torch.Tensor:
    return batch.attention_mask[:, batch.prompt_len :].bool()


@pytest.mark.parametrize(("lora_rank", "seams"), [(0, False), (0, True), (4, True)])
def test_score_rollout_fast_equals_plain(tiny_model, monkeypatch, lora_rank, seams):
    """Policy, reference (LoRA: the adapter disabled) and critic on every completion token."""
    policy = _policy(tiny_model, lora_rank)
    episodes = _episodes(seams=seams)
    plain = _score(policy, episodes, PLAIN, monkeypatch)
    assert (plain.segment is not None) == seams
    for options in FAST:
        _assert_rollouts_equal(plain, _score(policy, episodes, options, monkeypatch))


def test_shared_prompts_run_once(tiny_model, monkeypatch):
    """With share_prompts a group's prompt goes through the model once: fewer token positions
    embedded than the padding-free path (which runs it per row), the same outputs."""
    policy = _policy(tiny_model)
    episodes = _episodes(seed=4)
    seen = []
    embed = policy.model.get_input_embeddings()
    handle = embed.register_forward_hook(lambda module, args, out: seen.append(args[0].numel()))
    unpad = _score(policy, episodes, ForwardOptions(unpad=True, max_padding=0.0), monkeypatch)
    per_row, seen[:] = sum(seen), []
    shared = _score(policy, episodes, ForwardOptions(unpad=True, max_padding=0.0, share_prompts=True), monkeypatch)
    handle.remove()
    prompts = [len(e.turns[0].prompt_token_ids) for e in episodes]
    # Rows 0/1 and 3/4 share a prompt, but micro batches of 4 rows split the second pair; the
    # hook sees the policy only (the reference is a copy).
    assert prompts[0] == prompts[1] and per_row - sum(seen) == prompts[0]
    _assert_rollouts_equal(unpad, shared)


def _outputs_and_grads(policy, batch, options, seams):
    """forward_pass in training mode, then the backward of a loss over every output: the
    outputs on real completion tokens and the gradient of every trainable parameter."""
    policy.model.zero_grad(set_to_none=True)
    policy.value_head.zero_grad(set_to_none=True)
    policy.model.train()
    logprobs, values, entropy = ppo.forward_pass(
        policy.model,
        policy.value_head,
        batch.sequences,
        batch.attention_mask,
        batch.prompt_len,
        0.7,
        with_entropy=True,
        segment=batch.segment if seams else None,
        options=options,
    )
    policy.model.eval()
    real = _real(batch)
    weights = torch.linspace(-1.0, 1.0, real.numel()).reshape(real.shape) * real
    ((logprobs * weights).sum() + (values * weights.flip(1) * real).sum()).backward()
    named = list(policy.model.named_parameters()) + list(policy.value_head.named_parameters())
    grads = {n: p.grad.clone() for n, p in named if p.requires_grad}
    return [t[real] for t in (logprobs, values, entropy)], grads


@pytest.mark.parametrize(
    ("lora_rank", "seams", "checkpointing"), [(0, False, False), (0, True, False), (4, False, True)]
)
def test_training_forward_and_gradients_fast_equal_plain(tiny_model, monkeypatch, lora_rank, seams, checkpointing):
    """Also under gradient checkpointing (no KV cache there: shared prompts fall back to per row)."""
    policy = _policy(tiny_model, lora_rank, gradient_checkpointing=checkpointing)
    batch = _score(policy, _episodes(seed=1, seams=seams), PLAIN, monkeypatch)
    want, want_grads = _outputs_and_grads(policy, batch, PLAIN, seams)
    assert all(g.abs().sum() > 0 for g in want_grads.values())
    for options in FAST:
        got, got_grads = _outputs_and_grads(policy, batch, options, seams)
        for name, a, b in zip(("logprobs", "values", "entropy"), got, want, strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5, msg=f"{name} {options}")
        assert got_grads.keys() == want_grads.keys()
        for name, grad in got_grads.items():
            # A gradient sums over every token: compare it as a whole, relative to its size.
            error = float((grad - want_grads[name]).norm() / want_grads[name].norm())
            assert error < 1e-4, (name, options, error)


def test_ppo_update_fast_equals_plain(tiny_model, monkeypatch):
    """Two PPO epochs in micro batches from the same start: the same statistics and weights."""
    policy = _policy(tiny_model)
    start = (copy.deepcopy(policy.model.state_dict()), copy.deepcopy(policy.value_head.state_dict()))
    episodes = _episodes(seed=2, rows=8, seams=True)
    p = PPOParams(ppo_epochs=2, mini_batch_size=4, micro_batch_size=2)
    results = []
    for options in (PLAIN, FAST[4]):
        policy.model.load_state_dict(start[0])
        policy.value_head.load_state_dict(start[1])
        batch = _score(policy, episodes, options, monkeypatch)
        scores = torch.linspace(0.0, 1.0, len(episodes))
        rewards, _ = ppo.kl_rewards(batch.logprobs, batch.ref_logprobs, batch.mask, scores, p.kl_coef)
        advantages = ppo.gae(rewards, batch.values, batch.mask, p.gamma, p.lam)
        returns = (advantages + batch.values) * batch.mask
        advantages = ppo.whiten(advantages, batch.mask)
        optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
        torch.manual_seed(3)  # the same minibatch order
        stats = ppo.ppo_update(policy, optimizer, batch, advantages, returns, p, 0.7)
        results.append((stats, copy.deepcopy(policy.model.state_dict())))
    (plain_stats, plain_weights), (fast_stats, fast_weights) = results
    assert plain_stats.keys() == fast_stats.keys()
    for key, value in plain_stats.items():
        assert fast_stats[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    # Each weight's move, compared as a whole: Adam's normalised steps turn float noise in a
    # near-zero gradient element into a visible difference in that element alone.
    for key, weight in plain_weights.items():
        moved = weight - start[0][key]
        assert moved.norm() > 0, key
        error = float((fast_weights[key] - weight).norm() / moved.norm())
        assert error < 1e-2, (key, error)


def test_length_groups_bound_padding_and_cover_every_row():
    lengths = [30, 5, 29, 12, 28, 6, 30, 1]
    for max_padding in (0.0, 0.1, 0.5, 1.0):
        groups = length_groups(lengths, max_padding)
        assert sorted(r for g in groups for r in g) == list(range(len(lengths)))
        for group in groups:
            slots = max(lengths[r] for r in group) * len(group)
            assert slots - sum(lengths[r] for r in group) <= max_padding * slots
    assert length_groups(lengths, 0.0) == [[0, 6], [2], [4], [3], [5], [1], [7]]
    assert len(length_groups(lengths, 1.0)) == 1
