"""The OpenAI wire format: request bodies in, response bodies and stream chunks out.

Pure functions over dicts and the engine's dataclasses, so the shapes can be read (and
tested) without a server. Field placement follows vLLM where OpenAI has no field: the
`token_ids` of each choice and `prompt_token_ids` (on the response for chat, on the choice
for completions) when the request sets `return_token_ids`, and a thinking model's
`reasoning_content` beside `content` (see reasoning.py; `reasoning_format: "none"` in a chat
request, llama.cpp's switch, asks for the raw text in `content` instead).
"""

from __future__ import annotations

import hashlib
import math
import random
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from arlecli.engine.base import Completion, GenerationRequest, SamplingParams
from arlecli.serve import response_format
from arlecli.serve.reasoning import Reply
from arlecli.serve.tools import ToolRequest, ToolRequestError, message_tool_calls, parse_tool_request, stream_calls

MAX_N = 128
# Stop strings are checked at every decode step, so their number and length cost every
# request in the batch; OpenAI allows 4, these bounds leave room for eval cards.
MAX_STOPS = 64
MAX_STOP_CHARS = 1024
# OpenAI's documented defaults: completions stop after 16 tokens; chat runs to the context
# limit, which the engine protocol does not expose, so chat gets a generous fixed budget.
DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 1024
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1
# A chat request's `reasoning_format` (llama.cpp's name): "parsed", the default, returns a thinking
# model's thought in `reasoning_content`; "none" returns the raw text, thought and all, in `content`.
REASONING_FORMATS = ("parsed", "none")
# Dividing logits by a temperature near 0 overflows them (1e-40 makes the hf engine's sampler
# raise on inf/nan; fp16 overflows far sooner): a smaller positive one is raised to this, as
# vLLM does. It samples as greedily as anyone asking for 1e-9 can have meant.
MIN_TEMPERATURE = 0.01


@dataclass(frozen=True)
class TokenText:
    """How token ids show in logprobs: `text` each one's decoded text, `raw` the bytes it
    stands for (serve/token_bytes.py; a token holding part of a character decodes to U+FFFD)."""

    text: Callable[[list[int]], list[str]]
    raw: Callable[[list[int]], list[bytes]]


class ApiError(Exception):
    """An error answered in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI clients parse."""
        if self.status == 401:
            kind = "authentication_error"
        else:
            kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param)


@dataclass
class ApiRequest:
    """A validated /chat/completions or /completions request.

    `prompts` holds one chat message list (chat) or one or more prompt strings
    (completions); each gets `n` choices, numbered prompt-major as OpenAI does.
    """

    chat: bool
    model: str | None
    prompts: list[Any]
    params: SamplingParams
    n: int = 1
    seeds: list[int | None] = field(default_factory=lambda: [None])
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False  # the client wants logprobs in the response
    return_token_ids: bool = False
    max_tokens_explicit: bool = False  # the client set max_tokens (a default may be cut to fit)
    raw_reasoning: bool = False  # reasoning_format "none": the thought stays in `content`
    tools: ToolRequest | None = None  # function calling (serve/tools.py)
    top_logprobs: int = 0  # alternatives per token (chat `top_logprobs`, completions `logprobs=N`)
    echo: bool = False  # completions: the prompt, with its logprobs, before each choice's text
    prompt_ids: list[list[int]] | None = None  # completions sent as token ids (`prompts` holds their text)
    response_format: Any = None  # serve/response_format.ResponseFormat, or None (plain text)

    def engine_requests(
        self,
        force_logprobs: bool = False,
        prompt_ids: list[list[int] | None] | None = None,
        max_tokens: list[int] | None = None,
    ) -> list[GenerationRequest]:
        """One engine request per choice, each with its own SamplingParams object (the batcher
        cuts a cancelled one short through it). `force_logprobs` asks the engine for logprobs
        the client did not request (the recorder keeps them; they do not change the sampled
        tokens). `prompt_ids`, per prompt, replaces encoding it: ids the server already
        computed to check the context, or a continued session's exact ids (continuation.py).
        `max_tokens`, per prompt, replaces the request's (a default cut to the context)."""
        out = []
        for p, prompt in enumerate(self.prompts):
            ids = prompt_ids[p] if prompt_ids is not None else None
            budget = max_tokens[p] if max_tokens is not None else self.params.max_tokens
            for seed in self.seeds:
                params = replace(
                    self.params,
                    seed=seed,
                    stop=list(self.params.stop),
                    max_tokens=budget,
                    logprobs=self.logprobs or force_logprobs,
                )
                if self.chat:
                    out.append(
                        GenerationRequest(
                            messages=prompt,
                            params=params,
                            prompt_token_ids=ids,
                            tools=self.tools.tools if self.tools is not None else None,
                        )
                    )
                else:
                    out.append(GenerationRequest(prompt=prompt, params=params, prompt_token_ids=ids))
        return out


