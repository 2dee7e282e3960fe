"""The openai engine against the fake OpenAI-compatible server (no network, all fast)."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.openai import OpenAIEngine, list_models
from arlecli.errors import UserError

from helpers.fake_openai import FAKE_LOGPROB, FakeOpenAIServer

FAST = dict(backoff_base_s=0.001, backoff_max_s=0.01)


def chat(text: str, **params) -> GenerationRequest:
    messages = [{"role": "user", "content": text}]
    return GenerationRequest(messages=messages, params=SamplingParams(**params))


def prompt(text: str, **params) -> GenerationRequest:
    return GenerationRequest(prompt=text, params=SamplingParams(**params))


def last_user_text(request_json: dict) -> str:
    if "messages" in request_json:
        return request_json["messages"][-1]["content"]
    return request_json["prompt"]


def echo(request_json: dict) -> str:
    return "echo: " + last_user_text(request_json)


def run_all(engine: OpenAIEngine, requests: list[GenerationRequest]) -> dict:
    return dict(engine.generate(requests))


def test_chat_and_completion_round_trip():
    with FakeOpenAIServer(echo) as srv, OpenAIEngine(srv.base_url, srv.model) as engine:
        out = run_all(engine, [chat("hello"), prompt("Q: 1+1\nA:")])
        bodies = {r.path: r.body for r in srv.requests}
    assert out[0].text == "echo: hello"
    assert out[0].token_ids == [ord(c) for c in "echo: hello"]
    assert out[0].prompt_token_ids == [ord(c) for c in "hello"]
    assert out[0].finish_reason == "stop"
    assert out[0].logprobs is None
    assert out[1].text == "echo: Q: 1+1\nA:"
    assert out[1].prompt_token_ids == [ord(c) for c in "Q: 1+1\nA:"]
    assert bodies["/v1/chat/completions"]["messages"] == [{"role": "user", "content": "hello"}]
    assert bodies["/v1/completions"]["prompt"] == "Q: 1+1\nA:"
    for body in bodies.values():
        assert body["return_token_ids"] is True and body["model"] == "fake-model"


def test_sampling_params_reach_the_server_and_logprobs_come_back():
    stop = ["a", "b", "c", "d", "e"]
    params = dict(temperature=0.7, top_p=0.9, max_tokens=5, stop=stop, seed=3, logprobs=True)
    with (
        FakeOpenAIServer(lambda r: "xyz") as srv,
        OpenAIEngine(srv.base_url, "fake-model") as engine,
    ):
        out = run_all(engine, [chat("hi", **params), prompt("hi", **params)])
        chat_body, comp_body = srv.bodies("/chat/completions")[0], srv.bodies("/v1/completions")[0]
    for body in (chat_body, comp_body):
        assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and body["max_tokens"] == 5
        assert body["seed"] == 3
        assert body["stop"] == stop[:4]  # OpenAI's limit; the fifth is applied client-side
    assert chat_body["logprobs"] is True
    assert comp_body["logprobs"] == 1
    assert out[0].logprobs == out[1].logprobs == [FAKE_LOGPROB] * 3


def test_seed_left_out_when_not_set():
    with FakeOpenAIServer() as srv, OpenAIEngine(srv.base_url, "m") as engine:
        run_all(engine, [chat("hi")])
        (body,) = srv.bodies()
    assert "seed" not in body and "stop" not in body and "logprobs" not in body


def test_stop_strings_cut_client_side():
    # The fake server ignores `stop`, as some real servers do.
    with FakeOpenAIServer(lambda r: "The answer is 4.\n\nQuestion: next one") as srv:
        with OpenAIEngine(srv.base_url, "m") as engine:
            requests = [chat("q", stop=["\n\n", "Question:"]), prompt("q", stop=["zzz"])]
            out = run_all(engine, requests)
    assert out[0].text == "The answer is 4."
    assert out[0].finish_reason == "stop"
    assert out[1].text == "The answer is 4.\n\nQuestion: next one"


def test_finish_reason_length():
    with (
        FakeOpenAIServer(lambda r: "one two three four") as srv,
        OpenAIEngine(srv.base_url, "m") as engine,
    ):
        out = run_all(engine, [prompt("q", max_tokens=2)])
    assert out[0].text == "one two"
    assert out[0].finish_reason == "length"


def test_results_are_yielded_as_they_complete():
    """The slow request answers only once both fast results have reached the caller (no clock:
    an engine that waited for the whole batch would see the slow one answer first, after 30 s)."""
    release, slow_done = threading.Event(), threading.Event()

    def slow_or_fast(request_json: dict) -> str:
        if "slow" in last_user_text(request_json):
            release.wait(timeout=30)
            slow_done.set()
        return last_user_text(request_json)

    with FakeOpenAIServer(slow_or_fast) as srv, OpenAIEngine(srv.base_url, "m") as engine:
        arrivals = []
        for index, completion in engine.generate([chat("slow"), chat("fast 1"), prompt("fast 2")]):
            arrivals.append((index, completion.text, slow_done.is_set()))
            if len(arrivals) == 2:
                release.set()
    assert [a[:2] for a in arrivals[2:]] == [(0, "slow")]
    assert {a[:2] for a in arrivals[:2]} == {(1, "fast 1"), (2, "fast 2")}
    assert not arrivals[0][2] and not arrivals[1][2]  # both fast ones came while the slow one was out


def test_concurrency_limit_is_respected():
    with FakeOpenAIServer(lambda r: "ok", delay_s=0.05) as srv:
        with OpenAIEngine(srv.base_url, "m", concurrency=3) as engine:
            out = run_all(engine, [chat(f"q{i}") for i in range(15)])
    assert len(out) == 15
    assert srv.max_in_flight == 3


def test_generate_can_be_called_repeatedly_and_stopped_early():
    def slow(request_json: dict) -> str:
        time.sleep(0.05 if last_user_text(request_json) == "first" else 0.3)
        return "ok"

    with FakeOpenAIServer(slow) as srv:
        engine = OpenAIEngine(srv.base_url, "m", concurrency=2)
        for _ in range(3):
            assert len(run_all(engine, [chat("a"), chat("b")])) == 2
        start = time.monotonic()
        gen = engine.generate([chat("first")] + [chat(f"later {i}") for i in range(20)])
        assert next(gen)[0] == 0
        gen.close()  # must cancel the rest instead of waiting for them
        assert time.monotonic() - start < 1.0
        assert len(run_all(engine, [chat("again")])) == 1
        started = len(srv.requests)
        engine.close()
        engine.close()  # idempotent
        assert time.monotonic() - start < 2.0
    assert started < 21  # most of the 20 cancelled requests were never sent
    with pytest.raises(RuntimeError, match="closed"):
        next(engine.generate([chat("x")]))


def test_empty_request_list_and_bad_request():
    with FakeOpenAIServer() as srv, OpenAIEngine(srv.base_url, "m") as engine:
        assert list(engine.generate([])) == []
        with pytest.raises(ValueError, match="exactly one"):
            list(engine.generate([GenerationRequest()]))
        assert srv.requests == []


@pytest.mark.parametrize("status", [429, 500, 503])
def test_retries_then_succeeds(status):
    with FakeOpenAIServer(echo, fail_first=2, fail_status=status) as srv:
        with OpenAIEngine(srv.base_url, "m", **FAST) as engine:
            out = run_all(engine, [chat("hi")])
    assert out[0].text == "echo: hi"
    assert [r.status for r in srv.requests] == [status, status, 200]


def test_retry_after_is_honoured():
    with FakeOpenAIServer(echo, fail_first=1, fail_status=429, retry_after=0.6) as srv:
        with OpenAIEngine(srv.base_url, "m", **FAST) as engine:
            start = time.monotonic()
            run_all(engine, [chat("hi")])
            elapsed = time.monotonic() - start
    assert elapsed >= 0.6
    assert len(srv.requests) == 2


def test_gives_up_after_max_retries():
    with FakeOpenAIServer(fail_first=100, fail_status=503) as srv:
        with OpenAIEngine(srv.base_url, "m", max_retries=2, **FAST) as engine:
            with pytest.raises(UserError, match="after 3 attempts.*HTTP 503.*injected failure"):
                run_all(engine, [chat("hi")])
    assert len(srv.requests) == 3


def test_timeouts_are_retried_then_reported():
    with FakeOpenAIServer(delay_s=1.0) as srv:
        with OpenAIEngine(srv.base_url, "m", timeout_s=0.2, max_retries=1, **FAST) as engine:
            with pytest.raises(UserError, match="after 2 attempts.*within 0.2 s"):
                run_all(engine, [chat("hi")])
    assert len(srv.requests) == 2


def test_connection_refused_is_reported():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed
    with OpenAIEngine(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, **FAST) as engine:
        with pytest.raises(UserError, match="after 2 attempts.*cannot connect"):
            run_all(engine, [chat("hi")])


def test_bad_request_fails_fast_with_the_server_message():
    with (
        FakeOpenAIServer(fail_first=5, fail_status=400) as srv,
        OpenAIEngine(srv.base_url, "m", **FAST) as engine,
    ):
        with pytest.raises(UserError, match="HTTP 400.*injected failure 1 of 5") as info:
            run_all(engine, [chat("hi")])
    assert "\n" not in str(info.value)
    assert len(srv.requests) == 1


def test_unknown_model_says_what_to_check():
    with (
        FakeOpenAIServer(check_model=True) as srv,
        OpenAIEngine(srv.base_url, "no-such-model") as engine,
    ):
        with pytest.raises(UserError, match="404.*does not exist.*base URL.*'no-such-model'"):
            run_all(engine, [chat("hi")])
    assert len(srv.requests) == 1


def test_wrong_api_key_names_the_variable_never_the_value(monkeypatch, caplog):
    secret = "sk-wrong-secret-123"
    monkeypatch.setenv("ARLE_TEST_KEY", secret)
    caplog.set_level(logging.DEBUG)
    with (
        FakeOpenAIServer(api_key="sk-right") as srv,
        OpenAIEngine(srv.base_url, "m", "ARLE_TEST_KEY") as engine,
    ):
        with pytest.raises(UserError) as info:
            run_all(engine, [chat("hi")])
        assert srv.requests[0].headers["authorization"] == f"Bearer {secret}"
        with pytest.raises(UserError) as listed:
            list_models(srv.base_url, "ARLE_TEST_KEY")
    for message in (str(info.value), str(listed.value)):
        assert "401" in message and "ARLE_TEST_KEY" in message
        assert secret not in message
    assert len(srv.requests) == 2  # no retries on 401
    assert secret not in caplog.text
    assert secret not in repr(engine.__dict__)


def test_right_api_key_is_read_at_request_time(monkeypatch):
    monkeypatch.delenv("ARLE_TEST_KEY", raising=False)
    with (
        FakeOpenAIServer(echo, api_key="sk-right") as srv,
        OpenAIEngine(srv.base_url, "m", "ARLE_TEST_KEY") as engine,
    ):
        with pytest.raises(UserError, match="ARLE_TEST_KEY is empty or not set"):
            run_all(engine, [chat("hi")])
        monkeypatch.setenv("ARLE_TEST_KEY", "sk-right")
        assert run_all(engine, [chat("hi")])[0].text == "echo: hi"


def test_without_token_id_support_falls_back_once():
    with FakeOpenAIServer(echo, strict=True) as srv, OpenAIEngine(srv.base_url, "m") as engine:
        first = run_all(engine, [chat("a")])
        second = run_all(engine, [chat("b")])
        statuses = [r.status for r in srv.requests]
    assert first[0].text == "echo: a" and second[0].text == "echo: b"
    assert first[0].token_ids == [] and first[0].prompt_token_ids == []
    assert statuses == [400, 200, 200]


def test_list_models_and_model_auto_pick():
    with FakeOpenAIServer(echo, model="served-name", check_model=True) as srv:
        assert list_models(srv.base_url + "/") == ["served-name"]
        with OpenAIEngine(srv.base_url) as engine:
            assert run_all(engine, [chat("hi")])[0].text == "echo: hi"
            assert engine.model == "served-name"


def test_list_models_connection_error_and_bad_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UserError, match="cannot reach.*is the server running"):
        list_models(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(UserError, match="must start with http"):
        OpenAIEngine("127.0.0.1:8000/v1", "m")


def test_generate_from_several_threads_at_once():
    with (
        FakeOpenAIServer(echo, delay_s=0.02) as srv,
        OpenAIEngine(srv.base_url, "m", concurrency=4) as engine,
    ):
        results: dict[int, dict] = {}

        def worker(n: int) -> None:
            results[n] = run_all(engine, [chat(f"t{n} r{i}") for i in range(5)])

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
    assert {n: out[4].text for n, out in results.items()} == {n: f"echo: t{n} r4" for n in range(3)}
    assert srv.max_in_flight <= 4
