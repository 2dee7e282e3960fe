"""Prompt-lookup speculative decoding on the hf engine (engine.lookup): a lone greedy row's
tokens are exactly those of plain greedy decoding, with stop strings, budgets, chained
follow-ups, streaming and multi-turn episodes, and the guesses really are taken."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.perf import run_quick
from helpers.turns import register_replying_env

from arlecli.catalog import load_card
from arlecli.engine.base import Completion, GenerationRequest, SamplingParams
from arlecli.engine.hf import HFEngine
from arlecli.engine.lookup import draft, next_guess_len
from arlecli.envs import make_env
from arlecli.envs.episodes import Job, run_episodes
from arlecli.types import Task


def test_draft_copies_what_followed_the_latest_occurrence_of_the_longest_tail():
    ids = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert draft(ids, 4) == [7, 8, 5, 2]  # the 2-gram (2, 3) last seen before 7 8 ...
    assert draft([5, 1, 2, 3, 4, 6, 1, 2, 3, 8, 0, 1, 2, 3], 2) == [8, 0]  # latest of two 3-gram matches
    assert draft([4, 1, 2, 7, 7, 9, 1, 2], 9) == [7, 7, 9, 1, 2]  # no longer than what follows
    assert draft([1, 2, 3, 4], 4) == [] and draft([3], 4) == [] and draft([], 4) == []
    assert draft([6, 6, 6, 6], 3) == [6]  # an occurrence overlapping the tail still has an id after it
    assert draft(ids, 0) == []
    assert draft([1, 2, 5, 1, 2], 3, min_ngram=3) == []  # 2-grams refused when asked


def test_a_guess_grows_while_kept_whole_and_shrinks_to_what_was_kept():
    assert next_guess_len(accepted=4, guessed=4) == 8
    assert next_guess_len(accepted=2, guessed=8) == 3
    assert next_guess_len(accepted=0, guessed=3) == 1


@pytest.mark.parametrize("padding", [0, 5])
def test_a_verify_forward_gives_each_position_the_bits_of_a_decode_step(tiny_model, padding):
    """The logits of a guess fed in one forward (rowwise attention on) equal, bit for bit, those
    of single decode steps over the same ids, left-padded or not: why the tokens are greedy's.
    Through the engine's forward (its fused projections: engine.fused)."""
    import torch
    from transformers import DynamicCache

    from arlecli.engine.hf import ROWWISE_ATTENTION

    engine = HFEngine(str(tiny_model), prefix_cache_tokens=0)
    assert engine._lookup_exact
    model, k = engine.model, 6
    assert engine._fused is not None
    ids = torch.tensor([engine.tokenizer("a b c a b c a b c d e f", add_special_tokens=False)["input_ids"]])
    n = ids.shape[1]
    start = torch.cat([torch.zeros(1, padding, dtype=torch.long), ids[:, : n - k]], 1)
    start_mask = torch.cat([torch.zeros(1, padding, dtype=torch.long), torch.ones(1, n - k, dtype=torch.long)], 1)

    def prefilled() -> Any:
        cache = DynamicCache(config=model.config)
        positions = (start_mask.cumsum(-1) - 1).clamp(min=0)
        engine.forward(start, start_mask, positions, cache)
        return cache

    with torch.inference_mode():
        cache, steps = prefilled(), []
        for j in range(k):
            mask = torch.cat([start_mask, torch.ones(1, j + 1, dtype=torch.long)], 1)
            position = torch.tensor([[n - k + j]])
            steps.append(engine.forward(ids[:, n - k + j :][:, :1], mask, position, cache)[0, -1])
        cache, token = prefilled(), ROWWISE_ATTENTION.set(True)
        try:
            logits = engine.forward(
                ids[:, n - k :],
                torch.cat([start_mask, torch.ones(1, k, dtype=torch.long)], 1),
                torch.arange(n - k, n).view(1, -1),
                cache,
            )
        finally:
            ROWWISE_ATTENTION.reset(token)
    for j in range(k):
        assert torch.equal(logits[0, j], steps[j]), j


def _engines(tiny_model: Any, batch_size: int = 1) -> tuple[HFEngine, HFEngine]:
    return (
        HFEngine(str(tiny_model), batch_size=batch_size, prefix_cache_tokens=0),
        HFEngine(str(tiny_model), batch_size=batch_size, prefix_cache_tokens=0, draft_tokens=0),
    )


