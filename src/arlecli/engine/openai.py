"""The `openai` engine: any OpenAI-compatible endpoint (vllm serve, hosted APIs, arle serve).

Requests with chat `messages` go to POST {base_url}/chat/completions, raw `prompt` requests to
POST {base_url}/completions. Work is async inside (one httpx.AsyncClient on an event loop in a
background thread, a semaphore of `concurrency` slots), but `generate()` is a plain synchronous
generator that yields `(index, Completion)` as each request finishes.

The API key is read from the environment variable named by `api_key_env` at request time; it is
never stored on the engine, logged, or put into an error message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import os
import queue
import random
import re
import threading
from datetime import datetime, timezone
from typing import Any, Iterator

import httpx

from arlecli.engine.base import Completion, GenerationRequest, SamplingParams, cut_at_stop
from arlecli.errors import UserError

# 408/409/425 are "try again" answers too; every 5xx is retried as well.
_RETRY_STATUS = frozenset({408, 409, 425, 429})
# OpenAI rejects more than 4 stop sequences; the rest are still applied client-side.
_MAX_SERVER_STOPS = 4
# A broken Retry-After (hours, a date far ahead) should not park a run silently.
_MAX_RETRY_AFTER_S = 300.0
_MAX_SERVER_MESSAGE = 300


class OpenAIEngine:
    """Engine for an OpenAI-compatible HTTP endpoint.

    Args:
        base_url: API root including the version, e.g. "http://127.0.0.1:8000/v1".
        model: served model name; None picks the only model the server lists (GET /models).
        api_key_env: name of the environment variable holding the API key, or None to send
            no Authorization header (a local vLLM server needs none).
        concurrency: most requests in flight at once.
        timeout_s: per-attempt read timeout; long generations need a generous value.
        max_retries: retries after the first attempt on 429, 5xx, timeouts and connection errors.
        backoff_base_s, backoff_max_s: exponential backoff (with jitter) between retries when
            the server gives no Retry-After.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key_env: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 600.0,
        max_retries: int = 5,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        if concurrency < 1:
            raise UserError(f"openai engine: concurrency must be at least 1 (got {concurrency})")
        if max_retries < 0:
            raise UserError(f"openai engine: max_retries must be 0 or more (got {max_retries})")
        self.base_url = _normalise_base_url(base_url)
        self.model = model
        self.api_key_env = api_key_env
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        # vLLM-only field; flipped off once if the server rejects it (hosted APIs do).
        self._send_token_ids = True
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self._closed = False

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        """Yield (index into requests, completion) as each request finishes, in any order.

        The first failure (after retries) is raised and the remaining requests are cancelled;
        so is everything still pending when the caller stops iterating early.
        """
        for i, req in enumerate(requests):
            _check_request(i, req)
        if not requests:
            return
        loop = self._start()
        done: queue.SimpleQueue[tuple[int, concurrent.futures.Future[Completion]]] = (
            queue.SimpleQueue()
        )
        futures = []
        for i, req in enumerate(requests):
            fut = asyncio.run_coroutine_threadsafe(self._generate_one(req), loop)
            fut.add_done_callback(lambda f, i=i: done.put((i, f)))
            futures.append(fut)
        try:
            for _ in futures:
                i, fut = done.get()
                if fut.cancelled():
                    raise RuntimeError("OpenAIEngine was closed while generate() was running")
                yield i, fut.result()
        finally:
            # Early exit or an error: stop the rest instead of letting them run unseen.
            for fut in futures:
                fut.cancel()

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

    def _start(self) -> asyncio.AbstractEventLoop:
        """Start the background loop and client on first use; resolve the model if not given."""
        with self._lock:
            if self._closed:
                raise RuntimeError("OpenAIEngine is closed")
            if self.model is None:
                self.model = _only_model(self.base_url, self.api_key_env)
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
            limits=httpx.Limits(
                max_connections=self.concurrency, max_keepalive_connections=self.concurrency
            ),
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
        """One request with retries; raises UserError when it cannot succeed."""
        assert self._client is not None and self._slots is not None and self.model is not None
        chat = req.messages is not None
        url = self.base_url + ("/chat/completions" if chat else "/completions")
        attempt = 0
        # The slot is held through backoff sleeps so a rate-limited server sees less load.
        async with self._slots:
            while True:
                headers, key = _auth_headers(self.api_key_env)
                body = _request_body(self.model, req, self._send_token_ids)
                delay: float | None = None
                try:
                    resp = await self._client.post(url, json=body, headers=headers)
                except httpx.TimeoutException:
                    problem = f"no answer within timeout_s={self.timeout_s:g}"
                except httpx.TransportError as exc:
                    problem = f"cannot connect ({_one_line(str(exc)) or type(exc).__name__})"
                else:
                    status = resp.status_code
                    if resp.is_success:
                        return _parse_completion(_json(resp, url), chat, req.params.stop)
                    message = _redact(_server_message(resp), key)
                    if status == 400 and self._send_token_ids and "return_token_ids" in message:
                        # Not vLLM: ask again without the extra field (costs no retry).
                        self._send_token_ids = False
                        continue
                    if status < 500 and status not in _RETRY_STATUS:
                        raise _status_error(
                            status, url, message, self.base_url, self.model, self.api_key_env
                        )
                    problem = f"HTTP {status}" + (f" ({message})" if message else "")
                    delay = _retry_after_s(resp.headers)
                if attempt >= self.max_retries:
                    raise UserError(
                        f"openai engine: POST {url} failed after {attempt + 1} attempts, last: "
                        f"{problem}; check that the server is up and the base URL is right, "
                        "or lower the concurrency / raise max_retries for a busy server"
                    )
                if delay is None:
                    delay = _backoff_s(attempt, self.backoff_base_s, self.backoff_max_s)
                await asyncio.sleep(delay)
                attempt += 1


