"""`arle serve` under the official `openai` client (issue 25): what an agent or eval harness
written against the OpenAI API (as `vllm serve` answers it) relies on.

One server per module (the tiny model, hf backend, loopback). Asserted: models.retrieve and its
404; streaming token by token (several content chunks that join to the non-streamed reply, a
final usage chunk); chat top_logprobs and completions logprobs=N with real alternatives (the
greedy token is the top one, with the engine's own logprob); completions echo with prompt
logprobs equal to the engine's loglikelihood, token-id prompts equal to their text;
response_format checked and marked, not silently ignored; what cannot be served is a 400
naming the parameter; one access-log line per request.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Iterator

import httpx
import openai
import pytest

from arlecli.engine.base import Completion, GenerationRequest, LoglikRequest, SamplingParams, encode_pair
from arlecli.serve.app import create_app
from arlecli.serve.server import BackgroundServer

CHAT = [{"role": "user", "content": "Tell me a story about a fox."}]


@pytest.fixture(scope="module")
def served(tiny_model):
    from arlecli.engine.hf import HFEngine

    engine = HFEngine(str(tiny_model), batch_size=8)
    app = create_app(engine, model_name="tiny", access_log=True)
    with BackgroundServer(app) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="local", max_retries=0)
        yield SimpleNamespace(engine=engine, client=client, url=srv.base_url, engine_batcher=app.state.batcher)
    engine.close()


def test_models_retrieve_and_an_unknown_id_is_a_404(served):
    card = served.client.models.retrieve("tiny")
    assert (card.id, card.object, card.owned_by) == ("tiny", "model", "arle")
    with pytest.raises(openai.NotFoundError) as missing:
        served.client.models.retrieve("gpt-4")
    assert missing.value.body["code"] == "model_not_found" and "gpt-4" in missing.value.body["message"]


def test_streaming_sends_tokens_as_they_come_then_usage(served):
    ask: dict[str, Any] = dict(model="tiny", messages=CHAT, max_tokens=24, temperature=1.0, seed=7)
    whole = served.client.chat.completions.create(**ask)
    chunks = list(served.client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 5  # token by token, not the whole reply in one chunk
    assert "".join(pieces) == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    # Completions stream the same way.
    text = list(
        served.client.completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=3, stream=True
        )
    )
    assert len([c for c in text if c.choices and c.choices[0].text]) >= 5


def test_chat_top_logprobs_are_real_alternatives(served):
    reply = served.client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    entries = reply.choices[0].logprobs.content
    own = next(
        iter(
            served.engine.generate(
                [GenerationRequest(messages=CHAT, params=SamplingParams(max_tokens=6, logprobs=True))]
            )
        )
    )[1]
    assert len(entries) == len(own.token_ids) == 6
    for entry, logprob in zip(entries, own.logprobs):
        top = entry.top_logprobs
        assert len(top) == 3 and [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert top[0].token == entry.token  # greedy: the sampled token is the most likely one
        assert entry.logprob == pytest.approx(logprob, abs=1e-4) == top[0].logprob


def test_completions_logprobs_n_give_n_alternatives_and_the_sampled_token(served):
    reply = served.client.completions.create(
        model="tiny", prompt="The quick brown fox", max_tokens=5, temperature=0, logprobs=2
    )
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        # Keyed by text, as OpenAI's: two byte tokens that both show as U+FFFD share a key.
        assert 1 <= len(top) <= 3 and top[token] == value == max(top.values())
    assert max(len(top) for top in lp.top_logprobs) >= 2


def test_echo_gives_the_prompt_logprobs_that_score_a_continuation(served):
    """lm-eval's loglikelihood request (token ids, echo, logprobs 1, max_tokens 1): the echoed
    continuation logprobs sum to the engine's own loglikelihood, and is_greedy agrees."""
    tok = served.engine.tokenizer
    context, continuation = "Question: What colour is the sky?\nAnswer:", " blue"
    ctx, cont = encode_pair(tok, context, continuation)
    want = next(iter(served.engine.loglikelihood([LoglikRequest(context, continuation)])))[1]
    reply = served.client.completions.create(
        model="tiny", prompt=[ctx + cont], max_tokens=1, temperature=0, logprobs=1, echo=True
    )
    lp = reply.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ctx) + len(cont) + 1 and lp.token_logprobs[0] is None
    assert reply.choices[0].text.startswith(tok.decode(ctx + cont))
    assert sum(lp.token_logprobs[len(ctx) : -1]) == pytest.approx(want.logprob, abs=1e-4)
    greedy = all(
        v == max(top.values()) for v, top in zip(lp.token_logprobs[len(ctx) : -1], lp.top_logprobs[len(ctx) : -1])
    )
    assert greedy == want.greedy
    # max_tokens 0: the prompt alone; a text prompt echoes its own text.
    only = served.client.completions.create(
        model="tiny", prompt=context, max_tokens=0, echo=True, logprobs=0, temperature=0
    )
    assert only.choices[0].text == context and len(only.choices[0].logprobs.tokens) == len(tok(context)["input_ids"])
    # ... at any temperature: no token is asked for, so none is sampled (vLLM's answer too).
    hot = served.client.completions.create(model="tiny", prompt=context, max_tokens=0, echo=True, temperature=1.0)
    assert hot.choices[0].text == context and hot.usage.completion_tokens == 0
    # The one greedy token of an echo, cut by a stop string, ends the choice as "stop" (as generating it would).
    nxt = served.client.completions.create(model="tiny", prompt=context, max_tokens=1, temperature=0)
    for echo in (False, True):
        cut = served.client.completions.create(
            model="tiny", prompt=context, max_tokens=1, temperature=0, echo=echo, logprobs=1, stop=[nxt.choices[0].text]
        )
        assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == (context if echo else "")


