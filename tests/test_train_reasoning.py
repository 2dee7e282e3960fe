"""Training reasoning models (issue 24, items 4-5), CPU, tiny models: thinking trained as
generated, forced tokens and cut samples out of the loss (overlong filtering), the soft overlong
punishment, clip-higher and the token-level loss in the TRL config, dynamic sampling (an
all-equal group dropped, refilled and counted), a two-stage context-lengthening recipe (the
second stage resumes the first), and a 3-turn tool episode under a template that drops earlier
turns' thinking, every turn trained on the prompt it was generated from."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from arlecli.rewards import register
from arlecli.types import Episode, Score, Task, Turn

from helpers.scripted_engine import continue_script
from helpers.train import train_in_process, varied_card

ROOT = Path(__file__).resolve().parents[1]
GSM8K_ROWS = str(ROOT / "benchmarks" / "fixtures" / "gsm8k.jsonl")
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "14 + 9 - 17"}}\n</tool_call>'
FLAT_TASKS: set[str] = set()  # the tasks test_one_flat_task scores the same whatever the model says


@register("test_one_flat_task")
def _one_flat_task():
    """0.5 for every completion of a task in FLAT_TASKS (a group with zero advantage); for any
    other task a value that differs between distinct completions (a hash of the text)."""

    def score(task, episode) -> Score:
        if task.id in FLAT_TASKS:
            return Score(reward=0.5, correct=False)
        digest = hashlib.sha256(episode.completion.encode()).digest()
        return Score(reward=int.from_bytes(digest[:4], "little") / 2**32, correct=False)

    return score


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def card_with_reward(tmp_path: Path, name: str, reward: str) -> Path:
    data = yaml.safe_load((ROOT / "benchmarks" / "countdown.yaml").read_text())
    data.update(name=name, reward={"name": reward}, metrics=["accuracy"])
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def scripted(monkeypatch, reply) -> None:
    """hf's generate answers request i of a call (at turn k) with `reply(i, k)` when that gives
    a text, as a model that writes that text then EOS would (scripted_engine.continue_script:
    cut at stops and budgets, each phase of engine.phases continued through `then`); the
    model's own otherwise."""
    from arlecli.engine import hf

    original = hf.HFEngine.generate

    def generate(self, requests, then=None):
        own = []
        for i, request in enumerate(requests):
            text = reply(i, sum(m["role"] == "assistant" for m in request.messages or []))
            if text is None:
                own.append(i)
                continue
            script = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            prompt = self.encode(request)
            while True:
                done = len(self.encode(request)) - len(prompt)
                comp = continue_script(self.tokenizer, script[done:], request.params, self.encode(request))
                follow = then(i, comp) if then is not None else None
                if follow is None:
                    break
                request = follow
            yield i, comp
        chained = (lambda j, comp: then(own[j], comp)) if then is not None else None
        for j, comp in original(self, [requests[i] for i in own], then=chained):
            yield own[j], comp

    monkeypatch.setattr(hf.HFEngine, "generate", generate)


def recording_trainer(monkeypatch, **overrides) -> None:
    """Wrap the GRPO trainer class (train.grpo.with_rollouts) with `overrides`: name -> function
    (self, original bound method, *args, **kwargs)."""
    import arlecli.train.grpo as grpo

    wrap = grpo.with_rollouts

    def recording(base):
        cls = wrap(base)
        methods = {}
        for name, fn in overrides.items():

            def method(self, *args, _name=name, _fn=fn, **kwargs):
                return _fn(self, getattr(super(sub, self), _name), *args, **kwargs)

            methods[name] = method
        sub = type(cls.__name__, (cls,), methods)
        return sub

    monkeypatch.setattr(grpo, "with_rollouts", recording)


# ---------------------------------------------------------------------------------------------
# Sequences: thinking, forced tokens, cut samples


