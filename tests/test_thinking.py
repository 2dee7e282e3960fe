"""Reasoning models (issue 24): the thinking is recorded, the answer alone is scored.

A stand-in endpoint answers like a thinking model on real fixture rows of a math, a
multiple-choice, a QA and a code card: its thought names one answer and its reply another,
or it runs out of tokens inside the thought, or a reasoning parser hands the thought back in
`reasoning_content`. Each reply goes through `arle eval` (in process, the engine built by
make_engine as the CLI builds it) and through `arle train`'s reward (CardReward over the same
episodes), which must agree sample by sample. Then the tiny thinking model on the hf engine:
its template opens the thought and its random weights never close it, so every sample is a
thought cut at its budget: no answer, scored wrong, counted in results.json's reasoning block.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arlecli import thinking
from arlecli.engine import make_engine
from arlecli.envs.episodes import Sampling, collect
from arlecli.eval import EvalOptions, load_tasks, run_eval
from arlecli.models import resolve_model
from arlecli.catalog import load_card
from arlecli.results import read_samples
from arlecli.train.reward import CardReward

from helpers.fake_openai import FakeOpenAIServer, Reply

# (card, its reward's kind): each kind of reward that reads the answer text, in chat format
# (where a reasoning parser's `reasoning_content` exists) and in completion format.
CARDS = [
    ("hendrycks_math", "math"),
    ("mmlu", "multiple choice"),
    ("triviaqa", "qa"),
    ("livecodebench", "code"),
    ("gsm8k", "math, completion format"),
    ("humaneval", "code, completion format"),
]


def reference(card_name: str) -> tuple[str, str]:
    """The first fixture row's (correct, wrong) reference completions."""
    card = load_card(card_name)
    answers = card.fixture_path.with_name(card.fixture_path.stem + ".answers.jsonl")
    first = json.loads(answers.read_text().splitlines()[0])
    return first["correct"], first["wrong"]


def variants(right: str, wrong: str) -> dict[str, tuple[str | Reply, bool]]:
    """name -> (the endpoint's reply, whether it must score correct)."""
    return {
        "thought wrong, answer right": (f"<think>\nIt could be this:\n{wrong}\nNo, wait.\n</think>\n\n{right}", True),
        "thought right, answer wrong": (f"<think>\nClearly:\n{right}\n</think>\n\n{wrong}", False),
        "cut inside the thought": (
            Reply(f"<think>\nThe answer is {right} maybe, but let me check", None, "length"),
            False,
        ),
        "reasoning_content right, answer wrong": (Reply(wrong, reasoning_content=f"So:\n{right}"), False),
        "reasoning_content wrong, answer right": (Reply(right, reasoning_content=f"So:\n{wrong}"), True),
    }


def run(card_name: str, reply: str | Reply, tmp_path: Path, name: str) -> tuple[dict, list, object]:
    """One sample of the card's first fixture row answered by `reply`: (its samples.jsonl line,
    the same episode scored by the train reward, results.json)."""
    card = load_card(card_name)
    with FakeOpenAIServer(lambda body: reply) as srv:
        spec = resolve_model(srv.model, base_url=srv.base_url)
        engine = make_engine(spec)
        try:
            opts = EvalOptions(data=str(card.fixture_path), limit=1, num_fewshot=0)
            run_dir = tmp_path / name.replace(" ", "-").replace(",", "")
            results = run_eval(card, engine, opts, model=spec.name, run_dir=run_dir)
            [sample] = read_samples(run_dir)
            tasks, exemplars = load_tasks(card, opts)
            [(_, episode)] = list(collect(card, engine, tasks, exemplars, [(0, 0)], Sampling(seed=opts.seed)))
            reward = CardReward(card, tasks)
            [trained] = reward.score([episode], [0], step=1)
        finally:
            engine.close()
    return sample, trained, results


