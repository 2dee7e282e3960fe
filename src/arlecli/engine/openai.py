"""The `openai` engine: any OpenAI-compatible endpoint (vllm serve, hosted APIs, arle serve).

Requests with chat `messages` go to POST {base_url}/chat/completions, raw `prompt` requests to
POST {base_url}/completions. Work is async inside (one httpx.AsyncClient on an event loop in a
background thread, a semaphore of `concurrency` slots), but `generate()` is a plain synchronous
generator that yields `(index, Completion)` as each request finishes.

The API key is read from the environment variable named by `api_key_env` at request time; it is
never stored on the engine, logged, or put into an error message.

A server can misbehave in every way: hang, trickle bytes, send garbage or a JSON reply of the
wrong shape. Each attempt therefore has one total deadline (`timeout_s`, covering connect,
headers and the whole body; httpx's own timeout is per read and never trips on a trickle), the
body is capped in size, and a reply is checked field by field before it becomes a Completion.
Whatever goes wrong ends as a UserError of one line that names the endpoint and what to do.

Reasoning models: `chat_template_kwargs` go in the body of chat requests (vLLM's and SGLang's
servers pass them to the chat template), `max_thinking_tokens` as vLLM's
`thinking_token_budget` (a server started with a reasoning parser enforces it; others refuse
or ignore the field). Stop strings cut the answer only: without a reasoning parser the text
holds the thinking too, and a stop string inside it does not end the turn; for a model known
to think (`--think-tags`) the stops are not sent to the server at all (it would cut inside the
thought), only applied here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import json
import math
import os
import queue
import random
import re
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Coroutine, Iterator, TypeVar

import httpx

from arlecli import config, safeio
from arlecli.engine.base import (
    Completion,
    EngineRequestError,
    GenerationRequest,
    Loglik,
    LoglikRequest,
    SamplingParams,
    cut_at_stop,
    cut_answer_at_stop,
)
from arlecli.errors import UserError
from arlecli.thinking import ThinkTags, tags_for, thinks

T = TypeVar("T")

# 408/409/425 are "try again" answers too; every 5xx is retried as well.
_RETRY_STATUS = frozenset({408, 409, 425, 429})
# OpenAI rejects more than 4 stop sequences; the rest are still applied client-side.
_MAX_SERVER_STOPS = 4
# A broken Retry-After (hours, a date far ahead) should not park a run silently.
_MAX_RETRY_AFTER_S = 300.0
_MAX_SERVER_MESSAGE = 300
# A reply bigger than this is a broken server, not a completion (a long one with logprobs is a
# few MB); without a cap a server streaming garbage fills the memory before the deadline.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
# GET /models answers at once on any real server; waiting the full request timeout is no use.
_MAX_LIST_MODELS_S = 30.0
# Retries are announced on stderr (a hung endpoint must not look like a slow run), but at most
# once per this many seconds: with many requests in flight they all retry together.
_WARN_EVERY_S = 30.0


class MalformedReply(ValueError):
    """A 200 reply whose JSON does not have the shape of a completion (says what is wrong)."""


class _TooLarge(Exception):
    """The reply body went past MAX_RESPONSE_BYTES."""


class OpenAIEngine:
    """Engine for an OpenAI-compatible HTTP endpoint.

    Args:
        base_url: API root including the version, e.g. "http://127.0.0.1:8000/v1".
        model: served model name; None picks the only model the server lists (GET /models).
        api_key_env: name of the environment variable holding the API key, or None to send
            no Authorization header (a local vLLM server needs none).
        concurrency: most requests in flight at once.
        timeout_s: deadline for one whole attempt (connect, wait, and the full reply however
            slowly it arrives); long generations need a generous value.
        max_retries: retries after the first attempt on 429, 5xx, timeouts, connection errors
            and broken connections. A malformed reply is not retried.
        backoff_base_s, backoff_max_s: exponential backoff (with jitter) between retries when
            the server gives no Retry-After.
        chat_template_kwargs: the chat template's switches (`enable_thinking`), sent with every
            chat request.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key_env: str | None = None,
        concurrency: int = 8,
        timeout_s: float = config.DEFAULT_REQUEST_TIMEOUT_S,
        max_retries: int = config.DEFAULT_MAX_RETRIES,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if concurrency < 1:
            raise UserError(f"openai engine: concurrency must be at least 1 (got {concurrency})")
        timeout_s = config.check_request_timeout(timeout_s, "openai engine: timeout_s")  # type: ignore[assignment]
        max_retries = config.check_max_retries(max_retries, "openai engine: max_retries")  # type: ignore[assignment]
        self.base_url = _normalise_base_url(base_url)
        self.model = model
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.timeout_s: float = timeout_s
        self.max_retries: int = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # vLLM-only field; flipped off once if the server rejects it (hosted APIs do).
        self._send_token_ids = True
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self._closed = False
        self._last_warning = -math.inf

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        """Yield (index into requests, completion) as each request finishes, in any order.

        The first failure (after retries) is raised and the remaining requests are cancelled;
        so is everything still pending when the caller stops iterating early.
        """
        for i, req in enumerate(requests):
            _check_request(i, req)
        if not requests:
            return
        # Started before the coroutines exist: a start that fails (a 401 resolving the model)
        # must not leave them unawaited ("coroutine ... was never awaited" at exit).
        self._start()
        yield from self._as_completed([_settled(self._generate_one(req)) for req in requests], "generate()")

    def loglikelihood(self, requests: list[LoglikRequest]) -> Iterator[tuple[int, Loglik]]:
        """Yield (index, Loglik) as each (context, continuation) is scored, in any order.

        As lm-eval's local-completions: POST /completions with the whole text as the prompt,
        `echo: true, logprobs: 1, max_tokens: 1`, and sum the echoed prompt logprobs of the
        continuation's tokens. The endpoint tokenises (arle has no tokenizer for it), so the
        continuation's tokens are found by `text_offset`: every prompt token that holds a
        character past the context (its trailing whitespace counts as continuation, as lm-eval
        splits). An endpoint that does not echo prompt logprobs is a one-line UserError."""
        if not requests:
            return
        self._start()  # before the coroutines exist, as in generate()
        yield from self._as_completed([_settled(self._loglik_request(req)) for req in requests], "loglikelihood()")

    def _as_completed(self, coros: list[Coroutine[Any, Any, T | Exception]], what: str) -> Iterator[tuple[int, T]]:
        """Run `coros` (each returns its failure rather than raising) on the engine's loop and
        yield (index, result) as each finishes. The first failure is raised and the rest are
        cancelled; so is everything still pending when the caller stops iterating early."""
        loop = self._start()
        done: queue.SimpleQueue[tuple[int, concurrent.futures.Future[T | Exception]]] = queue.SimpleQueue()
        futures = []
        for i, coro in enumerate(coros):
            fut = asyncio.run_coroutine_threadsafe(coro, loop)

            def finished(f: concurrent.futures.Future[T | Exception], i: int = i) -> None:
                done.put((i, f))

            fut.add_done_callback(finished)
            futures.append(fut)
        try:
            for _ in futures:
                i, fut = done.get()
                if fut.cancelled():
                    raise RuntimeError(f"OpenAIEngine was closed while {what} was running")
                result = fut.result()
                if isinstance(result, Exception):
                    raise result
                yield i, result
        finally:
            # Early exit or an error: stop the rest instead of letting them run unseen.
            for fut in futures:
                fut.cancel()

    async def _loglik_request(self, req: LoglikRequest) -> Loglik:
        url = self.base_url + "/completions"
        prompt = req.context + req.continuation
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": 1,
            "echo": True,
            "seed": 1234,
        }
        try:
            return await self._call(
                url, lambda: body, lambda data: _parse_echo(data, prompt, req.context), "echo of prompt logprobs"
            )
        except EngineRequestError as exc:
            if "HTTP 4" not in str(exc):  # retries spent, a hang: the endpoint's trouble, not a missing feature
                raise
            raise UserError(
                f"{exc}; --scoring loglikelihood needs an endpoint whose /completions echoes prompt "
                "logprobs (echo + logprobs, as vLLM's server does); use --scoring generate"
            ) from None

    def close(self) -> None:
        """Cancel in-flight requests, close the HTTP client and stop the background loop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        except concurrent.futures.TimeoutError:
            pass  # a stuck socket must not hang close(); the daemon thread dies with the process
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            if not thread.is_alive():
                loop.close()

    def __enter__(self) -> OpenAIEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def served_model(self) -> str:
        """The model id requests name: the one given, else the only one the server lists (asked
        once, as the first request would). An eval's header and results name it, not the URL."""
        with self._lock:
            if self.model is None:
                self.model = _only_model(self.base_url, self.api_key_env, min(self.timeout_s, _MAX_LIST_MODELS_S))
            return self.model

    def _start(self) -> asyncio.AbstractEventLoop:
        """Start the background loop and client on first use; resolve the model if not given."""
        with self._lock:
            if self._closed:
                raise RuntimeError("OpenAIEngine is closed")
            if self.model is None:
                self.model = _only_model(self.base_url, self.api_key_env, min(self.timeout_s, _MAX_LIST_MODELS_S))
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="arle-openai", daemon=True)
                thread.start()
                asyncio.run_coroutine_threadsafe(self._open(), loop).result()
                self._loop, self._thread = loop, thread
            return self._loop

    async def _open(self) -> None:
        # Created on the loop thread: the client's pool and the semaphore belong to that loop.
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 30.0)),
            limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency),
        )
        self._slots = asyncio.Semaphore(self.concurrency)

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()

    async def _generate_one(self, req: GenerationRequest) -> Completion:
        """One request with retries; raises EngineRequestError (a UserError) when it cannot succeed."""
        assert self.model is not None
        chat = req.messages is not None
        url = self.base_url + ("/chat/completions" if chat else "/completions")
        model = self.model
        tags = tags_for(self)
        # A model known to think would be cut inside its thought by the server's stops.
        server_stops = not thinks(self)

        def parse(data: Any) -> Completion:
            return parse_completion(data, chat, req.params.stop, tags)

        return await self._call(
            url,
            lambda: _request_body(model, req, self._send_token_ids, self.chat_template_kwargs, server_stops),
            parse,
            "completion",
        )

    async def _call(self, url: str, make_body: Any, parse: Any, what: str) -> Any:
        """POST `make_body()` to `url` with retries and return `parse(reply JSON)` (its
        `latency_s` set when it has one); EngineRequestError when it cannot succeed."""
        assert self._client is not None and self._slots is not None and self.model is not None
        attempt = 0
        # The slot is held through backoff sleeps so a rate-limited server sees less load.
        async with self._slots:
            # Latency starts once the request holds a slot: waiting behind our own concurrency
            # limit is not the server's time; retries and backoff are part of what it cost.
            started = time.perf_counter()
            while True:
                headers, key = _auth_headers(self.api_key_env)
                body = make_body()
                delay: float | None = None
                timed_out = False
                try:
                    # The one deadline that holds against a server trickling bytes.
                    status, resp_headers, content = await asyncio.wait_for(
                        self._post(url, body, headers), timeout=self.timeout_s
                    )
                except (asyncio.TimeoutError, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout):
                    problem = f"no complete answer within {self.timeout_s:g} s"
                    timed_out = True
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    problem = f"cannot connect ({_one_line(str(exc)) or type(exc).__name__})"
                except _TooLarge:
                    raise EngineRequestError(
                        f"openai engine: POST {url} answered with more than "
                        f"{MAX_RESPONSE_BYTES // 2**20} MB; is the base URL an OpenAI-compatible endpoint?"
                    ) from None
                except httpx.RequestError as exc:
                    # Not HTTP, a connection cut mid-reply, a body that does not decode.
                    detail = _one_line(str(exc))[:120] or type(exc).__name__
                    problem = f"broken answer ({type(exc).__name__}: {detail})"
                else:
                    if 200 <= status < 300:
                        try:
                            result = parse(_json(content, url))
                        except MalformedReply as exc:
                            raise EngineRequestError(
                                f"openai engine: POST {url} answered with a malformed {what} ({exc}); "
                                "is the base URL an OpenAI-compatible endpoint?"
                            ) from None
                        if hasattr(result, "latency_s"):
                            result.latency_s = time.perf_counter() - started
                        return result
                    message = _redact(_server_message(content), key)
                    # Checked on the body this request sent, not the flag: concurrent requests sent
                    # the field before the first refusal flipped it, and each must ask again.
                    if status == 400 and "return_token_ids" in body and "return_token_ids" in message:
                        # Not vLLM: ask again without the extra field (costs no retry).
                        self._send_token_ids = False
                        continue
                    if status < 500 and status not in _RETRY_STATUS:
                        raise _status_error(status, url, message, self.base_url, self.model, self.api_key_env)
                    problem = f"HTTP {status}" + (f" ({message})" if message else "")
                    delay = _retry_after_s(resp_headers)
                if attempt >= self.max_retries:
                    raise self._gave_up(url, attempt + 1, problem, timed_out)
                if delay is None:
                    delay = _backoff_s(attempt, self.backoff_base_s, self.backoff_max_s)
                self._warn_retry(url, problem, attempt + 2)
                await asyncio.sleep(delay)
                attempt += 1

    async def _post(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, httpx.Headers, bytes]:
        """POST and read the whole reply, refusing one past MAX_RESPONSE_BYTES."""
        assert self._client is not None
        # Encoded here, not by httpx: a lone surrogate (in an earlier turn's reply, a tool's
        # output) becomes U+FFFD instead of a UnicodeEncodeError that would stop the run.
        content = safeio.clean_text(json.dumps(body, ensure_ascii=False, separators=(",", ":"))).encode("utf-8")
        headers = {"Content-Type": "application/json", **headers}
        async with self._client.stream("POST", url, content=content, headers=headers) as resp:
            return resp.status_code, resp.headers, await _read_capped(resp)

    def _gave_up(self, url: str, attempts: int, problem: str, timed_out: bool) -> EngineRequestError:
        """The one-line error after the last attempt, with the fix that fits the failure."""
        if timed_out:
            fix = (
                f"the endpoint {self.base_url} looks hung or overloaded: check that it is up and "
                f"answering, or raise --request-timeout (now {self.timeout_s:g} s) for long "
                f"generations and --max-retries (now {self.max_retries})"
            )
        else:
            fix = (
                "check that the server is up and the base URL is right, or lower the concurrency "
                f"/ raise --max-retries (now {self.max_retries}) for a busy server"
            )
        return EngineRequestError(
            f"openai engine: POST {url} failed after {attempts} attempt{'s' if attempts > 1 else ''}, "
            f"last: {problem}; {fix}"
        )

    def _warn_retry(self, url: str, problem: str, next_attempt: int) -> None:
        # A line on stderr so that minutes of retrying a dead endpoint are never silent.
        now = time.monotonic()
        if now - self._last_warning < _WARN_EVERY_S:
            return
        self._last_warning = now
        print(
            safeio.terminal_text(  # the problem quotes the endpoint's own error text
                f"warning: openai engine: POST {url}: {problem}; retrying (attempt {next_attempt} of "
                f"{self.max_retries + 1}, each up to {self.timeout_s:g} s; see --request-timeout "
                "and --max-retries)"
            ),
            file=sys.stderr,
            flush=True,
        )


