"""An engine over TRL's vLLM server (`trl vllm-serve`): multi-node rollouts for GRPO and RLOO.

`arle train --vllm-server URL` runs TRL's server mode, the path TRL documents for multi-node
training: the trainer processes (under `accelerate launch`) push the policy's weights to a
vLLM server on another node over NCCL before each rollout, and generation happens there.
arle keeps its own rollouts on top: this engine turns arle's GenerationRequests into
`VLLMClient.generate` calls (prompt token ids from `engine.tokens.encode_request`, as the
in-process engines; the card's stop strings, the budget and each sample's seed as vLLM
sampling parameters), so the episodes are produced by the same collector as `arle eval`'s.

Requests go one per call (each carries its own seed), a bounded number at a time; the
server batches what arrives together.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Iterator

from arlecli.engine.base import Completion, GenerationRequest, cut_at_stop
from arlecli.engine.tokens import encode_request


class TRLServerEngine:
    """Generation through a TRL `VLLMClient` (weights are synced by TRL's trainer)."""

    name = "vllm-server"

    def __init__(
        self, client: Any, tokenizer: Any, *, concurrency: int = 32, chat_template_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.concurrency = max(1, concurrency)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids = {eos} if isinstance(eos, int) else set()

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        """Yield (index, completion) as each request's reply arrives."""
        if not requests:
            return
        with ThreadPoolExecutor(
            max_workers=min(self.concurrency, len(requests)), thread_name_prefix="arle-vllm-client"
        ) as pool:
            futures = {pool.submit(self._one, r): i for i, r in enumerate(requests)}
            for future in as_completed(futures):
                yield futures[future], future.result()

    def encode(self, request: GenerationRequest) -> list[int]:
        """Prompt token ids, as the in-process engines compute them."""
        return encode_request(self.tokenizer, request, self.chat_template_kwargs)

    def _one(self, request: GenerationRequest) -> Completion:
        p = request.params
        prompt_ids = self.encode(request)
        extra: dict[str, Any] = {}
        if p.stop:
            extra["stop"] = list(p.stop)
        if p.stop_token_ids:
            extra["stop_token_ids"] = list(p.stop_token_ids)
        if p.seed is not None and p.temperature > 0:
            extra["seed"] = p.seed
        out = self.client.generate(
            prompts=[prompt_ids],
            n=1,
            temperature=p.temperature,
            top_p=p.top_p,
            max_tokens=p.max_tokens,
            logprobs=0 if p.logprobs else None,
            generation_kwargs=extra,
        )
        ids = list(out["completion_ids"][0])
        logprobs = None
        if p.logprobs and out.get("logprobs"):
            logprobs = [float(step[0]) for step in out["logprobs"][0]]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = cut_at_stop(text, p.stop)
        ended = (ids and ids[-1] in self.eos_ids) or cut != text
        finish = "stop" if ended or len(ids) < p.max_tokens else "length"
        return Completion(text=cut, token_ids=ids, prompt_token_ids=prompt_ids, logprobs=logprobs, finish_reason=finish)

    def close(self) -> None:
        """Nothing to release: the server belongs to the run's operator."""