@pytest.mark.parametrize("card_name,kind", CARDS, ids=[c for c, _ in CARDS])
def test_only_the_answer_is_scored(card_name, kind, tmp_path):
    right, wrong = reference(card_name)
    chat = load_card(card_name).prompt.format == "chat"
    for name, (reply, correct) in variants(right, wrong).items():
        if name.startswith("reasoning_content") and not chat:
            continue  # /v1/completions has no reasoning field
        sample, trained, results = run(card_name, reply, tmp_path, name)
        assert sample["correct"] is correct, f"{card_name} ({kind}), {name}: {sample['details']}"
        assert trained.correct is correct and trained.reward == sample["reward"], (name, trained)
        assert sample["thinking"], f"{name}: the thinking is not recorded"
        assert right not in sample["completion"] or correct, f"{name}: the thought leaked into the answer"
        if name.startswith("reasoning_content"):
            assert sample["thinking"].startswith("So:"), sample["thinking"]
        if name == "cut inside the thought":
            assert sample["thinking_cut"] is True and sample["extracted"] is None
            assert sample["details"] == {"no_answer": "the turn ended inside its thinking"}
            assert sample["completion"] == ""
            assert results["reasoning"]["cut"] == 1 and results["reasoning"]["accuracy_cut"] == 0.0
        else:
            assert sample["thinking_cut"] is False
        assert results["reasoning"]["n"] == 1


def test_reasoning_tokens_from_the_endpoint_are_counted(tmp_path):
    sample, _, results = run(
        "hendrycks_math", Reply("\\boxed{6}", reasoning_content="14 + 9 - 17 = 6"), tmp_path, "counted"
    )
    assert sample["thinking_tokens"] == len("14 + 9 - 17 = 6")
    assert sample["answer_tokens"] == len("\\boxed{6}")
    assert results["reasoning"]["thinking_tokens"]["mean"] == len("14 + 9 - 17 = 6")


def test_a_model_that_does_not_think_is_unchanged(tmp_path):
    right, _ = reference("gsm8k")
    sample, trained, results = run("gsm8k", right, tmp_path, "plain")
    assert sample["correct"] and trained.correct
    assert "thinking" not in sample and "reasoning" not in results


def test_think_tags_none_keeps_the_literal_tag_in_the_answer(tmp_path):
    card = load_card("gsm8k")
    with FakeOpenAIServer(lambda body: "<think>x</think>\n#### 6") as srv:
        engine = make_engine(resolve_model(srv.model, base_url=srv.base_url))
        thinking.configure(engine, thinking.parse_option("none"))
        try:
            opts = EvalOptions(data=str(card.fixture_path), limit=1, num_fewshot=0)
            run_eval(card, engine, opts, model="fake", run_dir=tmp_path / "run")
        finally:
            engine.close()
    [sample] = read_samples(tmp_path / "run")
    assert sample["completion"] == "<think>x</think>\n#### 6" and "thinking" not in sample


def test_a_thought_cut_at_its_budget_on_the_hf_engine_has_no_answer(tiny_thinking_model, tmp_path):
    # The tiny thinking model's template opens the thought and its weights never close it.
    from arlecli.engine.hf import HFEngine

    card = load_card("hendrycks_math")  # a chat card: the template renders its prompt (and opens the thought)
    engine = HFEngine(str(tiny_thinking_model), batch_size=4)
    assert thinking.tags_for(engine) == thinking.DEFAULT
    opts = EvalOptions(data=str(card.fixture_path), limit=2, num_fewshot=0, max_tokens=12)
    results = run_eval(card, engine, opts, model="tiny-thinking", run_dir=tmp_path / "run")
    samples = read_samples(tmp_path / "run")
    assert len(samples) == 2
    for s in samples:
        assert s["thinking_cut"] is True and s["correct"] is False and s["completion"] == ""
        assert s["details"] == {"no_answer": "the turn ended inside its thinking"}
        assert s["thinking_tokens"] == s["completion_tokens"] == 12 and s["answer_tokens"] == 0
    assert results["reasoning"] == {
        "n": 2,
        "share_of_samples": 1.0,
        "thinking_tokens": {"mean": 12.0, "median": 12.0, "n": 2},
        "cut": 2,
        "cut_share": 1.0,
        "accuracy_cut": 0.0,
        "accuracy_answered": None,
    }


def test_split_keeps_an_answers_indentation():
    part = thinking.split("<think>plan</think>\n    return 1\n", thinking.DEFAULT)
    assert part == thinking.Split("plan", "    return 1\n")
    assert thinking.split("no thought here", thinking.DEFAULT) == thinking.Split(None, "no thought here")
    opened = thinking.split("still thinking", thinking.DEFAULT, opened=True)
    assert opened.cut and opened.answer == "" and opened.thinking == "still thinking"
