"""The hf engine on the tiny model: batching never changes a sample, stops and budgets hold."""

from __future__ import annotations

import pytest
from helpers.perf import run_quick

from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.hf import HFEngine


@pytest.fixture(scope="module")
def engines(tiny_model):
    return HFEngine(str(tiny_model), batch_size=8), HFEngine(str(tiny_model), batch_size=1)


def _requests() -> list[GenerationRequest]:
    reqs = [
        GenerationRequest(
            messages=[{"role": "user", "content": "count " * i}], params=SamplingParams(max_tokens=12, logprobs=True)
        )
        for i in range(1, 5)
    ]
    reqs += [
        GenerationRequest(
            prompt="def add(a, b):" * i, params=SamplingParams(max_tokens=12, temperature=0.9, seed=i, logprobs=True)
        )
        for i in range(1, 5)
    ]
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
    reqs = [
        GenerationRequest(
            prompt="def f(x):" * (1 + i % 5),
            params=SamplingParams(max_tokens=2 + (7 * i) % 13, temperature=0.8 * (i % 2), seed=i, logprobs=bool(i % 3)),
        )
        for i in range(14)
    ]
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
    reqs = [
        GenerationRequest(prompt="hello", params=SamplingParams(max_tokens=16, temperature=1.5, seed=s))
        for s in range(6)
    ]
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
        out = dict(
            engine.generate(
                [GenerationRequest(messages=[{"role": "user", "content": "hi"}], params=SamplingParams(max_tokens=30))]
            )
        )[0]
    finally:
        engine.eos_ids.discard(engine.tokenizer("\n")["input_ids"][0])
    assert eos in engine.eos_ids
    assert out.finish_reason == "stop" and len(out.token_ids) < 30


def _greedy_ids(engine: HFEngine, prompts: list[str]) -> list[list[int]]:
    reqs = [GenerationRequest(prompt=p, params=SamplingParams(max_tokens=10)) for p in prompts]
    out = dict(engine.generate(reqs))
    return [out[i].token_ids for i in range(len(prompts))]


