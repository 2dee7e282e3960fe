"""An OpenAI-compatible fake server for tests (stdlib only).

    def responder(request_json: dict) -> str:        # chat or completions body -> reply text
        return "42" if "6*7" in str(request_json) else "no idea"

    with FakeOpenAIServer(responder) as srv:
        engine = OpenAIEngine(srv.base_url, srv.model)
        ...
        assert srv.bodies("/chat/completions")[0]["temperature"] == 0.0

It serves GET /v1/models, POST /v1/chat/completions and POST /v1/completions with the standard
response shapes, plus vLLM's `token_ids` / `prompt_token_ids` when `return_token_ids` is set.
A "token" here is one character (token id = its code point, logprob -0.5), except that
`max_tokens` is honoured loosely by whitespace-separated words, so a reply a real model could
give within max_tokens is never cut. The server ignores `stop`, as some real servers do.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


@dataclass
class Reply:
    """What a responder may return instead of plain text: the answer (`content`), a reasoning
    parser's thinking (`reasoning_content`, as vLLM's and DeepSeek's servers send it beside
    the content; `reasoning_tokens` in usage), and a finish reason to force ("length": the
    model ran out of tokens, e.g. inside its thinking)."""

    content: str
    reasoning_content: str | None = None
    finish_reason: str | None = None


Responder = Callable[[dict[str, Any]], "str | Reply"]

# Fields only vLLM understands; `strict=True` rejects them like api.openai.com does.
VLLM_ONLY_FIELDS = ("return_token_ids",)
FAKE_LOGPROB = -0.5


@dataclass
class RecordedRequest:
    """One request the server received, with the status it answered."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: dict[str, Any] | None
    status: int = 0


