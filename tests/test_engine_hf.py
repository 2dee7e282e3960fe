"""The hf engine on the tiny model: batching never changes a sample, stops and budgets hold."""

from __future__ import annotations

import pytest

from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.hf import HFEngine


@pytest.fixture(scope="module")
def engines(tiny_model):
    return HFEngine(str(tiny_model), batch_size=8), HFEngine(str(tiny_model), batch_size=1)


def _requests() -> list[GenerationRequest]:
    reqs = [GenerationRequest(messages=[{"role": "user", "content": "count " * i}],
                              params=SamplingParams(max_tokens=12, logprobs=True)) for i in range(1, 5)]
    reqs += [GenerationRequest(prompt="def add(a, b):" * i,
                               params=SamplingParams(max_tokens=12, temperature=0.9, seed=i, logprobs=True))
             for i in range(1, 5)]
    return reqs


def test_batched_equals_unbatched_greedy_and_seeded_sampling(engines):
    batched, single = engines
    a = dict(batched.generate(_requests()))
    b = dict(single.generate(_requests()))
    assert sorted(a) == list(range(8))
    for i in range(8):
        assert a[i].token_ids == b[i].token_ids
        assert a[i].logprobs == pytest.approx(b[i].logprobs, abs=1e-4)


def test_refilled_slots_give_the_same_samples(tiny_model, engines):
    """Rows of different lengths and budgets finish at different steps; the freed slots are
    refilled with waiting requests whose KV cache is merged into the running batch. Every
    sample (greedy and seeded) must still equal its batch-of-one run."""
    refilling = HFEngine(str(tiny_model), batch_size=4)
    reqs = [GenerationRequest(prompt="def f(x):" * (1 + i % 5),
                              params=SamplingParams(max_tokens=2 + (7 * i) % 13, temperature=0.8 * (i % 2),
                                                    seed=i, logprobs=bool(i % 3)))
            for i in range(14)]
    merged = dict(refilling.generate(reqs))
    alone = dict(engines[1].generate(reqs))
    assert sorted(merged) == list(range(14))
    for i in range(14):
        assert merged[i].token_ids == alone[i].token_ids, i
        assert (merged[i].logprobs is None) == (alone[i].logprobs is None)
        if merged[i].logprobs:
            assert merged[i].logprobs == pytest.approx(alone[i].logprobs, abs=1e-4)


def test_token_budget_ids_and_logprobs(engines):
    engine = engines[0]
    out = dict(engine.generate(_requests()))
    for c in out.values():
        assert 1 <= len(c.token_ids) <= 12
        assert len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0.0 for lp in c.logprobs)
        assert c.prompt_token_ids
    assert any(c.finish_reason == "length" for c in out.values())


def test_different_seeds_give_different_samples(engines):
    engine = engines[0]
    reqs = [GenerationRequest(prompt="hello", params=SamplingParams(max_tokens=16, temperature=1.5, seed=s))
            for s in range(6)]
    texts = {c.token_ids.__repr__() for _, c in engine.generate(reqs)}
    assert len(texts) > 1


def test_stop_string_cuts_text_and_ends_row(engines):
    engine = engines[0]
    greedy = dict(engine.generate([GenerationRequest(prompt="x", params=SamplingParams(max_tokens=10))]))[0]
    assert len(greedy.text) > 2
    stop = greedy.text[1:3]  # a stop string we know the greedy output contains
    cut = dict(engine.generate([GenerationRequest(prompt="x", params=SamplingParams(max_tokens=10, stop=[stop]))]))[0]
    assert cut.finish_reason == "stop"
    assert stop not in cut.text and greedy.text.startswith(cut.text)
    assert len(cut.token_ids) <= len(greedy.token_ids)


def test_eos_token_ends_generation(engines):
    engine = engines[0]
    eos = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine.eos_ids.add(engine.tokenizer("\n")["input_ids"][0])  # make a common token end the row
    try:
        out = dict(engine.generate([GenerationRequest(messages=[{"role": "user", "content": "hi"}],
                                                      params=SamplingParams(max_tokens=30))]))[0]
    finally:
        engine.eos_ids.discard(engine.tokenizer("\n")["input_ids"][0])
    assert eos in engine.eos_ids
    assert out.finish_reason == "stop" and len(out.token_ids) < 30