def test_live_policy_is_packed_per_call_and_follows_its_weights(tiny_model, tmp_path):
    """A training policy's weights change between rollouts: the engine over the live model
    must pack them afresh each call, hand the model its own forward back afterwards, and
    sample exactly what an engine that loaded the same weights from disk samples."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlecli.engine.onednn import pack_linears

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    tok = AutoTokenizer.from_pretrained(str(tiny_model), padding_side="left")
    live = HFEngine("", model_obj=model, tokenizer=tok, batch_size=4)
    prompts = ["def f(x):", "hello there", "count count count"]
    before = _greedy_ids(live, prompts)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert all("forward" not in vars(m) for m in linears)  # the policy trains on its own modules
    with torch.no_grad():  # an optimizer step
        for m in linears:
            m.weight.mul_(-1.5)
    after = _greedy_ids(live, prompts)
    assert after != before
    model.save_pretrained(tmp_path / "stepped")
    tok.save_pretrained(tmp_path / "stepped")
    owned = HFEngine(str(tmp_path / "stepped"), batch_size=1)
    assert owned.packed_linears, "oneDNN packing is expected on these CPUs"
    assert _greedy_ids(owned, prompts) == after
    assert not set(map(id, pack_linears(owned.model))) & set(map(id, owned._packed))  # none packed twice


def test_packed_linear_rows_do_not_depend_on_the_batch():
    """oneDNN's packed matmul gives a row the same bits at any number of rows (why it is
    used: batching must not change a sample), and agrees with F.linear."""
    import torch

    from arlecli.engine.onednn import pack_linears, unpack_linears

    torch.manual_seed(0)
    # 1536 -> 576 is SmolLM2's down projection, where oneDNN on AVX-512 runs one row on another
    # kernel than two or more (the engine pads a lone row to two there).
    net = torch.nn.Sequential(
        torch.nn.Linear(64, 96), torch.nn.Linear(96, 1536, bias=False), torch.nn.Linear(1536, 576, bias=False)
    )
    x = torch.randn(16, 64)
    with torch.inference_mode():
        want = net(x)
        packed = pack_linears(net)
        assert len(packed) == 3
        rows = [net(x[i : i + 1]) for i in range(16)]
        full = net(x)
        unpack_linears(packed)
        assert torch.equal(net(x), want)
    assert torch.equal(torch.cat(rows), full)
    assert torch.allclose(full, want, atol=1e-4, rtol=1e-4)


def test_grouped_attention_equals_transformers_sdpa_with_padding(engines):
    """The grouped-head attention an owned CPU model runs is bit-identical to transformers'
    own sdpa path, on a left-padded batch (the mask is what made transformers copy K/V)."""
    import torch

    from arlecli.engine.hf import GROUPED_SDPA

    model = engines[0].model
    assert model.config._attn_implementation == GROUPED_SDPA
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    ids = torch.randint(3, 500, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[1, :1] = 0

    def logits() -> torch.Tensor:
        with torch.inference_mode():
            return model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits

    grouped = logits()
    try:
        model.set_attn_implementation("sdpa")
        reference = logits()
    finally:
        model.set_attn_implementation(GROUPED_SDPA)
    assert torch.equal(grouped, reference)


def test_length_groups_bound_the_padding_of_each_prefill():
    from arlecli.engine.hf import MAX_PREFILL_PADDING, length_groups

    lengths = [181, 170, 150, 136, 135, 120, 101, 99, 40]
    groups = length_groups(lengths)
    assert groups == [(0, 4), (4, 6), (6, 8), (8, 9)]
    for start, end in groups:
        run = lengths[start:end]
        assert min(run) >= (1 - MAX_PREFILL_PADDING) * max(run)
    assert length_groups([7, 7, 6]) == [(0, 3)]


def test_mixed_length_prompts_are_prefilled_in_groups(engines, monkeypatch):
    """Prompts of very different lengths admitted together are prefilled in groups of
    similar length (little padding) whose caches are merged; every sample still equals
    its batch-of-one run."""
    batched, single = engines
    prefills: list[tuple[int, int]] = []
    forward = batched.forward

    def spy(ids, mask=None, *args, **kwargs):
        if ids.shape[1] > 1:
            prefills.append((int((mask == 0).sum()), mask.numel()))
        return forward(ids, mask, *args, **kwargs)

    monkeypatch.setattr(batched, "forward", spy)
    reqs = [
        GenerationRequest(
            prompt="def f(x): return x" * n, params=SamplingParams(max_tokens=6, temperature=0.7 * (n % 2), seed=n)
        )
        for n in (12, 1, 7, 2, 12, 4, 1, 9)
    ]
    grouped = dict(batched.generate(reqs))
    monkeypatch.undo()
    assert len(prefills) >= 3  # one admission of 8 rows, prefilled as several groups
    assert all(padding <= 0.25 * slots for padding, slots in prefills)
    alone = dict(single.generate(reqs))
    for i in range(len(reqs)):
        assert grouped[i].token_ids == alone[i].token_ids, i


def test_a_prompt_shared_by_several_rows_is_prefilled_once(tiny_model, monkeypatch):
    """A GRPO group (or `arle eval -n`) sends one prompt several times: its prefill runs once
    and each row samples, bit for bit, what it samples when every row is prefilled (greedy and
    seeded, with logprobs), in a batch that also holds rows of other lengths (left padding)
    and a prompt used once; then three rows continuing the lone prompt's conversation on the
    same engine, which start from the KV kept from the first call (`_reuse`) and share it."""
    prompts = ["def f(x): return x" * 3] * 4 + ["count " * 9] * 3 + ["def g(y):"]
    reqs = [
        GenerationRequest(
            prompt=p, params=SamplingParams(max_tokens=8, temperature=0.9 * bool(i % 4), seed=i, logprobs=True)
        )
        for i, p in enumerate(prompts)
    ]
    runs = {}
    for share in (True, False):
        engine = HFEngine(str(tiny_model), batch_size=8)  # no KV kept from other calls
        monkeypatch.setattr(engine, "share_prompts", share)
        fed: list[int] = []
        forward = engine.forward

        def spy(ids, *args, forward=forward, fed=fed, **kwargs):
            if ids.shape[1] > 1:
                fed.append(ids.shape[0])
            return forward(ids, *args, **kwargs)

        monkeypatch.setattr(engine, "forward", spy)
        first = dict(engine.generate(reqs))
        rows = sum(fed)
        fed.clear()
        lone = first[7]
        extended = [*lone.prompt_token_ids, *lone.token_ids, *lone.token_ids[:3]]
        follow = [
            GenerationRequest(
                prompt_token_ids=extended, params=SamplingParams(max_tokens=6, temperature=0.9, seed=k, logprobs=True)
            )
            for k in range(3)
        ]
        again = dict(engine.generate(follow))
        assert engine.prefix_cache.reused_tokens >= 3 * len(lone.prompt_token_ids)
        runs[share] = first, rows, again, sum(fed)
    (shared, shared_rows, shared_again, again_rows), (plain, plain_rows, plain_again, _) = runs[True], runs[False]
    assert (shared_rows, plain_rows) == (3, 8)  # three distinct prompts, one prefill row each
    assert again_rows == 1  # the three continuations: one row run on the kept KV
    for a, b in ((shared, plain), (shared_again, plain_again)):
        for i in range(len(a)):
            assert a[i].prompt_token_ids == b[i].prompt_token_ids
            assert a[i].token_ids == b[i].token_ids, i
            assert a[i].logprobs == b[i].logprobs, i
    samples = [tuple(shared[i].token_ids) for i in (1, 2, 3)]
    assert len(set(samples)) > 1  # the copies sample with their own seeds, not one shared draw


def test_a_sampled_token_is_torch_multinomials_draw_bit_for_bit():
    """engine.hf.draw gives multinomial's token and leaves the generator where multinomial
    leaves it, over many seeds, flat and peaked distributions, and nucleus-cut ones (zeros)."""
    import torch

    from arlecli.engine.hf import draw

    for seed in range(120):
        logits = torch.randn(49152, generator=torch.Generator().manual_seed(1000 + seed)) * (0.3 + seed % 9)
        probs = torch.softmax(logits, -1)
        if seed % 3 == 0:  # top_p's cut, as _pick makes it
            ordered, idx = probs.sort(descending=True)
            ordered[ordered.cumsum(-1) - ordered > 0.8] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, idx, ordered)
        theirs, ours = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        for _ in range(3):
            assert draw(probs, ours).item() == torch.multinomial(probs, 1, generator=theirs)[0].item(), seed
        assert torch.equal(ours.get_state(), theirs.get_state())


def test_loading_a_model_does_not_import_scikit_learn(tiny_model):
    # transformers imports sklearn.metrics (1.5-2.5 s of start-up) wherever it is installed,
    # as it is beside lm-eval; the engine loads without it and still generates.
    import importlib.util
    import json
    import subprocess
    import sys

    assert importlib.util.find_spec("sklearn") is not None, "the dev extras install scikit-learn (lm-eval's)"
    script = (
        "import json, sys\n"
        "from arlecli.engine.base import GenerationRequest, SamplingParams\n"
        "from arlecli.engine.hf import HFEngine\n"
        f"e = HFEngine({str(tiny_model)!r})\n"
        "out = dict(e.generate([GenerationRequest(prompt='a b c', params=SamplingParams(max_tokens=3))]))\n"
        "print(json.dumps({'sklearn': 'sklearn' in sys.modules, 'scipy': 'scipy' in sys.modules,\n"
        "                  'tokens': len(out[0].token_ids)}))\n"
    )
    got = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    assert json.loads(got.splitlines()[-1]) == {"sklearn": False, "scipy": False, "tokens": 3}


def test_the_shared_prompts_perf_script_runs_both_sides_to_the_same_ids(tmp_path):
    """perf/shared_prompts.py --quick (no timing is asserted): the 4-turn math_tool episodes of
    a group are identical whether its prompt is prefilled once or per row."""
    result = run_quick("shared_prompts", tmp_path / "shared.json", "--samples", "3", "--max-tokens", "4")
    assert result["identical_ids"] and result["turns_per_episode"] == [4] * 6
    assert result["prompts"] == 2 and result["samples_per_prompt"] == 3


def test_the_sampling_perf_script_gets_the_same_ids_from_both_samplers(tmp_path):
    """perf/sampling.py --quick (no timing is asserted): draw and torch.multinomial agree on
    every draw and on every id of a 16-row sampled generate."""
    result = run_quick("sampling", tmp_path / "sampling.json")
    assert result["identical_ids"] and all(d["same_tokens"] for d in result["per_draw"])


def test_a_prompt_many_times_the_context_is_one_line_before_any_prefill(engines, monkeypatch):
    """Past the position embeddings nothing meaningful is computed, and a very long prompt asks the
    attention for tens of GB: refused before any prefill. A conversation a little over the context
    (an agent's late turns on a small model) still runs, as it always has."""
    from arlecli.engine.hf import LONG_PROMPT_FACTOR
    from arlecli.errors import UserError

    engine = engines[1]
    context = engine.model.config.max_position_embeddings
    prefills = []
    monkeypatch.setattr(engine, "_run", lambda *a, **k: prefills.append(a) or iter(()))
    long = GenerationRequest(prompt="a b " * (LONG_PROMPT_FACTOR * context), params=SamplingParams(max_tokens=2))
    said = rf"a prompt of [\d,]+ tokens is over {LONG_PROMPT_FACTOR}x the model's context"
    with pytest.raises(UserError, match=said):
        list(engine.generate([GenerationRequest(prompt="hi"), long]))
    assert prefills == []
    over = GenerationRequest(prompt="a b " * (context // 2 + 50), params=SamplingParams(max_tokens=2))
    list(engine.generate([over]))  # a little over: generated
    assert len(prefills) == 1
