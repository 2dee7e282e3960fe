"""`arle train --algo rft` on the tiny model, CPU: a round of sample -> keep -> SFT (full and
LoRA), kept rows against the reward's verdicts, a round that keeps nothing, resume after kill -9."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from helpers.train import arle, assert_trained, kill_after_first_checkpoint, steps_in, train_in_process

ROOT = Path(__file__).resolve().parents[1]

# The random tiny model writes gibberish; this reward accepts about half of it (an even number
# of distinct characters), so a round keeps some samples and drops others.
REWARD_PY = """
from arlecli.types import Score

def even_chars():
    def score(task, episode):
        n = len(set(episode.completion))
        return Score(reward=n / 20, correct=n > 0 and n % 2 == 0, extracted=n, details={})
    return score
"""

# 2 tasks x 2 samples, 8 new tokens each, held-out evals of 2 tasks. The tiny model's gibberish
# runs to the token limit, so these runs keep cut episodes (keep_cut; the default drops them,
# tested on its own below).
TINY = [
    "--limit",
    "2",
    "--num-generations",
    "2",
    "--set",
    "tasks_per_round=2",
    "--max-tokens",
    "8",
    "--set",
    "per_device_train_batch_size=2",
    "--eval-limit",
    "2",
    "--set",
    "eval_max_tokens=8",
    "--set",
    "keep_cut=true",
]


def rft_card(tmp_path: Path) -> Path:
    """The countdown card (same generator, prompt, splits) scored by a file reward next to it."""
    data = yaml.safe_load((ROOT / "benchmarks" / "countdown.yaml").read_text())
    data.pop("fixture", None)
    data.update(name="countdown_even", reward={"name": "even_chars.py:even_chars"}, metrics=["accuracy"])
    (tmp_path / "even_chars.py").write_text(REWARD_PY)
    path = tmp_path / "countdown_even.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_one_round_keeps_what_the_reward_accepts_and_trains(tmp_path, tiny_model, lora):
    run = tmp_path / "run"
    train_in_process(
        str(rft_card(tmp_path)),
        "--algo",
        "rft",
        "--model",
        str(tiny_model),
        *TINY,
        "--set",
        "rounds=1",
        "--max-steps",
        "2",
        "--set",
        "num_train_epochs=2",
        "--lora-rank",
        str(lora),
        "--learning-rate",
        "1e-3",
        "--output",
        str(run),
    )

    # Every sample was scored once, with step = round 1; the kept rows are exactly the accepted ones.
    verdicts = lines(run / "rewards.jsonl")
    assert len(verdicts) == 4 and {v["step"] for v in verdicts} == {1}
    rows = lines(run / "checkpoint-1" / "rows.jsonl")
    accepted = sorted((v["task_id"], v["completion"]) for v in verdicts if v["correct"])
    assert sorted((r["task_id"], r["messages"][-1]["content"]) for r in rows) == accepted
    assert 0 < len(rows) < 4, "the fixture reward should accept some samples and reject others"
    for r in rows:
        assert r["messages"][-1]["role"] == "assistant" and r["messages"][0]["role"] in ("system", "user")
        assert r["correct"] is True and r["benchmark"] == "countdown_even" and r["run"] == str(run)
        assert r["sample"] in (0, 1) and r["model"].endswith("@step-0")

    (metric,) = lines(run / "metrics.jsonl")
    assert metric["step"] == metric["round"] == 1
    assert (metric["samples"], metric["kept"]) == (4, len(rows)) and metric["keep_rate"] == len(rows) / 4
    assert metric["sft_steps"] == 2 and math.isfinite(metric["loss"])
    assert metric["accuracy"] == len(rows) / 4
    assert metric["cut"] == sum(v["finish_reason"] == "length" for v in verdicts)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algo"] == "rft" and summary["global_step"] == 1
    assert summary["before"]["label"] == "step-0" and summary["after"]["label"] == "step-1"

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


def test_a_round_that_keeps_nothing_takes_no_step_and_the_run_ends(tmp_path, tiny_model, capsys):
    run = tmp_path / "run"
    # The reward never reaches 99: nothing is kept in either round.
    train_in_process(
        str(rft_card(tmp_path)),
        "--algo",
        "rft",
        "--model",
        str(tiny_model),
        *TINY,
        "--set",
        "rounds=2",
        "--set",
        "min_reward=99",
        "--max-steps",
        "2",
        "--eval-limit",
        "0",
        "--output",
        str(run),
    )
    err = capsys.readouterr().err
    assert "round 1: the reward accepted none of 4 samples; no SFT step" in err
    rows = lines(run / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2] and all(r["kept"] == 0 and r["sft_steps"] == 0 for r in rows)
    assert all(r["loss"] is None for r in rows)
    # Round 2 sampled other seeds: not a copy of round 1.
    verdicts = lines(run / "rewards.jsonl")
    assert [v["step"] for v in verdicts] == [1] * 4 + [2] * 4
    # `arle runs list` counts an rft run in rounds.
    from arlecli.rundir import describe

    info = describe(run)
    assert (info.done, info.expected, info.unit, info.status) == (2, 2, "rounds", "complete")
    # ... and so does its report, which charts the per-round reward and accuracy.
    from arlecli.report import build_report

    assert "2 logged rounds of 2" in build_report([run])
    # The final model is the start model, unchanged.
    from safetensors.torch import load_file

    base, final = load_file(str(tiny_model / "model.safetensors")), load_file(str(run / "final" / "model.safetensors"))
    assert all(final[k].equal(base[k]) for k in base)


def test_kill_mid_run_then_resume_continues_after_the_last_round(tmp_path, tiny_model, capsys):
    common = [
        str(rft_card(tmp_path)),
        "--algo",
        "rft",
        "--model",
        str(tiny_model),
        *TINY,
        "--set",
        "rounds=3",
        "--max-steps",
        "2",
        "--learning-rate",
        "1e-3",
        "--eval-limit",
        "1",
        "--eval-every",
        "2",
    ]
    run = tmp_path / "run"
    kill_after_first_checkpoint(["train", *common, "--output", str(run)], run, steps=3)
    from arlecli.rundir import describe

    info = describe(run)
    assert info.status == "interrupted" and info.note.startswith("resumes from checkpoint-")

    capsys.readouterr()
    train_in_process(*common, "--output", str(run), "--resume")
    assert "resuming from checkpoint-" in capsys.readouterr().err
    assert steps_in(run / "metrics.jsonl") == [1, 2, 3]
    # Each round scored its 4 samples once: a round redone after the resume would add lines.
    assert sorted(steps_in(run / "rewards.jsonl")) == [1] * 4 + [2] * 4 + [3] * 4
    assert (run / "final").is_dir() and json.loads((run / "summary.json").read_text())["global_step"] == 3
    assert len((run / "eval" / "step-0" / "samples.jsonl").read_text().splitlines()) == 1
    summary = json.loads((run / "summary.json").read_text())
    assert sorted(summary["evals"]) == ["step-0", "step-2", "step-3"]  # --eval-every 2: after round 2 too

    # The resumed run sampled what an uninterrupted run samples: weights and seeds came back.
    train_in_process(*common, "--output", str(tmp_path / "straight"))
    sampled = lambda r: [(x["step"], x["task_id"], x["completion"]) for x in lines(r / "rewards.jsonl")]
    assert sampled(run) == sampled(tmp_path / "straight")


def test_more_rounds_on_resume_continue_the_lora_adapter(tmp_path, tiny_model):
    """`--resume --set rounds=2` after a finished 1-round LoRA run: round 2 starts from round 1's
    adapter (loaded trainable) and trains it further; round 1 is not redone."""
    from safetensors.torch import load_file

    common = [
        str(rft_card(tmp_path)),
        "--algo",
        "rft",
        "--model",
        str(tiny_model),
        *TINY,
        "--max-steps",
        "2",
        "--set",
        "num_train_epochs=2",
        "--lora-rank",
        "4",
        "--learning-rate",
        "1e-3",
        "--eval-limit",
        "1",
        "--output",
        str(tmp_path / "run"),
    ]
    run = tmp_path / "run"
    train_in_process(*common, "--set", "rounds=1")
    after_one = load_file(str(run / "final" / "adapter_model.safetensors"))
    assert (run / "checkpoint-1" / "model" / "adapter_config.json").exists()  # round 2 resumes from it
    train_in_process(*common, "--set", "rounds=2", "--resume")
    assert steps_in(run / "metrics.jsonl") == [1, 2] and sorted(steps_in(run / "rewards.jsonl")) == [1] * 4 + [2] * 4
    after_two = load_file(str(run / "final" / "adapter_model.safetensors"))
    assert after_two.keys() == after_one.keys()
    assert any(not after_two[k].equal(after_one[k]) for k in after_one if "lora_B" in k)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 2 and sorted(summary["evals"]) == ["step-0", "step-1", "step-2"]
    assert json.loads((run / "meta.json").read_text())["trainer"]["rounds"] == 2


def test_bad_rft_settings_are_one_line_errors(tmp_path, tiny_model):
    card = str(rft_card(tmp_path))
    out = arle(
        "train",
        card,
        "--algo",
        "rft",
        "--model",
        str(tiny_model),
        "--set",
        "rounds=0",
        "--output",
        str(tmp_path / "run"),
    )
    assert out.returncode == 2 and "rounds must be a whole number >= 1" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    from arlecli.errors import UserError
    from arlecli.train.config import resolve

    with pytest.raises(UserError, match="unknown setting 'beta' for --algo rft"):
        resolve({}, {"algo": "rft"}, {"beta": 0.1})  # a DPO/GRPO field, not SFT's or RFT's
    with pytest.raises(UserError, match="min_reward must be a number"):
        resolve({}, {"algo": "rft"}, {"min_reward": "high"})
    from arlecli.train.launch import LaunchOptions, check

    with pytest.raises(UserError, match="--algo rft runs in one process"):
        check(LaunchOptions(num_processes=2), "rft")
    cfg = resolve({"rounds": 5}, {"algo": "rft", "num_generations": 8}, {"max_length": 256})
    assert (cfg.trainer["rounds"], cfg.trainer["num_generations"], cfg.trainer["max_length"]) == (5, 8, 256)
    assert cfg.trainer["tasks_per_round"] == 64 and cfg.trainer["min_reward"] is None  # defaults, in meta.json


def test_cards_rft_cannot_learn_from_are_refused_before_the_run_starts(tmp_path):
    from dataclasses import replace

    from arlecli.errors import UserError
    from arlecli.catalog import load_card
    from arlecli.train.config import resolve
    from arlecli.train.rft import check_settings

    cfg = resolve({}, {"algo": "rft"}, {})
    shots = load_card(str(rft_card(tmp_path)))
    shots.prompt.fewshot = replace(shots.prompt.fewshot, n=2, split="train")  # exemplars: assistant turns
    with pytest.raises(UserError, match="2 few-shot exemplars.*--num-fewshot 0"):
        check_settings(cfg, shots, tmp_path / "run")
    check_settings(replace(cfg, options=replace(cfg.options, num_fewshot=0)), shots, tmp_path / "run")
    agent = load_card(str(ROOT / "examples" / "openai_agent" / "card.yaml"))
    # An env: rollout card is learnt from its token record (test_rollout_tools trains one).
    check_settings(cfg, agent, tmp_path / "run")
    # A completion-format card is learnt from (its rows are prompt/completion text, its plain-text
    # exemplars part of the prompt, with no loss): test_from_eval_completions trains one.
    plain = load_card(str(rft_card(tmp_path)))
    plain.prompt.format = "completion"
    plain.prompt.fewshot = replace(plain.prompt.fewshot, n=2, split="train")
    check_settings(cfg, plain, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_episode_cut_at_the_token_limit_is_not_kept_unless_keep_cut():
    """Its row would end the cut turn with an end-of-turn token the model never produced."""
    from arlecli.train.rft import RFTSettings
    from arlecli.types import Episode, Score, Turn

    prompt = [{"role": "user", "content": "2+3?"}]
    cut = Episode("t", [Turn(prompt, "The answer is 5, because two and three make", finish_reason="length")])
    whole = Episode("t", [Turn(prompt, "5", finish_reason="stop")])
    cut_tool_call = Episode("t", [Turn(prompt, "<tool_call>{", finish_reason="length"), Turn(prompt, "5")])
    right = Score(1.0, True)
    default, keep = RFTSettings.of({}), RFTSettings.of({"keep_cut": True})
    assert [default.accepts(right, e) for e in (cut, whole, cut_tool_call)] == [False, True, False]
    assert [keep.accepts(right, e) for e in (cut, whole, cut_tool_call)] == [True, True, True]
    assert not default.accepts(Score(0.0, False), whole)
    from arlecli.errors import UserError

    with pytest.raises(UserError, match="keep_cut must be true or false"):
        RFTSettings.of({"keep_cut": "yes"})


def test_a_multi_turn_episode_becomes_the_conversation_its_last_prompt_continues():
    """A tool episode's row: the last turn's prompt (what the model saw: the first prompt, its
    earlier turns and the tool results, as the env driver built it), then its final answer;
    `tools` when the chat template rendered schemas."""
    from arlecli.train.rft import to_rows
    from arlecli.types import Episode, Score, Task, Turn

    first = [{"role": "system", "content": "use tools"}, {"role": "user", "content": "2+3?"}]
    call, result = (
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>',
        [{"role": "tool", "content": "5"}],
    )
    second = [*first, {"role": "assistant", "content": call}, *result]
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    episode = Episode("t1", [Turn(first, call, observation=result), Turn(second, "5")], tools=tools)
    task = Task("t1", "2+3?", "5")
    (row,) = to_rows(
        [episode, episode],
        [(0, 0), (0, 1)],
        [Score(1.0, True), Score(0.0, False)],
        [True, False],
        [task],
        benchmark="math_tool",
        run="r",
        model="m@step-0",
    )
    assert row["messages"] == [*second, {"role": "assistant", "content": "5"}]
    assert row["tools"] == tools and (row["task_id"], row["sample"], row["reward"]) == ("t1", 0, 1.0)
