"""@arlecli.rollout on the tiny model: the openai-client example (examples/openai_agent) in eval
and in 2 GRPO steps, the recorded trajectory equal to the engine's ids (continued across calls,
never re-tokenised), agents that raise, and how a card names its function."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

import arlecli
from arlecli import ClientConfig, rollout
from arlecli.engine.base import Completion, GenerationRequest, SamplingParams
from arlecli.engine.tokens import encode_request, render_chat
from arlecli.envs import make_env
from arlecli.envs.episodes import Job
from arlecli.errors import UserError
from arlecli.eval import EvalOptions, load_tasks, run_eval
from arlecli.catalog import load_card
from arlecli.agent import get_rollout, rollout_names, run_rollout_episodes

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "openai_agent"
CARD = str(EXAMPLE / "card.yaml")


class Spy:
    """An engine that passes requests to another and keeps every completion it returned."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.name, self.tokenizer = engine, engine.name, engine.tokenizer
        self.completions: list[Completion] = []

    def generate(self, requests: list[GenerationRequest]):
        for i, comp in self.engine.generate(requests):
            self.completions.append(comp)
            yield i, comp

    def close(self) -> None:
        pass


def example_jobs(n: int, params: SamplingParams, **env_params: Any) -> list[Job]:
    card = load_card(CARD)
    card.env_params = {**card.env_params, **env_params}
    tasks, _ = load_tasks(card, EvalOptions(limit=n))
    return [Job(t, make_env(card, t), params) for t in tasks]


def test_the_example_runs_in_eval_with_every_call_a_turn(tiny_model, tmp_path):
    from arlecli.engine.hf import HFEngine

    card = load_card(CARD)
    engine = Spy(HFEngine(str(tiny_model), batch_size=4))
    result = run_eval(card, engine, EvalOptions(limit=2, max_tokens=8), model="tiny", run_dir=tmp_path)
    assert result["metrics"]["accuracy"]["n"] == 2
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and len(engine.completions) == 4  # two calls per task, each one a turn
    texts = sorted(c.text for c in engine.completions)
    for sample in samples:
        assert sample["end_reason"] == "done" and sample["env_info"]["calls"] == 2
        draft, final = sample["turns"]
        assert draft["observation"][0]["content"].startswith("Check your expression")
        assert sample["completion"] == final["completion"] == sample["env_info"]["answer"]
        assert sample["num_tokens"] == draft["num_tokens"] + final["num_tokens"]
    assert sorted(t["completion"] for s in samples for t in s["turns"]) == texts


def test_the_trajectory_ids_are_the_engines_and_later_calls_continue_them(tiny_model):
    from arlecli.engine.hf import HFEngine
    from arlecli.train.batches import flatten_episode

    engine = Spy(HFEngine(str(tiny_model), batch_size=4))
    jobs = example_jobs(3, SamplingParams(temperature=1.0, max_tokens=8, seed=7))
    episodes = dict(run_rollout_episodes(engine, jobs))
    assert sorted(episodes) == [0, 1, 2] and len(engine.completions) == 6
    for episode in episodes.values():
        first, second = episode.turns
        for turn in (first, second):  # what the engine generated, id for id (logprobs too)
            [comp] = [c for c in engine.completions if c.prompt_token_ids == turn.prompt_token_ids]
            assert (turn.token_ids, turn.logprobs, turn.completion) == (comp.token_ids, comp.logprobs, comp.text)
        # The second call re-sent the conversation as text; its prompt still starts with the
        # first call's exact ids, so the episode is one unbroken sequence.
        assert (
            second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.token_ids)]
            == first.prompt_token_ids + first.token_ids
        )
        assert "seams" not in episode.info
        prompt_ids, completion_ids, mask, logprobs = flatten_episode(episode)
        assert prompt_ids + completion_ids == second.prompt_token_ids + second.token_ids
        assert sum(mask) == len(first.token_ids) + len(second.token_ids)
        assert [lp for lp, m in zip(logprobs, mask) if m] == first.logprobs + second.logprobs


class Spelled:
    """Answers every call with "return", one byte-level token per letter: ids that encoding
    the text again would never give back (the tokenizer merges the word)."""

    name = "spelled"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids = tokenizer.convert_tokens_to_ids(list("return")) + [tokenizer.eos_token_id]

    def generate(self, requests: list[GenerationRequest]):
        for i, request in enumerate(requests):
            yield i, Completion("return", list(self.ids), encode_request(self.tokenizer, request), [0.0] * 7)

    def close(self) -> None:
        pass


