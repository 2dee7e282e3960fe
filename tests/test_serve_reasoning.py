"""`arle serve` and a thinking model (issue 24, item 6): the thought goes out in
`reasoning_content` (non-streaming and streamed before the answer), the answer in `content`,
as vLLM's reasoning parsers answer; a plain model's replies have no reasoning_content; the
recording gateway's records keep the split, and an agent's later call that sends the reply back
(with or without its reasoning_content) continues it.

Over loopback with the real `openai` client; engines are the tiny thinking model (its template
opens the thought and its random weights never close it: every reply is a cut thought), the
plain tiny model, and a scripted engine on the thinking tokenizer that thinks and then answers.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import httpx
import openai
import pytest

from arlecli.engine.base import Completion, GenerationRequest
from arlecli.engine.tokens import encode_request
from arlecli.serve.app import create_app
from arlecli.serve.record import read_records
from arlecli.serve.server import BackgroundServer

CHAT = [{"role": "user", "content": "What is 12 plus 30?"}]
THOUGHT = "12 plus 30: add the tens, 10 + 30 = 40, then 2 more."
ANSWER = "The answer is 42."
# What a thinking model generates after a prompt that opened its thought (`<think>\n`).
GENERATED = f"{THOUGHT}\n</think>\n\n{ANSWER}"


class Thinker:
    """An engine on a thinking tokenizer that answers every request with `text` (its own ids),
    after the prompt the chat template renders: a model that thinks, then answers."""

    name = "thinker"

    def __init__(self, tokenizer: Any, text: str = GENERATED) -> None:
        self.tokenizer, self.text = tokenizer, text
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        self.prompts: list[list[int]] = []

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        for i, request in enumerate(requests):
            prompt = request.prompt_token_ids or encode_request(self.tokenizer, request)
            self.prompts.append(list(prompt))
            yield i, Completion(self.text, list(self.ids), list(prompt), [-0.5] * len(self.ids), "stop")

    def close(self) -> None:
        pass


def serve(engine: Any, record: Path | None = None) -> tuple[BackgroundServer, SimpleNamespace]:
    app = create_app(engine, model_name="tiny", record_dir=record)
    srv = BackgroundServer(app).__enter__()
    return srv, SimpleNamespace(
        app=app,
        url=srv.base_url,
        root=srv.base_url.removesuffix("/v1"),
        client=openai.OpenAI(base_url=srv.base_url, api_key="local", max_retries=0),
    )


@pytest.fixture(scope="module")
def thinking_tokenizer(tiny_thinking_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_thinking_model))


@pytest.fixture(scope="module")
def thinking_server(tiny_thinking_model, tmp_path_factory):
    from arlecli.engine.hf import HFEngine

    engine = HFEngine(str(tiny_thinking_model), batch_size=4)
    srv, info = serve(engine, tmp_path_factory.mktemp("record"))
    info.record = Path(info.app.state.recorder.directory)
    yield info
    srv.__exit__(None, None, None)
    engine.close()


@pytest.fixture(scope="module")
def thinker(thinking_tokenizer, tmp_path_factory):
    engine = Thinker(thinking_tokenizer)
    srv, info = serve(engine, tmp_path_factory.mktemp("record"))
    info.engine, info.record = engine, Path(info.app.state.recorder.directory)
    yield info
    srv.__exit__(None, None, None)


def stream_chunks(client: openai.OpenAI, **kwargs: Any) -> list[Any]:
    return list(
        client.chat.completions.create(
            model="tiny", messages=CHAT, stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )


def deltas(chunks: list[Any]) -> list[tuple[str, Any]]:
    """Each chunk's choice-0 delta as (field, value), in the order they came (role, thinking,
    content, finish), skipping empty ones; consecutive deltas of one field (the tokens of a
    text streamed token by token) are joined."""
    out: list[tuple[str, Any]] = []
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta.model_dump(exclude_none=True)
            for key in ("role", "reasoning_content", "content"):
                if delta.get(key):
                    if out and out[-1][0] == key and key != "role":
                        out[-1] = (key, out[-1][1] + delta[key])
                    else:
                        out.append((key, delta[key]))
            if choice.finish_reason:
                out.append(("finish", choice.finish_reason))
    return out


# ------------------------------------------------------------------ the tiny models


def test_reasoning_content_for_the_thinking_model_and_none_for_the_plain_one(thinking_server, tiny_model):
    """Every reply of the tiny thinking model is a thought its budget cut: all of it is
    reasoning_content, content is null (no answer), the stream sends the thought before the
    finish, and usage counts the thinking tokens. The plain tiny model's replies, streamed or
    not, hold no reasoning_content at all."""
    from arlecli.engine.hf import HFEngine

    reply = thinking_server.client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=8, temperature=1.0, seed=3, extra_body={"return_token_ids": True}
    )
    choice = reply.choices[0]
    message = choice.message.model_dump()
    assert choice.finish_reason == "length" and len(choice.model_extra["token_ids"]) == 8
    assert message["content"] is None
    [record] = [r for r in read_records(thinking_server.record / "default.jsonl") if r["id"] == reply.id]
    generated = record["choices"][0]["text"]
    assert message["reasoning_content"] == generated.strip("\n") and message["reasoning_content"]
    assert reply.usage.completion_tokens_details.reasoning_tokens == 8

    chunks = stream_chunks(thinking_server.client, max_tokens=8, temperature=1.0, seed=3)
    order = deltas(chunks)
    assert [k for k, _ in order] == ["role", "reasoning_content", "finish"]
    assert order[1][1] == message["reasoning_content"]  # the same seed: the same thought, streamed
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 8

    engine = HFEngine(str(tiny_model), batch_size=4)
    srv, plain = serve(engine)
    try:
        reply = plain.client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8)
        message = reply.choices[0].message.model_dump(exclude_none=True)
        assert set(message) == {"role", "content"} and message["content"]
        assert reply.usage.completion_tokens_details is None
        chunks = stream_chunks(plain.client, max_tokens=8)
        assert [k for k, _ in deltas(chunks)] == ["role", "content", "finish"]
        assert all("reasoning_content" not in c.model_dump_json() for c in chunks)
    finally:
        srv.__exit__(None, None, None)
        engine.close()


# ------------------------------------------------------------------ a model that thinks, then answers


def test_thought_then_answer_non_streaming_streaming_and_raw(thinker, thinking_tokenizer):
    client = thinker.client
    reply = client.chat.completions.create(model="tiny", messages=CHAT)
    message = reply.choices[0].message.model_dump()
    assert (message["content"], message["reasoning_content"]) == (ANSWER, THOUGHT)
    thought_ids = thinking_tokenizer(f"{THOUGHT}\n</think>", add_special_tokens=False)["input_ids"]
    assert reply.usage.completion_tokens_details.reasoning_tokens == len(thought_ids)

    # Streamed: the whole thought, then the answer, then the finish reason.
    order = deltas(stream_chunks(client))
    assert order == [("role", "assistant"), ("reasoning_content", THOUGHT), ("content", ANSWER), ("finish", "stop")]

    # The raw text on request (llama.cpp's reasoning_format "none"), and always from /completions.
    raw = client.chat.completions.create(model="tiny", messages=CHAT, extra_body={"reasoning_format": "none"})
    assert raw.choices[0].message.content == GENERATED
    assert "reasoning_content" not in raw.choices[0].message.model_dump(exclude_none=True)
    assert [v for k, v in deltas(stream_chunks(client, extra_body={"reasoning_format": "none"})) if k == "content"] == [
        GENERATED
    ]
    text = client.completions.create(model="tiny", prompt="Question: 12 + 30?", max_tokens=64)
    assert text.choices[0].text == GENERATED
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny", messages=CHAT, extra_body={"reasoning_format": "deep"})
    assert "reasoning_format" in str(bad.value)


def test_records_keep_the_split_and_a_reply_sent_back_continues_its_ids(thinker):
    """An agent's second call sends the first reply back as the client got it (content and
    reasoning_content, or content alone): the session's record keeps both replies' thinking
    apart, and the second call's prompt ids extend the first reply's generated ids."""
    client = thinker.client
    for sent_back in ("with_reasoning", "content_only"):
        sid = httpx.post(thinker.root + "/sessions").json()["id"]
        agent = openai.OpenAI(base_url=f"{thinker.root}/s/{sid}/v1", api_key="local", max_retries=0)
        first = agent.chat.completions.create(model="tiny", messages=CHAT).choices[0].message
        back = {"role": "assistant", "content": first.content}
        if sent_back == "with_reasoning":
            back["reasoning_content"] = first.model_dump()["reasoning_content"]
        agent.chat.completions.create(model="tiny", messages=[*CHAT, back, {"role": "tool", "content": "42"}])
        records = read_records(thinker.record / f"{sid}.jsonl")
        assert len(records) == 2
        for record in records:
            choice = record["choices"][0]
            assert choice["text"] == GENERATED  # the generated text, whole
            assert (choice["content"], choice["reasoning_content"], choice["thinking_cut"]) == (ANSWER, THOUGHT, False)
            assert choice["thinking_tokens"] > 0
        one, two = (r["choices"][0] for r in records)
        link = records[1]["continues"]
        assert link["id"] == records[0]["id"]  # the answer sent back is the reply it continues
        if sent_back == "with_reasoning":  # the template renders the thought: the ids extend as generated
            assert link["seamless"]
            assert (
                two["prompt_token_ids"][: len(one["prompt_token_ids"]) + len(one["token_ids"])]
                == one["prompt_token_ids"] + one["token_ids"]
            )
        else:  # without it the template renders no thought: a seam, and the record says so
            assert not link["seamless"]
    assert client.chat.completions.create(model="tiny", messages=CHAT).choices[0].message.content == ANSWER


def test_recorded_thinking_becomes_the_episodes_turns(thinker):
    """rollout.build_episode over a recorded session: each turn's completion is the answer the
    agent got, its thinking, cut flag and token count are the record's, and the env's message
    between the calls is the turn's observation (the reply was sent back with its thinking)."""
    from arlecli.engine.base import SamplingParams
    from arlecli.envs.episodes import Job
    from arlecli.agent import RolloutEnv, build_episode
    from arlecli.types import Task

    sid = httpx.post(thinker.root + "/sessions").json()["id"]
    agent = openai.OpenAI(base_url=f"{thinker.root}/s/{sid}/v1", api_key="local", max_retries=0)
    reply = agent.chat.completions.create(model="tiny", messages=CHAT).choices[0].message.model_dump()
    first = {"role": "assistant", "content": reply["content"], "reasoning_content": reply["reasoning_content"]}
    agent.chat.completions.create(model="tiny", messages=[*CHAT, first, {"role": "tool", "content": "42"}])
    records = read_records(thinker.record / f"{sid}.jsonl")
    job = Job(Task("t", "q", "42"), RolloutEnv("agent", lambda *a: None, CHAT), SamplingParams())
    episode = build_episode(job, records, None, None)
    assert [t.completion for t in episode.turns] == [ANSWER, ANSWER]
    assert [t.thinking for t in episode.turns] == [THOUGHT, THOUGHT]
    assert not episode.thinking_cut and episode.completion == ANSWER
    assert episode.turns[0].thinking_tokens == records[0]["choices"][0]["thinking_tokens"] > 0
    assert episode.turns[0].observation == [{"role": "tool", "content": "42"}]
    assert episode.turns[0].token_ids == records[0]["choices"][0]["token_ids"]  # thought and answer, as generated


