"""The growing KV cache (engine.kv_buffer): it holds exactly what transformers' DynamicLayer holds
through updates, crops, row selections and a replaced tensor, attention over its views gives the
bits of a contiguous cache, and the engine's tokens are the same with it as with DynamicCache."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest

from helpers.turns import register_replying_env

from arlecli.catalog import load_card
from arlecli.engine import kv_buffer
from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.hf import HFEngine
from arlecli.engine.kv_buffer import HEADROOM, GrowingLayer, fill_gaps
from arlecli.envs import make_env
from arlecli.envs.episodes import Job, run_episodes
from arlecli.types import Task


def _states(gen: Any, batch: int, width: int) -> tuple[Any, Any]:
    import torch

    return torch.randn(batch, 2, width, 8, generator=gen), torch.randn(batch, 2, width, 8, generator=gen)


def test_it_holds_what_a_dynamic_layer_holds_through_every_change():
    """Prefill, single columns past the first buffer's room (a regrowth), a crop of a verified
    guess's tail, a row selection (a finished row leaving) and keys replaced from outside (the
    engine's merge of two caches): after each, the same keys and values as DynamicLayer's."""
    import torch
    from transformers.cache_utils import DynamicLayer

    gen = torch.Generator().manual_seed(0)
    mine, theirs = GrowingLayer(), DynamicLayer()

    def both(k: Any, v: Any) -> None:
        got, want = mine.update(k, v), theirs.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    both(*_states(gen, 3, 10))
    first = mine._buffers
    for _ in range(HEADROOM + 5):
        both(*_states(gen, 3, 1))
    assert mine._buffers is not first  # it grew once the room ran out
    assert mine.keys.data_ptr() == mine._buffers[0].data_ptr()  # and writes in place again
    both(*_states(gen, 3, 6))
    mine.crop(-4), theirs.crop(-4)
    both(*_states(gen, 3, 1))
    rows = torch.tensor([0, 2])
    mine.batch_select_indices(rows), theirs.batch_select_indices(rows)
    both(*_states(gen, 2, 1))
    extra = _states(gen, 2, mine.get_seq_length())
    mine.keys, mine.values = torch.cat([mine.keys, extra[0]]), torch.cat([mine.values, extra[1]])
    theirs.keys, theirs.values = torch.cat([theirs.keys, extra[0]]), torch.cat([theirs.values, extra[1]])
    both(*_states(gen, 4, 1))
    assert mine.get_seq_length() == theirs.get_seq_length()


def test_rows_leaving_are_replaced_from_the_tail_and_only_those_rows_move():
    """fill_gaps keeps rows in place where it can; a selection in that order copies the moved rows
    alone (the buffer stays the same memory) and holds what DynamicLayer's full selection holds."""
    import torch
    from transformers.cache_utils import DynamicLayer

    assert fill_gaps([0, 1, 2], 3) == [0, 1, 2]
    assert fill_gaps([0, 2, 3, 5], 6) == [0, 5, 2, 3]
    assert fill_gaps([4, 5], 6) == [5, 4]
    assert fill_gaps([], 4) == []
    gen = torch.Generator().manual_seed(3)
    mine, theirs = GrowingLayer(), DynamicLayer()
    for layer in (mine, theirs):
        layer.update(*_states(torch.Generator().manual_seed(4), 6, 9))
    buffer = mine._buffers[0]
    order = torch.tensor(fill_gaps([0, 2, 3, 5], 6))
    mine.batch_select_indices(order), theirs.batch_select_indices(order)
    assert mine._buffers[0].data_ptr() == buffer.data_ptr()  # moved in place
    assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    step = _states(gen, 4, 1)
    assert all(torch.equal(a, b) for a, b in zip(mine.update(*step), theirs.update(*step)))
    shuffled = torch.tensor([3, 1, 0])  # not fill_gaps' order: a whole selection, still the same rows
    mine.batch_select_indices(shuffled), theirs.batch_select_indices(shuffled)
    assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)


