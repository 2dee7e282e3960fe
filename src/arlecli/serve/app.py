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

Streaming: the role delta goes out at once; over an engine that streams (hf: `streams`, its
ids after every decode step) each choice's text follows token by token (streaming.py holds back
what may still change: a stop string's start, a think tag's), the thinking as reasoning_content
deltas before the answer's content deltas; when the choice finishes, a last content delta with
what is left and the choice's logprobs and token ids, then its finish delta (then usage, then
[DONE]). Other engines (vllm), and replies parsed for tool calls, send each field whole when the
choice finishes.

Logprobs (scoring.py): chat `top_logprobs` and completions `logprobs=N` give the top-N
alternatives of each token, and completions `echo` the prompt's tokens with their logprobs (as
lm-eval's loglikelihood requests ask: token-id prompts, `echo`, `logprobs: 1`, `max_tokens: 1`),
from one scoring pass of the engine's model; an engine that cannot score is a 400 naming the
parameter. `response_format` (response_format.py) is checked, not enforced, and says so.
Completions also take token-id prompts (a list of ints, or a list of them), as vLLM does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import contextlib
import hmac
import sys
import time
import traceback
from concurrent.futures import Future
from pathlib import Path
from typing import Any, AsyncIterator, cast

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from arlecli import safeio
from arlecli.safeio import terminal_text
from arlecli.engine.base import Engine, GenerationRequest, cut_at_stop
from arlecli.errors import UserError
from arlecli.serve import protocol
from arlecli.serve import limits as lim
from arlecli.serve import scoring
from arlecli.serve.access_log import AccessLog, set_tokens
from arlecli.serve.streaming import TextStream
from arlecli.serve.batcher import SHUTDOWN, Batcher, Finished
from arlecli.serve.continuation import Continuations
from arlecli.serve.limits import ServeLimits
from arlecli.serve.protocol import ApiError, ApiRequest
from arlecli.serve.reasoning import Reasoning, Reply, reasoning_tokens
from arlecli.serve.record import Recorder, build_record
from arlecli.serve.sessions import DEFAULT_SESSION, Sessions
from arlecli.serve.tools import forced_start, parser_for, with_calls

SESSION_HEADER = "x-arle-session"


class _Json(JSONResponse):
    """A JSON response that encodes whatever it holds (a reply with a lone surrogate included)."""

    def render(self, content: Any) -> bytes:
        return safeio.dumps(content, allow_nan=False, separators=(",", ":")).encode("utf-8")


class _Wake:
    """Wakes a stream's event loop from the engine's thread, once per batch of new ids (not
    once per token: a 64-row batch would write the loop's self-pipe 64 times a step)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.pending = False

    def ring(self) -> None:
        if self.pending:
            return
        self.pending = True
        try:
            self.loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:  # the loop is closed: the server stopped
            pass

    def reset(self) -> None:
        self.pending = False
        self.event.clear()


class _Streamed:
    """One streamed choice: the engine thread's `hook` leaves its ids so far; the stream reads them."""

    def __init__(self, text: TextStream, wake: _Wake) -> None:
        self.text = text
        self.wake = wake
        self.ids: list[int] = []
        self.count = 0

    def hook(self, ids: list[int]) -> None:
        self.ids, self.count = ids, len(ids)  # the engine's own list: read up to count, never changed
        self.wake.ring()