def test_continued_ids_are_the_sampled_ones_not_a_re_tokenisation(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    engine = Spelled(tok)
    assert tok("return", add_special_tokens=False)["input_ids"] != engine.ids[:-1]  # the premise
    [(_, episode)] = run_rollout_episodes(engine, example_jobs(1, SamplingParams(max_tokens=8)))
    first, second = episode.turns
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + 7] == first.prompt_token_ids + engine.ids
    fresh = tok(render_chat(tok, second.prompt), add_special_tokens=False)["input_ids"]
    assert fresh != second.prompt_token_ids and tok.decode(fresh) == tok.decode(second.prompt_token_ids)


def test_a_thinking_models_turns_carry_the_split_eval_makes(tiny_thinking_model, tmp_path):
    """The tiny thinking model behind the gateway (its every reply a thought cut short): each
    recorded turn's answer, thinking, cut flag and thinking tokens are what the in-process
    episode driver records for the same completion (envs.episodes.Transcript.record), the agent
    got no answer (content null), and eval scores the episode as one with no answer."""
    from arlecli.engine.hf import HFEngine
    from arlecli.envs.episodes import Transcript
    from arlecli.rewards import NO_ANSWER
    from arlecli.thinking import tags_for
    from arlecli.types import Episode

    engine = Spy(HFEngine(str(tiny_thinking_model), batch_size=4))
    episodes = dict(
        run_rollout_episodes(engine, example_jobs(2, SamplingParams(temperature=1.0, max_tokens=8, seed=3)))
    )
    for episode in episodes.values():
        assert len(episode.turns) == 2 and episode.thinking_cut and episode.completion == ""
        for turn in episode.turns:
            [comp] = [c for c in engine.completions if c.prompt_token_ids == turn.prompt_token_ids]
            want = Transcript(None, Episode("x")).record(comp, tags_for(engine.engine), engine.tokenizer)
            got = (turn.completion, turn.thinking, turn.thinking_cut, turn.thinking_tokens)
            assert got == (want.completion, want.thinking, want.thinking_cut, want.thinking_tokens)
            assert got == ("", want.thinking, True, 8)
            assert turn.thinking and turn.token_ids == comp.token_ids

    run_eval(load_card(CARD), engine, EvalOptions(limit=1, max_tokens=8), model="tiny", run_dir=tmp_path)
    [sample] = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert sample["thinking_cut"] and NO_ANSWER in sample["details"] and sample["reward"] == 0
    assert [t["thinking_cut"] for t in sample["turns"]] == [True, True] and sample["thinking_tokens"] == 16


@rollout(name="test_flaky")
def flaky(task: Any, client: ClientConfig, fail: str = "before") -> str:
    """Fails before calling the model, or after one call."""
    if fail == "before":
        raise ValueError("no model call")
    api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
    api.chat.completions.create(messages=client.prompt, **client.sampling())
    raise RuntimeError("after one call")


@pytest.mark.parametrize("fail, calls", [("before", 0), ("after", 1)])
def test_an_agent_that_raises_is_recorded_and_scores_zero(tiny_model, tmp_path, capsys, fail, calls):
    from arlecli.engine.hf import HFEngine

    card = load_card(CARD)
    card.env_params = {"function": "test_flaky", "fail": fail}  # a registered name; params pass through
    result = run_eval(
        card,
        HFEngine(str(tiny_model), batch_size=4),
        EvalOptions(limit=2, max_tokens=8),
        model="tiny",
        run_dir=tmp_path,
    )
    assert result["metrics"]["accuracy"] == {"value": 0.0, "stderr": 0.0, "n": 2}
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    error = "ValueError: no model call" if fail == "before" else "RuntimeError: after one call"
    for sample in samples:
        assert sample["end_reason"] == "error" and sample["env_info"]["error"] == error
        assert sample["env_info"]["calls"] == calls and sample["reward"] == 0.0 and sample["extracted"] is None
        assert len(sample["turns"]) == 1 and (sample["turns"][0]["finish_reason"] == "error") == (calls == 0)
    assert capsys.readouterr().err.count("raised") == 1  # one warning, not one per episode


