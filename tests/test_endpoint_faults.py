"""The openai engine and `arle eval --base-url` against endpoints that misbehave.

Real local servers (127.0.0.1 only) that hang, trickle bytes, send garbage or JSON of the
wrong shape. Each must end as one line (a UserError; exit 2 from the CLI), never a traceback,
within the request deadline (times the attempts); an eval keeps what it finished and resumes.
Elapsed times are asserted with wide margins: they check that a deadline holds, not speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

from arlecli import config
from arlecli.engine import make_engine
from arlecli.engine import openai as openai_engine
from arlecli.engine.base import EngineRequestError, GenerationRequest, SamplingParams
from arlecli.engine.openai import OpenAIEngine, list_models
from arlecli.errors import UserError
from arlecli.models import resolve_model

from helpers.fake_openai import FakeOpenAIServer

FAST = dict(backoff_base_s=0.001, backoff_max_s=0.01)
ARLE = [sys.executable, "-m", "arlecli"]
# Generous: these runs share two CPU cores with other work; a hang would take far longer.
MARGIN_S = 4.0

Behaviour = Callable[["_Handler"], None]


class FaultyServer:
    """A local HTTP server whose POSTs (and, with `models_too`, GET /v1/models) get `behaviour`.

    GET /v1/models otherwise lists one model, so the engine reaches the completion request.
    `stop` is set on exit so that handlers waiting "forever" end with the test."""

    def __init__(self, behaviour: Behaviour, models_too: bool = False) -> None:
        self.behaviour = behaviour
        self.models_too = models_too
        self.stop = threading.Event()
        self.posts = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FaultyServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.fault = self  # type: ignore[attr-defined]
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def fault(self) -> FaultyServer:
        return self.server.fault  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.fault.models_too:
            self.fault.behaviour(self)
        else:
            send(self, 200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode())

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        with self.fault._lock:
            self.fault.posts += 1
        self.fault.behaviour(self)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str = "application/json") -> None:
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
    except OSError:
        pass  # the client gave up


def hang(handler: _Handler) -> None:
    """Accept, read the request, never answer."""
    handler.fault.stop.wait()
    handler.close_connection = True


def trickle(raw: bytes) -> Behaviour:
    """Send `raw` one byte per second, forever (the bytes repeat): httpx's per-read timeout
    is reset by every byte, so only a total deadline ends the request."""

    def behaviour(handler: _Handler) -> None:
        i = 0
        while not handler.fault.stop.wait(1.0):
            try:
                handler.wfile.write(raw[i % len(raw) : i % len(raw) + 1])
            except OSError:
                break
            i += 1
        handler.close_connection = True

    return behaviour


TRICKLE_HEADERS = trickle(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000)
BODY_HEAD = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"choices": ['


def trickle_body(handler: _Handler) -> None:
    """Headers at once, then a body of 1 MB announced and sent one byte per second."""
    try:
        handler.wfile.write(BODY_HEAD)
    except OSError:
        return
    trickle(b" ")(handler)


def reply_raw(body: bytes, status: int = 200, content_type: str = "application/json") -> Behaviour:
    return lambda handler: send(handler, status, body, content_type)


def reply(payload: Any) -> Behaviour:
    return reply_raw(json.dumps(payload).encode())


def not_http(handler: _Handler) -> None:
    """Bytes that are not an HTTP response at all, then hang up."""
    try:
        handler.wfile.write(b"\x00\xff\xfe garbage, not HTTP \r\n\r\n")
    except OSError:
        pass
    handler.close_connection = True


def chat(text: str = "hi", **params: Any) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], params=SamplingParams(**params))


def prompt(text: str = "hi", **params: Any) -> GenerationRequest:
    return GenerationRequest(prompt=text, params=SamplingParams(**params))


def fails(engine: OpenAIEngine, request: GenerationRequest) -> tuple[str, float]:
    """Run one request that must fail; return its one-line message and the seconds it took."""
    start = time.monotonic()
    with pytest.raises(UserError) as info:
        dict(engine.generate([request]))
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message, elapsed


# ------------------------------------------------------------------ deadlines


def test_hanging_endpoint_is_reported_within_the_deadline_times_the_attempts(capsys):
    with FaultyServer(hang) as srv, OpenAIEngine(srv.base_url, "m", timeout_s=1.0, max_retries=1, **FAST) as engine:
        message, elapsed = fails(engine, chat())
        posts = srv.posts
    assert 1.9 <= elapsed < 2 * 1.0 + MARGIN_S
    assert posts == 2
    assert "failed after 2 attempts" in message and "no complete answer within 1 s" in message
    assert srv.base_url in message and "--request-timeout" in message and "hung" in message
    # The first deadline already says what is happening: a retry is never silent.
    warning = capsys.readouterr().err
    assert "warning:" in warning and "retrying (attempt 2 of 2, each up to 1 s" in warning


@pytest.mark.parametrize("behaviour", [trickle_body, TRICKLE_HEADERS], ids=["body", "headers"])
def test_trickling_endpoint_is_cut_at_the_deadline(behaviour):
    # The deadline (2.5 s) is longer than the gap between bytes (1 s): a per-read timeout never fires.
    with FaultyServer(behaviour) as srv, OpenAIEngine(srv.base_url, "m", timeout_s=2.5, max_retries=0) as engine:
        message, elapsed = fails(engine, chat())
    assert 2.4 <= elapsed < 2.5 + MARGIN_S
    assert "failed after 1 attempt," in message and "no complete answer within 2.5 s" in message


def test_model_listing_on_a_hanging_or_trickling_endpoint_has_a_deadline():
    with FaultyServer(hang, models_too=True) as srv, OpenAIEngine(srv.base_url, None, timeout_s=1.0) as engine:
        message, elapsed = fails(engine, chat())
    assert elapsed < 1.0 + MARGIN_S
    assert "GET" in message and "/models" in message and "pass the model name" in message
    with FaultyServer(trickle_body, models_too=True) as srv:
        start = time.monotonic()
        with pytest.raises(EngineRequestError, match="no complete answer within 1.5 s"):
            list_models(srv.base_url, timeout_s=1.5)
    assert time.monotonic() - start < 1.5 + MARGIN_S


def test_many_requests_to_a_hung_endpoint_all_end_at_the_deadline():
    with (
        FaultyServer(hang) as srv,
        OpenAIEngine(srv.base_url, "m", timeout_s=1.0, max_retries=0, concurrency=4) as engine,
    ):
        start = time.monotonic()
        with pytest.raises(EngineRequestError):
            dict(engine.generate([chat(str(i)) for i in range(8)]))
    # The first failure ends generate(); the rest are cancelled, not waited for.
    assert time.monotonic() - start < 1.0 + MARGIN_S


# ------------------------------------------------------------------ garbage


def test_garbage_instead_of_json_fails_at_once():
    html = reply_raw(b"<html><body>502 Bad Gateway</body></html>", content_type="text/html")
    with FaultyServer(html) as srv, OpenAIEngine(srv.base_url, "m", max_retries=3, **FAST) as engine:
        message, elapsed = fails(engine, chat())
        posts = srv.posts
    assert posts == 1  # a server answering 200 with HTML will do it again: no retries
    assert "did not answer with JSON" in message and "502 Bad Gateway" in message


def test_bytes_that_are_not_http_are_retried_then_reported():
    with FaultyServer(not_http) as srv, OpenAIEngine(srv.base_url, "m", max_retries=1, **FAST) as engine:
        message, _ = fails(engine, chat())
        posts = srv.posts
    assert posts == 2
    assert "failed after 2 attempts" in message and "broken answer" in message


def test_invalid_utf8_and_deeply_nested_json_are_one_line():
    for body in (b"\xff\xfe\xfd not utf-8", b"[" * 200_000 + b"]" * 200_000):
        with FaultyServer(reply_raw(body)) as srv, OpenAIEngine(srv.base_url, "m", **FAST) as engine:
            message, _ = fails(engine, chat())
        assert "did not answer with JSON" in message


def test_an_error_message_with_a_lone_surrogate_prints(tmp_path):
    body = b'{"error": {"message": "bad \\ud800 request"}}'
    with FaultyServer(reply_raw(body, status=400)) as srv, OpenAIEngine(srv.base_url, "m", **FAST) as engine:
        message, _ = fails(engine, chat())
    assert "HTTP 400" in message and "bad ? request" in message
    message.encode("utf-8")  # printable as it is


def test_a_reply_past_the_size_cap_is_refused(monkeypatch):
    monkeypatch.setattr(openai_engine, "MAX_RESPONSE_BYTES", 1000)
    big = {"choices": [{"message": {"role": "assistant", "content": "x" * 5000}}]}
    with FaultyServer(reply(big)) as srv, OpenAIEngine(srv.base_url, "m", **FAST) as engine:
        message, _ = fails(engine, chat())
    assert "more than" in message and "MB" in message


def _chat_reply(**choice: Any) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop", **choice}]}


def _message(content: Any) -> dict[str, Any]:
    return _chat_reply(message={"role": "assistant", "content": content})


# (id, the raw JSON reply, request kind, what the message must name)
MALFORMED: list[tuple[str, bytes, str, str]] = [
    ("not-an-object", b"[1, 2, 3]", "chat", "the reply is a list"),
    ("choices-missing", json.dumps({"id": "x", "object": "chat.completion"}).encode(), "chat", "no choices"),
    ("choices-not-a-list", json.dumps({"choices": {"0": {"text": "a"}}}).encode(), "chat", "choices is an object"),
    (
        "choices-empty-with-error",
        json.dumps({"choices": [], "error": {"message": "quota exceeded"}}).encode(),
        "chat",
        "quota exceeded",
    ),
    ("choice-a-string", json.dumps({"choices": ["hello"]}).encode(), "chat", "choices[0] is a string"),
    ("message-a-string", json.dumps(_chat_reply(message="hello")).encode(), "chat", "choices[0].message is a string"),
    ("message-missing", json.dumps(_chat_reply(text="hello")).encode(), "chat", "choices[0].message is null"),
    ("content-an-int", json.dumps(_message(42)).encode(), "chat", "message.content is a number"),
    ("content-a-list", json.dumps(_message([1, "two"])).encode(), "chat", "message.content is a list"),
    ("content-an-object", json.dumps(_message({"text": "a"})).encode(), "chat", "message.content is an object"),
    (
        "lone-surrogate",
        b'{"choices": [{"message": {"role": "assistant", "content": "ok \\ud800 then"}}]}',
        "chat",
        "lone UTF-16 surrogate",
    ),
    ("usage-a-string", json.dumps({**_message("ok"), "usage": "12 tokens"}).encode(), "chat", "usage is a string"),
    (
        "logprobs-not-numbers",
        json.dumps(
            _chat_reply(
                message={"content": "ab"},
                logprobs={"content": [{"token": "a", "logprob": "-0.5"}, {"token": "b", "logprob": -0.1}]},
            )
        ).encode(),
        "chat",
        "holds a string",
    ),
    (
        "logprobs-wrong-shape",
        json.dumps(_chat_reply(message={"content": "ab"}, logprobs=[-0.5, -0.1])).encode(),
        "chat",
        "logprobs is a list",
    ),
    (
        "logprobs-content-not-a-list",
        json.dumps(_chat_reply(message={"content": "ab"}, logprobs={"content": "-0.5"})).encode(),
        "chat",
        "logprobs.content is not a list",
    ),
    (
        "logprobs-nan",
        b'{"choices": [{"message": {"content": "a"}, "logprobs": {"content": [{"logprob": NaN}]}}]}',
        "chat",
        "not a number",
    ),
    (
        "logprobs-a-boolean",
        json.dumps(_chat_reply(message={"content": "a"}, logprobs={"content": [{"logprob": True}]})).encode(),
        "chat",
        "holds a boolean",
    ),
    (
        "token-ids-not-ints",
        json.dumps(_chat_reply(message={"content": "a"}, token_ids=["a"])).encode(),
        "chat",
        "token_ids is not a list of token ids",
    ),
    (
        "prompt-token-ids-a-string",
        json.dumps({**_message("a"), "prompt_token_ids": "1 2 3"}).encode(),
        "chat",
        "prompt_token_ids is not a list",
    ),
    (
        "completion-text-an-int",
        json.dumps({"choices": [{"text": 7}]}).encode(),
        "prompt",
        "choices[0].text is a number",
    ),
    (
        "completion-logprobs-not-numbers",
        json.dumps({"choices": [{"text": "ab", "logprobs": {"token_logprobs": ["x", None]}}]}).encode(),
        "prompt",
        "token_logprobs holds a string",
    ),
    (
        "completion-logprobs-an-int",
        json.dumps({"choices": [{"text": "ab", "logprobs": {"token_logprobs": 3}}]}).encode(),
        "prompt",
        "token_logprobs is a number",
    ),
]


@pytest.mark.parametrize("body,kind,names", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_json_reply_is_a_failed_request_in_one_line(body, kind, names):
    request = chat(logprobs=True) if kind == "chat" else prompt(logprobs=True)
    with FaultyServer(reply_raw(body)) as srv, OpenAIEngine(srv.base_url, "m", max_retries=3, **FAST) as engine:
        with pytest.raises(EngineRequestError) as info:
            dict(engine.generate([request]))
        posts = srv.posts
    message = str(info.value)
    assert "\n" not in message
    assert names in message, message
    if body.startswith(b"{") or body.startswith(b"["):
        assert "malformed completion" in message and srv.base_url in message
    assert posts == 1  # a malformed reply is not retried: the same server would answer the same


def test_well_formed_variants_still_parse():
    """Shapes real servers send: content parts, null content, -inf and null logprobs, no usage."""
    parts = _chat_reply(message={"content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}]})
    with FaultyServer(reply(parts)) as srv, OpenAIEngine(srv.base_url, "m") as engine:
        assert dict(engine.generate([chat()]))[0].text == "42"
    empty = _chat_reply(message={"role": "assistant", "content": None}, logprobs={"content": None})
    with FaultyServer(reply(empty)) as srv, OpenAIEngine(srv.base_url, "m") as engine:
        out = dict(engine.generate([chat(logprobs=True)]))[0]
    assert out.text == "" and out.logprobs == []
    odd = b'{"choices": [{"text": "ab", "logprobs": {"token_logprobs": [null, -Infinity]}}], "usage": null}'
    with FaultyServer(reply_raw(odd)) as srv, OpenAIEngine(srv.base_url, "m") as engine:
        out = dict(engine.generate([prompt(logprobs=True)]))[0]
    assert out.text == "ab" and out.logprobs == [0.0, float("-inf")]


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    "kwargs,names",
    [
        (dict(timeout_s=-1), "timeout_s"),
        (dict(timeout_s=0), "timeout_s"),
        (dict(timeout_s=float("nan")), "timeout_s"),
        (dict(timeout_s=float("inf")), "timeout_s"),
        (dict(max_retries=-1), "max_retries"),
        (dict(max_retries=1.5), "max_retries"),
        (dict(max_retries=True), "max_retries"),
    ],
    ids=["negative", "zero", "nan", "inf", "negative-retries", "fractional-retries", "bool-retries"],
)
def test_bad_limits_are_refused_in_one_line(kwargs, names):
    with pytest.raises(UserError, match=names) as info:
        OpenAIEngine("http://127.0.0.1:1/v1", "m", **kwargs)
    assert "\n" not in str(info.value)


def test_profile_limits_are_used_unless_the_command_line_overrides():
    config.save_profile(
        config.ModelProfile(name="slow", base_url="http://127.0.0.1:1/v1", model="m", request_timeout=7, max_retries=0)
    )
    spec = resolve_model("slow")
    assert (spec.request_timeout, spec.max_retries) == (7.0, 0)
    engine = make_engine(spec)
    assert (engine.timeout_s, engine.max_retries) == (7.0, 0)
    spec = resolve_model("slow", request_timeout="2.5", max_retries="3")
    engine = make_engine(spec)
    assert (engine.timeout_s, engine.max_retries) == (2.5, 3)
    # Nothing set anywhere: the engine's defaults.
    engine = make_engine(resolve_model(None, base_url="http://127.0.0.1:1/v1"))
    assert (engine.timeout_s, engine.max_retries) == (config.DEFAULT_REQUEST_TIMEOUT_S, config.DEFAULT_MAX_RETRIES)


def test_a_bad_limit_in_models_yaml_names_the_file_and_profile(isolated_home):
    (isolated_home / "models.yaml").write_text(
        "profiles:\n  ep: {base_url: 'http://127.0.0.1:1/v1', request_timeout: -3}\n"
    )
    with pytest.raises(UserError, match=r"models.yaml: profile 'ep': request_timeout must be") as info:
        resolve_model("ep")
    assert "\n" not in str(info.value)


def test_limits_on_weights_are_refused():
    with pytest.raises(UserError, match="only apply to endpoints"):
        resolve_model("org/some-model", max_retries=2)


# ------------------------------------------------------------------ through the CLI


def arle(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run([*ARLE, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    return proc, time.monotonic() - start


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The run's single `error:` line; progress lines may precede it, a traceback may not."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1] == errors[0]
    return errors[0]


def read_samples(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]


def read_ids(run: Path) -> list[str]:
    return [s["id"] for s in read_samples(run)]


def test_eval_on_a_hanging_endpoint_exits_2_in_one_line_then_resumes(tmp_path):
    rows = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(6)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    release = threading.Event()

    def responder(body: dict[str, Any]) -> str:
        n = int(body["prompt"].rsplit("What is ", 1)[1].split()[0])
        if n == 3:  # this one request hangs until the server is fixed
            release.wait(60)
        return f" #### {n + 1}"

    run = tmp_path / "run"
    common = ["eval", "gsm8k", "--data", str(data), "--base-url", "", "--num-fewshot", "0", "--output", str(run)]
    with FakeOpenAIServer(responder) as srv:
        common[common.index("--base-url") + 1] = srv.base_url
        proc, elapsed = arle(*common, "--request-timeout", "2", "--max-retries", "0")
        line = one_error_line(proc)
        assert "no complete answer within 2 s" in line and srv.base_url in line
        assert "--request-timeout" in line and "rerun with --resume" in line
        assert elapsed < 60  # the deadline, not an hour (process start-up dominates)
        done = read_ids(run)
        assert 1 <= len(done) <= 5
        assert not any("What is 3 plus 1?" in str(s["prompt"]) for s in read_samples(run))
        release.set()  # the endpoint works again
        proc, _ = arle(*common, "--resume", "--json")
    assert proc.returncode == 0, proc.stderr
    assert f"resuming: {len(done)}/6" in proc.stderr
    assert sorted(read_ids(run)) == sorted(set(read_ids(run))) and len(read_ids(run)) == 6
    assert json.loads(proc.stdout)["metrics"]["flexible_extract"]["value"] == 1.0


def test_eval_on_a_malformed_endpoint_exits_2_in_one_line(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": "What is 1 plus 1?", "answer": "#### 2"}) + "\n")
    with FaultyServer(reply({"choices": [{"text": {"nested": "object"}}]})) as srv:
        proc, _ = arle(
            "eval",
            "gsm8k",
            "--data",
            str(data),
            "--base-url",
            srv.base_url,
            "--num-fewshot",
            "0",
            "--output",
            str(tmp_path / "run"),
            "--max-retries",
            "0",
        )
    line = one_error_line(proc)
    assert "malformed completion" in line and "choices[0].text is an object" in line
    assert "no sample finished before it" in line  # its only sample failed: nothing kept is claimed


@pytest.mark.parametrize(
    "args,names",
    [
        (["eval", "gsm8k", "--base-url", "http://127.0.0.1:1/v1", "--request-timeout", "-5"], "--request-timeout"),
        (["eval", "gsm8k", "--base-url", "http://127.0.0.1:1/v1", "--request-timeout", "soon"], "--request-timeout"),
        (["eval", "gsm8k", "--base-url", "http://127.0.0.1:1/v1", "--max-retries", "-1"], "--max-retries"),
        (
            ["model", "setup", "--name", "ep", "--base-url", "http://127.0.0.1:1/v1", "--max-retries", "x"],
            "--max-retries",
        ),
        (
            ["model", "setup", "--name", "ep", "--hub-id", "org/m", "--request-timeout", "5"],
            "only apply with --base-url",
        ),
    ],
    ids=[
        "eval-negative-timeout",
        "eval-text-timeout",
        "eval-negative-retries",
        "setup-text-retries",
        "setup-limits-on-weights",
    ],
)
def test_bad_values_on_the_command_line_are_one_line_exit_2(args, names):
    proc, _ = arle(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error:"), proc.stderr
    assert names in proc.stderr


def test_model_setup_stores_the_limits(isolated_home):
    proc, _ = arle(
        "model",
        "setup",
        "--name",
        "ep",
        "--base-url",
        "http://127.0.0.1:1/v1",
        "--request-timeout",
        "90",
        "--max-retries",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    assert "request timeout  90 s" in proc.stdout and "max retries      2" in proc.stdout
    profile = config.get_profile("ep")
    assert (profile.request_timeout, profile.max_retries) == (90.0, 2)