async def _read_capped(resp: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def _settled(coro: Any) -> Any:
    """`coro`'s result, or the exception it raised as a value. A request that fails after
    the caller stopped listening (another one failed first and the rest were cancelled a moment
    too late) otherwise logs "Task exception was never retrieved" with a traceback at exit."""
    try:
        return await coro
    except Exception as exc:  # CancelledError is a BaseException: cancellation still propagates
        return exc


def list_models(base_url: str, api_key_env: str | None = None, timeout_s: float = _MAX_LIST_MODELS_S) -> list[str]:
    """Return the model names an OpenAI-compatible server serves (GET {base_url}/models).

    `timeout_s` bounds the whole request, a server trickling its answer included."""
    base = _normalise_base_url(base_url)
    url = base + "/models"
    headers, key = _auth_headers(api_key_env)

    async def get() -> tuple[int, bytes]:
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, _MAX_LIST_MODELS_S))
        async with httpx.AsyncClient(timeout=timeout) as client:
            async with client.stream("GET", url, headers=headers) as resp:
                return resp.status_code, await _read_capped(resp)

    try:
        status, content = _run_blocking(asyncio.wait_for(get(), timeout=timeout_s))
    except (asyncio.TimeoutError, httpx.TimeoutException):
        raise EngineRequestError(
            f"openai engine: GET {url} gave no complete answer within {timeout_s:g} s; "
            f"the endpoint {base} looks hung: check that it is up, or pass the model name"
        ) from None
    except _TooLarge:
        raise EngineRequestError(
            f"openai engine: GET {url} answered with more than {MAX_RESPONSE_BYTES // 2**20} MB; "
            "check the base URL (it usually ends in /v1)"
        ) from None
    except httpx.RequestError as exc:
        raise EngineRequestError(
            f"openai engine: cannot reach {url} ({_one_line(str(exc))[:120] or type(exc).__name__}); "
            "is the server running and the base URL right?"
        ) from None
    if not 200 <= status < 300:
        message = _redact(_server_message(content), key)
        raise _status_error(status, url, message, base, None, api_key_env)
    data = _json(content, url)
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        entries = []
    return [
        m["id"] for m in entries if isinstance(m, dict) and isinstance(m.get("id"), str) and not _has_surrogate(m["id"])
    ]