def _prompts() -> list[str]:
    # Repetitive prompts (a random model copies them readily) and plain ones.
    return ["a b c a b c a b c", "def f(x): return x\ndef f(x):", "one two three " * 4, "hello", "1 2 3 4 1 2 3"]


def test_greedy_tokens_equal_plain_decoding_and_the_guesses_are_taken(tiny_model):
    looking, plain = _engines(tiny_model)
    reqs = [GenerationRequest(prompt=p, params=SamplingParams(max_tokens=24 + 7 * i)) for i, p in enumerate(_prompts())]
    reqs += [
        GenerationRequest(
            messages=[{"role": "user", "content": p}], params=SamplingParams(max_tokens=40, logprobs=True)
        )
        for p in _prompts()
    ]
    a, b = dict(looking.generate(reqs)), dict(plain.generate(reqs))
    for i in range(len(reqs)):
        assert a[i].token_ids == b[i].token_ids, i
        assert (a[i].text, a[i].finish_reason) == (b[i].text, b[i].finish_reason)
        assert a[i].logprobs == b[i].logprobs, i  # the same floats, where asked for (a verify forward's too)
    tally = looking.lookup
    assert tally.forwards > 0 and tally.tokens > tally.forwards  # steps were saved
    assert plain.lookup.forwards == 0
    wanting = [r for r in reqs if r.params.logprobs]
    saved = tally.tokens - tally.forwards
    list(looking.generate(wanting))
    assert tally.tokens - tally.forwards > saved  # rows that want logprobs take guesses too


