"""Budget forcing and answer-only stops for reasoning models, once, over any in-process engine.

A model that thinks writes its thought, the end tag, then its answer. Two settings need to
know where the thought ends, and both are done here for every engine that continues exact
token ids (`GenerationRequest.prompt_token_ids`: hf, vllm, TRL's vLLM server):

- `max_thinking_tokens` (budget forcing, as s1 and vLLM's `thinking_token_budget` do): when
  the thought reaches that many tokens without its end tag, arle writes the end tag itself
  (`FORCED_CLOSE`; its positions go in `Completion.forced` with logprob 0.0, so training keeps
  them out of the loss) and the model answers within `max_tokens` of its own;
- a card's stop strings cut the answer only: inside a thought generation stops only at the end
  tag, so gsm8k's `Question:` written while thinking does not end the turn.

A turn runs in phases: the thinking phase (stops at the end tag, up to the thinking budget) and
the answer phase (the card's stops, the answer budget). An engine that chains (`chains`: hf,
vllm) runs a request's next phase the moment its last one ends, as a follow-up (`generate(...,
then=...)`: hf keeps the row and its KV cache in the batch, vLLM's prefix cache keeps the
shared prefix), so phases cost neither a second prefill nor a batch drained at a phase
boundary; on any other engine each phase is one `generate` call batched across the requests
still going. Where the chat template opens the thought (R1: the prompt
ends with `<think>`) the thinking phase starts at once. Where the model writes the start tag
itself (Qwen3), the first phase stops at the card's stops too: one that stops inside a thought
the model opened goes on thinking (the thought is detected as it is generated), and a model
that did not think has answered in that phase, as it would have without this module.

Without `max_thinking_tokens` a turn keeps one budget, `max_tokens`, for thought and answer
together (as before). Seeds: the first phase samples with the request's seed, a later one with
`phase_seed(seed, k)`, so a sample stays a function of its own seed. The merged Completion
holds every phase's ids and logprobs end to end, the text as generated (the answer cut at its
stop), and the last phase's finish reason.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, cast

from arlecli.engine.base import Completion, Engine, GenerationRequest, SamplingParams
from arlecli.thinking import ThinkTags, answer_start, prompt_opens, tags_for, thinks

FORCED_CLOSE = "\n{end}"  # what budget forcing writes; the model's own line breaks follow


def phase_seed(seed: int, phase: int) -> int:
    """The seed of phase `phase` (1, 2, ...) of a sample seeded `seed`."""
    digest = hashlib.sha256(f"{seed}:phase:{phase}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def phased(engine: Engine) -> Engine:
    """`engine` wrapped in a PhasedEngine when its model thinks and it continues exact token ids
    (it has a tokenizer); else `engine` itself (a plain model generates exactly as before)."""
    if isinstance(engine, PhasedEngine) or getattr(engine, "tokenizer", None) is None:
        return engine
    tags = tags_for(engine)
    if tags is None or not thinks(engine):
        return engine
    return PhasedEngine(engine, tags)


def needs_phases(params: SamplingParams) -> bool:
    """Whether a request needs phases: without stop strings or a thinking budget one phase is
    the same generation."""
    return bool(params.stop) or params.max_thinking_tokens is not None


class PhasedEngine:
    """An engine over `engine` (same tokenizer, name and other attributes) whose `generate`
    runs each request of a thinking model in phases (see the module docstring)."""

    def __init__(self, engine: Engine, tags: ThinkTags) -> None:
        # Any: an in-process engine, which has a tokenizer (phased checks it) and, when it chains,
        # takes generate(..., then=); the Engine protocol declares neither.
        self.engine: Any = engine
        self.tags = tags
        self.think_tags = tags
        self.thinks = True
        tokenizer = cast(Any, engine).tokenizer
        self.forced_ids = list(tokenizer.encode(FORCED_CLOSE.format(end=tags.end), add_special_tokens=False))
        # An end tag that is one token of its own (Qwen3's, R1's) stops a thought by its id: the
        # engine need not decode every step to look for it.
        end = list(tokenizer.encode(tags.end, add_special_tokens=False))
        self.end_id = end[0] if len(end) == 1 else None

    def __getattr__(self, name: str) -> Any:
        # Everything but generate is the engine's own (name, tokenizer, encode, loglikelihood ...).
        return getattr(self.engine, name)

    def encode(self, request: GenerationRequest) -> list[int]:
        """The request's prompt ids, as the engine encodes them."""
        encode = getattr(self.engine, "encode", None)
        if encode is not None:
            return list(encode(request))
        from arlecli.engine.tokens import encode_request

        return encode_request(self.engine.tokenizer, request, getattr(self.engine, "chat_template_kwargs", None))

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        """Yield (index, merged completion) as each request's last phase finishes."""
        tokenizer = self.engine.tokenizer
        turns: dict[int, _Turn] = {}
        turn: _Turn | None
        round_: list[tuple[int, GenerationRequest]] = []
        for i, request in enumerate(requests):
            if not needs_phases(request.params):
                round_.append((i, request))
                continue
            prompt_ids = self.encode(request)
            turn = _Turn(request, prompt_ids, prompt_opens(tokenizer, prompt_ids, self.tags), self)
            turns[i] = turn
            round_.append((i, turn.next_request()))
        if getattr(self.engine, "chains", False):
            yield from self._chained(round_, turns)
            return
        while round_:
            later: list[tuple[int, GenerationRequest]] = []
            for r, comp in self.engine.generate([request for _, request in round_]):
                i = round_[r][0]
                turn = turns.get(i)
                if turn is None:
                    yield i, comp
                elif turn.advance(comp):
                    later.append((i, turn.next_request()))
                else:
                    yield i, turn.completion()
            round_ = later

    def _chained(
        self, first: list[tuple[int, GenerationRequest]], turns: dict[int, _Turn]
    ) -> Iterator[tuple[int, Completion]]:
        """Every phase as a follow-up of the one before, in one `generate` call."""

        def then(i: int, comp: Completion) -> GenerationRequest | None:
            turn = turns.get(first[i][0])
            return turn.next_request() if turn is not None and turn.advance(comp) else None

        for r, comp in self.engine.generate([request for _, request in first], then=then):
            i = first[r][0]
            turn = turns.get(i)
            yield i, comp if turn is None else turn.completion()

    def close(self) -> None:
        """Close the engine underneath."""
        self.engine.close()