def test_a_kept_view_is_not_changed_by_later_writes():
    """What update returned stays what it was when the buffer takes more columns or regrows."""
    import torch

    gen = torch.Generator().manual_seed(1)
    layer = GrowingLayer()
    keys, _ = layer.update(*_states(gen, 2, 5))
    before = keys.clone()
    for _ in range(HEADROOM + 3):
        layer.update(*_states(gen, 2, 1))
    assert torch.equal(keys, before)


@pytest.mark.parametrize(("batch", "length", "masked"), [(1, 40, False), (4, 300, True)])
def test_attention_over_the_buffer_views_has_the_bits_of_a_contiguous_cache(batch, length, masked):
    import torch

    gen = torch.Generator().manual_seed(2)
    layer = GrowingLayer()
    k, v = torch.randn(batch, 3, length, 64, generator=gen), torch.randn(batch, 3, length, 64, generator=gen)
    keys, values = layer.update(k[:, :, :-1], v[:, :, :-1])
    keys, values = layer.update(k[:, :, -1:], v[:, :, -1:])
    assert not keys.is_contiguous()  # a view with room after it
    q = torch.randn(batch, 9, 1, 64, generator=gen)
    mask = None
    if masked:
        mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
        mask[0, ..., :7] = False
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert torch.equal(
        sdpa(q, keys, values, attn_mask=mask, enable_gqa=True), sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
    )


@contextlib.contextmanager
def _dynamic(monkeypatch: Any) -> Iterator[None]:
    """While open, the engine grows transformers' own DynamicCache."""
    from transformers import DynamicCache

    with monkeypatch.context() as m:
        m.setattr(kv_buffer, "new_cache", lambda config: DynamicCache(config=config))
        yield


def test_engine_tokens_are_the_same_with_a_dynamic_cache(tiny_model, monkeypatch):
    """Rows of different lengths finishing at different steps (selections, merges of newly
    admitted rows), greedy with prompt lookup (crops), seeded and logprob rows, stop strings:
    the same tokens and logprobs whichever cache the engine grows."""
    prompts = ["a b c a b c a b c", "def f(x): return x\n" * 5, "one two three " * 9, "hi", "1 2 3 4 1 2 3"]
    reqs = [
        GenerationRequest(
            prompt=p,
            params=SamplingParams(
                max_tokens=8 + 11 * (i % 4),
                temperature=0.8 * (i % 3 == 1),
                seed=i,
                logprobs=i % 3 == 2,
                stop=[" a", "x"] if i % 2 else [],
            ),
        )
        for i, p in enumerate(prompts * 3)
    ]

    def run(batch_size: int) -> dict[int, Any]:
        engine = HFEngine(str(tiny_model), batch_size=batch_size, prefix_cache_tokens=0)
        return {i: (c.token_ids, c.logprobs) for i, c in engine.generate(reqs)}

    for batch_size in (1, 4):
        grown = run(batch_size)
        with _dynamic(monkeypatch):
            assert run(batch_size) == grown


def test_multi_turn_episodes_are_the_same_with_a_dynamic_cache(tiny_model, monkeypatch):
    """Through envs.episodes.run_episodes: 4-turn episodes of the math_tool card, greedy and
    seeded, three at a time with the KV kept across turns (prefix-cache entries cut from the
    buffers, refilled into new ones)."""
    register_replying_env("test_kv_buffer_turns", lambda completion: f"You said: {completion[:30]} More.")
    card = load_card("math_tool")
    card.env, card.env_params = "test_kv_buffer_turns", {}

    def episodes() -> dict[int, Any]:
        engine = HFEngine(str(tiny_model), batch_size=3)
        tasks = [Task(str(i), f"What is {i} times {3 * i}?", "") for i in range(4)]
        jobs = [
            Job(t, make_env(card, t), SamplingParams(max_tokens=10 + 5 * i, temperature=0.7 * (i % 2), seed=i))
            for i, t in enumerate(tasks)
        ]
        done = dict(run_episodes(engine, jobs))
        assert engine.prefix_cache.hits >= 4 * 3
        return {i: [(t.prompt_token_ids, t.token_ids) for t in e.turns] for i, e in done.items()}

    grown = episodes()
    assert all(len(turns) == 4 for turns in grown.values())
    with _dynamic(monkeypatch):
        assert episodes() == grown