def test_stop_strings_and_budgets_end_a_speculated_row_where_plain_decoding_does(tiny_model):
    looking, plain = _engines(tiny_model)
    free = dict(plain.generate([GenerationRequest(prompt=p, params=SamplingParams(max_tokens=40)) for p in _prompts()]))
    reqs = []
    for i, p in enumerate(_prompts()):
        text = free[i].text
        stop = [text[len(text) // 2 : len(text) // 2 + 3]] if len(text) > 8 else []
        reqs.append(GenerationRequest(prompt=p, params=SamplingParams(max_tokens=40, stop=stop)))
        for budget in (1, 2, 3, 9):  # cut inside a guess, at its first token and at the very start
            reqs.append(GenerationRequest(prompt=p, params=SamplingParams(max_tokens=budget)))
    a, b = dict(looking.generate(reqs)), dict(plain.generate(reqs))
    for i in range(len(reqs)):
        assert (a[i].token_ids, a[i].text, a[i].finish_reason) == (b[i].token_ids, b[i].text, b[i].finish_reason), i
        assert len(a[i].token_ids) <= reqs[i].params.max_tokens
    assert any(a[i].finish_reason == "stop" for i in range(len(reqs)))
    assert looking.lookup.tokens > looking.lookup.forwards


def test_a_batch_whose_last_row_runs_alone_gives_every_row_its_plain_tokens(tiny_model):
    """Rows of a batch of 3 finish at different steps; the last one left speculates. Seeded and
    logprob rows never do, and every row (greedy, seeded, with logprobs) is as without lookup."""
    looking, plain = _engines(tiny_model, batch_size=3)
    reqs = [
        GenerationRequest(
            prompt=p * (1 + i % 2),
            params=SamplingParams(
                max_tokens=30 + 25 * i if i % 3 == 0 else 6 + 3 * i,  # greedy rows run longest
                temperature=0.9 * (i % 3 == 1),
                seed=i,
                logprobs=i % 3 == 2,
            ),
        )
        for i, p in enumerate(_prompts() * 2)
    ]
    a, b = dict(looking.generate(reqs)), dict(plain.generate(reqs))
    for i in range(len(reqs)):
        assert a[i].token_ids == b[i].token_ids, i
        assert a[i].logprobs == b[i].logprobs, i
    assert looking.lookup.forwards > 0


def test_chained_follow_ups_and_streaming_see_every_token_in_order(tiny_model):
    """A follow-up that continues a row (what a thinking model's phases use) runs as without
    lookup, and `on_tokens` sees the ids grow one at a time, as a stream must."""
    looking, plain = _engines(tiny_model)
    tail = looking.tokenizer(" then again", add_special_tokens=False)["input_ids"]

    def then(index: int, done: Completion) -> GenerationRequest | None:
        if done.prompt_token_ids[-len(tail) :] == tail:  # one follow-up per request
            return None
        return GenerationRequest(
            prompt_token_ids=[*done.prompt_token_ids, *done.token_ids, *tail],
            params=SamplingParams(max_tokens=20),
        )

    def run(engine: HFEngine) -> tuple[dict[int, Completion], dict[int, list[int]]]:
        reqs = [GenerationRequest(prompt=p, params=SamplingParams(max_tokens=12)) for p in _prompts()]
        seen: dict[int, list[int]] = {}
        out = dict(engine.generate(reqs, then=then, on_tokens=lambda i, ids: seen.setdefault(i, []).append(len(ids))))
        return out, seen

    (a, seen_a), (b, seen_b) = run(looking), run(plain)
    assert {i: c.token_ids for i, c in a.items()} == {i: c.token_ids for i, c in b.items()}
    assert {i: c.prompt_token_ids for i, c in a.items()} == {i: c.prompt_token_ids for i, c in b.items()}
    assert seen_a == seen_b
    assert looking.lookup.tokens > looking.lookup.forwards


def test_multi_turn_episodes_are_the_same_with_and_without_lookup(tiny_model):
    """Through envs.episodes.run_episodes (what eval and every trainer run): greedy 4-turn
    episodes of the math_tool card one at a time, with the KV kept across turns."""
    register_replying_env("test_lookup_four_turns", lambda completion: f"You said: {completion[:40]} Check that again.")
    card = load_card("math_tool")
    card.env, card.env_params = "test_lookup_four_turns", {}

    def episodes(engine: HFEngine) -> dict[int, Any]:
        tasks = [Task(str(i), f"What is {i} plus {7 * i}? {i} plus {7 * i}.", "") for i in range(3)]
        jobs = [Job(t, make_env(card, t), SamplingParams(max_tokens=16 + 4 * i)) for i, t in enumerate(tasks)]
        return dict(run_episodes(engine, jobs))

    looking = HFEngine(str(tiny_model), batch_size=1)
    a, b = episodes(looking), episodes(HFEngine(str(tiny_model), batch_size=1, draft_tokens=0))
    for i in range(3):
        assert len(a[i].turns) == 4
        assert [(t.prompt_token_ids, t.token_ids) for t in a[i].turns] == [
            (t.prompt_token_ids, t.token_ids) for t in b[i].turns
        ]
    assert looking.lookup.tokens > looking.lookup.forwards
    assert looking.prefix_cache.hits >= 3 * 3  # a cut-back cache still serves the next turn


def test_the_environment_variable_sets_the_draft_length_and_zero_turns_lookup_off(tiny_model, monkeypatch):
    monkeypatch.setenv("ARLE_PROMPT_LOOKUP", "0")
    off = HFEngine(str(tiny_model))
    list(off.generate([GenerationRequest(prompt=_prompts()[0], params=SamplingParams(max_tokens=30))]))
    assert off.draft_tokens == 0 and off.lookup.forwards == 0
    monkeypatch.setenv("ARLE_PROMPT_LOOKUP", "3")
    assert HFEngine(str(tiny_model)).draft_tokens == 3


@pytest.mark.parametrize("value", ["many", "-1"])
def test_a_bad_draft_length_in_the_environment_is_one_line_exit_2(tiny_model, monkeypatch, value):
    from helpers.cli import arle, assert_one_line_error

    monkeypatch.setenv("ARLE_PROMPT_LOOKUP", value)
    proc = arle("eval", "one_digit_sums", "--model", str(tiny_model), "--limit", "1")
    assert_one_line_error(proc, "ARLE_PROMPT_LOOKUP", "0 turns prompt lookup off")


def test_the_perf_script_runs_both_sides_to_the_same_completions(tmp_path):
    """perf/prompt_lookup.py --quick (no timing is asserted): gsm8k 8-shot and humaneval evals
    are identical with lookup on and off, and at batch 1 the guesses saved decode steps."""
    table = run_quick("prompt_lookup", tmp_path / "lookup.json", "--rows", "2")["table"]
    assert {(r["workload"], r["batch"]) for r in table} == {
        (w, b) for w in ("gsm8k 8-shot", "humaneval") for b in (1, 4)
    }
    assert all(r["identical_completions"] for r in table)
    assert all(r["decode_steps_saved"] > 0 for r in table if r["batch"] == 1)
