"""PPO: the math against hand-computed numbers, its batch against the engine's own sampling
logprobs, and train_ppo end to end on rollouts from arle's engine."""

from __future__ import annotations

import math

import pytest
import torch

from arlecli.train import ppo
from arlecli.engine.base import SamplingParams
from arlecli.envs.episodes import Job, run_episodes
from arlecli.envs.single_turn import SingleTurnEnv
from arlecli.train.ppo import PPOParams, gae, kl_rewards, policy_loss, train_ppo, value_loss, whiten
from arlecli.types import Task

PROMPTS = ["Question: What is 12 plus 30?", [{"role": "user", "content": "count to three"}], "def add(a, b):"]
FAST = {"prompts_per_step": 2, "ppo_epochs": 2, "mini_batch_size": 2}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The tiny model's matmuls are too small to gain from threads, and when other processes share
    # the 2 cores, OpenMP's spin-waiting turns a 0.15 s step into several seconds.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _reward(episodes: list, prompt_indices: list[int]) -> list[float]:
    # Anything that varies across samples: longer texts and digits score higher.
    return [len(e.completion) / 20 + sum(ch.isdigit() for ch in e.completion) for e in episodes]


def _episodes(policy, indices: list[int], step: int, max_tokens: int = 8, temperature: float = 1.0) -> list:
    """PROMPTS[i] for each index, sampled on arle's hf engine over the policy (as train.batches does)."""
    from arlecli.engine.hf import HFEngine

    engine = HFEngine("", model_obj=policy.model, tokenizer=policy.tokenizer, device=str(policy.device))
    jobs = [
        Job(
            Task(str(i), "", None),
            SingleTurnEnv(PROMPTS[i]),
            SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=1000 * step + j, logprobs=True),
        )
        for j, i in enumerate(indices)
    ]
    out = [None] * len(jobs)
    for j, episode in run_episodes(engine, jobs):
        out[j] = episode
    return out


def _train(model, out, *, max_steps=2, lora_rank=0, save_steps=0, resume=False, logs=None, params=FAST):
    logs = [] if logs is None else logs
    final = train_ppo(
        str(model),
        len(PROMPTS),
        _episodes,
        _reward,
        output_dir=out,
        max_steps=max_steps,
        learning_rate=1e-3,
        lora_rank=lora_rank,
        num_generations=2,
        temperature=1.0,
        seed=0,
        save_steps=save_steps,
        resume=resume,
        params=dict(params),
        on_log=logs.append,
    )
    return final, logs


# --- the math -----------------------------------------------------------------------------


def test_gae_matches_hand_computation():
    gamma, lam = 0.9, 0.8  # gamma * lam = 0.72
    rewards = torch.tensor([[0.1, -0.2, 1.0, 9.0], [0.0, 2.0, 5.0, 5.0], [0.0, 9.0, 1.0, 9.0]])
    values = torch.tensor([[0.5, 0.4, 0.3, 7.0], [1.0, 0.5, 3.0, 3.0], [0.2, 9.0, 0.6, 9.0]])
    mask = torch.tensor(
        [
            [1.0, 1, 1, 0],  # padding after the 3rd token: 9.0 / 7.0 must not leak
            [1.0, 1, 0, 0],
            [1.0, 0, 1, 0],
        ]
    )  # a masked hole is skipped
    # Row 0: d2 = 1.0 - 0.3 = 0.7 (terminal after it)           A2 = 0.7
    #        d1 = -0.2 + 0.9*0.3 - 0.4 = -0.33                  A1 = -0.33 + 0.72*0.7 = 0.174
    #        d0 = 0.1 + 0.9*0.4 - 0.5 = -0.04                   A0 = -0.04 + 0.72*0.174 = 0.08528
    # Row 1: d1 = 2.0 - 0.5 = 1.5                               A1 = 1.5
    #        d0 = 0.0 + 0.9*0.5 - 1.0 = -0.55                   A0 = -0.55 + 0.72*1.5 = 0.53
    # Row 2: d2 = 1.0 - 0.6 = 0.4                               A2 = 0.4
    #        token 1 skipped; d0 = 0.0 + 0.9*0.6 - 0.2 = 0.34   A0 = 0.34 + 0.72*0.4 = 0.628
    expected = torch.tensor([[0.08528, 0.174, 0.7, 0.0], [0.53, 1.5, 0.0, 0.0], [0.628, 0.0, 0.4, 0.0]])
    assert torch.allclose(gae(rewards, values, mask, gamma, lam), expected, atol=1e-6)


