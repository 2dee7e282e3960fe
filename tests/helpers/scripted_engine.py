"""Scripted engines: `ScriptedEngine` writes a fixed continuation token by token as a model would (for
tests of engine.phases); `Replies` answers each model turn of a conversation with a fixed text."""

from __future__ import annotations

from typing import Any, Iterator

from arlecli.engine.base import Completion, GenerationRequest, SamplingParams, cut_at_stop


class ScriptedEngine:
    """Continues every request with `script` (after what it generated already, counted from
    the end of `prompt`), token by token: ending at a stop string (its ids kept, its text cut),
    a stop token id, max_tokens, or the script's end (EOS), as the in-process engines do."""

    name = "scripted"

    def __init__(self, tokenizer: Any, prompt: str, script: str) -> None:
        self.tokenizer = tokenizer
        self.prompt_ids = list(tokenizer.encode(prompt, add_special_tokens=False))
        self.script_ids = [*tokenizer.encode(script, add_special_tokens=False), tokenizer.eos_token_id]
        self.calls: list[GenerationRequest] = []

    def encode(self, request: GenerationRequest) -> list[int]:
        return list(request.prompt_token_ids) if request.prompt_token_ids is not None else list(self.prompt_ids)

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        for i, request in enumerate(requests):
            self.calls.append(request)
            prompt = self.encode(request)
            yield (
                i,
                continue_script(
                    self.tokenizer, self.script_ids[len(prompt) - len(self.prompt_ids) :], request.params, prompt
                ),
            )

    def close(self) -> None:
        pass


def continue_script(
    tokenizer: Any, rest: list[int], params: SamplingParams, prompt: list[int], budget: bool = True
) -> Completion:
    """The Completion a model that goes on with `rest` (its ids, EOS last) writes under
    `params`: cut at a stop string (its ids kept, its text cut), a stop token id, EOS or, with
    `budget`, max_tokens."""
    out: list[int] = []
    why = "length"
    for tok in rest:
        out.append(tok)
        if tok == tokenizer.eos_token_id or tok in params.stop_token_ids:
            why = "stop"
            break
        if any(s in tokenizer.decode(out, skip_special_tokens=True) for s in params.stop):
            why = "stop"
            break
        if budget and len(out) >= params.max_tokens:
            break
    text = cut_at_stop(tokenizer.decode(out, skip_special_tokens=True), params.stop)
    return Completion(
        text=text,
        token_ids=out,
        prompt_token_ids=prompt,
        finish_reason=why,
        logprobs=[-1.0] * len(out) if params.logprobs else None,
    )


class Replies:
    """An engine that answers a conversation's k-th model turn with replies[k] (the last repeats)."""

    name = "replies"

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies

    def generate(self, requests):
        for i, request in enumerate(requests):
            turn = sum(m["role"] == "assistant" for m in request.messages or [])
            yield i, Completion(text=self.replies[min(turn, len(self.replies) - 1)])

    def close(self) -> None:
        pass
