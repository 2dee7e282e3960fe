"""Multi-turn envs: tool calls, their failures, turn limits, token continuity across turns,
multi-turn eval (every turn logged) and GRPO on whole episodes with the env tokens masked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from arlecli.engine.base import Completion, GenerationRequest, SamplingParams
from arlecli.envs import Step, make_env, register_env
from arlecli.envs.episodes import Job, run_episodes
from arlecli.envs.tools import call_tool, get_tool, parse_tool_calls
from arlecli.eval import EvalOptions, run_eval
from arlecli.catalog import load_card
from arlecli.types import Task

from helpers.tool_model import CALL, GSM8K_ROWS, first_turn_calls_a_tool

ROOT = Path(__file__).resolve().parents[1]


class ScriptedAgent:
    """An engine that answers turn k with replies[k] (a fixed agent for env tests)."""

    name = "scripted"

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: list[GenerationRequest]):
        for i, request in enumerate(requests):
            self.requests.append(request)
            turn = sum(m["role"] == "assistant" for m in request.messages or [])
            yield i, Completion(text=self.replies[min(turn, len(self.replies) - 1)])

    def close(self) -> None:
        pass


def episodes_for(card_name: str, replies: list[str], limit: int = 1):
    card = load_card(card_name)
    task = Task("t", "How many loaves are left?", "#### 6", {"question": "How many loaves are left?"})
    jobs = [Job(task, make_env(card, task), SamplingParams()) for _ in range(limit)]
    return [ep for _, ep in run_episodes(ScriptedAgent(replies), jobs)]


def test_tool_call_parsing_tolerates_what_models_write():
    calls = parse_tool_calls(
        'first <tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}'
        '</tool_call> then <tool_call>{"name": "calculator", "arguments": {"expression": "2"}}'
    )
    assert [(c.name, c.arguments) for c in calls] == [
        ("python", {"code": "print(1)"}),
        ("calculator", {"expression": "2"}),
    ]
    assert parse_tool_calls("no calls here") == []


def test_a_tool_call_nested_past_the_json_limit_is_a_bad_call_not_a_crash():
    # Model text: a RecursionError here would end the whole run, not this one call.
    calls = parse_tool_calls("<tool_call>" + "[" * 100_000 + "</tool_call>")
    assert [c.name for c in calls] == [None] and "nested more than 200 deep" in calls[0].error
    deep_args = '{"name": "python", "arguments": "' + "[" * 100_000 + "]" * 100_000 + '"}'
    assert parse_tool_calls(f"<tool_call>{deep_args}</tool_call>")[0].error is not None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<tool_call>{not json}</tool_call>", "error: the tool call is not valid JSON"),
        ('<tool_call>{"name": "shell", "arguments": {}}</tool_call>', "error: unknown tool 'shell'"),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>',
            "error: UnsafeExpression: division by zero",
        ),
        ('<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>', "error: bad arguments"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'error: a tool call needs {"name"'),
    ],
)
def test_bad_tool_calls_become_error_observations_and_the_episode_goes_on(text, expected):
    [episode] = episodes_for("math_tool", [text, "#### 6"])
    assert [t.completion for t in episode.turns] == [text, "#### 6"]
    assert expected in episode.turns[0].observation[0]["content"]
    assert episode.end_reason == "answered" and episode.info == {"tool_calls": 1, "tool_errors": 1}


def test_turn_limit_ends_the_episode_with_its_reason():
    [episode] = episodes_for("math_tool", [CALL])  # calls a tool every turn, never answers
    assert len(episode.turns) == 4 and episode.end_reason == "turn_limit"
    assert episode.info["tool_calls"] == 4


def test_python_tool_runs_in_the_sandbox():
    python = get_tool("python", Task("t", "", ""))
    assert python(code="import os; print(6 * 7, os.getcwd() != '/')") == "42 True"
    out, ok = call_tool(
        {"python": python},
        parse_tool_calls('<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>')[0],
    )
    assert ok and "error (timeout)" in out


@pytest.mark.parametrize(
    "replies, correct", [([CALL, "So 6 are left.\n#### 6"], True), ([CALL, "So 7 are left.\n#### 7"], False)]
)
def test_multi_turn_eval_logs_every_turn(tmp_path, replies, correct):
    card = load_card("math_tool")
    result = run_eval(
        card,
        ScriptedAgent(replies),
        EvalOptions(data=GSM8K_ROWS, limit=1, num_fewshot=0),
        model="scripted",
        run_dir=tmp_path,
    )
    assert result["metrics"]["accuracy"]["value"] == float(correct)
    sample = json.loads((tmp_path / "samples.jsonl").read_text())
    assert [t["completion"] for t in sample["turns"]] == replies
    assert sample["turns"][0]["observation"] == [{"role": "user", "content": "<tool_response>\n6\n</tool_response>"}]
    assert sample["end_reason"] == "answered" and sample["env_info"]["tool_calls"] == 1


@register_env("test_nudge")
def _nudge_env(card: Any, task: Task, exemplars: list[Task], native_tools: bool) -> Any:
    """Two turns: whatever the model says first, the env asks it to check, then it ends."""

    class Nudge:
        tools = None
        max_turns = 2

        def reset(self):
            return [{"role": "user", "content": task.input}]

        def step(self, completion: str) -> Step:
            return Step([{"role": "user", "content": "Check that again."}])

        def info(self):
            return {}

    return Nudge()


def test_later_turns_extend_the_engine_ids_exactly(tiny_model):
    from arlecli.engine.hf import HFEngine
    from arlecli.train.batches import flatten_episode

    card = load_card("math_tool")
    card.env, card.env_params = "test_nudge", {}
    engine = HFEngine(str(tiny_model), batch_size=4)
    tasks = [Task(str(i), f"What is {i} plus 30?", "") for i in range(3)]
    jobs = [
        Job(t, make_env(card, t), SamplingParams(temperature=1.0, max_tokens=6, seed=i, logprobs=True))
        for i, t in enumerate(tasks)
    ]
    for _, episode in run_episodes(engine, jobs):
        first, second = episode.turns
        assert (
            second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.token_ids)]
            == first.prompt_token_ids + first.token_ids
        )
        prompt_ids, completion_ids, mask, logprobs = flatten_episode(episode)
        assert prompt_ids + completion_ids == second.prompt_token_ids + second.token_ids
        env_part = [t for t, m in zip(completion_ids, mask) if m == 0]
        assert "Check that again." in engine.tokenizer.decode(env_part)
        assert (
            sum(mask) == len(first.token_ids) + len(second.token_ids) == len([lp for lp, m in zip(logprobs, mask) if m])
        )


def test_tool_call_episode_on_the_tiny_model_logs_every_turn(tmp_path, tiny_model, monkeypatch):
    from arlecli.engine.hf import HFEngine

    first_turn_calls_a_tool(monkeypatch)
    run_eval(
        load_card("math_tool"),
        HFEngine(str(tiny_model)),
        EvalOptions(data=GSM8K_ROWS, limit=2, max_tokens=8),
        model="tiny",
        run_dir=tmp_path,
    )
    for line in (tmp_path / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        first, second = sample["turns"][:2]
        assert first["completion"] == CALL and "<tool_response>" in first["observation"][0]["content"]
        assert second["num_tokens"] > 0 and sample["completion"] == sample["turns"][-1]["completion"]
        assert sample["env_info"]["tool_calls"] >= 1


def test_grpo_trains_on_whole_episodes_with_env_tokens_masked(tmp_path, tiny_model, monkeypatch):
    """Two GRPO steps on math_tool: the first turn is a fixed tool call (a tiny random model
    never writes one), the second is the model's own; the env's reply is masked out."""
    from arlecli.cli.train import train_command
    from arlecli.train import batches

    first_turn_calls_a_tool(monkeypatch)
    flattened: list[tuple[list[int], list[int]]] = []
    flatten = batches.flatten_episode

    def record(episode):
        out = flatten(episode)
        flattened.append((out[1], out[2]))
        return out

    monkeypatch.setattr(batches, "flatten_episode", record)
    import typer

    import yaml

    card = yaml.safe_load((ROOT / "benchmarks" / "math_tool.yaml").read_text())
    card["source"] = {"kind": "files", "path": GSM8K_ROWS}  # the fixture rows, offline
    (tmp_path / "math_tool.yaml").write_text(yaml.safe_dump(card))
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(train_command)
    run = tmp_path / "run"
    app(
        args=[
            str(tmp_path / "math_tool.yaml"),
            "--model",
            str(tiny_model),
            "--num-generations",
            "2",
            "--max-steps",
            "2",
            "--eval-limit",
            "0",
            "--set",
            "max_completion_length=8",
            "--set",
            "per_device_train_batch_size=2",
            "--output",
            str(run),
        ],
        standalone_mode=False,
    )

    lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(x["turns"] == 2 and x["env_info"]["tool_calls"] == 1 for x in lines)
    assert len(flattened) == 4
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    for ids, mask in flattened:
        env_ids = [t for t, m in zip(ids, mask) if m == 0]
        model_ids = [t for t, m in zip(ids, mask) if m == 1]
        assert "<tool_response>\n6\n</tool_response>" in tok.decode(env_ids)
        assert "<tool_response>" not in tok.decode(model_ids) and CALL in tok.decode(model_ids)
    assert (run / "final").is_dir()


def test_rloo_keeps_env_tokens_out_of_its_loss(tmp_path, tiny_model, monkeypatch):
    """RLOO (no env_mask in TRL 1.16) on math_tool: the batch's loss mask is 0 on the env's
    reply and 1 on the model's tokens; the losses stay finite (env tokens stay attended to)."""
    import math

    import yaml

    import arlecli.train.grpo as grpo
    from helpers.train import train_in_process

    first_turn_calls_a_tool(monkeypatch)
    batches: list[tuple[list[list[int]], list[list[float]]]] = []
    wrap = grpo.rloo_with_rollouts

    def recording(base):
        cls = wrap(base)

        class Recording(cls):
            def _generate_and_score_completions(self, inputs):
                out = super()._generate_and_score_completions(inputs)
                batches.append((out["completion_ids"].tolist(), out["arle_loss_mask"].tolist()))
                return out

        return Recording

    monkeypatch.setattr(grpo, "rloo_with_rollouts", recording)
    card = yaml.safe_load((ROOT / "benchmarks" / "math_tool.yaml").read_text())
    card["source"] = {"kind": "files", "path": GSM8K_ROWS}
    (tmp_path / "math_tool.yaml").write_text(yaml.safe_dump(card))
    run = tmp_path / "run"
    train_in_process(
        str(tmp_path / "math_tool.yaml"),
        "--algo",
        "rloo",
        "--model",
        str(tiny_model),
        "--num-generations",
        "2",
        "--max-steps",
        "2",
        "--eval-limit",
        "0",
        "--max-tokens",
        "8",
        "--set",
        "per_device_train_batch_size=2",
        "--output",
        str(run),
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    assert len(batches) == 2
    for ids_rows, mask_rows in batches:
        for ids, mask in zip(ids_rows, mask_rows):
            env_ids = [t for t, m in zip(ids, mask) if m == 0]
            model_ids = [t for t, m in zip(ids, mask) if m == 1]
            assert "<tool_response>" in tok.decode(env_ids) and CALL in tok.decode(model_ids)
            assert "<tool_response>" not in tok.decode(model_ids)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in rows)