@dataclass
class _Turn:
    """One request across its phases: the ids generated so far and where the answer begins."""

    request: GenerationRequest
    prompt_ids: list[int]
    opened: bool  # the prompt ends with the start tag: the generation starts inside the thought
    owner: PhasedEngine
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)
    text: str = ""  # every phase's text but the last's, stop strings and forced tags included
    last_text: str = ""  # the last phase's text as the engine cut it
    answer_from: int | None = None  # index in `ids` where the answer begins; None while thinking
    inside: bool = False  # known to be inside a thought (its card stops are off)
    card_stops_on: bool = False  # whether the phase running now stops at the card's stops
    phase: int = 0
    latency_s: float = 0.0
    finish_reason: str = "stop"

    def __post_init__(self) -> None:
        self.inside = self.opened

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    def _thinking_left(self) -> int:
        p = self.params
        return (p.max_thinking_tokens if p.max_thinking_tokens is not None else p.max_tokens) - len(self.ids)

    def _answer_left(self) -> int:
        p = self.params
        if p.max_thinking_tokens is None:  # one budget for thought and answer together
            return p.max_tokens - len(self.ids)
        return p.max_tokens - (len(self.ids) - (self.answer_from or 0))

    def next_request(self) -> GenerationRequest:
        """The request of the next phase: the prompt and everything generated so far, as ids."""
        p = self.params
        self.card_stops_on = not self.inside
        end, end_id = self.owner.tags.end, self.owner.end_id
        end_stop = ([], [end_id]) if end_id is not None else ([end], [])  # (strings, token ids)
        if self.answer_from is not None:
            budget, stop, stop_ids = self._answer_left(), list(p.stop), list(p.stop_token_ids)
        elif self.inside:
            budget, (stop, stop_ids) = self._thinking_left(), end_stop
        else:  # not known to think yet: the card's stops apply unless a thought turns up
            budget = min(self._thinking_left(), self._answer_left())
            stop, stop_ids = [*p.stop, *end_stop[0]], [*p.stop_token_ids, *end_stop[1]]
        seed = p.seed if self.phase == 0 or p.seed is None else phase_seed(p.seed, self.phase)
        params = replace(p, max_tokens=budget, stop=stop, stop_token_ids=stop_ids, seed=seed, max_thinking_tokens=None)
        return GenerationRequest(
            messages=self.request.messages,
            prompt=self.request.prompt,
            params=params,
            tools=self.request.tools,
            prompt_token_ids=[*self.prompt_ids, *self.ids],
        )

    def advance(self, comp: Completion) -> bool:
        """Take one phase's completion in; True when another phase follows."""
        tokenizer = self.owner.engine.tokenizer
        new = list(comp.token_ids)
        self.phase += 1
        self.latency_s += comp.latency_s or 0.0
        self.finish_reason = comp.finish_reason
        self.last_text = comp.text
        if self.params.logprobs:
            self.logprobs += (
                list(comp.logprobs) if comp.logprobs and len(comp.logprobs) == len(new) else [0.0] * len(new)
            )
        written = tokenizer.decode(new, skip_special_tokens=True)  # stop strings included, unlike comp.text
        before = len(self.ids)
        self.ids += new
        if self.answer_from is not None:
            return False  # the answer phase is the last
        tags = self.owner.tags
        whole = self.text + written
        start = answer_start(whole, tags, opened=self.opened)
        if start is None:  # inside an open thought
            self.inside = True
            if comp.finish_reason != "length" and not self._stopped_at_card(written):
                return False  # the model ended its turn inside its thought: cut, no answer
            if self._thinking_left() > 0:
                self.text = whole  # a stop string inside the thought: think on
                return True
            if self.params.max_thinking_tokens is None:
                self.finish_reason = "length"  # the one budget is spent inside the thought
                return False
            self.text = whole
            self._force()
            return self._answer_left() > 0
        if start == 0:  # no thought: what was written is (the start of) the answer
            self.answer_from = 0
            if comp.finish_reason == "length" and self._answer_left() > 0:
                self.text = whole  # cut by the thinking budget, which did not apply: answer on
                return True
            return False
        # The thought closed in this phase: the answer follows.
        self.answer_from = before + len(new)
        self.text = whole
        self.last_text = ""
        if self._answer_left() <= 0:
            self.finish_reason = "length"
            return False
        return True

    def _stopped_at_card(self, written: str) -> bool:
        # A phase that ended inside the thought on "stop" hit one of the card's stops (think on),
        # if they were on, or the model ended its turn (EOS) there.
        return self.card_stops_on and any(s and s in written for s in self.params.stop)

    def _force(self) -> None:
        """Close the thought for the model (budget forcing)."""
        forced = self.owner.forced_ids
        self.forced += list(range(len(self.ids), len(self.ids) + len(forced)))
        self.ids += forced
        if self.params.logprobs:
            self.logprobs += [0.0] * len(forced)
        self.text += self.owner.engine.tokenizer.decode(forced, skip_special_tokens=True)
        self.last_text = ""
        self.answer_from = len(self.ids)

    def completion(self) -> Completion:
        """The turn's Completion, every phase merged."""
        return Completion(
            text=self.text + self.last_text,
            token_ids=list(self.ids),
            prompt_token_ids=list(self.prompt_ids),
            logprobs=list(self.logprobs) if self.params.logprobs else None,
            finish_reason=self.finish_reason,
            latency_s=self.latency_s,
            forced=list(self.forced),
        )