def _run_blocking(coro: Any) -> Any:
    """Run `coro` to completion from synchronous code, even when this thread runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _only_model(base_url: str, api_key_env: str | None, timeout_s: float) -> str:
    models = list_models(base_url, api_key_env, timeout_s)
    if len(models) == 1:
        return models[0]
    if not models:
        raise UserError(f"openai engine: {base_url}/models lists no models; pass the model name")
    raise UserError(f"openai engine: {base_url} serves several models ({', '.join(models)}); pick one by name")


def _normalise_base_url(base_url: str) -> str:
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UserError(
            f"openai engine: base URL {base_url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1)"
        )
    return url


def _check_request(i: int, req: GenerationRequest) -> None:
    if (req.messages is None) == (req.prompt is None):
        raise ValueError(f"request {i}: set exactly one of `messages` and `prompt`")


def _auth_headers(api_key_env: str | None) -> tuple[dict[str, str], str | None]:
    """Authorization header from the environment, read now so a rotated key is picked up."""
    if not api_key_env:
        return {}, None
    key = os.environ.get(api_key_env, "").strip()
    if not key:
        raise UserError(
            f"openai engine: environment variable {api_key_env} is empty or not set; "
            "export it with the API key for this endpoint"
        )
    return {"Authorization": f"Bearer {key}"}, key


def _request_body(
    model: str,
    req: GenerationRequest,
    token_ids: bool,
    template_kwargs: dict[str, Any] | None = None,
    server_stops: bool = True,
) -> dict[str, Any]:
    p: SamplingParams = req.params
    body: dict[str, Any] = {
        "model": model,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "max_tokens": p.max_tokens,
        "n": 1,
    }
    if p.stop and server_stops:
        body["stop"] = p.stop[:_MAX_SERVER_STOPS]
    if p.seed is not None:
        body["seed"] = p.seed
    if p.max_thinking_tokens is not None:
        body["thinking_token_budget"] = p.max_thinking_tokens  # vLLM's name; OpenAI's API has no budget
    if req.messages is not None:
        body["messages"] = req.messages
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        if p.logprobs:
            body["logprobs"] = True
    else:
        body["prompt"] = req.prompt
        if p.logprobs:
            body["logprobs"] = 1
    if token_ids:
        body["return_token_ids"] = True
    return body


def parse_completion(data: Any, chat: bool, stop: list[str], tags: ThinkTags | None = None) -> Completion:
    """The Completion in a 200 reply; MalformedReply (saying which field is wrong) for any other shape.

    Checked field by field because whatever passes here is written to samples.jsonl and fed to
    rewards and trainers: a number where text belongs must fail here, in one line, not there.
    """
    if not isinstance(data, dict):
        raise MalformedReply(f"the reply is {_kind(data)}, not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        said = _error_text(data)
        what = "no choices" if choices is None or choices == [] else f"choices is {_kind(choices)}"
        raise MalformedReply(what + (f"; the server said: {said}" if said else ""))
    choice = choices[0]
    if not isinstance(choice, dict):
        raise MalformedReply(f"choices[0] is {_kind(choice)}, not an object")
    if chat:
        message = choice.get("message")
        if not isinstance(message, dict):
            raise MalformedReply(f"choices[0].message is {_kind(message)}, not an object")
        text = _text(message.get("content"), "choices[0].message.content")
        # A reasoning parser's thinking, apart from the answer (vLLM: `reasoning`, earlier and
        # SGLang / DeepSeek: `reasoning_content`).
        key = next((k for k in ("reasoning_content", "reasoning") if message.get(k) is not None), None)
        reasoning = _text(message[key], f"choices[0].message.{key}") if key else None
    else:
        text = _text(choice.get("text"), "choices[0].text")
        reasoning = None
    usage = data.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise MalformedReply(f"usage is {_kind(usage)}, not an object")
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    # Some servers ignore `stop` or accept only 4 of them, so cut here as well: the answer only
    # (a reasoning parser's `text` is all answer; without one the thinking is in it too).
    cut = cut_at_stop(text, stop) if reasoning is not None else cut_answer_at_stop(text, stop, tags)
    if cut != text:
        text, finish = cut, "stop"
    # vLLM puts prompt_token_ids on the choice for /completions and on the response for chat.
    raw_prompt_ids, where = choice.get("prompt_token_ids"), "choices[0]"
    if raw_prompt_ids is None:
        raw_prompt_ids, where = data.get("prompt_token_ids"), "reply"
    usage = usage or {}
    return Completion(
        text=text,
        token_ids=_token_ids(choice.get("token_ids"), "choices[0].token_ids"),
        prompt_token_ids=_token_ids(raw_prompt_ids, f"{where}.prompt_token_ids"),
        logprobs=_logprobs(choice.get("logprobs"), chat),
        finish_reason=finish,
        # What the server bills and counts, which is what token and cost metrics report.
        prompt_tokens=_count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
        completion_tokens=_count(usage.get("completion_tokens"), "usage.completion_tokens"),
        reasoning=reasoning,
        reasoning_tokens=_reasoning_tokens(usage),
    )


def _reasoning_tokens(usage: dict[str, Any]) -> int | None:
    details = usage.get("completion_tokens_details")
    if not isinstance(details, dict):
        return None
    return _count(details.get("reasoning_tokens"), "usage.completion_tokens_details.reasoning_tokens")


class _NoPromptLogprobs(UserError):
    """The endpoint answered, but without the prompt's logprobs (it ignores `echo`)."""


