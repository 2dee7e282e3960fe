"""The rollout engine protocol shared by every backend (hf, openai; vllm later).

An engine takes a list of requests and yields `(index, Completion)` pairs as each
request finishes, in any order, so callers can persist results as they arrive.
Token ids always come from the engine (never from re-tokenising text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

from arlecli.errors import UserError
from arlecli.thinking import ThinkTags, answer_start


class EngineRequestError(UserError):
    """A generation request failed for good (after retries): the endpoint hung, broke off or
    answered nonsense. What was generated before it is still valid, so a caller that saves as it
    goes (arle eval) can tell the user to resume."""


@dataclass
class SamplingParams:
    """Decoding settings. temperature 0 means greedy.

    `max_thinking_tokens` bounds a reasoning model's thought apart from its answer: at that
    many tokens the thought is closed for it and the answer gets `max_tokens` of its own
    (budget forcing, engine.phases; endpoints get it as vLLM's `thinking_token_budget`).
    None: one budget, `max_tokens`, for thought and answer together."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    max_thinking_tokens: int | None = None
    # Token ids that end the generation like a stop string (kept in token_ids), checked without
    # decoding: engine.phases stops a thought at an end tag that is one token of its own.
    stop_token_ids: list[int] = field(default_factory=list)
    # A constraint on the text, for engines that decode under one (vllm: `guides = True`): vLLM's
    # structured-output fields, {"json_object": True} or {"json": <JSON Schema>}. Others ignore it.
    structured: dict[str, Any] | None = None


@dataclass
class GenerationRequest:
    """One generation: either chat `messages` or a raw `prompt` string.

    `tools` (JSON schemas) go to the chat template for models whose template renders them.
    `prompt_token_ids`, when set, is what in-process engines feed the model instead of
    encoding the messages: a later turn of an episode continues the exact ids of the
    earlier ones (see envs.episodes). Endpoints ignore it and send the messages."""

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    tools: list[dict[str, Any]] | None = None
    prompt_token_ids: list[int] | None = None


@dataclass
class Completion:
    """What the engine produced. `text` is cut before any stop string (as OpenAI does)."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    finish_reason: str = "stop"  # "stop" (EOS or stop string) or "length"
    # The server's own counts (an endpoint's `usage`), which may differ from the ids' lengths
    # (hosted APIs send no ids at all); None: count the ids.
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None  # wall seconds this request took to generate, where the backend knows
    # An endpoint's reasoning parser returns the thinking apart (`reasoning_content`); `text` is
    # then the answer. None: the thinking, if any, is in `text` (thinking.split takes it apart).
    reasoning: str | None = None
    reasoning_tokens: int | None = None  # the endpoint's count of them (usage.completion_tokens_details)
    forced: list[int] = field(default_factory=list)  # positions of token_ids arle wrote (budget forcing)


@dataclass
class LoglikRequest:
    """Score `continuation` after `context` (lm-eval's `loglikelihood` request)."""

    context: str
    continuation: str


@dataclass
class Loglik:
    """A continuation's summed log-probability, whether greedy decoding would have produced
    every one of its tokens (lm-eval's `is_greedy`), and how many tokens it took."""

    logprob: float
    greedy: bool
    num_tokens: int


def encode_pair(
    tokenizer: Any, context: str, continuation: str, prefix_token_id: int | None = None
) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) exactly as lm-eval 0.4.13 splits them for a causal LM.

    Trailing whitespace of the context moves to the continuation; the whole text is encoded
    once (with the tokenizer's own special tokens, BOS where it adds one) and the
    continuation is what follows the length of the context encoded alone. An empty context
    is conditioned on `prefix_token_id` (BOS, else EOS), as lm-eval's `loglikelihood` does.
    """
    prefix = (
        prefix_token_id
        if prefix_token_id is not None
        else (tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id)
    )
    if context == "":
        cont = list(tokenizer.encode(continuation, add_special_tokens=False))
        return ([prefix], cont) if prefix != cont[0] else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    prefix_text = tokenizer.decode(prefix) if prefix is not None else ""

    def encode(text: str) -> list[int]:
        # lm-eval's tok_encode: no special tokens when the text already starts with the prefix token.
        special = not (prefix_text and text.startswith(prefix_text))
        return list(tokenizer.encode(text, add_special_tokens=special))

    whole = encode(context + continuation)
    ctx = encode(context)
    return ctx, whole[len(ctx) :]


def cut_at_stop(text: str, stop: list[str]) -> str:
    """`text` up to its first stop string, as OpenAI-compatible servers return it (every
    engine cuts the same way, so a stop means the same thing on every backend)."""
    positions = [text.find(s) for s in stop if s]
    positions = [p for p in positions if p >= 0]
    return text[: min(positions)] if positions else text


def cut_answer_at_stop(text: str, stop: list[str], tags: ThinkTags | None, *, opened: bool = False) -> str:
    """`cut_at_stop` on the answer alone: a stop string inside the thinking (gsm8k's
    `Question:` in a thought) does not end the turn, and an open thought is never cut."""
    start = answer_start(text, tags, opened=opened)
    if start is None:
        return text
    return text[:start] + cut_at_stop(text[start:], stop)


class Engine(Protocol):
    """Every backend implements this. `make_engine` also gives each engine `think_tags` (how
    the model's thinking is delimited; see thinking.tags_for). An engine with `chains = True`
    (hf, vllm) also takes `generate(requests, then=fn)`: `fn(index, completion)` returns the
    request's follow-up (run at once under the same index, its completion yielded instead) or
    None; engine.phases chains a thinking model's phases with it."""

    name: str

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        """Yield (index into requests, completion) as each request finishes."""
        ...

    def close(self) -> None:
        """Release resources (threads, sessions, models)."""
        ...


class LoglikEngine(Protocol):
    """A backend that can score continuations (hf, vllm, and endpoints with prompt logprobs)."""

    name: str

    def loglikelihood(self, requests: list[LoglikRequest]) -> Iterator[tuple[int, Loglik]]:
        """Yield (index into requests, Loglik) as each is scored, in any order."""
        ...