def list_models(
    base_url: str, api_key_env: str | None = None, timeout_s: float = 30.0
) -> list[str]:
    """Return the model names an OpenAI-compatible server serves (GET {base_url}/models)."""
    base = _normalise_base_url(base_url)
    url = base + "/models"
    headers, key = _auth_headers(api_key_env)
    try:
        resp = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException:
        raise UserError(f"openai engine: GET {url} timed out after {timeout_s:g} s") from None
    except httpx.TransportError as exc:
        raise UserError(
            f"openai engine: cannot reach {url} ({_one_line(str(exc))}); "
            "is the server running and the base URL right?"
        ) from None
    if not resp.is_success:
        message = _redact(_server_message(resp), key)
        raise _status_error(resp.status_code, url, message, base, None, api_key_env)
    data = _json(resp, url)
    entries = data.get("data") if isinstance(data, dict) else None
    return [m["id"] for m in entries or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _only_model(base_url: str, api_key_env: str | None) -> str:
    models = list_models(base_url, api_key_env)
    if len(models) == 1:
        return models[0]
    if not models:
        raise UserError(f"openai engine: {base_url}/models lists no models; pass the model name")
    raise UserError(
        f"openai engine: {base_url} serves several models ({', '.join(models)}); pick one by name"
    )


def _normalise_base_url(base_url: str) -> str:
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UserError(
            f"openai engine: base URL {base_url!r} must start with http:// or https:// "
            "(e.g. http://127.0.0.1:8000/v1)"
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


def _request_body(model: str, req: GenerationRequest, token_ids: bool) -> dict[str, Any]:
    p: SamplingParams = req.params
    body: dict[str, Any] = {
        "model": model,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "max_tokens": p.max_tokens,
        "n": 1,
    }
    if p.stop:
        body["stop"] = p.stop[:_MAX_SERVER_STOPS]
    if p.seed is not None:
        body["seed"] = p.seed
    if req.messages is not None:
        body["messages"] = req.messages
        if p.logprobs:
            body["logprobs"] = True
    else:
        body["prompt"] = req.prompt
        if p.logprobs:
            body["logprobs"] = 1
    if token_ids:
        body["return_token_ids"] = True
    return body


def _parse_completion(data: Any, chat: bool, stop: list[str]) -> Completion:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise UserError(
            "openai engine: the server answered without any choices; is it OpenAI-compatible?"
        )
    choice = choices[0]
    if chat:
        text = (choice.get("message") or {}).get("content") or ""
    else:
        text = choice.get("text") or ""
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    # Some servers ignore `stop` or accept only 4 of them, so cut here as well.
    cut = cut_at_stop(text, stop)
    if cut != text:
        text, finish = cut, "stop"
    # vLLM puts prompt_token_ids on the choice for /completions and on the response for chat.
    prompt_ids = choice.get("prompt_token_ids") or data.get("prompt_token_ids") or []
    return Completion(
        text=text,
        token_ids=list(choice.get("token_ids") or []),
        prompt_token_ids=list(prompt_ids),
        logprobs=_logprobs(choice.get("logprobs"), chat),
        finish_reason=finish,
    )


def _logprobs(raw: Any, chat: bool) -> list[float] | None:
    """Per-token logprobs: chat gives {"content": [{"logprob"}]}, completions {"token_logprobs"}."""
    if not isinstance(raw, dict):
        return None
    if chat:
        values = [entry.get("logprob") for entry in raw.get("content") or []]
    else:
        values = list(raw.get("token_logprobs") or [])
    # Only an echoed first prompt token has no logprob; 0.0 keeps positions aligned.
    return [float(v) if v is not None else 0.0 for v in values]


def _json(resp: httpx.Response, url: str) -> Any:
    try:
        return resp.json()
    except ValueError:
        snippet = _one_line(resp.text)[:120]
        raise UserError(
            f"openai engine: {url} did not answer with JSON ({snippet!r}); "
            "check the base URL (it usually ends in /v1)"
        ) from None


def _server_message(resp: httpx.Response) -> str:
    """The error text in a body: OpenAI's {"error": {"message"}} or older vLLM's {"message"}."""
    try:
        data = resp.json()
    except ValueError:
        return _one_line(resp.text)[:_MAX_SERVER_MESSAGE]
    message: Any = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        message = message or data.get("message") or data.get("detail")
    return _one_line(str(message or data))[:_MAX_SERVER_MESSAGE]


def _status_error(
    status: int, url: str, message: str, base_url: str, model: str | None, api_key_env: str | None
) -> UserError:
    """One-line, fix-it message for a 4xx that retrying cannot cure."""
    said = f" (server said: {message})" if message else ""
    if status in (401, 403):
        if api_key_env:
            fix = (
                f"check that the environment variable {api_key_env} holds a valid API key "
                "for this endpoint"
            )
        else:
            fix = (
                "the server wants an API key: set api_key_env to the name of an environment "
                "variable that holds it"
            )
        return UserError(f"openai engine: HTTP {status} from {url}{said}; {fix}")
    if status == 404:
        what = (
            f" and the model name {model!r} (GET {base_url}/models lists the served models)"
            if model
            else ""
        )
        return UserError(
            f"openai engine: HTTP 404 from {url}{said}; check the base URL (it usually ends "
            f"in /v1){what}"
        )
    return UserError(f"openai engine: HTTP {status} from {url}{said}")


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
    return min(max_s, base_s * 2**attempt) * random.uniform(0.5, 1.0)


def _redact(text: str, key: str | None) -> str:
    # Some servers echo the rejected key in their error message; it must not reach logs.
    return text.replace(key, "<redacted>") if key else text


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