def test_eval_through_serve_records_the_thinking_an_in_process_eval_does(
    thinking_server, tiny_thinking_model, tmp_path
):
    """`arle eval` of the thinking model through arle serve (the openai engine reads
    reasoning_content and usage's reasoning_tokens) writes the samples an in-process eval
    writes: the same thinking, cut flags, thinking tokens and (empty) answers."""
    from arlecli.engine.hf import HFEngine
    from arlecli.engine.openai import OpenAIEngine
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.catalog import load_card

    opts = EvalOptions(limit=3, max_tokens=8, temperature=1.0)
    card = load_card("one_digit_sums")
    run_eval(card, HFEngine(str(tiny_thinking_model), batch_size=4), opts, model="tiny", run_dir=tmp_path / "local")
    remote = OpenAIEngine(thinking_server.url, model="tiny")
    try:
        run_eval(card, remote, opts, model="tiny", run_dir=tmp_path / "remote")
    finally:
        remote.close()

    def samples(run: str) -> list[dict[str, Any]]:
        import json

        keep = ("id", "completion", "thinking", "thinking_cut", "thinking_tokens", "answer_tokens", "correct")
        rows = [json.loads(line) for line in (tmp_path / run / "samples.jsonl").read_text().splitlines()]
        return sorted(({k: row.get(k) for k in keep} for row in rows), key=lambda r: r["id"])

    local = samples("local")
    assert len(local) == 3 and all(s["thinking_cut"] and s["thinking_tokens"] == 8 for s in local)
    assert any(s["thinking"] for s in local)
    assert samples("remote") == local
