"""`arle serve` under hostile input (issue 12, item 5), on the tiny model (hf backend).

Prompts beyond the context and max_tokens beyond what is left are 400 before any generation;
prompts x n is capped; malformed bodies are 4xx with no traceback in the log; a client that
disconnects frees the engine; idle and half-open connections cannot lock clients out; a
pasted key given to --api-key-env is refused without being echoed. Only localhost is used.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import pytest

from arlecli.engine.hf import HFEngine
from arlecli.serve.app import create_app
from arlecli.serve.limits import ServeLimits
from arlecli.serve.server import BackgroundServer

ARLE = [sys.executable, "-m", "arlecli"]
CONTEXT = 2048  # the tiny model's max_position_embeddings
CHAT = [{"role": "user", "content": "What is 12 plus 30?"}]
MAX_BODY = 8 * 2**20


def _start(engine: HFEngine, limits: ServeLimits) -> tuple[BackgroundServer, SimpleNamespace]:
    app = create_app(engine, model_name="tiny", max_concurrency=16, limits=limits)
    srv = BackgroundServer(app).__enter__()
    host, port = srv.sock.getsockname()[:2]
    return srv, SimpleNamespace(url=srv.base_url, app=app, host=host, port=port, connections=srv.connections)


@pytest.fixture(scope="module")
def engine(tiny_model):
    engine = HFEngine(str(tiny_model), batch_size=16)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def served(engine):
    """Default connection limits; a lower choice cap and body cap than the defaults."""
    srv, info = _start(engine, ServeLimits(max_choices=32, max_body_bytes=MAX_BODY))
    with httpx.Client(base_url=info.url, timeout=60) as client:
        info.client = client
        yield info
    srv.__exit__(None, None, None)


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text[:500]
    err = resp.json()["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    return err


def _normal_request_is_answered(url: str, within_s: float) -> None:
    start = time.monotonic()
    resp = httpx.post(
        url + "/chat/completions", json={"messages": CHAT, "max_tokens": 4, "temperature": 0}, timeout=within_s + 30
    )
    took = time.monotonic() - start
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"], resp.text[:300]
    assert took < within_s, f"a normal request took {took:.1f} s"


# ------------------------------------------------------------------ context and max_tokens


def test_a_5mb_prompt_is_refused_at_once(served):
    huge = "lorem ipsum " * (5 * 2**20 // 12)
    for path, body in (
        ("/chat/completions", {"messages": [{"role": "user", "content": huge}]}),
        ("/completions", {"prompt": huge, "max_tokens": 4}),
    ):
        start = time.monotonic()
        err = _error(served.client.post(path, json=body), 400)
        assert time.monotonic() - start < 5
        assert err["code"] == "context_length_exceeded" and f"maximum context length is {CONTEXT}" in err["message"]
    # Over the context in tokens, though not in characters: counted exactly, then refused.
    err = _error(served.client.post("/completions", json={"prompt": "12 plus 30 " * 1500, "max_tokens": 1}), 400)
    assert err["code"] == "context_length_exceeded" and "input tokens" in err["message"]


def test_max_tokens_1e9_is_400_then_a_normal_request_is_answered_in_seconds(served):
    calls = served.app.state.batcher.generate_calls
    for path, body in (("/chat/completions", {"messages": CHAT}), ("/completions", {"prompt": "x"})):
        err = _error(served.client.post(path, json={**body, "max_tokens": 10**9}), 400)
        assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
        assert "1000000000 in the completion" in err["message"]
        assert _error(served.client.post(path, json={**body, "max_tokens": 1e9}), 400)["param"] == "max_tokens"
    err = _error(served.client.post("/chat/completions", json={"messages": CHAT, "max_completion_tokens": 2048}), 400)
    assert err["param"] == "max_tokens"
    assert served.app.state.batcher.generate_calls == calls  # refused before any generation
    _normal_request_is_answered(served.url, within_s=5)


def test_a_default_max_tokens_is_cut_to_what_the_context_leaves(served):
    prompt = "x " * 1950  # ~1,950 tokens: the chat default of 1,024 does not fit
    body = served.client.post(
        "/chat/completions",
        json={"messages": [{"role": "user", "content": prompt}], "temperature": 0, "return_token_ids": True},
    ).json()
    assert body["usage"]["prompt_tokens"] < CONTEXT
    assert body["usage"]["total_tokens"] <= CONTEXT


def test_prompts_times_n_is_capped(served):
    err = _error(served.client.post("/completions", json={"prompt": ["a"] * 8, "n": 8, "max_tokens": 1}), 400)
    assert err["param"] == "n" and "64 generations" in err["message"] and "--max-choices" in err["message"]
    ok = served.client.post("/completions", json={"prompt": ["a"] * 8, "n": 4, "max_tokens": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 32


# ------------------------------------------------------------------ malformed bodies


def test_malformed_bodies_are_4xx_and_leave_no_traceback(served, capfd):
    c = served.client
    post = lambda raw, path="/chat/completions": c.post(
        path,
        content=raw,  # noqa: E731
        headers={"content-type": "application/json"},
    )
    surrogates = [
        b'{"messages": [{"role": "user", "content": "\\ud800 lone"}]}',
        b'{"messages": [{"role": "user\\udfff", "content": "hi"}]}',
        b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["\\udc80"]}',
        b'{"messages": [{"role": "user", "content": "hi"}], "\\ud834": 1}',
    ]
    for raw in surrogates:
        assert "surrogate" in _error(post(raw), 400)["message"]
    assert "surrogate" in _error(post(b'{"prompt": "x\\ud800", "max_tokens": 1}', "/completions"), 400)["message"]
    # A proper pair is fine: it is one character.
    assert post(b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 1}').status_code == 200

    depth = 100_000
    for raw in (
        b"[" * depth + b"]" * depth,
        b'{"messages": ' + b"[" * depth + b"]" * depth + b"}",
        b'{"a": ' * depth + b"1" + b"}" * depth,
    ):
        assert "nests too deeply" in _error(post(raw), 400)["message"]
    for raw in (
        b"{not json",
        b"\xff\xfe{}",
        b'{"messages": [{"role": "user", "content": "x"}], "seed": 1' + b"0" * 5000 + b"}",
        b"",
        b"null",
        b"[]",
        b'"text"',
    ):
        _error(post(raw), 400)

    wrong_types = [
        {"messages": "hello"},
        {"messages": [{"role": 1, "content": "x"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": [{"x": 1}]}]},
        {"messages": CHAT, "max_tokens": "5"},
        {"messages": CHAT, "max_tokens": -1},
        {"messages": CHAT, "n": 1.5},
        {"messages": CHAT, "temperature": "hot"},
        {"messages": CHAT, "stop": [1]},
        {"messages": CHAT, "stop": ["x"] * 1000},
        {"messages": CHAT, "stream": "yes"},
        {"messages": CHAT, "stream_options": []},
        {"messages": CHAT, "model": ["tiny"]},
        {"messages": CHAT, "seed": 2**70},
    ]
    for body in wrong_types:
        _error(c.post("/chat/completions", json=body), 400)
    for raw in (
        b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        b'{"messages": [{"role": "user", "content": "x"}], "top_p": Infinity}',
    ):
        _error(post(raw), 400)
    # A template that cannot render these messages is the client's mistake too.
    _error(c.post("/chat/completions", json={"messages": [{"role": "user", "content": {"a": 1}}]}), 400)

    big = b'{"prompt": "' + b"a" * (MAX_BODY + 10) + b'"}'
    assert _error(post(big, "/completions"), 413)["code"] == "request_too_large"

    def chunked():  # no Content-Length: the cap is counted while reading
        yield b'{"prompt": "'
        for _ in range(MAX_BODY // 2**16 + 2):
            yield b"a" * 2**16
        yield b'"}'

    assert c.post("/completions", content=chunked()).status_code == 413

    # What a web page can send without a CORS preflight (text/plain, a form) is not read as
    # JSON: otherwise any page could make a local server generate. No header at all is fine.
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}'
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        resp = c.post("/chat/completions", content=body, headers={"content-type": kind})
        assert "Content-Type: application/json" in _error(resp, 415)["message"]
    options = {"messages": CHAT, "max_tokens": 1, "stream": True, "stream_options": {"include_usage": "yes"}}
    assert _error(c.post("/chat/completions", json=options), 400)["param"] == "stream_options.include_usage"
    for kind in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"):
        assert c.post("/chat/completions", content=body, headers={"content-type": kind}).status_code == 200
    assert c.post("/chat/completions", content=body).status_code == 200

    _normal_request_is_answered(served.url, within_s=10)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "Exception" not in out + err, (out + err)[-3000:]


# ------------------------------------------------------------------ disconnected clients


def test_a_client_that_disconnects_mid_generation_frees_the_engine(served):
    """16 greedy rows of 2,000 tokens take well over 10 s on the tiny model; after the client
    goes away a normal request must not wait for them."""
    batcher = served.app.state.batcher
    long = {"prompt": "x", "max_tokens": 2000, "temperature": 0, "n": 16}
    for stream in (False, True):
        cancelled = batcher.cancelled
        if stream:  # tokens stream out as they come: the client reads for 1.5 s, then goes away
            with httpx.stream("POST", served.url + "/completions", json={**long, "stream": True}, timeout=1.5) as resp:
                began = time.monotonic()
                try:
                    for _ in resp.iter_lines():
                        if time.monotonic() - began > 1.5:
                            break
                except httpx.ReadTimeout:
                    pass
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(served.url + "/completions", json=long, timeout=1.5)
        _normal_request_is_answered(served.url, within_s=6)
        deadline = time.monotonic() + 5
        while batcher.cancelled < cancelled + 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert batcher.cancelled == cancelled + 16


# ------------------------------------------------------------------ connections


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} open files; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _open_idle(host: str, port: int, count: int) -> list[socket.socket]:
    socks = []
    for i in range(count):
        s = socket.create_connection((host, port), timeout=10)
        if i % 2:  # half of them start a request and never finish its headers (slowloris)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    return socks


def test_1000_idle_connections_then_a_normal_request_is_answered(served):
    # Client and server ends share this process: two descriptors per connection.
    _raise_fd_limit(2 * 1000 + 512)
    socks = _open_idle(served.host, served.port, 1000)
    try:
        _normal_request_is_answered(served.url, within_s=10)
    finally:
        for s in socks:
            s.close()


def test_the_connection_cap_pushes_out_idle_connections_and_headers_have_a_deadline(engine):
    _raise_fd_limit(2 * 1000 + 512)
    srv, info = _start(engine, ServeLimits(max_connections=100, header_timeout_s=1.0, keep_alive_s=1.0))
    socks: list[socket.socket] = []
    try:
        socks = _open_idle(info.host, info.port, 1000)
        time.sleep(0.2)
        assert len(info.connections) <= 100
        _normal_request_is_answered(info.url, within_s=10)
        # Every idle connection is closed by the server: pushed out, or past the header deadline.
        time.sleep(2.0)
        for s in socks:
            s.settimeout(5)
            try:
                assert s.recv(1024) == b""
            except ConnectionResetError:
                pass
        assert len(info.connections) == 0
    finally:
        for s in socks:
            s.close()
        srv.__exit__(None, None, None)


# ------------------------------------------------------------------ --api-key-env


@pytest.mark.parametrize("value", ["sk-proj-4f9Xb2LqZt7Wc1Vn8Ka3", "AbCdEf0123456789GhIjKlMn"])
def test_api_key_env_given_a_pasted_key_is_refused_without_echoing_it(value, tmp_path):
    env = {**os.environ, "ARLE_HOME": str(tmp_path)}
    env.pop(value, None)
    proc = subprocess.run(
        [*ARLE, "serve", "--api-key-env", value, "--port", "0"], capture_output=True, text=True, env=env, timeout=120
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert value not in output and "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and "NAME of an environment variable" in lines[0]


def test_headers_past_the_limit_are_431_even_when_they_arrive_at_once(engine):
    """uvicorn's h11 limit holds only for headers still arriving: a block that lands in one read
    was taken whole. The app counts every request's line and headers."""
    srv, info = _start(engine, ServeLimits(max_header_bytes=8192))
    try:
        with httpx.Client(base_url=info.url, timeout=30) as c:
            body = {"messages": CHAT, "max_tokens": 1}
            for headers in ({"x-big": "a" * 20_000}, {f"x-h{i}": "b" * 40 for i in range(300)}):
                resp = c.post("/chat/completions", json=body, headers=headers)
                assert resp.status_code == 431, resp.text[:300]
                assert resp.json()["error"]["code"] == "request_header_fields_too_large"
            assert c.post("/chat/completions", json=body, headers={"x-small": "c" * 1000}).status_code == 200
    finally:
        srv.__exit__(None, None, None)