def choice_seeds(seed: int | None, n: int, temperature: float) -> list[int | None]:
    """Seeds for n choices: choice 0 keeps the request's seed (so n=1 samples what the engine
    would in-process), the others get seeds hashed from (seed, i). No seed: a random base, so
    unseeded sampling varies between requests as it does on OpenAI."""
    if temperature <= 0:
        return [seed] * n  # greedy ignores the seed
    if seed is None:
        seed = random.getrandbits(62)
    seeds: list[int | None] = [seed]
    for i in range(1, n):
        digest = hashlib.sha256(f"{seed}:{i}".encode()).digest()
        seeds.append(int.from_bytes(digest[:8], "big") >> 2)
    return seeds


# ------------------------------------------------------------------------------ parsing


def parse_chat(body: Any) -> ApiRequest:
    """Validate a chat completion body; raise ApiError(400) naming the bad field."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("`messages` must be a non-empty list of {role, content} objects", "messages")
    try:
        clean = [_message(i, m) for i, m in enumerate(messages)]
        tool_request = parse_tool_request(body)
    except ToolRequestError as exc:
        raise _bad(str(exc), exc.param) from None
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, 20)
    if top and not logprobs:
        raise _bad("`top_logprobs` needs `logprobs: true`", "top_logprobs")
    try:
        answer_format = response_format.parse(body.get("response_format"))
    except response_format.ResponseFormatError as exc:
        raise _bad(str(exc), "response_format") from None
    fmt = body.get("reasoning_format")
    if fmt is not None and fmt not in REASONING_FORMATS:
        raise _bad(
            '`reasoning_format` must be "parsed" (the thinking in `reasoning_content`) or "none" '
            "(the raw text in `content`)",
            "reasoning_format",
        )
    max_tokens = _max_tokens(body, DEFAULT_CHAT_MAX_TOKENS, "max_completion_tokens", "max_tokens")
    req = _common(
        body,
        chat=True,
        prompts=[clean],
        max_tokens=max_tokens,
        logprobs=logprobs,
        explicit=any(body.get(k) is not None for k in ("max_completion_tokens", "max_tokens")),
    )
    req.raw_reasoning = fmt == "none"
    req.top_logprobs = top if logprobs else 0
    req.response_format = answer_format
    req.tools = tool_request
    return req


def parse_completion(body: Any) -> ApiRequest:
    """Validate a (legacy) completion body; raise ApiError(400) naming the bad field."""
    body = _object(body)
    prompt = body.get("prompt")
    prompt_ids = token_prompts(prompt)
    if prompt_ids is not None:
        prompts: list[Any] = [""] * len(prompt_ids)  # their text: the app decodes the ids
    elif isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    else:
        raise _bad(
            "`prompt` must be a string, a non-empty list of strings, a list of token ids or a list of "
            "lists of token ids",
            "prompt",
        )
    logprobs_n = body.get("logprobs")
    if logprobs_n is not None and (
        isinstance(logprobs_n, bool) or not isinstance(logprobs_n, int) or not 0 <= logprobs_n <= 20
    ):
        raise _bad("`logprobs` must be an integer from 0 to 20", "logprobs")
    echo = _bool(body, "echo")
    asked = body.get("response_format")
    if asked is not None and not (isinstance(asked, dict) and asked.get("type") == "text"):
        raise _bad("`response_format` is supported on /v1/chat/completions only", "response_format")
    best_of = body.get("best_of")
    if best_of is not None and best_of != body.get("n", 1):
        raise _bad("`best_of` is not supported by arle serve", "best_of")
    if body.get("suffix"):
        raise _bad("`suffix` is not supported by arle serve", "suffix")
    if echo and body.get("max_tokens") == 0:  # prompt logprobs only (vLLM takes 0 with echo)
        max_tokens = 0
    else:
        max_tokens = _max_tokens(body, DEFAULT_COMPLETION_MAX_TOKENS, "max_tokens")
    req = _common(
        body,
        chat=False,
        prompts=prompts,
        max_tokens=max_tokens,
        logprobs=logprobs_n is not None,
        explicit=body.get("max_tokens") is not None,
    )
    req.top_logprobs = logprobs_n or 0
    req.echo = echo
    req.prompt_ids = prompt_ids
    if echo and req.stream:
        raise _bad("`echo` with `stream` is not supported by arle serve", "echo")
    return req


def token_prompts(prompt: Any) -> list[list[int]] | None:
    """A completions `prompt` of token ids as one id list per prompt (a list of ints is one
    prompt, a list of lists several, as vLLM takes them); None when it is not token ids."""
    if not isinstance(prompt, list) or not prompt:
        return None
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if min(prompt) < 0:
            raise _bad("`prompt` token ids must be integers >= 0", "prompt")
        return [list(prompt)]
    if not all(isinstance(p, list) for p in prompt):
        return None
    for i, p in enumerate(prompt):
        if not p or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
            raise _bad(f"`prompt[{i}]` must be a non-empty list of token ids (integers >= 0)", "prompt")
    return [list(p) for p in prompt]


def _common(
    body: dict[str, Any], *, chat: bool, prompts: list[Any], max_tokens: int, logprobs: bool, explicit: bool = False
) -> ApiRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("`model` must be a string", "model")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    if 0 < temperature < MIN_TEMPERATURE:
        temperature = MIN_TEMPERATURE
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0:
        raise _bad("`top_p` must be greater than 0", "top_p")
    n = _int(body, "n", 1, MAX_N, default=1)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not _SEED_MIN <= seed <= _SEED_MAX):
        raise _bad("`seed` must be a 64-bit integer", "seed")
    for name in ("frequency_penalty", "presence_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0.0:
            raise _bad(f"`{name}` is not supported by arle serve (leave it 0)", name)
    if body.get("logit_bias"):
        raise _bad("`logit_bias` is not supported by arle serve", "logit_bias")
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("`stream_options` must be an object", "stream_options")
    include_usage = stream and _bool(options or {}, "include_usage", "stream_options.include_usage")
    params = SamplingParams(
        temperature=temperature, top_p=top_p, max_tokens=max_tokens, stop=_stop(body), seed=seed, logprobs=logprobs
    )
    return ApiRequest(
        chat=chat,
        model=model,
        prompts=prompts,
        params=params,
        n=n,
        seeds=choice_seeds(seed, n, temperature),
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        return_token_ids=_bool(body, "return_token_ids"),
        max_tokens_explicit=explicit,
    )


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object")
    return body


def _message(i: int, m: Any) -> dict[str, Any]:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise _bad(f"messages[{i}] must be an object with a string `role`", "messages")
    out: dict[str, Any] = {"role": m["role"], "content": _content(i, m.get("content"))}
    if m["role"] == "assistant" and m.get("tool_calls"):  # an earlier reply's calls, for the template
        out["tool_calls"] = message_tool_calls(i, m["tool_calls"])
    if m["role"] == "tool":
        for key in ("tool_call_id", "name"):  # which call this answers (templates may render either)
            if isinstance(m.get(key), str):
                out[key] = m[key]
    if m["role"] == "assistant":
        # An earlier reply's thinking, sent back as it came (vLLM: `reasoning` or `reasoning_content`):
        # kept for the chat template, which may render it (Qwen3's does after the last user turn).
        thought = next((k for k in ("reasoning_content", "reasoning") if m.get(k) is not None), None)
        if thought is not None:
            if not isinstance(m[thought], str):
                raise _bad(f"messages[{i}].{thought} must be a string", "messages")
            out["reasoning_content"] = m[thought]
    return out


def _content(i: int, content: Any) -> str:
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _bad(f"messages[{i}].content: only text parts are supported by arle serve", "messages")
            parts.append(part["text"])
        text = "".join(parts)
    else:
        raise _bad(f"messages[{i}].content must be a string or a list of text parts", "messages")
    return text


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _bad("`stop` must be a string or a list of strings", "stop")
    if len(stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise _bad(f"`stop` may hold at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters", "stop")
    return [s for s in stop if s]


def _max_tokens(body: dict[str, Any], default: int, *names: str) -> int:
    for name in names:  # max_completion_tokens, the newer name, wins
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _bad(f"`{name}` must be a positive integer", name)
            return value
    return default


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise _bad(f"`{name}` must be a number from {low:g} to {high:g}", name)
    return float(value)


def _int(body: dict[str, Any], name: str, low: int, high: int, default: int = 0) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(f"`{name}` must be an integer from {low} to {high}", name)
    return value


def _bool(body: dict[str, Any], name: str, shown: str | None = None) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"`{shown or name}` must be true or false", shown or name)
    return value


# ------------------------------------------------------------------------------ responses


def new_id(chat: bool) -> str:
    """An id in OpenAI's style: chatcmpl-... or cmpl-..."""
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def usage(req: ApiRequest, completions: list[Completion], reasoning_tokens: int | None = None) -> dict[str, Any]:
    """Token counts from the engine's ids; each prompt counts once however many choices it has.
    `reasoning_tokens` (those of a thinking model's thoughts) goes where OpenAI puts it,
    `completion_tokens_details`, which is left out when nothing thought."""
    prompt = sum(len(completions[p * req.n].prompt_token_ids) for p in range(len(req.prompts)))
    completion = sum(len(c.token_ids) for c in completions)
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def _parsed(req: ApiRequest, reply: Reply) -> bool:
    # Whether this chat reply goes out with its thinking apart (reasoning.py).
    return req.chat and reply.thought and not (req.raw_reasoning and reply.completion.reasoning is None)