def test_forced_tokens_carry_no_loss_and_thinking_is_trained():
    from arlecli.train.batches import Sequences, flatten_episode

    # A thought closed by budget forcing: the engine wrote token 13 (`</think>`), the model the rest.
    turn = Turn(
        "q",
        "42",
        prompt_token_ids=[1, 2],
        token_ids=[10, 11, 12, 13, 14, 15],
        logprobs=[-0.5] * 6,
        thinking="a long thought",
        thinking_tokens=4,
        forced=[3],
    )
    flat = flatten_episode(Episode("t", [turn]))
    assert flat.completion_ids == [10, 11, 12, 13, 14, 15]  # the thinking is part of what trains
    assert flat.env_mask == [1, 1, 1, 0, 1, 1] and flat.segment == [0] * 6
    seqs = Sequences.of([Episode("t", [turn])], end_id=0)
    assert seqs.env_mask == [[1, 1, 1, 0, 1, 1]] and not seqs.seamed


def test_overlong_filtering_masks_cut_episodes_only():
    from arlecli.train.dapo import DAPOOptions, is_cut
    from arlecli.train.batches import Rollouts, Sequences

    done = Turn("q", "42", prompt_token_ids=[1], token_ids=[5, 6], thinking="t")
    budget = Turn(
        "q", "", prompt_token_ids=[1], token_ids=[5, 6], finish_reason="length", thinking="t", thinking_cut=True
    )
    no_answer = Turn("q", "", prompt_token_ids=[1], token_ids=[5, 6], thinking="t", thinking_cut=True)
    episodes = [Episode("a", [done]), Episode("b", [budget]), Episode("c", [no_answer])]
    assert [is_cut(e) for e in episodes] == [False, True, True]
    rollouts = Rollouts(None, [], None, None, None, dapo=DAPOOptions(overlong_filter=True))  # type: ignore[arg-type]
    seqs = Sequences.of(episodes, 0).without_loss([rollouts.no_loss(e) for e in episodes])
    assert seqs.env_mask == [[1, 1], [0, 0], [0, 0]]
    assert seqs.completion_ids == [[5, 6]] * 3  # the tokens stay: attended to, not trained


def test_soft_overlong_punishment_and_its_rewards_lines(tmp_path):
    from arlecli.catalog import load_card
    from arlecli.train.dapo import DAPOOptions, overlong_penalty
    from arlecli.train.reward import CardReward

    # DAPO eq. 13 with L_max 20, L_cache 4: nothing up to 16 tokens, then linear to -factor.
    assert [overlong_penalty(n, 20, 4, 1.0) for n in (10, 16, 17, 18, 20, 25)] == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(20, 20, 0, 1.0) == 0.0
    card = load_card("gsm8k")
    task = Task("t1", "q", "#### 6", {"question": "q"})
    short = Episode("t1", [Turn("q", "#### 6", token_ids=[1] * 10)])
    long = Episode("t1", [Turn("q", "#### 6", token_ids=[1] * 18, finish_reason="stop")])
    reward = CardReward(card, [task], tmp_path, shaping=DAPOOptions(overlong_buffer_len=4), max_tokens=20)
    scores = reward.score([short, long], [0, 0], step=1)
    assert [s.reward for s in scores] == [1.0, 0.5] and all(s.correct for s in scores)
    first, second = lines(tmp_path / "rewards.jsonl")
    assert first["reward"] == 1.0 and "overlong_penalty" not in first
    assert second["reward"] == 1.0 and second["overlong_penalty"] == -0.5 and second["trained_reward"] == 0.5
    # Dynamic sampling reads the card's rewards: two right answers of different lengths are an
    # all-equal group (DAPO filters on accuracy), though the penalty tells them apart.
    from arlecli.train.dapo import flat_group

    assert flat_group(scores) and not flat_group([scores[0], Score(0.0, False)])


def test_clip_higher_and_token_level_loss_reach_the_trl_config(tmp_path):
    """The CPU reasoning recipe's DAPO settings: TRL's own (epsilon_high, loss_type) in its
    GRPOConfig, arle's (filtering, punishment, dynamic sampling) in the run's DAPO options."""
    from arlecli.train.config import load_recipe, resolve
    from arlecli.train.grpo import trainer_args

    path, data = load_recipe("reasoning-grpo-cpu")
    cfg = resolve(data, {}, {"loss_type": "bnpo"}, recipe_name=str(path))
    args = trainer_args(cfg.stages[0].config, tmp_path, 32)
    assert (args.epsilon, args.epsilon_high, args.loss_type) == (0.2, 0.28, "bnpo")
    assert cfg.dapo.overlong_filter and cfg.dapo.dynamic_sampling and cfg.dapo.overlong_buffer_len == 8
    assert [s.config.trainer["max_completion_length"] for s in cfg.stages] == [24, 48]
    dapo = resolve({"benchmark": "countdown"}, {}, {"epsilon_high": 0.28})
    assert trainer_args(dapo, tmp_path, 32).epsilon_high == 0.28 and trainer_args(dapo, tmp_path, 32).epsilon == 0.2