def _parse_echo(data: Any, prompt: str, context: str) -> Loglik:
    """The continuation's Loglik from a /completions reply that echoes the prompt's logprobs."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise MalformedReply("no choices")
    choice = data["choices"][0]
    if not isinstance(choice, dict):
        raise MalformedReply("choices[0] is not an object")
    raw = choice.get("logprobs")
    text = choice.get("text")
    fix = (
        "--scoring loglikelihood needs an endpoint whose /completions echoes prompt logprobs "
        "(echo + logprobs, as vLLM's server does); use --scoring generate"
    )
    if not isinstance(raw, dict) or not isinstance(text, str) or not text.startswith(prompt):
        raise _NoPromptLogprobs(f"openai engine: the endpoint answered without the prompt's logprobs; {fix}")
    tokens, values, offsets = raw.get("tokens"), raw.get("token_logprobs"), raw.get("text_offset")
    if not (
        isinstance(tokens, list)
        and isinstance(values, list)
        and isinstance(offsets, list)
        and len(tokens) == len(values) == len(offsets)
    ):
        raise _NoPromptLogprobs(f"openai engine: the endpoint's echo has no tokens/token_logprobs/text_offset; {fix}")
    top = raw.get("top_logprobs") if isinstance(raw.get("top_logprobs"), list) else None
    # Prompt tokens: those starting inside the prompt (the generated token starts at its end).
    n_prompt = sum(1 for o in offsets if isinstance(o, int) and o < len(prompt))
    boundary = len(context.rstrip())
    total, greedy, count = 0.0, True, 0
    for i in range(n_prompt):
        end = offsets[i + 1] if i + 1 < len(offsets) else len(prompt)
        if min(end, len(prompt)) <= boundary:
            continue  # all context
        value = values[i]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            raise MalformedReply(f"choices[0].logprobs.token_logprobs[{i}] is {_kind(value)}, not a number")
        total += float(value)
        count += 1
        if top is not None and i < len(top) and isinstance(top[i], dict) and top[i]:
            greedy = greedy and value >= max(v for v in top[i].values() if isinstance(v, (int, float)))
        else:
            greedy = False
    if count == 0:
        raise MalformedReply("no echoed token covers the continuation")
    return Loglik(total, greedy, count)


def _count(value: Any, where: str) -> int | None:
    """A token count from `usage`: a whole number >= 0, or None when the server left it out."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MalformedReply(f"{where} is {_kind(value)} ({_short(value)}), not a token count")
    return value


