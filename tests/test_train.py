"""`arle train` on the tiny model, CPU: GRPO/RLOO/PPO (full and LoRA), resume after kill -9,
the reward adapter against the eval, and `--set` validation."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest
import yaml

from arlecli.rewards import register
from arlecli.types import Score

from helpers.train import (
    TINY,
    arle,
    assert_trained,
    kill_after_first_checkpoint,
    steps_in,
    train_in_process,
    varied_card,
)

ROOT = Path(__file__).resolve().parents[1]
# The same step shape for PPO: one prompt x 2 completions.
TINY_PPO = [*TINY[:-1], "prompts_per_step=1"]


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
def test_two_steps_change_weights_and_final_loads_in_eval(tmp_path, tiny_model, algo, lora):
    run = tmp_path / "run"
    t0 = time.monotonic()
    train_in_process(
        str(varied_card(tmp_path)),
        "--algo",
        algo,
        "--model",
        str(tiny_model),
        *(TINY_PPO if algo == "ppo" else TINY),
        "--max-steps",
        "2",
        "--lora-rank",
        str(lora),
        "--learning-rate",
        "1e-3",
        "--eval-limit",
        "2",
        "--set",
        "eval_max_tokens=8",
        "--output",
        str(run),
    )
    train_s = time.monotonic() - t0

    assert steps_in(run / "metrics.jsonl") == [1, 2]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all("reward" in r and "accuracy" in r for r in rows)
    assert all(math.isfinite(r.get("loss", r.get("policy_loss"))) for r in rows), rows
    assert len((run / "rewards.jsonl").read_text().splitlines()) == 4  # 2 steps x 1 prompt x 2 completions
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 2 and summary["before"]["label"] == "step-0"
    assert (run / "eval" / "step-0" / "results.json").exists() and (run / "eval" / "step-2" / "results.json").exists()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["algo"] == algo and meta["options"]["lora_rank"] == lora

    final = run / "final"
    assert_trained(final, tiny_model, lora)

    out = arle(
        "eval",
        "countdown",
        "--model",
        str(final),
        "--limit",
        "2",
        "--max-tokens",
        "8",
        "--output",
        str(tmp_path / "eval"),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["n_tasks"] == 2
    print(f"{algo} lora={lora}: train {train_s:.1f} s")


def test_kill_after_first_checkpoint_then_resume(tmp_path, tiny_model, capsys):
    card = str(varied_card(tmp_path))  # a reward that moves the weights, so resuming has state to get right
    common = [
        card,
        "--model",
        str(tiny_model),
        *TINY,
        "--max-steps",
        "3",
        "--save-steps",
        "1",
        "--learning-rate",
        "1e-3",
        "--eval-limit",
        "1",
        "--set",
        "eval_max_tokens=4",
    ]
    run = tmp_path / "run"
    kill_after_first_checkpoint(["train", *common, "--output", str(run)], run, steps=3)

    capsys.readouterr()
    train_in_process(*common, "--output", str(run), "--resume")  # in-process: one import of trl saved
    assert "resuming from checkpoint-" in capsys.readouterr().err
    state = json.loads((run / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert steps_in(run / "metrics.jsonl") == [1, 2, 3]
    # Each step scored its 2 completions once: a step redone after the resume would add lines.
    assert sorted(steps_in(run / "rewards.jsonl")) == [1, 1, 2, 2, 3, 3]
    assert (run / "final").is_dir() and json.loads((run / "summary.json").read_text())["global_step"] == 3
    # The step-0 evaluation finished before the kill and was not redone.
    assert len((run / "eval" / "step-0" / "samples.jsonl").read_text().splitlines()) == 1

    # Weights, optimizer, RNG and data position all came back: the resumed run sampled the
    # same prompts and the same completions as a run that was never interrupted.
    train_in_process(*common, "--output", str(tmp_path / "straight"))
    sampled = lambda r: [
        (x["step"], x["task_id"], x["completion"])
        for x in map(json.loads, (r / "rewards.jsonl").read_text().splitlines())
    ]
    assert sampled(run) == sampled(tmp_path / "straight")


def test_ppo_evaluates_every_n_prunes_checkpoints_and_reports(tmp_path, tiny_model, monkeypatch):
    import types

    logged: list[tuple[int, dict]] = []
    finished: list[bool] = []
    run_obj = types.SimpleNamespace(
        log=lambda row, step: logged.append((step, row)), finish=lambda: finished.append(True)
    )
    fake_wandb = types.ModuleType("wandb")
    fake_wandb.init = lambda **kwargs: run_obj
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)  # no account, no network

    run = tmp_path / "run"
    train_in_process(
        str(varied_card(tmp_path)),
        "--algo",
        "ppo",
        "--model",
        str(tiny_model),
        *TINY_PPO,
        "--max-steps",
        "3",
        "--save-steps",
        "1",
        "--set",
        "save_total_limit=1",
        "--eval-every",
        "2",
        "--eval-limit",
        "1",
        "--set",
        "eval_max_tokens=4",
        "--report-to",
        "wandb",
        "--output",
        str(run),
    )
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-3"]
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["step-0", "step-2", "step-3"]
    assert set(json.loads((run / "summary.json").read_text())["evals"]) == {"step-0", "step-2", "step-3"}
    assert [step for step, _ in logged] == [1, 2, 3] and "train/reward" in logged[0][1]
    assert finished == [True]


def test_reward_adapter_gives_the_eval_reward(tmp_path):
    """Same episodes, same numbers: the eval (through the OpenAI engine and a fake server) and
    the training adapter (TRL's call shape) over the episodes the one producer (`collect`)
    gives for the same tasks, on a chat card and on a completion card with stop strings."""
    from helpers.fake_openai import FakeOpenAIServer

    from arlecli.data.sources import load_rows, tasks_from_rows
    from arlecli.engine import make_engine
    from arlecli.eval import EvalOptions, load_tasks, run_eval
    from arlecli.cards import render_prompt
    from arlecli.envs.episodes import Sampling, collect
    from arlecli.models import resolve_model
    from arlecli.catalog import load_card
    from arlecli.train.reward import CardReward

    def countdown_reply(body: dict) -> str:
        q = body["messages"][-1]["content"]
        row = next(r for r in rows if r["question"] in q)
        i = int(row["id"].rsplit("-", 1)[1])
        return [
            f"Easy. <answer>{row['answer']}</answer>",
            f"<answer>{row['answer']} + 1</answer>",
            f"{row['answer']}",
            "no idea",
        ][i % 4]

    gsm_rows = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(6)]

    def gsm_reply(body: dict) -> str:
        i = int(body["prompt"].rsplit("What is ", 1)[1].split()[0])
        # After the stop string the text must not count: the eval cuts it, so must training.
        return [f" {i + 1}\n\nQuestion: and 7? #### 7", f" #### {i + 1}", f" {i}", " 99 Question: 5"][i % 4]

    cases = []
    card = load_card("countdown")
    rows = load_rows(card, "test", limit=8)
    cases.append((card, countdown_reply, EvalOptions(limit=8, num_fewshot=0), None))
    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in gsm_rows))
    cases.append((load_card("gsm8k"), gsm_reply, EvalOptions(num_fewshot=0, data=str(data)), gsm_rows))

    for card, reply, opts, raw_rows in cases:
        with FakeOpenAIServer(reply) as srv:
            engine = make_engine(resolve_model(None, base_url=srv.base_url), concurrency=4)
            run_eval(card, engine, opts, model="fake", run_dir=tmp_path / card.name)
            tasks, exemplars = load_tasks(card, opts)
            draws = [(i, 0) for i in range(len(tasks))]
            episodes = [None] * len(tasks)
            for j, episode in collect(card, engine, tasks, exemplars, draws, Sampling(seed=opts.seed)):
                episodes[j] = episode
        samples = {s["task_id"]: s for s in map(json.loads, (tmp_path / card.name / "samples.jsonl").open())}
        if raw_rows is not None:
            assert [t.id for t in tasks] == [t.id for t in tasks_from_rows(card, raw_rows)]
        prompts = [render_prompt(card.prompt, t, exemplars) for t in tasks]
        adapter = CardReward(card, tasks, tmp_path)
        # TRL's own decoding of the ids (uncut: it knows no stop strings) is not what is scored.
        completions = [reply({"messages": p} if isinstance(p, list) else {"prompt": p}) for p in prompts]
        logged = []
        rewards = adapter(
            prompts,
            completions,
            task_index=list(range(len(tasks))),
            episode=episodes,
            log_metric=lambda name, value: logged.append((name, value)),  # noqa: B023 (called within this iteration)
        )
        assert rewards == [samples[t.id]["reward"] for t in tasks]
        assert 0 < sum(rewards) < len(rewards), "the cases must mix right and wrong answers"
        accuracy = sum(samples[t.id]["correct"] for t in tasks) / len(tasks)
        assert logged == [("accuracy", accuracy)]
        lines = [json.loads(line) for line in (tmp_path / "rewards.jsonl").read_text().splitlines()][-len(tasks) :]
        assert [line["completion"] for line in lines] == [samples[t.id]["completion"] for t in tasks]
        (tmp_path / "rewards.jsonl").unlink()


@register("test_flaky")
def _flaky_reward():
    """Raises on the task with id "bad" (with a lone surrogate in the message), else right."""

    def score(task, episode):
        if task.id == "bad":
            raise ValueError("no \udcff here")
        return Score(1.0, True, episode.completion, {})

    return score


def test_the_training_reward_scores_a_raising_sample_wrong_and_writes_valid_utf8(tmp_path):
    # One completion whose reward raises must not kill the step (and every step after it): it
    # scores 0 with the error, and rewards.jsonl stays valid UTF-8 whatever the model wrote.
    from dataclasses import replace

    from arlecli.catalog import load_card
    from arlecli.train.reward import CardReward
    from arlecli.types import Episode, Task, Turn

    card = replace(load_card("gsm8k"), reward="test_flaky", reward_params={})
    tasks = [Task("ok", "q", "1"), Task("bad", "q", "2")]
    episodes = [Episode(t.id, [Turn("q", f"answer \ud800 {t.id}")]) for t in tasks]
    adapter = CardReward(card, tasks, tmp_path)
    rewards = adapter(["q", "q"], ["x", "y"], task_index=[0, 1], episode=episodes)
    assert rewards == [1.0, 0.0]
    lines = [json.loads(line) for line in (tmp_path / "rewards.jsonl").read_bytes().decode("utf-8").splitlines()]
    assert [line["task_id"] for line in lines] == ["ok", "bad"]
    assert lines[0]["completion"] == "answer \ud800 ok"  # escaped in the file, the same string read back
    assert lines[1]["correct"] is False and lines[1]["details"] == {"reward_error": "ValueError: no \ufffd here"}


def test_unknown_set_key_is_a_one_line_error():
    out = arle("train", "countdown", "--set", "lerning_rate=1e-5")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert "lerning_rate" in out.stderr and "learning_rate" in out.stderr


def test_recipes_resolve():
    from arlecli.train.config import load_recipe, resolve

    names = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    assert {"countdown-grpo-cpu", "gsm8k-grpo", "finqa-grpo", "mbpp-grpo"} <= set(names)
    for name in names:
        path, data = load_recipe(name)
        cfg = resolve(data, {}, {"max_steps": 3}, recipe_name=str(path))
        assert cfg.options.benchmark and cfg.trainer["max_steps"] == 3


def test_settings_layers_and_values():
    from arlecli.errors import UserError
    from arlecli.train.config import parse_set, resolve

    recipe = {"benchmark": "countdown", "max_steps": 7, "beta": 0.1, "lora_rank": 8}
    cfg = resolve(
        recipe,
        {"max_steps": 5, "lora_rank": None},
        parse_set(["learning_rate=1e-5", "save_total_limit=null", "loss-type=dr_grpo", "beta=0"]),
    )
    assert cfg.trainer["max_steps"] == 5  # a flag beats the recipe
    assert cfg.options.lora_rank == 8  # an unset flag does not
    assert cfg.trainer["learning_rate"] == 1e-5 and isinstance(cfg.trainer["learning_rate"], float)
    assert cfg.trainer["save_total_limit"] is None and cfg.trainer["loss_type"] == "dr_grpo"
    assert cfg.trainer["beta"] == 0.0 and isinstance(cfg.trainer["beta"], float)
    with pytest.raises(UserError, match="loss_type.*rloo|rloo.*loss_type"):
        resolve({"loss_type": "dapo"}, {"algo": "rloo"}, {})  # a GRPO-only field
    with pytest.raises(UserError, match="--output"):
        resolve({}, {}, {"output_dir": "x"})
    with pytest.raises(UserError, match="must be a number"):
        resolve({}, {}, {"beta": "high"})


def test_ppo_trains_on_a_multi_turn_game(tmp_path, tiny_model, monkeypatch):
    """`arle train frozenlake --algo ppo`: whole episodes from the env driver; the env's boards
    are attended to but are no actions (PPO's mask is 0 on them)."""
    import arlecli.train.ppo as ppo

    batches = []
    score = ppo.score_rollout

    def recording(policy, episodes, indices, temperature, micro, **kwargs):
        batch = score(policy, episodes, indices, temperature, micro, **kwargs)
        batches.append(batch)
        return batch

    monkeypatch.setattr(ppo, "score_rollout", recording)
    card = yaml.safe_load((ROOT / "benchmarks" / "frozenlake.yaml").read_text())
    card["env"] = {"name": "frozenlake", "params": {"max_turns": 3}}  # 3 turns are multi-turn; 20 only cost time
    card["fixture"] = str(ROOT / "benchmarks" / card["fixture"])
    (tmp_path / "frozenlake.yaml").write_text(yaml.safe_dump(card))
    run = tmp_path / "run"
    train_in_process(
        str(tmp_path / "frozenlake.yaml"),
        "--algo",
        "ppo",
        "--model",
        str(tiny_model),
        *TINY_PPO,
        "--max-tokens",
        "6",
        "--max-steps",
        "2",
        "--eval-limit",
        "1",
        "--set",
        "eval_max_tokens=4",
        "--output",
        str(run),
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["policy_loss"]) for r in rows)
    lines = [json.loads(line) for line in (run / "rewards.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(x["end_reason"] and x["turns"] >= 1 for x in lines)
    assert len(batches) == 2
    from arlecli.train.batches import flatten_episode

    for batch in batches:
        for r, episode in enumerate(batch.episodes):
            _, completion, env_mask, _ = flatten_episode(episode)  # every segment, seams included
            attended = int(batch.attention_mask[r, batch.prompt_len :].sum())
            assert batch.mask[r, : len(env_mask)].tolist() == env_mask and int(batch.mask[r].sum()) == sum(env_mask)
            assert (
                attended == len(completion) and batch.sequences[r, batch.prompt_len :][:attended].tolist() == completion
            )
    # The boards between turns are in the sequences, attended to and masked out of the loss.
    assert any(0 in flatten_episode(e)[2] for b in batches for e in b.episodes), "the test needs multi-turn episodes"
    assert (run / "final" / "model.safetensors").exists()