def test_bad_dapo_and_stage_settings_are_one_line_errors():
    from arlecli.errors import UserError
    from arlecli.train.config import resolve

    cases = [
        ({}, {"algo": "ppo", "dynamic_sampling": True}, "dynamic_sampling .* grpo and rloo"),
        ({}, {"algo": "rft", "overlong_filter": True}, "rft drops cut episodes"),
        ({}, {"dynamic_sampling": "yes"}, "dynamic_sampling must be true or false"),
        ({}, {"overlong_buffer_len": -1}, "must be >= 0"),
        ({"stages": [{"steps": 0}]}, {}, "needs steps"),
        ({"stages": [{"steps": 2, "learning_rate": 1e-5}]}, {}, "learning_rate, which every stage shares"),
        ({"stages": [{"steps": 2, "max_completion_lenght": 8}]}, {}, "did you mean max_completion_length"),
        ({"stages": {"steps": 2}}, {}, "stages must be a list"),
        ({"algo": "ppo", "stages": [{"steps": 2}]}, {}, "stages resume .* grpo and rloo"),
    ]
    for recipe, sets, message in cases:
        with pytest.raises(UserError, match=message):
            resolve({"benchmark": "countdown", **recipe}, {}, sets, recipe_name="r.yaml")
    staged = {
        "benchmark": "countdown",
        "stages": [{"steps": 3, "max_completion_length": 4}, {"steps": 5, "max_completion_length": 8}],
    }
    cfg = resolve(staged, {"max_steps": 4}, {"temperature": 0.7})  # a flag cuts the plan short
    assert [(s.end, s.config.trainer["max_completion_length"]) for s in cfg.stages] == [(3, 4), (4, 8)]
    assert cfg.trainer["max_steps"] == 4 and all(s.config.trainer["temperature"] == 0.7 for s in cfg.stages)
    # Each stage's trainer schedules the whole run (its learning rate decays over every stage)
    # and stops at its own end.
    assert [(s.config.trainer["max_steps"], s.config.stop_at) for s in cfg.stages] == [(4, 3), (4, 4)]
    assert [p["steps"] for p in cfg.stage_plan] == [3, 5]  # meta.json keeps the plan as written


def test_rft_rows_carry_their_tokens_as_generated_one_sequence_per_segment():
    from arlecli.train.rft import token_sequences, trajectory
    from arlecli.train.sft import IGNORE, sft_dataset

    # Turn 2's prompt was rendered without turn 1's thinking (ids 7, 8): a seam.
    first = Turn(
        [{"role": "user", "content": "q"}],
        "call",
        prompt_token_ids=[1, 2],
        token_ids=[7, 8, 9, 3],
        thinking="t",
        forced=[1],
        observation=[{"role": "user", "content": "r"}],
    )
    second = Turn([], "42", prompt_token_ids=[1, 2, 9, 3, 4], token_ids=[5, 3])
    episode = Episode("t", [first, second], info={"seams": [1]})
    assert token_sequences(episode) == [
        {"input_ids": [1, 2, 7, 8, 9, 3], "completion_mask": [0, 0, 1, 0, 1, 1]},
        {"input_ids": [1, 2, 9, 3, 4, 5, 3], "completion_mask": [0, 0, 0, 0, 0, 1, 1]},
    ]
    said = trajectory(episode, Task("t", "q", "42"), 0, Score(1.0, True), benchmark="b", run="r", model="m")
    assert said.continuation[0] == {"role": "assistant", "content": "call", "reasoning_content": "t"}
    data = sft_dataset(None, [{"messages": [], "sequences": token_sequences(episode)}])
    assert data[0]["labels"] == [IGNORE, IGNORE, 7, IGNORE, 9, 3] and len(data) == 2


