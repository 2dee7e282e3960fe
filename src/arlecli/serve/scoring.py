"""Per-token logprobs with top-N alternatives, for a served request: its echoed prompt (lm-eval's
loglikelihood requests) and the top-N alternatives of generated tokens (`top_logprobs`,
completions `logprobs=N`).

The engine protocol reports only the sampled token's logprob, so these come from one scoring
pass over the sequence (prompt + completion) on the engine's own model, as its `loglikelihood`
scores continuations (engine/hf.py `_score_batch`, engine/vllm.py's prompt logprobs):

    hf     one forward pass of the engine's model (its packed kernels); each position's
           distribution is the one the token was drawn from: temperature-scaled and nucleus-
           renormalised for sampled tokens, raw for greedy ones and for prompt tokens
    vllm   vLLM's prompt logprobs (`prompt_logprobs=N`): raw logprobs, so alternatives of a
           token sampled at temperature > 0 are refused (400) rather than given from another
           distribution

`scorer_for(engine)` is None for an engine that cannot score (a remote endpoint): the app
answers 400 naming the parameter. The scoring runs in the batcher's thread (Batcher.call),
between generate calls, since the engines are not thread-safe.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

# (token id, logprob) pairs, best first.
Alternatives = list[tuple[int, float]]


@dataclass
class Scored:
    """One sequence scored: for each position p >= 1, the logprob of token p and the top-N
    alternatives there (position 0, the first prompt token, has none: nothing predicts it);
    `next_token` is the greedy pick after the last position (what echo with max_tokens 1 and
    temperature 0 generates), with its logprob and alternatives."""

    logprobs: list[float]
    top: list[Alternatives]
    next_token: int
    next_logprob: float
    next_top: Alternatives


@dataclass
class ScoreJob:
    """Score `ids`; positions from `sampled_from` on were sampled at `temperature`/`top_p`
    (their distributions are scaled as the engine sampled them); `top_n` alternatives each."""

    ids: list[int]
    top_n: int
    sampled_from: int
    temperature: float = 0.0
    top_p: float = 1.0


Scorer = Callable[[list[ScoreJob]], list[Scored]]


def scorer_for(engine: Any) -> Scorer | None:
    """How to score sequences on `engine`, or None where it cannot (no model in this process)."""
    if getattr(engine, "model", None) is not None and hasattr(engine, "_cache_kw"):
        return lambda jobs: [_score_hf(engine, job) for job in jobs]
    if getattr(engine, "llm", None) is not None and getattr(engine, "_replicas", None) is None:
        return lambda jobs: _score_vllm(engine, jobs)
    return None


def raw_only(engine: Any) -> bool:
    """Whether `engine`'s scores are raw logprobs only (vllm): alternatives of a sampled token
    (temperature > 0) cannot be given from the distribution it was drawn from."""
    return getattr(engine, "model", None) is None or not hasattr(engine, "_cache_kw")


def _score_hf(engine: Any, job: ScoreJob) -> Scored:
    torch = engine.torch
    with torch.inference_mode():
        ids = torch.tensor([job.ids], device=engine.device)
        logits = engine.forward(ids)[0].float()
        rows = torch.log_softmax(logits, dim=-1)
        if job.temperature > 0 and job.sampled_from < len(job.ids) + 1:
            # Positions predicting sampled tokens: the distribution the engine drew from (hf._pick).
            start = max(job.sampled_from - 1, 0)
            rows[start:] = _processed(torch, logits[start:], job.temperature, job.top_p)
        n = max(job.top_n, 1)
        best_lp, best_id = rows.topk(min(n, rows.shape[-1]), dim=-1)
        target = torch.tensor(job.ids[1:], device=rows.device)
        chosen = rows[:-1].gather(1, target.view(-1, 1)).squeeze(1).tolist() if len(job.ids) > 1 else []
        best_lp, best_id = best_lp.tolist(), best_id.tolist()
    top = [list(zip(best_id[p], best_lp[p]))[: job.top_n] for p in range(len(job.ids))]
    return Scored(chosen, top[:-1], best_id[-1][0], best_lp[-1][0], top[-1])


def _processed(torch: Any, logits: Any, temperature: float, top_p: float) -> Any:
    """Log-probabilities after temperature and nucleus (top-p) cutting, as hf._pick samples."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cut = sorted_p.cumsum(-1) - sorted_p > top_p
        sorted_p[cut] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return torch.log(probs)


def _score_vllm(engine: Any, jobs: list[ScoreJob]) -> list[Scored]:
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    out: list[Scored] = []
    lock = getattr(engine, "_lock", None) or contextlib.nullcontext()
    for job in jobs:
        n = max(job.top_n, 1)
        # One greedy token is the least vLLM generates; its logprobs are the next-token ones.
        params = VSamplingParams(n=1, temperature=0.0, max_tokens=1, prompt_logprobs=n, logprobs=n, detokenize=False)
        with lock:
            [res] = engine.llm.generate(
                [TokensPrompt(prompt_token_ids=job.ids)],
                params,
                use_tqdm=False,
                lora_request=getattr(engine, "_lora", None),
            )
        steps = res.prompt_logprobs or []
        chosen, top = [], []
        for p in range(1, len(job.ids)):
            step = steps[p] or {}
            chosen.append(float(step[job.ids[p]].logprob))
            top.append(_ranked(step, job.top_n))
        gen = res.outputs[0]
        last = (gen.logprobs or [{}])[0]
        tok = int(gen.token_ids[0])
        out.append(Scored(chosen, top, tok, float(last[tok].logprob), _ranked(last, job.top_n)))
    return out


def _ranked(step: dict[int, Any], n: int) -> Alternatives:
    pairs = sorted(
        ((int(t), float(lp.logprob)) for t, lp in step.items() if lp.rank is not None and lp.rank <= n),
        key=lambda x: -x[1],
    )
    return pairs[:n]