def test_token_id_prompts_generate_what_their_text_does(served):
    texts = ["def add(a, b):", "Question: 2 + 2?"]
    ids = [served.engine.tokenizer(t)["input_ids"] for t in texts]
    by_text = served.client.completions.create(model="tiny", prompt=texts, max_tokens=8, temperature=0)
    by_ids = served.client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0)
    one = served.client.completions.create(model="tiny", prompt=ids[0], max_tokens=8, temperature=0)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    assert one.choices[0].text == by_text.choices[0].text and by_ids.usage == by_text.usage
    with pytest.raises(openai.BadRequestError) as bad:
        served.client.completions.create(model="tiny", prompt=[[1, 2], [10**9]], max_tokens=2)
    assert bad.value.body["param"] == "prompt" and "vocabulary" in bad.value.body["message"]


def test_response_format_is_checked_and_said_to_be_unconstrained(served):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}):
        raw = served.client.chat.completions.with_raw_response.create(
            model="tiny", messages=CHAT, max_tokens=6, response_format=fmt
        )
        assert raw.headers["x-arle-response-format"] == "unconstrained"
        choice = raw.parse().choices[0].model_extra
        assert choice["response_format_valid"] is False and choice["response_format_error"]  # random weights
    for bad in ({"type": "regex", "regex": "a+"}, {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}):
        with pytest.raises(openai.BadRequestError) as refused:
            served.client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, response_format=bad)
        assert refused.value.body["param"] == "response_format"


def test_a_reply_that_matches_the_schema_is_marked_valid():
    from arlecli.serve.response_format import ResponseFormat, check, structured

    fmt = ResponseFormat(
        "json_schema", {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    )
    assert check(fmt, '{"answer": 42}') is None
    assert "answer" in check(fmt, '{"answer": "42"}') and "not JSON" in check(fmt, "42 is the answer")
    assert check(ResponseFormat("json_object"), "[1]") is not None
    # What the vllm engine decodes under (vLLM's structured outputs); hf has no grammar.
    assert structured(fmt) == {"json": fmt.schema} and structured(ResponseFormat("json_object")) == {
        "json_object": True
    }


class _NoModel:
    """An engine with no model in this process (as a remote endpoint is): it cannot score."""

    name = "scripted"

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        for i, _ in enumerate(requests):
            yield i, Completion("ok", [1], [2], [-0.5], "stop")

    def close(self) -> None:
        pass


def test_what_the_engine_cannot_give_is_a_400_naming_it():
    with BackgroundServer(create_app(_NoModel(), model_name="tiny")) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="local", max_retries=0)
        cases = [
            (
                "top_logprobs",
                lambda: client.chat.completions.create(model="tiny", messages=CHAT, logprobs=True, top_logprobs=2),
            ),
            ("logprobs", lambda: client.completions.create(model="tiny", prompt="x", logprobs=3)),
            ("echo", lambda: client.completions.create(model="tiny", prompt="x", logprobs=1, echo=True)),
            ("prompt", lambda: client.completions.create(model="tiny", prompt=[1, 2, 3])),
        ]
        for param, call in cases:
            with pytest.raises(openai.BadRequestError) as bad:
                call()
            assert bad.value.body["param"] == param, param
        assert client.chat.completions.create(model="tiny", messages=CHAT, logprobs=True).choices[0].logprobs