class FakeOpenAIServer:
    """Threaded OpenAI-compatible server on 127.0.0.1 (random port), used as a context manager.

    Args:
        responder: `responder(request_json) -> completion text` (or a `Reply`, for a thinking
            model's reasoning_content or a forced finish reason); called concurrently from
            handler threads. Default answers "ok". If it raises, the server answers 500.
        model: the name GET /v1/models lists.
        check_model: answer 404 (like vLLM) when a request names another model.
        api_key: when set, requests without `Authorization: Bearer <api_key>` get 401 (the
            message echoes the key received, as some servers do, so clients must redact it).
        fail_first: answer the first N completion requests with `fail_status`, then succeed.
        fail_status: HTTP status for those injected failures.
        retry_after: when set, injected failures carry this `Retry-After` header (seconds).
        delay_s: sleep this long before answering each successful completion request.
        strict: reject vLLM-only fields (return_token_ids) with 400, like hosted APIs.
        usage: send the `usage` token counts (as OpenAI and vLLM do); False leaves them out.
        echo_logprobs: `echo_logprobs(prompt) -> [(token_text, text_offset, logprob), ...]` for the
            prompt's tokens (the first logprob None, as vLLM sends it): a /completions request with
            `echo: true` and `logprobs` is then answered as vLLM's server does (the prompt's tokens
            echoed with their logprobs, then one generated token). Without it `echo` is ignored,
            as by servers that cannot score prompts.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        model: str = "fake-model",
        check_model: bool = False,
        api_key: str | None = None,
        fail_first: int = 0,
        fail_status: int = 429,
        retry_after: float | None = None,
        delay_s: float = 0.0,
        strict: bool = False,
        usage: bool = True,
        echo_logprobs: Callable[[str], list[tuple[str, int, float | None]]] | None = None,
    ) -> None:
        self.responder: Responder = responder or (lambda request_json: "ok")
        self.model = model
        self.check_model = check_model
        self.api_key = api_key
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.retry_after = retry_after
        self.delay_s = delay_s
        self.strict = strict
        self.usage = usage
        self.echo_logprobs = echo_logprobs
        self.in_flight = 0
        self.max_in_flight = 0
        self._failed = 0
        self._counter = 0
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """API root to hand to a client, e.g. http://127.0.0.1:54321/v1."""
        if self._httpd is None:
            raise RuntimeError("FakeOpenAIServer is not running; use it as a context manager")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def bodies(self, endpoint: str | None = None) -> list[dict[str, Any]]:
        """JSON bodies of POST requests, optionally only those whose path ends with `endpoint`."""
        return [
            r.body
            for r in self.requests
            if r.method == "POST" and r.body is not None and (endpoint is None or r.path.endswith(endpoint))
        ]

    def __enter__(self) -> FakeOpenAIServer:
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.fake = self
        # A short poll interval keeps __exit__ (shutdown) from adding ~0.5 s to every test.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        path = handler.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in handler.headers.items()}
        length = int(headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body: dict[str, Any] | None = None
        bad_json = False
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                bad_json = True
        record = RecordedRequest(method, path, headers, body)
        with self._lock:
            self._requests.append(record)
        status, payload, extra = self._answer(method, path, headers, body, bad_json)
        record.status = status
        _send_json(handler, status, payload, extra)

    def _answer(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: dict[str, Any] | None,
        bad_json: bool,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if self.api_key is not None:
            given = headers.get("authorization", "")
            if given != f"Bearer {self.api_key}":
                token = given.removeprefix("Bearer ")
                return _error(401, f"Incorrect API key provided: {token}", "invalid_api_key")
        if method == "GET" and path == "/v1/models":
            model = {"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}
            return 200, {"object": "list", "data": [model]}, {}
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            return _error(404, f"{method} {path} not found", "not_found")
        with self._lock:
            inject = self._failed < self.fail_first
            if inject:
                self._failed += 1
                n = self._failed
        if inject:
            extra = {"Retry-After": f"{self.retry_after:g}"} if self.retry_after is not None else {}
            message = f"injected failure {n} of {self.fail_first}"
            status, payload, _ = _error(self.fail_status, message, "fake")
            return status, payload, extra
        chat = path == "/v1/chat/completions"
        problem = _validate(body, chat, bad_json)
        if problem:
            return _error(400, problem, "invalid_request_error")
        assert body is not None
        if self.strict:
            for field in VLLM_ONLY_FIELDS:
                if field in body:
                    message = f"Unrecognized request argument supplied: {field}"
                    return _error(400, message, "invalid_request_error")
        if self.check_model and body["model"] != self.model:
            return _error(404, f"The model `{body['model']}` does not exist.", "model_not_found")
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self._counter += 1
            number = self._counter
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            try:
                text = self.responder(body)
            except Exception as exc:  # surface test bugs as a server error, visibly
                traceback.print_exc()
                return _error(500, f"responder raised {type(exc).__name__}: {exc}", "server_error")
            reply = (
                _completion(body, chat, text.content, number, text.reasoning_content, text.finish_reason)
                if isinstance(text, Reply)
                else _completion(body, chat, str(text), number)
            )
            if not chat and body.get("echo") and body.get("logprobs") is not None and self.echo_logprobs:
                _echo(reply, body["prompt"], self.echo_logprobs(body["prompt"]))
            if not self.usage:
                del reply["usage"]
            return 200, reply, {}
        finally:
            with self._lock:
                self.in_flight -= 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many concurrent clients connecting at once
    fake: FakeOpenAIServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like a real server
    # Headers and body go out in separate writes; with Nagle on, the body waits ~40 ms for
    # the client's delayed ACK on every response.
    disable_nagle_algorithm = True
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.fake._handle(self, "GET")

    def do_POST(self) -> None:  # noqa: N802
        self.server.fake._handle(self, "POST")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


def _validate(body: dict[str, Any] | None, chat: bool, bad_json: bool) -> str | None:
    if bad_json or not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str):
        return "`model` is required"
    if chat and not isinstance(body.get("messages"), list):
        return "`messages` must be a list"
    if not chat and not isinstance(body.get("prompt"), str):
        return "`prompt` must be a string"
    return None


def _completion(
    body: dict[str, Any],
    chat: bool,
    text: str,
    number: int,
    reasoning: str | None = None,
    forced_finish: str | None = None,
) -> dict[str, Any]:
    """A standard (vLLM-flavoured) response for `text` (and a reasoning parser's `reasoning`)."""
    finish = "stop"
    max_tokens = body.get("max_tokens")
    words = text.split(" ")
    if isinstance(max_tokens, int) and len(words) > max_tokens:
        text, finish = " ".join(words[:max_tokens]), "length"
    if chat:
        messages = [m for m in body["messages"] if isinstance(m, dict)]
        prompt = "".join(_content_text(m.get("content")) for m in messages)
    else:
        prompt = body["prompt"]
    token_ids = [ord(c) for c in text]
    prompt_ids = [ord(c) for c in prompt]
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
    response: dict[str, Any] = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-fake-{number}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(token_ids),
            "total_tokens": len(prompt_ids) + len(token_ids),
        },
    }
    if forced_finish is not None:
        choice["finish_reason"] = forced_finish
    if reasoning is not None:
        response["usage"]["completion_tokens"] += len(reasoning)
        response["usage"]["total_tokens"] += len(reasoning)
        response["usage"]["completion_tokens_details"] = {"reasoning_tokens": len(reasoning)}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
        if reasoning is not None:
            choice["message"]["reasoning_content"] = reasoning
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [_chat_logprob(c) for c in text]}
    else:
        choice["text"] = text
        if body.get("logprobs") is not None:
            choice["logprobs"] = {
                "tokens": list(text),
                "token_logprobs": [FAKE_LOGPROB] * len(text),
                "top_logprobs": None,
                "text_offset": list(range(len(text))),
            }
    if body.get("return_token_ids"):
        # Where vLLM puts them: token_ids on the choice; prompt ids on the response for chat,
        # on the choice for completions.
        choice["token_ids"] = token_ids
        if chat:
            response["prompt_token_ids"] = prompt_ids
        else:
            choice["prompt_token_ids"] = prompt_ids
    return response


def _echo(reply: dict[str, Any], prompt: str, scored: list[tuple[str, int, float | None]]) -> None:
    """Turn a /completions reply into vLLM's answer to `echo: true`: the prompt and its scored
    tokens first (top_logprobs holding each token itself), then the generated text."""
    choice = reply["choices"][0]
    gen = choice["logprobs"] or {"tokens": [], "token_logprobs": [], "top_logprobs": None, "text_offset": []}
    tokens = [t for t, _, _ in scored] + list(gen["tokens"])
    values = [lp for _, _, lp in scored] + list(gen["token_logprobs"])
    offsets = [o for _, o, _ in scored] + [len(prompt) + o for o in gen["text_offset"]]
    top = [None if lp is None else {t: lp} for t, _, lp in scored] + [
        {t: lp} for t, lp in zip(gen["tokens"], gen["token_logprobs"])
    ]
    choice["text"] = prompt + choice["text"]
    choice["logprobs"] = {"tokens": tokens, "token_logprobs": values, "top_logprobs": top, "text_offset": offsets}


def _chat_logprob(token: str) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": FAKE_LOGPROB,
        "bytes": list(token.encode()),
        "top_logprobs": [],
    }


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return json.dumps(content)


def _error(status: int, message: str, code: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return status, {"error": {"message": message, "type": kind, "param": None, "code": code}}, {}


def _send_json(handler: BaseHTTPRequestHandler, status: int, payload: dict[str, Any], extra: dict[str, str]) -> None:
    data = json.dumps(payload).encode()
    try:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        for name, value in extra.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the client gave up (e.g. its timeout fired); nothing to tell it
