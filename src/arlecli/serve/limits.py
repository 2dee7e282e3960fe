"""Limits that keep one request, or one client, from taking `arle serve` down.

    ServeLimits        the knobs (each an `arle serve` option), with safe defaults
    read_json          the body: size-capped, time-boxed, and any JSON that would crash a
                       handler (nesting past the recursion limit, lone surrogates) is a 400
    context_length     the model's context, from the engine
    check_context      a prompt longer than the context, or max_tokens beyond what is left
                       of it, is a 400 before any generation (vLLM's behaviour and wording)

Connection-level limits (header and idle timeouts, the connection cap) live with uvicorn in
server.py; they read the same ServeLimits.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from arlecli.serve.continuation import DEFAULT_MAX_BYTES
from arlecli.serve.protocol import ApiError, ApiRequest

# A JSON string can carry a lone UTF-16 surrogate ("\ud800"); Python decodes it into a str
# that cannot be encoded as UTF-8, so the tokenizer or the JSON response would fail (500).
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class ServeLimits:
    """What one request or connection, and the recorded sessions, may take. Defaults fit a server
    on one machine.

    Args:
        max_choices: most generations one request may ask for (prompts x n).
        max_body_bytes: largest request body; a longer one is answered 413 unread.
        body_timeout_s: how long a request body may take to arrive (a client trickling
            bytes holds a connection and a task).
        header_timeout_s: how long a connection may take to send a request's headers, from
            when it opened or its previous response ended; then it is closed.
        keep_alive_s: how long an idle keep-alive connection stays open between requests.
        max_connections: most open connections; at the cap, a new connection pushes out the
            longest-idle one (one with no request in flight), or is closed if all are busy.
            None: from the file-descriptor limit (see server.connection_cap).
        max_header_bytes: largest request line + headers.
        record_memory_bytes: most memory recorded sessions may hold, all together, in the
            replies kept to continue them with exact ids (see continuation.py); past it the
            least recently used session's oldest replies are dropped.
    """

    max_choices: int = 256
    max_body_bytes: int = 32 * 2**20
    body_timeout_s: float = 60.0
    header_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int | None = None
    max_header_bytes: int = 64 * 1024
    record_memory_bytes: int = DEFAULT_MAX_BYTES


async def read_json(request: Any, limits: ServeLimits) -> Any:
    """The request's body, parsed; ApiError (413, 408 or 400) for a body too big, too slow,
    or not JSON a handler can take."""
    from starlette.requests import ClientDisconnect

    kind = request.headers.get("content-type")
    if kind is not None and not _json_media_type(kind):
        # A browser sends text/plain or a form to any address without asking first (no CORS
        # preflight): read as JSON, any web page could make a local server generate, or write
        # into its recorded sessions. FastAPI (vLLM's server) refuses them the same way.
        raise ApiError(
            415,
            f"the request body is {kind.split(';')[0].strip()[:100]!r}: send JSON with "
            "`Content-Type: application/json`",
            "invalid_request_error",
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise _too_big(limits)  # refused before reading a byte of it
    chunks: list[bytes] = []
    size = 0

    async def pull() -> None:
        nonlocal size
        async for chunk in request.stream():  # chunked bodies have no Content-Length: count
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise _too_big(limits)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(pull(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(
            408, f"the request body did not arrive within {limits.body_timeout_s:g} s", "request_timeout"
        ) from None
    except ClientDisconnect:  # nobody is left to answer; a 400 keeps it out of the error log
        raise ApiError(400, "the client disconnected while sending the body", "invalid_request_error") from None
    return decode_json(b"".join(chunks))


class HeaderGuard:
    """ASGI middleware: a request whose line + headers pass `max_header_bytes` is answered 431.
    uvicorn's h11 bounds only headers still arriving; a block that lands in one read (up to
    256 KiB) was taken whole."""

    def __init__(self, app: Any, max_header_bytes: int) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 16
            size += sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ()))
            if size > self.max_header_bytes:
                error = ApiError(
                    431,
                    f"the request's headers are {size:,} bytes, over this server's limit of {self.max_header_bytes:,}",
                    "request_header_fields_too_large",
                )
                body = json.dumps(error.body()).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 431, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _json_media_type(content_type: str) -> bool:
    """Whether a Content-Type header names JSON (application/json or a +json type, any parameters)."""
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def decode_json(raw: bytes) -> Any:
    """`raw` parsed as JSON; ApiError(400) for anything but JSON whose strings are all valid
    Unicode (the one check json.loads leaves out)."""
    try:
        body = json.loads(raw)
    except RecursionError:  # "[[[[...": json's C scanner recurses once per level
        raise ApiError(400, "the request body nests too deeply", "invalid_request_error") from None
    except ValueError:  # UnicodeDecodeError (not UTF-8) included
        raise ApiError(400, "the request body is not valid JSON", "invalid_request_error") from None
    # Walk iteratively (never recursively: the nesting json.loads accepted can still be ~1000 deep).
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                raise ApiError(
                    400,
                    "the request body holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not valid Unicode text",
                    "invalid_request_error",
                )
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return body


def context_length(engine: Any, max_model_len: int | None = None) -> int | None:
    """The most tokens (prompt + completion) one sequence may hold on `engine`, or None when
    the engine does not say (a remote endpoint: then nothing is checked here).

    `max_model_len` (the server's --max-model-len) wins; else vLLM's own setting, else the
    model config's max_position_embeddings, else the tokenizer's model_max_length where it
    is a real number (transformers puts 1e30 there when it does not know)."""
    if max_model_len:
        return max_model_len
    llm = getattr(engine, "llm", None)
    vllm_len = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "max_model_len", None)
    if isinstance(vllm_len, int) and vllm_len > 0:
        return vllm_len
    config = getattr(getattr(engine, "model", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        return positions
    tok_len = getattr(getattr(engine, "tokenizer", None), "model_max_length", None)
    if isinstance(tok_len, int) and 0 < tok_len < 10**7:
        return tok_len
    return None


def longest_token_chars(tokenizer: Any) -> int | None:
    """The most characters one token of `tokenizer` can stand for (the longest vocabulary
    entry: byte-level entries spell each byte as one character, so this bounds characters
    too), or None when the tokenizer cannot list its vocabulary."""
    try:
        return max((len(t) for t in tokenizer.get_vocab()), default=0) or None
    except (AttributeError, TypeError, NotImplementedError):
        return None


def prompt_chars(req: ApiRequest, i: int) -> int:
    """Characters of prompt `i` of `req` that its tokens must cover (chat: every message's
    role and content; the template only adds to them)."""
    prompt = req.prompts[i]
    if req.chat:
        return sum(len(m["role"]) + len(m["content"]) for m in prompt)
    return len(prompt)


def too_long_by_chars(req: ApiRequest, context: int, longest_token: int) -> None:
    """ApiError(400) when a prompt has so many characters that even at `longest_token`
    characters a token it exceeds the context: a 5 MB prompt is refused without tokenizing it."""
    for i in range(len(req.prompts)):
        chars = prompt_chars(req, i)
        if chars > context * longest_token:
            raise ApiError(
                400,
                f"This model's maximum context length is {context} tokens. However, your "
                f"{_what(req)} of {chars:,} characters has at least {chars // longest_token:,} "
                f"tokens. Please reduce the length of the {_what(req)}.",
                "context_length_exceeded",
                _what(req),
            )


def check_context(req: ApiRequest, prompt_lengths: list[int], context: int) -> list[int]:
    """Each prompt's max_tokens, checked against `context`, as vLLM does: a prompt that
    leaves no room, or a `max_tokens` the client set beyond what is left, is ApiError(400);
    a default `max_tokens` is cut to what is left."""
    budgets = []
    for length in prompt_lengths:
        if length >= context:
            raise ApiError(
                400,
                f"This model's maximum context length is {context} tokens. However, your "
                f"request has {length} input tokens. Please reduce the length of the {_what(req)}.",
                "context_length_exceeded",
                _what(req),
            )
        room = context - length
        wanted = req.params.max_tokens
        if wanted > room and req.max_tokens_explicit:
            raise ApiError(
                400,
                f"This model's maximum context length is {context} tokens. However, you "
                f"requested {length + wanted} tokens ({length} in the {_what(req)}, {wanted} in the "
                f"completion). Please reduce the length of the {_what(req)} or completion.",
                "context_length_exceeded",
                "max_tokens",
            )
        budgets.append(min(wanted, room))
    return budgets


def check_choices(req: ApiRequest, limits: ServeLimits) -> None:
    """ApiError(400) when `req` asks for more generations (prompts x n) than the server allows."""
    total = len(req.prompts) * req.n
    if total > limits.max_choices:
        raise ApiError(
            400,
            f"this request asks for {total} generations ({len(req.prompts)} prompt(s) x n={req.n}); "
            f"this server allows at most {limits.max_choices} per request (arle serve --max-choices)",
            "invalid_request_error",
            "n",
        )


def _what(req: ApiRequest) -> str:
    return "messages" if req.chat else "prompt"


def _too_big(limits: ServeLimits) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than this server's limit of {limits.max_body_bytes:,} bytes "
        "(arle serve --max-body-mb)",
        "request_too_large",
    )