class _Api:
    def __init__(
        self,
        engine: Engine,
        batcher: Batcher,
        model_name: str,
        api_key: str | None,
        recorder: Recorder | None,
        limits: ServeLimits,
        max_model_len: int | None,
        tool_call_parser: str | None = None,
    ) -> None:
        self.engine = engine
        self.batcher = batcher
        self.limits = limits
        self.model_name = model_name
        self.api_key = api_key
        self.recorder = recorder
        self.token_text = protocol.token_text_for(engine)
        self.reasoning = Reasoning(engine)
        self.scorer = scoring.scorer_for(engine)
        self.created = int(time.time())
        tokenizer = getattr(engine, "tokenizer", None)
        self.tool_parser = parser_for(tokenizer, tool_call_parser)  # serve/tools.py
        # Only recorded traffic needs exact ids, and only chat templates have turns to continue.
        self.continuations = (
            Continuations(tokenizer, limits.record_memory_bytes, getattr(engine, "chat_template_kwargs", None))
            if (recorder is not None and getattr(tokenizer, "chat_template", None))
            else None
        )
        self.sessions = Sessions(on_close=self.continuations.forget if self.continuations is not None else None)
        # Context checks need the context and the engine's own prompt encoding; an engine
        # without them (a remote endpoint) leaves the checks to whoever serves the model.
        self.encode = getattr(engine, "encode", None)
        self.context = lim.context_length(engine, max_model_len) if self.encode is not None else None
        self.longest_token = lim.longest_token_chars(tokenizer) if self.context is not None else None

    def _card(self) -> dict[str, Any]:
        card: dict[str, Any] = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "arle"}
        if self.context is not None:
            card["max_model_len"] = self.context  # vLLM's field
        return card

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        return _Json({"object": "list", "data": [self._card()]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{id}: the served model's card (openai's models.retrieve); 404 for another id."""
        self._authorize(request)
        wanted = request.path_params["model_id"]
        if wanted != self.model_name:
            raise ApiError(
                404,
                f"The model `{wanted}` does not exist (this server serves `{self.model_name}`).",
                "model_not_found",
                "model",
            )
        return _Json(self._card())

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
            raise ApiError(
                404,
                f"The model `{req.model}` does not exist (this server serves `{self.model_name}`).",
                "model_not_found",
                "model",
            )
        lim.check_choices(req, self.limits)
        if req.tools is not None and self.encode is None:
            # Over a remote endpoint the engine sends text and gets text: calls would be lost.
            raise ApiError(
                400,
                f"`tools` are not supported by arle serve on the {self.engine.name} engine (function "
                "calling needs the model's chat template in this process: the hf or vllm backend)",
                "invalid_request_error",
                "tools",
            )
        self._check_logprobs(req)
        if req.prompt_ids is not None:
            req.prompts = await asyncio.to_thread(self._token_prompts, req.prompt_ids)
        session = self.sessions.check(request.path_params.get("session") or request.headers.get(SESSION_HEADER))
        endpoint = "/v1/chat/completions" if chat else "/v1/completions"
        rid = protocol.new_id(chat)
        continued, continues = None, None
        if chat and self.continuations is not None:
            continued, continues = self.continuations.prompt_ids(
                session, req.prompts[0], req.tools.tools if req.tools is not None else None
            )
        prompt_ids, budgets = await self._fit_context(req, continued)
        prompt_ids, budgets = self._force_call(req, prompt_ids, budgets)
        headers = {"Cache-Control": "no-cache"} if req.stream else {}
        if req.response_format is not None:
            from arlecli.serve import response_format as rf

            guided = bool(getattr(self.engine, "guides", False))
            if guided:  # vllm decodes under the format
                req.params.structured = rf.structured(req.response_format)
            headers[rf.HEADER] = rf.GUIDED if guided else rf.UNCONSTRAINED
        if req.echo and prompt_ids is not None and (req.params.max_tokens == 0 or (
            req.params.temperature == 0 and req.params.max_tokens == 1
        )):  # fmt: skip
            # lm-eval's loglikelihood request: the scoring pass alone gives the prompt's logprobs
            # and the greedy next token (at any temperature when no token is asked for), so
            # nothing is generated.
            return await self._echo_only(
                request, req, rid, received, [p for p in prompt_ids if p is not None], session, endpoint, headers
            )
        engine_requests = req.engine_requests(
            force_logprobs=self.recorder is not None or self._scores(req), prompt_ids=prompt_ids, max_tokens=budgets
        )
        streams = self._text_streams(req, engine_requests)
        try:
            futures = self.batcher.submit(engine_requests, [s.hook for s in streams] if streams else None)
        except RuntimeError as exc:  # shutting down
            raise ApiError(503, str(exc), "unavailable") from None
        waiting = [asyncio.wrap_future(f) for f in futures]
        if req.stream:
            events = self._stream(
                req, futures, waiting, rid, int(received), session, endpoint, received, continues, streams, request
            )
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        # Future[Any]: the answers and the disconnect watch race in one wait.
        gathered: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*waiting))
        gone: asyncio.Future[Any] = asyncio.ensure_future(_disconnected(request))
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
            # ... and asyncio would log "exception was never retrieved" for each dropped client.
            gathered.add_done_callback(lambda f: f.cancelled() or f.exception())
        replies = [self._reply(req, f.completion) for f in finished]
        self._record(session, rid, endpoint, req, finished, received, continues, replies)
        thought = reasoning_tokens(replies) if req.chat and not req.raw_reasoning else None
        scored = await self._score(req, [f.completion for f in finished]) if self._scores(req) else None
        body = protocol.response(req, rid, int(received), self.model_name, replies, self.token_text, thought, scored)
        if req.response_format is not None:
            from arlecli.serve import response_format as rf

            texts = [c["message"]["content"] for c in body["choices"]]
            verdicts = await asyncio.to_thread(rf.check_replies, req.response_format, texts)
            for choice, error in zip(body["choices"], verdicts):
                rf.mark(choice, error)
        set_tokens(request, body["usage"])
        return _Json(body, headers=headers)

    def _check_logprobs(self, req: ApiRequest) -> None:
        """ApiError(400) for logprobs this engine cannot give (see scoring.py)."""
        if not self._scores(req):
            return
        param = "echo" if req.echo else ("top_logprobs" if req.chat else "logprobs")
        if self.scorer is None:
            raise ApiError(
                400,
                f"`{param}` ({'prompt logprobs' if req.echo else 'top-N alternatives'}) is not "
                f"supported by arle serve on the {self.engine.name} engine (it has no model in this "
                "process to score with)",
                "invalid_request_error",
                param,
            )
        if req.top_logprobs and req.params.temperature > 0 and scoring.raw_only(self.engine):
            raise ApiError(
                400,
                f"`{param}` with temperature > 0 is not supported by arle serve on the "
                f"{self.engine.name} engine (its alternatives would be raw logprobs, not those of the "
                "distribution the token was sampled from): use temperature 0 or the hf backend",
                "invalid_request_error",
                param,
            )

    @staticmethod
    def _scores(req: ApiRequest) -> bool:
        # A scoring pass is needed for alternatives, and for the prompt's logprobs of an echo.
        return req.logprobs and (req.top_logprobs > 0 or req.echo)

    def _token_prompts(self, prompts: list[list[int]]) -> list[str]:
        """The text of token-id prompts; ApiError(400) for ids outside the vocabulary."""
        tokenizer = getattr(self.engine, "tokenizer", None)
        if tokenizer is None or not hasattr(tokenizer, "decode"):
            raise ApiError(
                400,
                f"token-id prompts need a tokenizer, and the {self.engine.name} engine has none here; "
                "send the prompt as text",
                "invalid_request_error",
                "prompt",
            )
        vocab = len(tokenizer)
        for i, ids in enumerate(prompts):
            bad = next((t for t in ids if t >= vocab), None)
            if bad is not None:
                raise ApiError(
                    400,
                    f"`prompt[{i}]` holds token id {bad}, outside this model's vocabulary of {vocab}",
                    "invalid_request_error",
                    "prompt",
                )
        return [tokenizer.decode(ids) for ids in prompts]

    async def _score(self, req: ApiRequest, completions: list[Any]) -> list[scoring.Scored]:
        """The scoring pass of each choice (prompt + its tokens), in the batcher's thread."""
        assert self.scorer is not None
        jobs = [
            scoring.ScoreJob(
                list(c.prompt_token_ids) + list(c.token_ids),
                req.top_logprobs,
                len(c.prompt_token_ids),
                req.params.temperature,
                req.params.top_p,
            )
            for c in completions
        ]
        scorer = self.scorer
        try:
            return await asyncio.wrap_future(self.batcher.call(lambda: scorer(jobs)))
        except Exception as exc:
            raise _engine_error(exc) from None

    async def _echo_only(
        self,
        request: Request,
        req: ApiRequest,
        rid: str,
        received: float,
        prompt_ids: list[list[int]],
        session: str,
        endpoint: str,
        headers: dict[str, str],
    ) -> Response:
        """An echo with at most one greedy token: the prompt's logprobs (and that token) from
        the scoring pass alone."""
        from arlecli.engine.base import Completion

        if self.scorer is None:
            raise ApiError(
                400,
                f"`echo` is not supported by arle serve on the {self.engine.name} engine",
                "invalid_request_error",
                "echo",
            )
        jobs = [scoring.ScoreJob(ids, req.top_logprobs, len(ids)) for ids in prompt_ids]
        scorer = self.scorer
        try:
            scored = await asyncio.wrap_future(self.batcher.call(lambda: scorer(jobs)))
        except Exception as exc:
            raise _engine_error(exc) from None
        completions, per_choice = [], []
        for ids, sc in zip(prompt_ids, scored):
            generate = req.params.max_tokens >= 1
            tokens = [sc.next_token] if generate else []
            # An engine with a scorer is in-process: it has the tokenizer the Engine protocol does not declare.
            text = cast(Any, self.engine).tokenizer.decode(tokens, skip_special_tokens=True) if tokens else ""
            kept = cut_at_stop(text, req.params.stop)
            comp = Completion(
                text=kept,
                token_ids=tokens,
                prompt_token_ids=ids,
                logprobs=[sc.next_logprob] if generate else [],
                finish_reason="stop" if kept != text else "length",  # as generating that token would end
            )
            full = scoring.Scored(
                sc.logprobs + ([sc.next_logprob] if generate else []),
                sc.top + ([sc.next_top] if generate else []),
                sc.next_token,
                sc.next_logprob,
                sc.next_top,
            )
            for _ in range(req.n):
                completions.append(comp)
                per_choice.append(full)
        now = time.time()
        finished = [Finished(c, received, now, len(completions)) for c in completions]
        replies = [self._reply(req, c) for c in completions]
        self._record(session, rid, endpoint, req, finished, received, None, replies)
        body = protocol.response(
            req,
            rid,
            int(received),
            self.model_name,
            replies,
            self.token_text,
            None,
            per_choice if req.logprobs else None,
        )
        set_tokens(request, body["usage"])
        return _Json(body, headers=headers)

    def _text_streams(self, req: ApiRequest, requests: list[GenerationRequest]) -> list[_Streamed] | None:
        """Per choice, its text stream and the hook the engine feeds it through, when this
        request streams token by token (see the module docstring); else None."""
        tokenizer = getattr(self.engine, "tokenizer", None)
        if not req.stream or not self.batcher.streams or tokenizer is None or req.tools is not None:
            return None
        parse = req.chat and not req.raw_reasoning
        from arlecli.thinking import prompt_opens

        out = []
        wake = _Wake()
        for gen in requests:
            opened = (
                parse
                and gen.prompt_token_ids is not None
                and prompt_opens(tokenizer, gen.prompt_token_ids, self.reasoning.tags)
            )
            out.append(
                _Streamed(
                    TextStream(tokenizer, stop=gen.params.stop, tags=self.reasoning.tags, opened=opened, parse=parse),
                    wake,
                )
            )
        return out

    async def _fit_context(
        self, req: ApiRequest, continued: list[int] | None
    ) -> tuple[list[list[int] | None] | None, list[int] | None]:
        """(prompt ids, max_tokens) per prompt, or (None, None) where the context is unknown;
        ApiError(400) for a prompt the chat template or tokenizer refuses, a prompt longer
        than the context, or a max_tokens beyond what it leaves.

        Encoding here, once, is what the engine would do anyway (the ids go with the request);
        it runs in a worker thread, so a long prompt does not stall other connections."""
        if self.context is None or self.encode is None:
            if req.prompt_ids is not None:
                return list(req.prompt_ids), None
            if any(p == "" for p in req.prompts):  # nothing to check the ids with: the text is all there is
                raise _empty_prompt()
            return ([continued] if continued is not None else None), None
        if self.longest_token is not None:
            lim.too_long_by_chars(req, self.context, self.longest_token)
        encode = self.encode
        ids: list[list[int] | None] = []
        for p, prompt in enumerate(req.prompts):
            if continued is not None:  # chat: one prompt, continuing a recorded reply
                ids.append(continued)
                continue
            if req.prompt_ids is not None:  # sent as token ids: taken as they are
                ids.append(req.prompt_ids[p])
                continue
            gen = (
                GenerationRequest(messages=prompt, tools=req.tools.tools if req.tools is not None else None)
                if req.chat
                else GenerationRequest(prompt=prompt)
            )
            try:
                ids.append(await asyncio.to_thread(encode, gen))
            except UserError as exc:  # e.g. a chat request to a model without a chat template
                raise ApiError(400, str(exc), "invalid_request_error") from None
            except Exception as exc:  # the template raised on these messages (roles out of order ...)
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                raise ApiError(
                    400,
                    f"the {'chat template' if req.chat else 'tokenizer'} refused this "
                    f"{'conversation' if req.chat else 'prompt'}: {type(exc).__name__}: {first}",
                    "invalid_request_error",
                    "messages" if req.chat else "prompt",
                ) from None
        lengths = [len(x) for x in ids if x is not None]
        if 0 in lengths:
            raise _empty_prompt()
        return ids, lim.check_context(req, lengths, self.context)

    async def _stream(
        self,
        req: ApiRequest,
        futures: list[Future[Finished]],
        waiting: list[asyncio.Future[Finished]],
        rid: str,
        created: int,
        session: str,
        endpoint: str,
        received: float,
        continues: dict[str, Any] | None,
        streams: list[_Streamed] | None = None,
        request: Request | None = None,
    ) -> AsyncIterator[str]:
        def event(choices: list[dict[str, Any]], **extra: Any) -> str:
            return _sse(protocol.chunk(req, rid, created, self.model_name, choices, **extra))

        def tokens(i: int) -> list[dict[str, Any]]:
            # The deltas choice i's new ids allow out (streaming.py), in field order.
            assert streams is not None
            st = streams[i]
            return [protocol.token_delta(req, i, key, text) for key, text in st.text.update(st.ids[: st.count])]

        index = {fut: i for i, fut in enumerate(waiting)}
        finished: list[Finished | None] = [None] * len(waiting)
        replies: list[Reply | None] = [None] * len(waiting)
        try:
            if req.chat:  # the role goes out at once, so clients know the request is being served
                yield event([protocol.first_delta(req, i) for i in range(len(waiting))])
            # Future[Any]: the wake-up task waits beside the choices' futures.
            pending: set[asyncio.Future[Any]] = set(waiting)
            prompt_ids_sent = False
            wake = streams[0].wake if streams else None
            while pending:
                ringing: asyncio.Future[Any] | None = (
                    asyncio.ensure_future(wake.event.wait()) if wake is not None else None
                )
                try:
                    done, pending = await asyncio.wait(
                        pending | ({ringing} if ringing else set()), return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    if ringing is not None:
                        ringing.cancel()
                pending.discard(ringing)
                done.discard(ringing)
                if wake is not None and streams is not None:
                    wake.reset()  # before reading: ids that come meanwhile ring again
                    for i in range(len(waiting)):
                        if finished[i] is None and waiting[i] not in done:
                            for delta in tokens(i):
                                yield event([delta])
                for fut in sorted(done, key=index.__getitem__):
                    i, fin = index[fut], fut.result()
                    finished[i] = fin
                    reply_i = replies[i] = self._reply(req, fin.completion)
                    extra = {}
                    if req.chat and req.return_token_ids and not prompt_ids_sent:
                        extra["prompt_token_ids"] = list(fin.completion.prompt_token_ids)
                        prompt_ids_sent = True
                    scored = (await self._score(req, [fin.completion]))[0] if self._scores(req) else None
                    rest = None
                    if streams is not None:  # what the token deltas left of each field
                        left = dict(streams[i].text.finish(reply_i, protocol.parsed(req, reply_i)))
                        if left.get("reasoning_content"):
                            yield event(
                                [protocol.token_delta(req, i, "reasoning_content", left["reasoning_content"])], **extra
                            )
                            extra = {}
                        rest = left.get("content", "")
                    else:
                        thought = protocol.reasoning_delta(req, i, reply_i)
                        if thought is not None:  # the thinking before the answer, as vLLM streams it
                            yield event([thought], **extra)
                            extra = {}
                    yield event([protocol.content_delta(req, i, reply_i, self.token_text, rest, scored)], **extra)
                    yield event([protocol.finish_delta(req, i, fin.completion, reply_i)])
            done_all = [f for f in finished if f is not None]
            split = [r for r in replies if r is not None]
            thinking = reasoning_tokens(split) if req.chat and not req.raw_reasoning else None
            usage = protocol.usage(req, [f.completion for f in done_all], thinking)
            if request is not None:
                set_tokens(request, usage)
            if req.include_usage:
                yield event([], usage=usage)
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
        if req.chat and req.tools is not None:
            forced = self._forced_ids(req)
            if forced and list(comp.prompt_token_ids[-len(forced) :]) == forced:  # the call's start arle wrote
                comp = dataclasses.replace(comp, text=forced_start(req.tools, self.tool_parser) + comp.text)
        reply = self.reasoning.reply(comp)
        return with_calls(reply, req.tools, self.tool_parser) if req.chat else reply

    def _forced_ids(self, req: ApiRequest) -> list[int]:
        """The ids of the call opening a `tool_choice` of "required" or a function forces (tools.py)."""
        text = forced_start(req.tools, self.tool_parser) if req.chat else ""
        tokenizer = getattr(self.engine, "tokenizer", None)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text and tokenizer is not None else []

    def _force_call(
        self, req: ApiRequest, prompt_ids: list[list[int] | None] | None, budgets: list[int] | None
    ) -> tuple[list[list[int] | None] | None, list[int] | None]:
        """Each prompt followed by the call opening its tool_choice forces (none: unchanged; a prompt
        that opens a thought is left to think first), its max_tokens shortened by as many tokens."""
        forced = self._forced_ids(req)
        if not forced or prompt_ids is None:
            return prompt_ids, budgets
        from arlecli.thinking import prompt_opens

        tokenizer = getattr(self.engine, "tokenizer", None)
        out = [p if p is None or prompt_opens(tokenizer, p, self.reasoning.tags) else [*p, *forced] for p in prompt_ids]
        return out, [max(1, b - len(forced)) for b in budgets] if budgets is not None else None

    def _record(
        self,
        session: str,
        rid: str,
        endpoint: str,
        req: ApiRequest,
        finished: list[Finished],
        received: float,
        continues: dict[str, Any] | None,
        replies: list[Reply],
    ) -> None:
        if self.recorder is None or (session != DEFAULT_SESSION and session not in self.sessions):
            return  # closed while this request ran: its episode was read already
        completions = [f.completion for f in finished]
        usage = protocol.usage(req, completions, reasoning_tokens(replies))
        record = build_record(
            rid=rid,
            endpoint=endpoint,
            model=self.model_name,
            request=req,
            finished=finished,
            received_at=received,
            usage=usage,
            continues=continues,
            replies=replies,
        )
        self.recorder.write(session, record)
        if req.chat and self.continuations is not None:
            # Before the response goes out, so the client's next call finds this reply.
            self.continuations.remember(session, rid, req.prompts[0], completions, replies)

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        sent = request.headers.getlist("authorization")
        if len(sent) > 1:  # a proxy that reads the last one would disagree with a server reading the first
            raise ApiError(401, "more than one Authorization header: send one", "invalid_api_key")
        given = sent[0] if sent else ""
        scheme, _, token = given.partition(" ")
        if not given:
            raise ApiError(401, "missing API key: send the header `Authorization: Bearer <key>`", "invalid_api_key")
        # Constant-time compare; the message never repeats what was sent.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "invalid API key", "invalid_api_key")


def create_app(
    engine: Engine,
    *,
    model_name: str,
    api_key: str | None = None,
    record_dir: Path | None = None,
    max_concurrency: int = 16,
    batch_wait_s: float = 0.005,
    limits: ServeLimits | None = None,
    max_model_len: int | None = None,
    tool_call_parser: str | None = None,
    access_log: bool = False,
) -> Starlette:
    """The server app for `engine`, served as `model_name`.

    Args:
        access_log: one line per request on stderr (access_log.py; `arle serve` sets it unless
            --no-access-log).
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
    routes = [
        Route("/health", _health, methods=["GET"]),
        Route("/sessions", api.open_session, methods=["POST"]),
        Route("/sessions/{sid}", api.close_session, methods=["DELETE"]),
    ]
    for prefix in ("", "/s/{session}"):
        routes += [
            Route(prefix + "/v1/models", api.models, methods=["GET"]),
            Route(prefix + "/v1/models/{model_id:path}", api.model, methods=["GET"]),
            Route(prefix + "/v1/chat/completions", api.chat, methods=["POST"]),
            Route(prefix + "/v1/completions", api.completions, methods=["POST"]),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        batcher.close(timeout=0)  # answer whatever is still waiting; don't wait for the engine

    from starlette.middleware import Middleware

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error},
        middleware=[
            *([Middleware(AccessLog)] if access_log else []),
            Middleware(lim.HeaderGuard, max_header_bytes=limits.max_header_bytes),
        ],
    )
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
    return ApiError(
        400,
        "the prompt is empty: it encodes to no tokens, and the model needs at least one to start from",
        "invalid_request_error",
        "prompt",
    )


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
    return _Json(
        ApiError(exc.status_code, message, "not_found" if exc.status_code == 404 else None).body(),
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _server_error(request: Request, exc: Exception) -> Response:
    # The message may quote what the client sent: escaped, so it cannot drive the log's terminal.
    sys.stderr.write(terminal_text("".join(traceback.format_exception(exc))))
    return _Json(ApiError(500, f"internal error: {type(exc).__name__}", "server_error").body(), status_code=500)
