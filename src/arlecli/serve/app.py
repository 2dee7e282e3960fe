"""The OpenAI-compatible ASGI app (starlette) over any engine of the protocol.

    GET  /v1/models                 the one served model
    POST /v1/chat/completions       chat, streaming or not
    POST /v1/completions            raw prompts, streaming or not
    GET  /health                    200 when up (no key needed)
    POST /sessions                  open a recording session: {"id", "base_url"} (sessions.py)
    DELETE /sessions/{id}           close one

Every /v1 route also answers under /s/{session}/v1/..., which names the recording session
(else the X-Arle-Session header, else "default"); a session must be open (opened by this
server), any other id is a 404. Requests go through a Batcher, which
groups concurrent ones into single engine.generate calls. When recording over an engine with
a tokenizer, a chat request that continues an earlier reply of its session gets that reply's
exact ids as its prompt's start (see continuation.py), so a recorded agent trajectory is one
unbroken id sequence.

Limits (limits.py): a body too big, too slow or not valid Unicode JSON, more generations than
--max-choices, a prompt beyond the model's context or a max_tokens beyond what is left of it
are refused (4xx, OpenAI's error shape) before anything is queued, and so is a prompt that
encodes to no tokens (the engine cannot start from nothing, and a failed batch is retried one
request at a time, which would slow its batch mates). A client that goes away
while its request waits or generates has the request cancelled (Batcher.cancel), so the engine
does not generate for nobody.

Function calling (tools.py): a chat request's `tools` go to the chat template and the reply's
calls are parsed out of it (message.tool_calls, finish_reason "tool_calls"), as vLLM's tool
parsers do; the parser is the model family's or `tool_call_parser`'s.

Thinking (reasoning.py): a chat reply of a model that thinks carries its answer in `content`
and its thought in `reasoning_content`, as vLLM's reasoning parsers answer; `reasoning_format:
"none"` in the request keeps the raw text in `content`. /v1/completions returns the raw text.

Streaming: the engine protocol yields whole completions, not tokens, so a stream sends the
role delta at once, then, when a choice finishes, its thinking as one reasoning_content delta
(if it thought), its answer as one content delta and its finish delta (then usage, then
[DONE]). Clients see valid OpenAI SSE; they just do not see tokens trickle in.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import sys
import time
import traceback
from concurrent.futures import Future
from pathlib import Path
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from arlecli import safeio
from arlecli.safeio import terminal_text
from arlecli.engine.base import Engine, GenerationRequest
from arlecli.errors import UserError
from arlecli.serve import protocol
from arlecli.serve import limits as lim
from arlecli.serve.batcher import SHUTDOWN, Batcher, Finished
from arlecli.serve.continuation import Continuations
from arlecli.serve.limits import ServeLimits
from arlecli.serve.protocol import ApiError, ApiRequest
from arlecli.serve.reasoning import Reasoning, Reply, reasoning_tokens
from arlecli.serve.record import Recorder, build_record
from arlecli.serve.sessions import DEFAULT_SESSION, Sessions
from arlecli.serve.tools import parser_for, with_calls

SESSION_HEADER = "x-arle-session"


class _Json(JSONResponse):
    """A JSON response that encodes whatever it holds (a reply with a lone surrogate included)."""

    def render(self, content: Any) -> bytes:
        return safeio.dumps(content, allow_nan=False, separators=(",", ":")).encode("utf-8")


class _Api:
    def __init__(self, engine: Engine, batcher: Batcher, model_name: str, api_key: str | None,
                 recorder: Recorder | None, limits: ServeLimits, max_model_len: int | None,
                 tool_call_parser: str | None = None) -> None:
        self.engine = engine
        self.batcher = batcher
        self.limits = limits
        self.model_name = model_name
        self.api_key = api_key
        self.recorder = recorder
        self.token_text = protocol.token_text_for(engine)
        self.reasoning = Reasoning(engine)
        self.created = int(time.time())
        tokenizer = getattr(engine, "tokenizer", None)
        self.tool_parser = parser_for(tokenizer, tool_call_parser)  # serve/tools.py
        # Only recorded traffic needs exact ids, and only chat templates have turns to continue.
        self.continuations = Continuations(tokenizer, limits.record_memory_bytes) if (
            recorder is not None and getattr(tokenizer, "chat_template", None)) else None
        self.sessions = Sessions(on_close=self.continuations.forget if self.continuations is not None else None)
        # Context checks need the context and the engine's own prompt encoding; an engine
        # without them (a remote endpoint) leaves the checks to whoever serves the model.
        self.encode = getattr(engine, "encode", None)
        self.context = lim.context_length(engine, max_model_len) if self.encode is not None else None
        self.longest_token = lim.longest_token_chars(tokenizer) if self.context is not None else None

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "arle"}
        return _Json({"object": "list", "data": [card]})

    async def open_session(self, request: Request) -> Response:
        """POST /sessions: a new recording session, with the base URL that records into it."""
        self._authorize(request)
        sid = self.sessions.open()
        root = str(request.base_url).rstrip("/")
        return _Json({"id": sid, "object": "session", "base_url": f"{root}/s/{sid}/v1"}, status_code=201)

    async def close_session(self, request: Request) -> Response:
        """DELETE /sessions/{id}: later requests naming it are refused; its record stays on disk."""
        self._authorize(request)
        sid = request.path_params["sid"]
        if not self.sessions.close(sid):
            self.sessions.check(sid)  # not open: the 404
        return _Json({"id": sid, "object": "session", "deleted": True})

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, *, chat: bool) -> Response:
        received = time.time()
        self._authorize(request)
        body = await lim.read_json(request, self.limits)
        req = protocol.parse_chat(body) if chat else protocol.parse_completion(body)
        if req.model is not None and req.model != self.model_name:
            raise ApiError(404, f"The model `{req.model}` does not exist (this server serves "
                           f"`{self.model_name}`).", "model_not_found", "model")
        lim.check_choices(req, self.limits)
        session = self.sessions.check(request.path_params.get("session") or request.headers.get(SESSION_HEADER))
        endpoint = "/v1/chat/completions" if chat else "/v1/completions"
        rid = protocol.new_id(chat)
        continued, continues = None, None
        if chat and self.continuations is not None:
            continued, continues = self.continuations.prompt_ids(
                session, req.prompts[0], req.tools.tools if req.tools is not None else None)
        prompt_ids, budgets = await self._fit_context(req, continued)
        try:
            futures = self.batcher.submit(req.engine_requests(force_logprobs=self.recorder is not None,
                                                              prompt_ids=prompt_ids, max_tokens=budgets))
        except RuntimeError as exc:  # shutting down
            raise ApiError(503, str(exc), "unavailable") from None
        waiting = [asyncio.wrap_future(f) for f in futures]
        if req.stream:
            events = self._stream(req, futures, waiting, rid, int(received), session, endpoint, received, continues)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        gathered = asyncio.ensure_future(asyncio.gather(*waiting))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait([gathered, gone], return_when=asyncio.FIRST_COMPLETED)
            if not gathered.done():  # the client went away: nobody will read the answer
                return Response(status_code=499)  # nginx's "client closed request"; never sent
            try:
                finished: list[Finished] = list(gathered.result())
            except Exception as exc:
                raise _engine_error(exc) from None
        finally:
            gone.cancel()
            # On an error, a dropped client or a cancelled handler: don't generate for nobody.
            self.batcher.cancel([f for f in futures if not f.done()])
            gathered.cancel()  # after: its results (or errors) are nobody's to read
        replies = [self._reply(req, f.completion) for f in finished]
        self._record(session, rid, endpoint, req, finished, received, continues, replies)
        thought = reasoning_tokens(replies) if req.chat and not req.raw_reasoning else None
        return _Json(protocol.response(req, rid, int(received), self.model_name, replies, self.token_text,
                                       thought))

    async def _fit_context(self, req: ApiRequest, continued: list[int] | None
                           ) -> tuple[list[list[int] | None] | None, list[int] | None]:
        """(prompt ids, max_tokens) per prompt, or (None, None) where the context is unknown;
        ApiError(400) for a prompt the chat template or tokenizer refuses, a prompt longer
        than the context, or a max_tokens beyond what it leaves.

        Encoding here, once, is what the engine would do anyway (the ids go with the request);
        it runs in a worker thread, so a long prompt does not stall other connections."""
        if self.context is None or self.encode is None:
            if any(p == "" for p in req.prompts):  # nothing to check the ids with: the text is all there is
                raise _empty_prompt()
            return ([continued] if continued is not None else None), None
        if self.longest_token is not None:
            lim.too_long_by_chars(req, self.context, self.longest_token)
        encode = self.encode
        ids: list[list[int] | None] = []
        for prompt in req.prompts:
            if continued is not None:  # chat: one prompt, continuing a recorded reply
                ids.append(continued)
                continue
            gen = GenerationRequest(messages=prompt, tools=req.tools.tools if req.tools is not None else None) \
                if req.chat else GenerationRequest(prompt=prompt)
            try:
                ids.append(await asyncio.to_thread(encode, gen))
            except UserError as exc:  # e.g. a chat request to a model without a chat template
                raise ApiError(400, str(exc), "invalid_request_error") from None
            except Exception as exc:  # the template raised on these messages (roles out of order ...)
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                raise ApiError(400, f"the {'chat template' if req.chat else 'tokenizer'} refused this "
                               f"{'conversation' if req.chat else 'prompt'}: {type(exc).__name__}: {first}",
                               "invalid_request_error", "messages" if req.chat else "prompt") from None
        lengths = [len(x) for x in ids if x is not None]
        if 0 in lengths:
            raise _empty_prompt()
        return ids, lim.check_context(req, lengths, self.context)

    async def _stream(self, req: ApiRequest, futures: list[Future[Finished]],
                      waiting: list[asyncio.Future[Finished]], rid: str, created: int,
                      session: str, endpoint: str, received: float,
                      continues: dict[str, Any] | None) -> AsyncIterator[str]:
        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            return _sse(protocol.chunk(req, rid, created, self.model_name, choices, **extra))

        index = {fut: i for i, fut in enumerate(waiting)}
        finished: list[Finished | None] = [None] * len(waiting)
        replies: list[Reply | None] = [None] * len(waiting)
        try:
            if req.chat:  # the role goes out at once, so clients know the request is being served
                yield event([protocol.first_delta(req, i) for i in range(len(waiting))])
            pending: set[asyncio.Future[Finished]] = set(waiting)
            prompt_ids_sent = False
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for fut in sorted(done, key=index.__getitem__):
                    i, fin = index[fut], fut.result()
                    finished[i] = fin
                    reply_i = replies[i] = self._reply(req, fin.completion)
                    extra = {}
                    if req.chat and req.return_token_ids and not prompt_ids_sent:
                        extra["prompt_token_ids"] = list(fin.completion.prompt_token_ids)
                        prompt_ids_sent = True
                    thought = protocol.reasoning_delta(req, i, reply_i)
                    if thought is not None:  # the thinking before the answer, as vLLM streams it
                        yield event([thought], **extra)
                        extra = {}
                    yield event([protocol.content_delta(req, i, reply_i, self.token_text)], **extra)
                    yield event([protocol.finish_delta(req, i, fin.completion, reply_i)])
            done_all = [f for f in finished if f is not None]
            split = [r for r in replies if r is not None]
            if req.include_usage:
                thinking = reasoning_tokens(split) if req.chat and not req.raw_reasoning else None
                yield event([], usage=protocol.usage(req, [f.completion for f in done_all], thinking))
            self._record(session, rid, endpoint, req, done_all, received, continues, split)
        except Exception as exc:  # headers are gone already: report in-band, as vLLM does
            yield _sse(_engine_error(exc).body())
        finally:
            # Also reached when starlette cancels the stream because the client disconnected.
            self.batcher.cancel([f for f in futures if not f.done()])
            for fut in waiting:  # after: their results (or errors) are nobody's to read
                fut.cancel()
        yield "data: [DONE]\n\n"

    def _reply(self, req: ApiRequest, comp: Any) -> Reply:
        """A choice as the client gets it: its thinking apart (reasoning.py), then its tool calls
        (serve/tools.py, for a chat request with tools)."""
        reply = self.reasoning.reply(comp)
        return with_calls(reply, req.tools, self.tool_parser) if req.chat else reply

    def _record(self, session: str, rid: str, endpoint: str, req: ApiRequest, finished: list[Finished],
                received: float, continues: dict[str, Any] | None, replies: list[Reply]) -> None:
        if self.recorder is None or (session != DEFAULT_SESSION and session not in self.sessions):
            return  # closed while this request ran: its episode was read already
        completions = [f.completion for f in finished]
        usage = protocol.usage(req, completions, reasoning_tokens(replies))
        record = build_record(rid=rid, endpoint=endpoint, model=self.model_name, request=req, finished=finished,
                              received_at=received, usage=usage, continues=continues, replies=replies)
        self.recorder.write(session, record)
        if req.chat and self.continuations is not None:
            # Before the response goes out, so the client's next call finds this reply.
            self.continuations.remember(session, rid, req.prompts[0], completions, replies)

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if not given:
            raise ApiError(401, "missing API key: send the header `Authorization: Bearer <key>`", "invalid_api_key")
        # Constant-time compare; the message never repeats what was sent.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "invalid API key", "invalid_api_key")


def create_app(engine: Engine, *, model_name: str, api_key: str | None = None, record_dir: Path | None = None,
               max_concurrency: int = 16, batch_wait_s: float = 0.005, limits: ServeLimits | None = None,
               max_model_len: int | None = None, tool_call_parser: str | None = None) -> Starlette:
    """The server app for `engine`, served as `model_name`.

    Args:
        api_key: when set, every /v1 request must send `Authorization: Bearer <api_key>`.
        record_dir: when set, every completed request is recorded under it (see record.py).
        max_concurrency: most requests in one engine.generate call.
        batch_wait_s: how long an idle server waits after a request for others to batch with.
        limits: what one request may take (see limits.ServeLimits; its connection limits are
            applied by server.py, which reads them from `app.state.limits`).
        max_model_len: the context prompts and max_tokens are checked against (default: the
            engine's, see limits.context_length).
        tool_call_parser: how replies to requests with `tools` are searched for calls (hermes,
            llama3_json, mistral; default: the one the model's chat template calls for, see tools.py).

    `app.state.batcher` holds the Batcher (its counters show how requests were batched),
    `app.state.sessions` the open recording sessions (`open()` one in-process, as the rollout
    driver does), `app.state.continuations` the replies kept to continue them (None unless
    recording over a chat model). The app does not close the engine: whoever made it does,
    after the server stops.
    """
    batcher = Batcher(engine, max_batch=max_concurrency, wait_s=batch_wait_s)
    recorder = Recorder(record_dir) if record_dir is not None else None
    limits = limits or ServeLimits()
    api = _Api(engine, batcher, model_name, api_key, recorder, limits, max_model_len, tool_call_parser)
    routes = [Route("/health", _health, methods=["GET"]),
              Route("/sessions", api.open_session, methods=["POST"]),
              Route("/sessions/{sid}", api.close_session, methods=["DELETE"])]
    for prefix in ("", "/s/{session}"):
        routes += [
            Route(prefix + "/v1/models", api.models, methods=["GET"]),
            Route(prefix + "/v1/chat/completions", api.chat, methods=["POST"]),
            Route(prefix + "/v1/completions", api.completions, methods=["POST"]),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        batcher.close(timeout=0)  # answer whatever is still waiting; don't wait for the engine

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        ApiError: _api_error, HTTPException: _http_error, Exception: _server_error})
    app.state.batcher = batcher
    app.state.recorder = recorder
    app.state.limits = limits
    app.state.sessions = api.sessions
    app.state.continuations = api.continuations
    return app


async def _health(request: Request) -> Response:
    return _Json({"status": "ok"})


async def _disconnected(request: Request) -> None:
    """Return once the client has gone (call after the body is read: the next ASGI message
    is then the disconnect, which uvicorn sends when the connection drops)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(data: dict[str, Any]) -> str:
    return f"data: {safeio.dumps(data)}\n\n"


def _empty_prompt() -> ApiError:
    return ApiError(400, "the prompt is empty: it encodes to no tokens, and the model needs at least one to "
                    "start from", "invalid_request_error", "prompt")


def _engine_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, UserError):  # e.g. a chat request to a model without a chat template
        return ApiError(400, str(exc), "invalid_request_error")
    if isinstance(exc, RuntimeError) and str(exc) == SHUTDOWN:
        return ApiError(503, str(exc), "unavailable")
    return ApiError(500, f"the engine failed: {type(exc).__name__}: {exc}", "server_error")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _Json(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"{request.method} {request.url.path} not found (the API is under /v1 or /s/SESSION/v1)"
    else:
        message = f"{request.method} {request.url.path}: {exc.detail}"
    return _Json(ApiError(exc.status_code, message, "not_found" if exc.status_code == 404 else None).body(),
                        status_code=exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    # The message may quote what the client sent: escaped, so it cannot drive the log's terminal.
    sys.stderr.write(terminal_text("".join(traceback.format_exception(exc))))
    return _Json(ApiError(500, f"internal error: {type(exc).__name__}", "server_error").body(),
                        status_code=500)