def _text(value: Any, where: str) -> str:
    """Reply text: a string, null (no text), or a list of {"type": "text", "text"} parts."""
    if value is None:
        return ""
    if isinstance(value, list):
        # Some servers answer with content parts, as requests may send them.
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value):
            raise MalformedReply(f'{where} is a list that is not all {{"type": "text", "text": ...}} parts')
        value = "".join(p["text"] for p in value)
    if not isinstance(value, str):
        raise MalformedReply(f"{where} is {_kind(value)}, not a string")
    if _has_surrogate(value):
        # JSON can carry "\ud800"; Python accepts it, but such text cannot be written as UTF-8.
        raise MalformedReply(f"{where} holds a lone UTF-16 surrogate, which is not text")
    return value


def _token_ids(value: Any, where: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise MalformedReply(f"{where} is not a list of token ids (whole numbers >= 0)")
    return value


def _logprobs(raw: Any, chat: bool) -> list[float] | None:
    """Per-token logprobs: chat gives {"content": [{"logprob"}]}, completions {"token_logprobs"}."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise MalformedReply(f"choices[0].logprobs is {_kind(raw)}, not an object")
    values: list[Any] | None
    if chat:
        entries = raw.get("content")
        if entries is None:
            return []
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise MalformedReply("choices[0].logprobs.content is not a list of objects")
        values, where = [e.get("logprob") for e in entries], "choices[0].logprobs.content[].logprob"
    else:
        values, where = raw.get("token_logprobs"), "choices[0].logprobs.token_logprobs"
        if values is None:
            return []
        if not isinstance(values, list):
            raise MalformedReply(f"{where} is {_kind(values)}, not a list")
    out = []
    for v in values:
        if v is None:  # only an echoed first prompt token has none; 0.0 keeps positions aligned
            out.append(0.0)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) and v != math.inf:
            out.append(float(v))  # -inf is a real (if rare) log-probability; NaN and +inf are not
        else:
            raise MalformedReply(f"{where} holds {_kind(v)} ({_short(v)}), not a number")
    return out


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _kind(value: Any) -> str:
    """How a JSON value reads in an error: "a string", "a list", "null", ..."""
    if value is None:
        return "null"
    names = {bool: "a boolean", str: "a string", list: "a list", dict: "an object", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    return _one_line(repr(value))[:40]


def _error_text(data: dict[str, Any]) -> str:
    """The server's error message inside a JSON object, if it sent one."""
    error = data.get("error")
    message: Any = error.get("message") if isinstance(error, dict) else error
    message = message or data.get("message") or data.get("detail")
    return _one_line(str(message))[:_MAX_SERVER_MESSAGE] if message else ""


def _json(content: bytes, url: str) -> Any:
    try:
        return json.loads(content)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past Python's stack
        snippet = _one_line(content[:200].decode("utf-8", "replace"))[:120]
        raise EngineRequestError(
            f"openai engine: {url} did not answer with JSON ({snippet!r}); check the base URL (it usually ends in /v1)"
        ) from None


def _server_message(content: bytes) -> str:
    """The error text in a body: OpenAI's {"error": {"message"}} or older vLLM's {"message"}."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return _one_line(content[:4096].decode("utf-8", "replace"))[:_MAX_SERVER_MESSAGE]
    message = _error_text(data) if isinstance(data, dict) else ""
    return message or _one_line(str(data))[:_MAX_SERVER_MESSAGE]


def _status_error(
    status: int, url: str, message: str, base_url: str, model: str | None, api_key_env: str | None
) -> EngineRequestError:
    """One-line, fix-it message for a 4xx that retrying cannot cure."""
    said = f" (server said: {message})" if message else ""
    if status in (401, 403):
        if api_key_env:
            fix = f"check that the environment variable {api_key_env} holds a valid API key for this endpoint"
        else:
            fix = (
                "the server wants an API key: pass --api-key-env NAME (or set api_key_env in the "
                "model profile), NAME an environment variable that holds it"
            )
        return EngineRequestError(f"openai engine: HTTP {status} from {url}{said}; {fix}")
    if status == 404:
        what = f" and the model name {model!r} (GET {base_url}/models lists the served models)" if model else ""
        return EngineRequestError(
            f"openai engine: HTTP 404 from {url}{said}; check the base URL (it usually ends in /v1){what}"
        )
    return EngineRequestError(f"openai engine: HTTP {status} from {url}{said}")


def _retry_after_s(headers: httpx.Headers) -> float | None:
    """Seconds the server asked us to wait (retry-after-ms, Retry-After seconds or HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return min(max(float(millis) / 1000.0, 0.0), _MAX_RETRY_AFTER_S)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - datetime.now(timezone.utc)).total_seconds()
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


def _backoff_s(attempt: int, base_s: float, max_s: float) -> float:
    # Jitter spreads retries of many concurrent requests so they don't hit the server in lockstep.
    # The exponent is capped: 2**1100 would overflow the float multiplication.
    return min(max_s, base_s * 2 ** min(attempt, 30)) * random.uniform(0.5, 1.0)


def _redact(text: str, key: str | None) -> str:
    # Some servers echo the rejected key in their error message; it must not reach logs.
    return text.replace(key, "<redacted>") if key else text


def _one_line(text: str) -> str:
    # Server text goes into error messages: a lone surrogate in it would break printing them.
    text = text.encode("utf-8", "replace").decode("utf-8")
    return re.sub(r"\s+", " ", text).strip()