def test_ppo_scores_a_segment_on_its_own_context(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    from arlecli.train.ppo import forward_pass

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    prompt, first, second_prompt, second = [5, 6, 7], [8, 9], [5, 6, 40, 41], [42, 43, 44]
    row = torch.tensor([prompt + first + second_prompt + second])
    segment = torch.tensor([[0] * 2 + [1] * 7])
    with torch.no_grad():
        logprobs, _, _ = forward_pass(model, None, row, torch.ones_like(row), 3, 1.0, segment=segment)

        def alone(context, tokens):
            ids = torch.tensor([context + tokens])
            logits = model(input_ids=ids).logits[0, len(context) - 1 : -1]
            return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]

        assert torch.allclose(logprobs[0, :2], alone(prompt, first), atol=1e-5)
        assert torch.allclose(logprobs[0, 6:], alone(second_prompt, second), atol=1e-5)
        # Not what the row before it would give: the seam is real.
        assert not torch.allclose(logprobs[0, 6:], alone(prompt + first + second_prompt, second), atol=1e-3)


# ---------------------------------------------------------------------------------------------
# GRPO runs on the tiny models


def test_grpo_trains_the_thinking_and_filters_cut_samples(tmp_path, tiny_thinking_model, monkeypatch):
    """The tiny thinking model's thoughts never close on their own. Row 0 of each rollout closes
    its thought and answers (kept, its thinking among the trained tokens); row 1 stops inside
    its thought (no answer); the others run out of tokens inside it: with overlong_filter those
    two kinds carry no loss (env_mask 0, asserted on the batch TRL trains on)."""
    thought = "I think it is 42"
    scripted(monkeypatch, lambda i, k: {0: f"{thought}\n</think>\n\n42", 1: "hmm"}.get(i % 4))
    batches: list[tuple[Any, list[Episode]]] = []

    def generate_and_score(self, original, inputs):
        out = original(inputs)
        batches.append((out, list(self.arle_seqs.episodes)))
        return out

    recording_trainer(monkeypatch, _generate_and_score_completions=generate_and_score)
    run = tmp_path / "run"
    train_in_process(
        str(varied_card(tmp_path)),
        "--model",
        str(tiny_thinking_model),
        "--limit",
        "2",
        "--num-generations",
        "2",
        "--max-tokens",
        "16",
        "--max-steps",
        "1",
        "--eval-limit",
        "0",
        "--set",
        "per_device_train_batch_size=4",
        "--set",
        "overlong_filter=true",
        "--output",
        str(run),
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_thinking_model))
    ((out, episodes),) = batches
    mask = (out["completion_mask"] * out["tool_mask"]).tolist()
    kinds = []
    for r, episode in enumerate(episodes):
        turn = episode.turns[0]
        n = len(turn.token_ids)
        if turn.thinking_cut:
            assert sum(mask[r]) == 0, f"row {r} was cut ({turn.finish_reason}) and must carry no loss"
            kinds.append("stop" if turn.finish_reason == "stop" else "length")
        else:
            assert mask[r][:n] == [1] * n and turn.completion == "42" and turn.thinking == thought
            assert thought in tok.decode(out["completion_ids"][r][:n].tolist())  # the thinking is trained
            kinds.append("answered")
    assert kinds == ["answered", "stop", "length", "length"]
    verdicts = lines(run / "rewards.jsonl")
    assert sorted(v["thinking_cut"] for v in verdicts) == [False, True, True, True]
    (row,) = lines(run / "metrics.jsonl")
    generated = sum(len(e.turns[0].token_ids) for e in episodes) / 4
    assert row["overlong/filtered_share"] == 0.75 and row["completions/generated_mean_length"] == generated