def test_an_answer_from_a_failed_agent_does_not_count(tiny_model):
    from arlecli.engine.hf import HFEngine

    jobs = example_jobs(1, SamplingParams(max_tokens=8), function="test_flaky", fail="after")
    [(_, episode)] = run_rollout_episodes(HFEngine(str(tiny_model)), jobs)
    assert episode.turns[0].completion and episode.turns[0].token_ids  # the call the agent made
    assert episode.completion == "" and episode.end_reason == "error"


def train_two_steps(card: str, model: Path, run: Path) -> Path:
    """`arle train CARD --algo grpo`, 2 steps of 2 episodes each, in this process."""
    import typer

    from arlecli.cli.train import train_command

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(train_command)
    app(
        args=[
            card,
            "--model",
            str(model),
            "--num-generations",
            "2",
            "--max-steps",
            "2",
            "--limit",
            "4",
            "--eval-limit",
            "0",
            "--set",
            "max_completion_length=8",
            "--set",
            "per_device_train_batch_size=2",
            "--output",
            str(run),
        ],
        standalone_mode=False,
    )
    return run


def test_grpo_trains_the_example_for_two_steps(tmp_path, tiny_model, monkeypatch):
    """`arle train` on the example card: whole two-call episodes, the nudge between the calls
    masked out of the loss."""
    from arlecli.train import batches as train_batches

    flattened: list[tuple[list[int], list[int], int]] = []
    flatten = train_batches.flatten_episode

    def record(episode):
        out = flatten(episode)
        flattened.append((out[1], out[2], sum(len(t.token_ids) for t in episode.turns)))
        return out

    monkeypatch.setattr(train_batches, "flatten_episode", record)
    run = train_two_steps(CARD, tiny_model, tmp_path / "run")
    lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(x["turns"] == 2 and x["env_info"]["calls"] == 2 for x in lines)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    assert len(flattened) == 4
    for ids, mask, model_tokens in flattened:
        assert sum(mask) == model_tokens  # both calls' own tokens are trained on
        assert "Check your expression" in tok.decode([t for t, m in zip(ids, mask) if m == 0])
    assert (run / "final").is_dir()


def test_grpo_goes_on_when_agents_fail_before_calling_the_model(tmp_path, tiny_model):
    import yaml

    card = yaml.safe_load(Path(CARD).read_text())
    card["env"] = {"name": "rollout", "params": {"function": "test_flaky", "fail": "before"}}
    (tmp_path / "flaky.yaml").write_text(yaml.safe_dump(card))
    run = train_two_steps(str(tmp_path / "flaky.yaml"), tiny_model, tmp_path / "run")
    lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(x["end_reason"] == "error" and x["reward"] == 0.0 for x in lines)
    assert (run / "final").is_dir()


def test_a_card_names_its_function_by_path_module_registry_or_entry_point(tmp_path, monkeypatch, request):
    assert arlecli.rollout is rollout and "test_flaky" in rollout_names()
    assert get_rollout("test_flaky") is flaky
    assert get_rollout("test_rollout_decorator:flaky") is flaky
    assert get_rollout("agent.py:draft_and_revise", EXAMPLE).__name__ == "draft_and_revise"

    from importlib import metadata

    from arlecli.agent import ROLLOUTS

    real = metadata.entry_points
    package = metadata.EntryPoint("from_a_package", "test_rollout_decorator:flaky", "arle.rollouts")
    monkeypatch.setattr(
        metadata,
        "entry_points",
        lambda group=None, **kw: [package] if group == "arle.rollouts" else real(group=group, **kw),
    )
    ROLLOUTS.refresh()
    request.addfinalizer(ROLLOUTS.refresh)  # after the real entry points are back
    assert get_rollout("from_a_package") is flaky and "from_a_package" in rollout_names()
    for bad, message in [
        ("nope", "unknown rollout function 'nope'"),
        ("missing.py:f", "no file"),
        ("test_rollout_decorator:nothing", "has no attribute"),
    ]:
        with pytest.raises(UserError, match=message):
            get_rollout(bad, tmp_path)
    card = load_card(CARD)
    card.env_params = {}
    with pytest.raises(UserError, match="needs params.function"):
        make_env(card, load_tasks(card, EvalOptions(limit=1))[0][0])