def test_policy_loss_clips_hand_example():
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 0.5, 0.5, 3.0]]))
    adv = torch.tensor([[1.0, 1.0, -2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # token 0: r=1.5, A=+1: max(-1.5, -1.2) = -1.2   (clipped at 1.2)
    # token 1: r=0.5, A=+1: max(-0.5, -0.8) = -0.5   (unclipped: the pessimistic term)
    # token 2: r=0.5, A=-2: max(1.0, 1.6)  = 1.6     (clipped at 0.8)
    # token 3: masked out
    loss, clip_fraction = policy_loss(new, old, adv, mask, cliprange=0.2)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.6) / 3, abs=1e-6)
    assert clip_fraction.item() == pytest.approx(2 / 3)


def test_value_loss_hand_example():
    # V moved 1.0 from V_old = 0; clipped V = 0.2; R = 2: max((1-2)^2, (0.2-2)^2) = 3.24, halved.
    loss, clip_fraction = value_loss(
        torch.tensor([[1.0, 2.0]]),
        torch.tensor([[0.0, 2.0]]),
        torch.tensor([[2.0, 2.0]]),
        torch.tensor([[1.0, 0.0]]),
        cliprange_value=0.2,
    )
    assert loss.item() == pytest.approx(1.62)
    assert clip_fraction.item() == 1.0


def test_kl_rewards_go_to_the_last_model_token_and_whiten():
    mask = torch.tensor([[1.0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])

    logp, ref = torch.full((3, 5), -1.0), torch.full((3, 5), -1.5)
    rewards, kl = kl_rewards(logp, ref, mask, torch.tensor([1.0, 2.0, 3.0]), kl_coef=0.1)
    assert torch.allclose(kl, 0.5 * mask)
    expected = -0.05 * mask
    expected[0, 2] += 1.0
    expected[1, 4] += 2.0
    expected[2, 0] += 3.0
    assert torch.allclose(rewards, expected)

    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = whiten(x, m)
    assert w[0, 3] == 0 and w[0, :3].mean().abs() < 1e-6 and w[0, :3].var().item() == pytest.approx(1.0, abs=1e-4)


def test_unknown_params_are_named():
    with pytest.raises(ValueError, match="unknown PPO parameter.*gama.*known: gamma"):
        ppo.parse_params({"gama": 0.9})
    assert ppo.parse_params({"gamma": 0.9}).gamma == 0.9
    with pytest.raises(ValueError, match="cliprange"):
        ppo.parse_params({"cliprange": 0})


# --- model-side pieces on the tiny model ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_policy(tiny_model):
    torch.manual_seed(0)
    return ppo.load_policy(str(tiny_model), 0, PPOParams())


def test_ppo_logprobs_are_the_engines_sampling_distribution(tiny_policy):
    """PPO's recomputed logprobs (left padding, rebuilt position ids) equal the logprobs the
    engine sampled the rollout from, on every model token; env tokens and padding are masked."""
    policy = tiny_policy
    episodes = _episodes(policy, [0, 1, 2], step=0, max_tokens=12, temperature=0.7)
    batch = ppo.score_rollout(policy, episodes, [0, 1, 2], temperature=0.7, micro_batch_size=8)
    sampled = torch.zeros_like(batch.logprobs)
    for r, episode in enumerate(episodes):
        own = episode.turns[0].logprobs
        sampled[r, : len(own)] = torch.tensor(own)
        assert batch.mask[r].sum() == len(own) == len(episode.turns[0].token_ids)
        assert batch.sequences[r, batch.prompt_len : batch.prompt_len + len(own)].tolist() == episode.turns[0].token_ids
    assert torch.allclose(batch.logprobs, sampled * batch.mask, atol=1e-4)
    assert batch.values.shape == batch.logprobs.shape


def test_value_loss_decreases_on_fixed_batch(tiny_policy):
    policy = tiny_policy
    indices = [0, 0, 1, 1, 2, 2]
    batch = ppo.score_rollout(
        policy, _episodes(policy, indices, step=0, max_tokens=6), indices, temperature=1.0, micro_batch_size=8
    )
    returns = torch.linspace(-1.0, 1.0, batch.mask.numel()).reshape(batch.mask.shape) * batch.mask
    head = torch.nn.Linear(policy.value_head.in_features, 1)
    head.load_state_dict(policy.value_head.state_dict())
    optimizer = torch.optim.Adam(head.parameters(), lr=1e-2)
    losses = []
    for _ in range(6):
        with torch.no_grad():  # only the critic trains here: the trunk stays fixed
            hidden = policy.model(
                input_ids=batch.sequences, attention_mask=batch.attention_mask, output_hidden_states=True
            ).hidden_states[-1][:, batch.prompt_len - 1 : -1]
        loss, _ = value_loss(head(hidden).squeeze(-1), batch.values, returns, batch.mask, cliprange_value=0.2)
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < 0.8 * losses[0], losses


# --- train_ppo end to end ----------------------------------------------------------------------


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_train_ppo_changes_weights_and_saves_a_loadable_final(tiny_model, tmp_path, lora_rank):
    from transformers import AutoModelForCausalLM

    from arlecli.engine.hf import HFEngine

    final, logs = _train(tiny_model, tmp_path / "run", lora_rank=lora_rank)
    assert final == tmp_path / "run" / "final"
    assert [log["step"] for log in logs] == [1, 2]
    for log in logs:
        for key in ("reward", "kl", "policy_loss", "value_loss", "clip_fraction", "entropy", "step_seconds"):
            assert math.isfinite(log[key]), (key, log)
    assert (final / "value_head.pt").exists()

    base = _state(AutoModelForCausalLM.from_pretrained(tiny_model))
    if lora_rank:
        from peft import AutoPeftModelForCausalLM

        assert (final / "adapter_config.json").exists() and not (final / "config.json").exists()
        peft_model = AutoPeftModelForCausalLM.from_pretrained(str(final))
        lora_b = [v for k, v in peft_model.state_dict().items() if "lora_B" in k]
        assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # lora_B starts at zero
        trained = _state(peft_model.merge_and_unload())
    else:
        trained = _state(AutoModelForCausalLM.from_pretrained(final))
    assert any(not torch.equal(base[k], trained[k]) for k in base)

    engine = HFEngine(str(final), device="cpu")  # what `arle eval --model final` loads
    assert engine.tokenizer.chat_template


def test_resume_continues_from_the_latest_checkpoint(tiny_model, tmp_path):
    from peft import AutoPeftModelForCausalLM

    first, logs = _train(tiny_model, tmp_path / "run", max_steps=2, save_steps=1, lora_rank=4)
    assert [log["step"] for log in logs] == [1, 2]
    assert {p.name for p in (tmp_path / "run").iterdir()} == {"checkpoint-1", "checkpoint-2", "final"}
    state = torch.load(tmp_path / "run" / "checkpoint-2" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 2 and state["data_position"] == 1  # 4 prompts taken from 3, cycling

    resumed, logs = _train(tiny_model, tmp_path / "run", max_steps=3, save_steps=1, lora_rank=4, resume=True)
    assert [log["step"] for log in logs] == [3]
    assert (tmp_path / "run" / "checkpoint-3").exists()

    # The resumed run is the uninterrupted one: same weights, RNG and optimizer state restored.
    straight, _ = _train(tiny_model, tmp_path / "straight", max_steps=3, lora_rank=4)
    a = _state(AutoPeftModelForCausalLM.from_pretrained(str(resumed)))
    b = _state(AutoPeftModelForCausalLM.from_pretrained(str(straight)))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_first_update_starts_at_ratio_one_and_scores_give_accuracy(tiny_model, tmp_path):
    """One epoch, one minibatch: the update's logprobs equal the rollout's, so nothing is clipped."""
    from arlecli.types import Score

    logs = []
    train_ppo(
        str(tiny_model),
        len(PROMPTS),
        _episodes,
        lambda episodes, idx: [Score(reward=float(i), correct=i == 0) for i in idx],
        output_dir=tmp_path / "run",
        max_steps=1,
        learning_rate=1e-3,
        lora_rank=0,
        num_generations=2,
        temperature=1.0,
        seed=0,
        save_steps=0,
        resume=False,
        params={"prompts_per_step": 2, "ppo_epochs": 1},
        on_log=logs.append,
    )
    (log,) = logs
    assert log["clip_fraction"] == 0.0 and log["approx_kl"] < 1e-10
    assert log["accuracy"] == 0.5 and log["reward"] == 0.5  # prompts 0 and 1, two samples each
    assert not any(p.name.startswith("checkpoint-") for p in (tmp_path / "run").iterdir())