def test_dynamic_sampling_drops_an_all_equal_group_refills_it_and_counts_it(tmp_path, tiny_model, monkeypatch):
    """Two tasks per step; every completion of task 0 scores 0.5, so its group has zero
    advantage: it is dropped, a second group of task 1 takes its place (new samples), and
    metrics.jsonl counts it (1 dropped group, a third of the step's tokens)."""
    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.catalog import load_card

    card = card_with_reward(tmp_path, "countdown_flat", "test_one_flat_task")
    tasks, _ = load_tasks(load_card(str(card)), EvalOptions(split="train", limit=2))
    FLAT_TASKS.clear()
    FLAT_TASKS.add(tasks[0].id)
    trained: list[tuple[list[int], list[float]]] = []

    def rollout(self, original):
        seqs = original()
        trained.append((list(seqs.indices), [float(s.reward) for s in seqs.scores]))
        return seqs

    recording_trainer(monkeypatch, arle_rollout=rollout)
    run = tmp_path / "run"
    train_in_process(
        str(card),
        "--model",
        str(tiny_model),
        "--limit",
        "2",
        "--num-generations",
        "2",
        "--max-tokens",
        "8",
        "--max-steps",
        "1",
        "--eval-limit",
        "0",
        "--set",
        "per_device_train_batch_size=4",
        "--set",
        "dynamic_sampling=true",
        "--output",
        str(run),
    )
    ((indices, rewards),) = trained
    assert indices == [1, 1, 1, 1] and len(set(rewards)) == 4  # two groups of task 1, every reward differs
    verdicts = lines(run / "rewards.jsonl")
    assert len(verdicts) == 6 and all(v["step"] == 1 for v in verdicts)
    assert sorted((v["task_index"], v["dropped"]) for v in verdicts) == [(0, True), (0, True)] + [(1, False)] * 4
    (row,) = lines(run / "metrics.jsonl")
    assert row["dynamic_sampling/dropped_groups"] == 1 and row["dynamic_sampling/sampled_groups"] == 3
    assert row["dynamic_sampling/refill_rounds"] == 1 and row["dynamic_sampling/unfilled_groups"] == 0
    assert row["dynamic_sampling/dropped_token_share"] == pytest.approx(1 / 3)
    assert row["frac_reward_zero_std"] == 0.0  # the batch trained on has no zero-advantage group


