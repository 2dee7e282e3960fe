"""The hf engine's KV reuse across calls (engine.prefix_cache): an agent episode's next turn
prefills only what the env appended, with the same tokens as without it, bounded memory, and
never a KV computed by weights that have changed since."""

from __future__ import annotations

from typing import Any

import pytest

from helpers.perf import run_quick
from helpers.turns import register_replying_env

from arlecli.catalog import load_card
from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.hf import HFEngine
from arlecli.engine.prefix_cache import PrefixCache
from arlecli.envs import make_env
from arlecli.envs.episodes import Job, run_episodes
from arlecli.types import Task

EPISODES = 6


def _appended(engine: HFEngine, turn: int, episode: int) -> list[int]:
    """What an env's reply adds to the conversation, a different length per turn and episode."""
    text = "<|im_end|>\n<|im_start|>user\n" + "check that " * (1 + (turn + episode) % 3) + "<|im_end|>\n"
    return engine.tokenizer(text + "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]


def _episodes(engine: HFEngine, temperature: float, turns: int = 4) -> list[list[Any]]:
    """`EPISODES` episodes of `turns` turns, one generate call per turn as the multi-turn driver
    makes them: turn k+1's prompt is turn k's prompt + its completion + appended ids."""
    prompts = [
        engine.encode(GenerationRequest(messages=[{"role": "user", "content": "count " * (1 + 2 * i)}]))
        for i in range(EPISODES)
    ]
    record: list[list[Any]] = []
    for turn in range(turns):
        reqs = [
            GenerationRequest(
                prompt_token_ids=p,
                params=SamplingParams(
                    max_tokens=3 + (5 * i + turn) % 9, temperature=temperature, seed=10 * i + turn, logprobs=True
                ),
            )
            for i, p in enumerate(prompts)
        ]
        out = dict(engine.generate(reqs))
        record.append([out[i] for i in range(EPISODES)])
        prompts = [p + out[i].token_ids + _appended(engine, turn, i) for i, p in enumerate(prompts)]
    return record


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_four_turn_episodes_give_the_same_tokens_with_and_without_kv_reuse(tiny_model, temperature):
    """Rows of different lengths, a batch smaller than the episodes (so rows are refilled and
    merged), greedy and seeded sampling: every turn's ids and logprobs as without the cache,
    and every later turn really is served from it."""
    reusing = HFEngine(str(tiny_model), batch_size=4)
    plain = HFEngine(str(tiny_model), batch_size=4, prefix_cache_tokens=0)
    with_cache, without = _episodes(reusing, temperature), _episodes(plain, temperature)
    for turn, (a, b) in enumerate(zip(with_cache, without)):
        for i in range(EPISODES):
            assert a[i].prompt_token_ids == b[i].prompt_token_ids
            assert a[i].token_ids == b[i].token_ids, (turn, i)
            assert a[i].logprobs == pytest.approx(b[i].logprobs, abs=1e-4)
    # Turns 2-4 of each episode reuse at least everything but the completion's last token and the appended ids.
    floor = sum(
        len(prev[i].prompt_token_ids) + len(prev[i].token_ids) - 1 for prev in with_cache[:-1] for i in range(EPISODES)
    )
    assert reusing.prefix_cache.reused_tokens >= floor
    assert plain.prefix_cache.reused_tokens == 0 and len(plain.prefix_cache) == 0


def test_a_prompt_that_leaves_a_kept_sequence_part_way_reuses_the_shared_part(tiny_model):
    engine = HFEngine(str(tiny_model), batch_size=2)
    plain = HFEngine(str(tiny_model), batch_size=2, prefix_cache_tokens=0)
    first = engine.encode(GenerationRequest(messages=[{"role": "user", "content": "count count count count"}]))
    params = SamplingParams(max_tokens=6, temperature=0.7, seed=3)
    [(_, done)] = engine.generate([GenerationRequest(prompt_token_ids=first, params=params)])
    kept = [*first, *done.token_ids[:-1]]
    # Shares the first half of the kept sequence, then says something else; and a shorter re-ask.
    other = kept[: len(kept) // 2] + _appended(engine, 0, 0)
    reqs = [GenerationRequest(prompt_token_ids=ids, params=params) for ids in (other, first)]
    reused_before = engine.prefix_cache.reused_tokens
    got, want = dict(engine.generate(reqs)), dict(plain.generate(reqs))
    assert [got[i].token_ids for i in range(2)] == [want[i].token_ids for i in range(2)]
    assert engine.prefix_cache.reused_tokens - reused_before >= len(kept) // 2 + len(first) - 1


def test_the_multi_turn_driver_gives_the_same_episodes_with_and_without_kv_reuse(tiny_model):
    """Through envs.episodes.run_episodes (what eval and every trainer run): 4-turn episodes
    of the math_tool card whose env always replies, seeded sampling."""
    register_replying_env("test_kv_four_turns", lambda completion: "Use the calculator and check that again.")
    card = load_card("math_tool")
    card.env, card.env_params = "test_kv_four_turns", {}

    def episodes(engine: HFEngine) -> dict[int, Any]:
        tasks = [Task(str(i), f"What is {i} plus {7 * i}?", "") for i in range(5)]
        jobs = [
            Job(t, make_env(card, t), SamplingParams(temperature=1.0, max_tokens=4 + i, seed=i, logprobs=True))
            for i, t in enumerate(tasks)
        ]
        return dict(run_episodes(engine, jobs))

    reusing = HFEngine(str(tiny_model), batch_size=3)
    a, b = episodes(reusing), episodes(HFEngine(str(tiny_model), batch_size=3, prefix_cache_tokens=0))
    assert sorted(a) == sorted(b) == list(range(5))
    for i in range(5):
        assert len(a[i].turns) == 4
        assert [(t.prompt_token_ids, t.token_ids) for t in a[i].turns] == [
            (t.prompt_token_ids, t.token_ids) for t in b[i].turns
        ]
    assert reusing.prefix_cache.hits >= 3 * 5  # every later turn found its episode's sequence


def test_the_cache_stays_within_its_cap_over_100_episodes(tiny_model):
    """100 two-turn episodes through a 600-token cache: after every store its own count of
    tokens is within the cap and equals what its entries hold (ids and KV columns)."""
    engine = HFEngine(str(tiny_model), batch_size=16, prefix_cache_tokens=600)
    cache = engine.prefix_cache
    sizes: list[int] = []
    put = cache.put

    def checked_put(ids: list[int], layers: list[Any]) -> None:
        put(ids, layers)
        entries = list(cache._entries.values())
        assert cache.tokens == sum(len(e.ids) for e in entries) <= cache.max_tokens
        assert all(k.shape[2] == v.shape[2] == len(e.ids) for e in entries for k, v in e.layers)
        sizes.append(cache.tokens)

    cache.put = checked_put  # type: ignore[method-assign]
    for start in range(0, 100, 25):
        prompts = [
            engine.encode(GenerationRequest(messages=[{"role": "user", "content": f"episode {start + i} " * 3}]))
            for i in range(25)
        ]
        for turn in range(2):
            reqs = [GenerationRequest(prompt_token_ids=p, params=SamplingParams(max_tokens=4)) for p in prompts]
            out = dict(engine.generate(reqs))
            prompts = [p + out[i].token_ids + _appended(engine, turn, i) for i, p in enumerate(prompts)]
    assert len(sizes) == 200 and max(sizes) <= 600
    assert max(sizes) > 400  # the cap, not a lack of work, is what held it


def test_a_weight_change_between_calls_drops_the_kept_kv(tiny_model):
    """A live LoRA policy (what a trainer hands the engine): after an optimizer step the next
    turn is prefilled afresh and samples what an engine without any cache samples."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(tiny_model)),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8, init_lora_weights=False),
    )
    tok = AutoTokenizer.from_pretrained(str(tiny_model), padding_side="left")
    engine = HFEngine("", model_obj=model, tokenizer=tok, batch_size=4)
    prompt = engine.encode(GenerationRequest(messages=[{"role": "user", "content": "count count"}]))
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    [(_, first)] = engine.generate([GenerationRequest(prompt_token_ids=prompt, params=params)])
    assert len(engine.prefix_cache) == 1
    next_turn = [GenerationRequest(prompt_token_ids=prompt + first.token_ids + _appended(engine, 0, 0), params=params)]

    model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=5.0)
    model(input_ids=torch.tensor([prompt]), labels=torch.tensor([prompt])).loss.backward()
    optimizer.step()
    model.eval()

    hits = engine.prefix_cache.hits
    [(_, got)] = engine.generate(next_turn)
    assert engine.prefix_cache.hits == hits  # nothing was served from the old weights' KV
    fresh = HFEngine("", model_obj=model, tokenizer=tok, batch_size=4, prefix_cache_tokens=0)
    [(_, want)] = fresh.generate(next_turn)
    assert got.token_ids == want.token_ids
    # Unchanged weights: the next call does reuse what the last one kept.
    list(engine.generate(next_turn))
    assert engine.prefix_cache.hits == hits + 1


def test_prefix_cache_matches_the_longest_prefix_and_evicts_the_least_recently_used():
    cache = PrefixCache(max_tokens=10)
    cache.put([1, 2, 3], [])
    cache.put([1, 2, 9, 9], [])
    assert cache.match([1, 2, 9, 9, 5]) == (4, cache._entries[1])
    assert cache.match([1, 2, 3]) == (2, cache._entries[0])  # the last prompt token is always run
    assert cache.match([7, 1, 2]) == (0, None)
    cache.put([1, 2, 3, 4], [])  # extends [1, 2, 3]: that one goes
    assert sorted(len(e.ids) for e in cache._entries.values()) == [4, 4] and cache.tokens == 8
    cache.match([1, 2, 9, 9, 9])  # [1, 2, 9, 9] is now the most recently used
    cache.put([5, 6, 7], [])  # 11 tokens: the least recently used, [1, 2, 3, 4], is evicted
    assert [e.ids for e in cache._entries.values()] == [[1, 2, 9, 9], [5, 6, 7]] and cache.tokens == 7
    cache.put(list(range(11)), [])  # longer than the whole budget: not kept
    assert cache.tokens == 7


def test_the_perf_script_runs_both_sides_to_the_same_ids(tmp_path):
    """perf/multiturn_kv.py --quick on 4 episodes (no timing is asserted): the 4-turn math_tool
    episodes are identical with and without KV reuse, and the cache served prompt tokens."""
    result = run_quick("multiturn_kv", tmp_path / "kv.json", "--samples", "1", "--max-tokens", "4")
    assert result["identical_ids"] and result["turns_per_episode"] == [4, 4, 4, 4]
    assert 0 < result["reused_tokens"] < result["prompt_tokens"]
    assert result["cache_peak_tokens"] <= result["cache_cap_tokens"]


def test_the_environment_variable_sets_every_engines_budget_and_zero_turns_reuse_off(tiny_model, monkeypatch):
    """$ARLE_KV_REUSE_TOKENS is the switch for eval, serve and rollouts alike: 0 keeps nothing
    across calls (a second identical prompt is prefilled again), a number is the budget."""
    monkeypatch.setenv("ARLE_KV_REUSE_TOKENS", "0")
    off = HFEngine(str(tiny_model), batch_size=2)
    messages = [{"role": "user", "content": "count count count"}]
    req = GenerationRequest(messages=messages, params=SamplingParams(max_tokens=3))
    list(off.generate([req]))
    list(off.generate([req]))
    assert off.prefix_cache.max_tokens == 0 and len(off.prefix_cache) == 0 and off.prefix_cache.hits == 0
    monkeypatch.setenv("ARLE_KV_REUSE_TOKENS", "128")
    assert HFEngine(str(tiny_model), batch_size=2).prefix_cache.max_tokens == 128
    monkeypatch.delenv("ARLE_KV_REUSE_TOKENS")
    assert HFEngine(str(tiny_model), batch_size=2).prefix_cache.max_tokens == 16384


@pytest.mark.parametrize("value", ["lots", "-5"])
def test_a_bad_budget_in_the_environment_is_one_line_exit_2(tiny_model, monkeypatch, value):
    from helpers.cli import arle, assert_one_line_error

    monkeypatch.setenv("ARLE_KV_REUSE_TOKENS", value)
    proc = arle("eval", "one_digit_sums", "--model", str(tiny_model), "--limit", "1")
    assert_one_line_error(proc, "ARLE_KV_REUSE_TOKENS", "0 (off)")