def test_one_access_log_line_per_request(served, capsys):
    capsys.readouterr()
    served.client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3)
    httpx.get(served.url + "/models/nope")
    lines = [line for line in capsys.readouterr().err.splitlines() if " /v1/" in line]
    assert len(lines) == 2
    assert lines[0].startswith("127.0.0.1 POST /v1/chat/completions 200 ") and lines[0].endswith("+3")
    assert " GET /v1/models/nope 404 " in lines[1]


def test_a_request_joins_the_batch_that_is_running(served):
    """A request that arrives while a long one generates is answered from the running engine
    call (no second generate call, no wait for the long row to end)."""
    import threading
    import time

    batcher = served.engine_batcher
    stop = threading.Event()

    def long_request() -> None:  # greedy, 2,000 tokens: seconds of decoding; abandoned below
        with httpx.stream(
            "POST",
            served.url + "/completions",
            timeout=60,
            json={"prompt": "x", "max_tokens": 2000, "temperature": 0, "stream": True},
        ) as resp:
            for _ in resp.iter_raw():
                if stop.is_set():
                    return

    calls = batcher.generate_calls
    worker = threading.Thread(target=long_request)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not batcher.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert batcher.running and batcher.generate_calls == calls + 1
        short = served.client.completions.create(model="tiny", prompt="Hello", max_tokens=3, temperature=0)
        assert short.usage.completion_tokens == 3
        assert batcher.running and batcher.generate_calls == calls + 1  # joined the long one's call
    finally:
        stop.set()
        worker.join(60)


def test_an_endpoint_that_wants_a_key_fails_cleanly_and_is_named_by_its_model():
    """Without the key: the 401 error and nothing else (the request coroutines were never made,
    so none is left unawaited); with it, served_model() names the model, not the URL."""
    import gc
    import warnings

    from arlecli.engine.base import EngineRequestError
    from arlecli.engine.openai import OpenAIEngine

    with BackgroundServer(create_app(_NoModel(), model_name="tiny-model", api_key="k3y")) as srv:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with OpenAIEngine(srv.base_url) as engine:
                with pytest.raises(EngineRequestError, match="401.*pass --api-key-env NAME"):
                    list(engine.generate([GenerationRequest(prompt="x")]))
            gc.collect()
        assert not [w for w in caught if "never awaited" in str(w.message)]
        # Two Authorization headers: refused whichever order (a proxy reading the other would disagree).
        for pair in (["Bearer k3y", "Bearer nope"], ["Bearer nope", "Bearer k3y"]):
            headers = httpx.Headers([("authorization", v) for v in pair])
            resp = httpx.get(srv.base_url + "/models", headers=headers)
            assert resp.status_code == 401 and "more than one" in resp.json()["error"]["message"]
        assert httpx.get(srv.base_url + "/models", headers={"authorization": "Bearer k3y"}).status_code == 200
        import os

        os.environ["ARLE_TEST_SERVE_KEY"] = "k3y"
        try:
            with OpenAIEngine(srv.base_url, api_key_env="ARLE_TEST_SERVE_KEY") as engine:
                assert engine.served_model() == "tiny-model"
        finally:
            del os.environ["ARLE_TEST_SERVE_KEY"]