def test_a_two_stage_recipe_resumes_the_first_stage(tmp_path, tiny_model, monkeypatch):
    """Stage 1 (4 tokens a turn) then stage 2 (8 tokens): one run directory, steps 1 then 2,
    the second stage's trainer starting from the first stage's checkpoint (step and weights)."""
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    import arlecli.train.grpo as grpo

    starts: list[tuple[int, int, dict]] = []
    schedules: list[int] = []
    build = grpo.build_trainer

    class Snapshot(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
            starts.append((state.global_step, args.max_completion_length, weights))
            schedules.append(args.max_steps)  # the learning rate's schedule spans both stages

    monkeypatch.setattr(grpo, "build_trainer", lambda *a, **kw: build(*a[:-1], [*a[-1], Snapshot()], **kw))
    recipe = {
        "benchmark": str(varied_card(tmp_path)),
        "model": str(tiny_model),
        "limit": 4,
        "eval_limit": 0,
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "learning_rate": 1e-3,
        "stages": [
            {"name": "short", "steps": 1, "max_completion_length": 4},
            {"name": "long", "steps": 1, "max_completion_length": 8},
        ],
    }
    (tmp_path / "staged.yaml").write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    train_in_process("--recipe", str(tmp_path / "staged.yaml"), "--output", str(run))

    assert [(step, budget) for step, budget, _ in starts] == [(0, 4), (1, 8)] and schedules == [2, 2]
    rows = lines(run / "metrics.jsonl")
    assert [(r["step"], r["stage"], r["completions/mean_length"]) for r in rows] == [
        (1, "short", 4.0),
        (2, "long", 8.0),
    ]
    saved = load_file(str(run / "checkpoint-1" / "model.safetensors"))
    base = load_file(str(tiny_model / "model.safetensors"))
    stage2 = starts[1][2]
    assert all(stage2[k].equal(saved[k]) for k in saved), "stage 2 must start from stage 1's checkpoint"
    assert any(not saved[k].equal(base[k]) for k in saved), "stage 1 must have changed the weights"
    assert all(starts[0][2][k].equal(base[k]) for k in base)
    meta = json.loads((run / "meta.json").read_text())
    assert [s["name"] for s in meta["stages"]] == ["short", "long"] and meta["trainer"]["max_steps"] == 2
    assert json.loads((run / "summary.json").read_text())["global_step"] == 2
    assert (run / "checkpoint-2").is_dir() and (run / "final" / "model.safetensors").exists()


@pytest.mark.parametrize("algo", ["grpo", "rloo"])
def test_a_three_turn_tool_episode_trains_every_turn_on_the_prompt_it_saw(
    tmp_path, tiny_thinking_model, monkeypatch, algo
):
    """math_tool on the tiny thinking model (its template drops earlier turns' thinking): turns 1
    and 2 think and call the calculator (scripted), turn 3 is the model's own. Every turn's
    prompt rewrites the history (two seams), so each turn is a segment of its own; the loss's
    logprobs of every assistant token equal the model's on exactly that turn's prompt (GRPO
    and RLOO; PPO's scoring is test_ppo_scores_a_segment_on_its_own_context's)."""
    import torch

    thought = "I add the numbers first"
    scripted(monkeypatch, lambda i, k: f"{thought}\n</think>\n\n{CALL}" if k < 2 else None)
    checked: list[int] = []

    def logps(self, original, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        out = original(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if not self.arle_generating:  # the loss's forward: compare with each turn on its own prompt
            with torch.no_grad():
                checked.append(
                    check_turns(model, self.processing_class, input_ids, logits_to_keep, out[0], self.arle_seqs)
                )
        return out

    recording_trainer(monkeypatch, _get_per_token_logps_and_entropies=logps)
    card = yaml.safe_load((ROOT / "benchmarks" / "math_tool.yaml").read_text())
    card["source"] = {"kind": "files", "path": GSM8K_ROWS}
    (tmp_path / "math_tool.yaml").write_text(yaml.safe_dump(card))
    run = tmp_path / "run"
    train_in_process(
        str(tmp_path / "math_tool.yaml"),
        "--algo",
        algo,
        "--model",
        str(tiny_thinking_model),
        "--limit",
        "1",
        "--num-generations",
        "2",
        "--max-tokens",
        "72",
        "--max-steps",
        "1",
        "--eval-limit",
        "0",
        "--set",
        "per_device_train_batch_size=2",
        "--output",
        str(run),
    )
    assert checked == [6]  # 2 episodes x 3 turns, each compared token by token
    for line in lines(run / "rewards.jsonl"):
        assert line["turns"] == 3 and line["env_info"]["seams"] == [1, 2] and line["env_info"]["tool_calls"] == 2


def check_turns(model: Any, tok: Any, input_ids: Any, logits_to_keep: int, logps: Any, seqs: Any) -> int:
    """Assert that each row's logprobs at each turn's own tokens are the model's on that turn's
    prompt alone, that the row's context for the turn is that prompt exactly, and that the loss
    mask covers the model's tokens and nothing else; return the number of turns checked."""
    import torch

    from arlecli.train.batches import flatten_episode

    completions = input_ids[:, -logits_to_keep:].tolist()
    seen = 0
    for r, row in enumerate(completions):
        (e,) = [e for e, ids in zip(seqs.episodes, seqs.completion_ids) if row[: len(ids)] == ids]
        flat = flatten_episode(e)
        assert e.info["seams"] == [1, 2] and set(flat.segment) == {0, 1, 2}
        assert input_ids[r, :-logits_to_keep].tolist()[-len(flat.prompt_ids) :] == e.turns[0].prompt_token_ids
        pos = 0
        for k, turn in enumerate(e.turns):
            prompt, own = turn.prompt_token_ids, turn.token_ids
            if k:  # a seam: the row holds this turn's whole prompt, as the template rendered it
                assert row[pos : pos + len(prompt)] == prompt
                assert "I add the numbers" not in tok.decode(prompt)  # the template dropped the thought
                assert "I add the numbers" in tok.decode(e.turns[k - 1].token_ids)  # trained in its own turn
                pos += len(prompt)
            assert row[pos : pos + len(own)] == own and flat.env_mask[pos : pos + len(own)] == [1] * len(own)
            logits = model(input_ids=torch.tensor([prompt + own], device=input_ids.device)).logits[0]
            expected = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1)
            expected = expected.gather(-1, torch.tensor(own, device=input_ids.device)[:, None])[:, 0]
            assert torch.allclose(logps[r, pos : pos + len(own)].float(), expected, atol=1e-4), f"turn {k + 1}"
            pos += len(own)
            seen += 1
        assert sum(flat.env_mask) == sum(len(t.token_ids) for t in e.turns)
    return seen
