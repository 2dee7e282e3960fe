"""Two hf engines, or two forwards, that must compute the same thing (the fused forward and the
model's own, the native load and transformers' classes): the same inputs through both, compared
exactly."""

from __future__ import annotations

from typing import Any

from helpers.turns import register_replying_env

from arlecli.catalog import load_card
from arlecli.engine.base import GenerationRequest, LoglikRequest, SamplingParams
from arlecli.envs import make_env
from arlecli.envs.episodes import Job, run_episodes
from arlecli.types import Task

PROMPTS = ["a b c a b c a b c", "def f(x): return x\ndef f(x):", "one two three " * 4, "hello", "1 2 3 4 1 2 3"]


def assert_same_logits(forward: Any, model: Any, config: Any, lengths: list[int], scored_width: int) -> None:
    """Left-padded prefill of rows of `lengths` keeping the last position, five decode steps, then
    lm-eval-style scoring of `scored_width` ids (right-padded, no mask, no cache), the same unpadded
    with a mask of ones (SDPA's causal flag, no mask made), and a shared prefix's cache repeated per
    row: every logit of `forward` (an engine.fused forward, its caches made from `config`)
    `torch.equal` to `model`'s own forward, and the KV caches alike."""
    import torch
    from transformers import DynamicCache

    def theirs(ids: Any, mask: Any = None, positions: Any = None, cache: Any = None, keep: int = 0) -> Any:
        kw = {"past_key_values": cache, "use_cache": True} if cache is not None else {}
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep, **kw).logits

    vocab, rows = model.config.vocab_size, len(lengths)
    gen = torch.Generator().manual_seed(1)
    width = max(lengths)
    ids = torch.randint(0, vocab, (rows, width), generator=gen)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, width - n :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        caches = [DynamicCache(config=config), DynamicCache(config=model.config)]
        outs = [f(ids, mask, positions, c, keep=1) for f, c in zip((forward, theirs), caches)]
        assert outs[0].shape == (rows, 1, vocab) and torch.equal(outs[0], outs[1])
        step, pos = outs[0][:, -1].argmax(-1), positions[:, -1:] + 1
        for _ in range(5):
            mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
            outs = [f(step.view(-1, 1), mask, pos, c) for f, c in zip((forward, theirs), caches)]
            assert torch.equal(outs[0], outs[1])
            step, pos = outs[0][:, -1].argmax(-1), pos + 1
        for mine, yours in zip(caches[0].layers, caches[1].layers, strict=True):
            assert torch.equal(mine.keys, yours.keys) and torch.equal(mine.values, yours.values)

        scored = torch.randint(0, vocab, (4, scored_width), generator=gen)
        assert torch.equal(forward(scored), theirs(scored))
        unpadded = [
            f(scored, torch.ones_like(scored), None, DynamicCache(config=c))
            for f, c in ((forward, config), (theirs, model.config))
        ]
        assert torch.equal(unpadded[0], unpadded[1])
        shared = []
        for f, c in ((forward, config), (theirs, model.config)):
            cache = DynamicCache(config=c)
            f(scored[:1, :4], cache=cache, keep=1)
            cache.batch_repeat_interleave(4)
            shared.append(f(scored[:, 4:], cache=cache))
        assert torch.equal(shared[0], shared[1])


def assert_same_generations_and_logliks(a_engine: Any, b_engine: Any) -> None:
    """Greedy, seeded and logprob rows with stop strings and budgets, chat prompts, and lm-eval's
    loglikelihoods: every id, text, finish reason and logprob equal on both engines. At batch size
    1 the greedy rows run prompt lookup's guesses, and `a_engine` must have verified some."""
    free = dict(b_engine.generate([GenerationRequest(prompt=p, params=SamplingParams(max_tokens=30)) for p in PROMPTS]))
    reqs = []
    for i, p in enumerate(PROMPTS):
        text = free[i].text
        stop = [text[len(text) // 2 : len(text) // 2 + 3]] if len(text) > 8 else []
        for j, temperature in enumerate((0.0, 0.8, 1.2)):
            cut = stop if (i + j) % 2 else []  # greedy rows without one run on and take lookup's guesses
            params = SamplingParams(
                max_tokens=(30, 9, 15)[j], temperature=temperature, seed=i, stop=cut, logprobs=j == 2
            )
            reqs.append(GenerationRequest(prompt=p, params=params))
        chat = [{"role": "user", "content": p}]
        reqs.append(GenerationRequest(messages=chat, params=SamplingParams(max_tokens=12, temperature=0.7, seed=i)))
    a, b = dict(a_engine.generate(reqs)), dict(b_engine.generate(reqs))
    assert len(a) == len(b) == len(reqs)
    for i in range(len(reqs)):
        mine = (a[i].prompt_token_ids, a[i].token_ids, a[i].text, a[i].finish_reason, a[i].logprobs)
        theirs = (b[i].prompt_token_ids, b[i].token_ids, b[i].text, b[i].finish_reason, b[i].logprobs)
        assert mine == theirs, i
    assert any(c.finish_reason == "stop" for c in a.values())
    if a_engine.batch_size == 1:
        assert a_engine.lookup.forwards > 0  # guesses were verified through `a_engine`'s forward
    scoring = [LoglikRequest(context=p, continuation=" yes") for p in PROMPTS] + [
        LoglikRequest(context="Question: pick", continuation=c) for c in (" one", " two", " three")
    ]
    assert dict(a_engine.loglikelihood(scoring)) == dict(b_engine.loglikelihood(scoring))


def assert_same_episodes(a_engine: Any, b_engine: Any, env_name: str) -> None:
    """Seeded 4-turn episodes of the math_tool card, three at a time, through
    envs.episodes.run_episodes (what eval and every trainer run), the KV kept across turns."""
    register_replying_env(env_name, lambda completion: f"You said: {completion[:40]} Again.")
    card = load_card("math_tool")
    card.env, card.env_params = env_name, {}

    def episodes(engine: Any) -> dict[int, Any]:
        tasks = [Task(str(i), f"What is {i} plus {7 * i}?", "") for i in range(3)]
        jobs = [
            Job(t, make_env(card, t), SamplingParams(max_tokens=12 + 4 * i, temperature=0.9 * (i % 2), seed=i))
            for i, t in enumerate(tasks)
        ]
        return dict(run_episodes(engine, jobs))

    a, b = episodes(a_engine), episodes(b_engine)
    for i in range(3):
        assert len(a[i].turns) == 4
        assert [(t.prompt_token_ids, t.token_ids) for t in a[i].turns] == [
            (t.prompt_token_ids, t.token_ids) for t in b[i].turns
        ]
    assert a_engine.prefix_cache.hits >= 3 * 3