def message(req: ApiRequest, reply: Reply) -> dict[str, Any]:
    """A chat reply's message: the answer in `content` and the thinking in `reasoning_content`
    (content null when the model thought and gave no answer, as vLLM's parsers answer);
    a reply without a thought, or one asked for raw, is the text as generated."""
    if reply.tool_calls:  # serve/tools.py: the text outside the calls, and the calls
        out: dict[str, Any] = {
            "role": "assistant",
            "content": reply.answer or None,
            "tool_calls": [dict(c) for c in reply.tool_calls],
        }
        if _parsed(req, reply):
            out["reasoning_content"] = reply.thinking
        return out
    if not _parsed(req, reply):
        return {"role": "assistant", "content": reply.completion.text}
    return {"role": "assistant", "content": reply.answer or None, "reasoning_content": reply.thinking}


def finish_reason(reply: Reply) -> str:
    """A choice's finish reason: "tool_calls" when the reply's calls were parsed out of it."""
    return "tool_calls" if reply.tool_calls else reply.completion.finish_reason


def response(
    req: ApiRequest,
    rid: str,
    created: int,
    model: str,
    replies: list[Reply],
    token_text: TokenText,
    reasoning_tokens: int | None = None,
    scored: list[Any] | None = None,
) -> dict[str, Any]:
    """The non-streaming response body for `replies` (one per choice, in choice order);
    `scored`, per choice, the scoring pass its alternatives and echoed logprobs come from."""
    choices = []
    completions = [r.completion for r in replies]
    for i, reply in enumerate(replies):
        comp = reply.completion
        choice: dict[str, Any] = {"index": i}
        if req.chat:
            choice["message"] = message(req, reply)
        else:
            choice["text"] = (req.prompts[i // req.n] + comp.text) if req.echo else comp.text
        choice["logprobs"] = logprobs(req, comp, token_text, scored[i] if scored is not None else None)
        choice["finish_reason"] = finish_reason(reply)
        _token_ids(req, choice, comp)
        choices.append(choice)
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion" if req.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(req, completions, reasoning_tokens),
    }
    if req.chat and req.return_token_ids:
        body["prompt_token_ids"] = completions[0].prompt_token_ids
    return body


def _token_ids(req: ApiRequest, choice: dict[str, Any], comp: Completion) -> None:
    if req.return_token_ids:
        choice["token_ids"] = list(comp.token_ids)
        if not req.chat:
            choice["prompt_token_ids"] = list(comp.prompt_token_ids)


def finite(values: list[float] | None) -> list[float] | None:
    """Logprobs safe for strict JSON: -inf (a token the sampler could not pick) becomes -9999.0,
    as vLLM reports it."""
    if values is None:
        return None
    return [v if math.isfinite(v) else -9999.0 for v in values]


def logprobs(req: ApiRequest, comp: Completion, token_text: TokenText, scored: Any = None) -> dict[str, Any] | None:
    """Per-token logprobs in the endpoint's shape, or None when not asked for.

    `scored` (serve/scoring.Scored over the prompt + these tokens), where the request wants
    alternatives or an echo, gives every position's logprob and top-`req.top_logprobs`
    alternatives from one scoring pass; else the engine's own logprobs of the sampled tokens
    go out, with no alternatives (chat `top_logprobs: []`; completions the sampled token alone,
    as OpenAI's `logprobs=0`). Completions with `echo` cover the prompt's tokens first, the
    first of them with a null logprob (nothing predicts it), as vLLM's server answers.
    """
    if not req.logprobs:
        return None
    prompt_ids = list(comp.prompt_token_ids) if req.echo else []
    ids = prompt_ids + list(comp.token_ids)
    if scored is not None:
        # Scored position k predicts ids[k] of prompt + completion; echoed prompts start at 0.
        first = len(comp.prompt_token_ids) - len(prompt_ids)
        values: list[float | None] = [scored.logprobs[k - 1] if k > 0 else None for k in range(first, first + len(ids))]
        alts: list[list[tuple[int, float]] | None] = [
            scored.top[k - 1] if k > 0 else None for k in range(first, first + len(ids))
        ]
    else:
        if comp.logprobs is None:
            return None
        values = list(comp.logprobs)
        ids = ids[: len(values)]
        alts = [[] for _ in values]
    texts = token_text.text(ids)
    values = [None if v is None else _finite(v) for v in values]
    alt_ids = sorted({t for a in alts if a for t, _ in a})
    alt_text = dict(zip(alt_ids, token_text.text(alt_ids))) if alt_ids else {}
    if req.chat:
        raws = token_text.raw(ids)
        alt_raw = dict(zip(alt_ids, token_text.raw(alt_ids))) if alt_ids else {}

        def entry(t: str, raw: bytes, lp: float | None) -> dict[str, Any]:
            return {"token": t, "logprob": lp, "bytes": list(raw)}

        return {
            "content": [
                {
                    **entry(t, raw, lp),
                    "top_logprobs": [entry(alt_text[i], alt_raw[i], _finite(a)) for i, a in (alts[k] or [])],
                }
                for k, (t, raw, lp) in enumerate(zip(texts, raws, values))
            ]
        }
    offsets, at = [], 0
    for t in texts:
        offsets.append(at)
        at += len(t)
    tops: list[dict[str, float] | None] = []
    for k, (t, lp) in enumerate(zip(texts, values)):
        if lp is None:
            tops.append(None)
            continue
        # OpenAI: the N most likely tokens, and always the sampled one (so up to N + 1).
        top: dict[str, float] = {}
        for i, a in alts[k] or []:  # best first; tokens that show as one text keep the best's logprob
            top.setdefault(alt_text[i], _finite(a))
        top.setdefault(t, lp)
        tops.append(top)
    return {"tokens": texts, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _finite(v: float) -> float:
    return v if math.isfinite(v) else -9999.0


def chunk(
    req: ApiRequest, rid: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """One streaming chunk (`chat.completion.chunk` or `text_completion`)."""
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk" if req.chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        **extra,
    }
    if req.include_usage and "usage" not in body:
        body["usage"] = None  # OpenAI: every chunk has usage: null, the last one the totals
    return body


def token_delta(req: ApiRequest, index: int, key: str, text: str) -> dict[str, Any]:
    """A streamed piece of a choice's text as it is generated: `key` is "content" or
    "reasoning_content" (chat); completions carry it as `text`."""
    if req.chat:
        return {"index": index, "delta": {key: text}, "logprobs": None, "finish_reason": None}
    return {"index": index, "text": text, "logprobs": None, "finish_reason": None}


def parsed(req: ApiRequest, reply: Reply) -> bool:
    """Whether this reply's thinking goes out apart from its answer (`reasoning_content`)."""
    return _parsed(req, reply)


def first_delta(req: ApiRequest, index: int) -> dict[str, Any]:
    """The opening chat delta of a choice (role only), sent before generation ends."""
    return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}


def reasoning_delta(req: ApiRequest, index: int, reply: Reply) -> dict[str, Any] | None:
    """A chat choice's whole thinking as one `reasoning_content` delta, sent before its content
    (vLLM's order); None when the reply goes out without a thought apart."""
    if not _parsed(req, reply):
        return None
    return {"index": index, "delta": {"reasoning_content": reply.thinking}, "logprobs": None, "finish_reason": None}


def content_delta(
    req: ApiRequest, index: int, reply: Reply, token_text: TokenText, rest: str | None = None, scored: Any = None
) -> dict[str, Any]:
    """A choice's last content delta: its whole answer (an engine that does not stream), or
    `rest`, what the token deltas before it left (serve/streaming.py); its logprobs and token
    ids cover everything generated, the thinking included."""
    comp = reply.completion
    choice: dict[str, Any] = {"index": index}
    if req.chat:
        if reply.tool_calls:  # the text outside the calls, and the calls whole (the shape clients accumulate)
            choice["delta"] = {"content": reply.answer or None, "tool_calls": stream_calls(reply.tool_calls)}
        elif rest is not None:
            choice["delta"] = {"content": rest}
        else:
            choice["delta"] = {"content": reply.answer if _parsed(req, reply) else comp.text}
    else:
        choice["text"] = comp.text if rest is None else rest
    choice["logprobs"] = logprobs(req, comp, token_text, scored)
    choice["finish_reason"] = None
    _token_ids(req, choice, comp)
    return choice


def finish_delta(req: ApiRequest, index: int, comp: Completion, reply: Reply | None = None) -> dict[str, Any]:
    """The closing delta of a choice: empty content and its finish reason ("tool_calls" for a
    `reply` with calls)."""
    if req.chat:
        why = finish_reason(reply) if reply is not None else comp.finish_reason
        return {"index": index, "delta": {}, "logprobs": None, "finish_reason": why}
    return {"index": index, "text": "", "logprobs": None, "finish_reason": comp.finish_reason}


def token_text_for(engine: Any) -> TokenText:
    """How to show token ids as text in logprobs: the engine's tokenizer when it has one,
    else vLLM's `token_id:N` convention."""
    tok = getattr(engine, "tokenizer", None)
    if tok is not None and hasattr(tok, "batch_decode"):
        from arlecli.serve.token_bytes import token_bytes_for

        return TokenText(lambda ids: list(tok.batch_decode([[i] for i in ids])), token_bytes_for(tok))
    text: Callable[[list[int]], list[str]] = lambda ids: [f"token_id:{i}" for i in ids]  # noqa: E731
    return TokenText(text, lambda ids: [t.encode() for t in text(ids)])
