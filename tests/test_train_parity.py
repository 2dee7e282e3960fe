"""Training samples what `arle eval` samples: the rollouts GRPO, RLOO and PPO consume equal the
eval's samples token for token (ids, text, reward, finish reason) for the same weights, seed
and tasks, on a completion card with stop strings (gsm8k format), a chat card (countdown) and
a multi-turn tool card (math_tool), on the hf and the vllm-cpu backends; and no token after a
stop string ever reaches the trainer.

How: each trainer runs one step with its rollouts recorded (`Rollouts.draws` gives which task
and sample each row is, `Sequences.of` what the trainer gets); `run_eval` runs on the same
tasks with the trainer's seed, temperature and budget, its episodes recorded too.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from arlecli.train.batches import flatten_episode

from helpers.tool_model import CALL, GSM8K_ROWS, first_turn_calls_a_tool
from helpers.train import train_in_process

ROOT = Path(__file__).resolve().parents[1]
SEED = 1234
TOKENS = 12
GENERATIONS = 2


def frequent_substring(texts: list[str]) -> str:
    """A 2-character string that most texts contain after their first character: a stop string
    this model is sure to run into mid-completion."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update({text[i : i + 2] for i in range(1, len(text) - 2) if text[i : i + 2].strip()})
    best, seen = counts.most_common(1)[0]
    assert seen >= len(texts) // 2, (best, seen, texts)
    return best


def gsm8k_card(tmp_path: Path, tiny_model: Path) -> Path:
    """The gsm8k card on its fixture rows, plus a stop string the tiny model writes mid-text (it
    never writes the card's own "Question:"), so stops really cut its completions. The string
    is read off the very samples step 0 draws (seed SEED, samples 0-3 of every task, card stops
    only): a stop cuts text it occurs in, and the text before it is unchanged."""
    from arlecli.catalog import resolve_references
    from arlecli.engine.hf import HFEngine
    from arlecli.envs.episodes import Sampling, collect
    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.catalog import load_card

    data = yaml.safe_load((ROOT / "benchmarks" / "gsm8k.yaml").read_text())
    data["source"] = {"kind": "files", "path": GSM8K_ROWS}
    path = tmp_path / "gsm8k_stops.yaml"
    path.write_text(yaml.safe_dump(data))
    card = load_card(str(path))
    resolve_references(card)
    tasks, _ = load_tasks(card, EvalOptions(num_fewshot=0))
    draws = [(i, k) for i in range(len(tasks)) for k in range(4)]
    sampling = Sampling(temperature=1.0, max_tokens=TOKENS, seed=SEED)
    texts = [e.completion for _, e in collect(card, HFEngine(str(tiny_model)), tasks, [], draws, sampling)]
    data["prompt"]["stop"] = [*data["prompt"]["stop"], frequent_substring(texts)]
    path.write_text(yaml.safe_dump(data))
    return path


def math_tool_card(tmp_path: Path) -> Path:
    data = yaml.safe_load((ROOT / "benchmarks" / "math_tool.yaml").read_text())
    data["source"] = {"kind": "files", "path": GSM8K_ROWS}  # the fixture rows, offline
    path = tmp_path / "math_tool.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Recorder:
    """Records every rollout draw and the sequences handed to the trainer."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from arlecli.train import batches

        self.draws: list[tuple[int, int]] = []
        self.sequences: list[Any] = []
        draws, of = batches.Rollouts.draws, batches.Sequences.of.__func__

        def record_draws(obj, indices, step):
            out = draws(obj, indices, step)
            if step == 0:
                self.draws += out
            return out

        def record_sequences(cls, episodes, end_id):
            out = of(cls, episodes, end_id)
            self.sequences.append(out)
            return out

        monkeypatch.setattr(batches.Rollouts, "draws", record_draws)
        monkeypatch.setattr(batches.Sequences, "of", classmethod(record_sequences))

    def rows(self) -> list[tuple[tuple[int, int], list[int], list[int], Any]]:
        """((task index, sample), prompt ids, completion ids, episode) of step 0's rollouts."""
        seqs = self.sequences[0]
        assert len(seqs.episodes) == len(self.draws[: len(seqs.episodes)])
        return list(zip(self.draws, seqs.prompt_ids, seqs.completion_ids, seqs.episodes))


def eval_episodes(
    card_path: Path, model: Path, backend: str, temperature: float, monkeypatch, run_dir: Path
) -> tuple[dict[tuple[str, int], Any], dict[tuple[str, int], dict]]:
    """`arle eval` with the trainer's seed, samples, temperature and budget: its episodes and samples."""
    import arlecli.eval as eval_module
    from arlecli.catalog import resolve_references
    from arlecli.engine import make_engine
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.models import resolve_model
    from arlecli.catalog import load_card

    from arlecli.train.run import train_split

    card = load_card(str(card_path))
    resolve_references(card)
    opts = EvalOptions(
        split=train_split(card, None),
        limit=4,
        num_samples=GENERATIONS,
        temperature=temperature,
        max_tokens=TOKENS,
        seed=SEED,
        num_fewshot=0,
    )
    got: dict[tuple[str, int], Any] = {}
    collect = eval_module.collect

    def record(card, engine, tasks, exemplars, draws, sampling):
        for j, episode in collect(card, engine, tasks, exemplars, draws, sampling):
            i, k = draws[j]
            got[(tasks[i].id, k)] = episode
            yield j, episode

    monkeypatch.setattr(eval_module, "collect", record)
    engine = make_engine(resolve_model(str(model), backend=backend))
    try:
        run_eval(card, engine, opts, model="tiny", run_dir=run_dir)
    finally:
        engine.close()
    samples = {(s["task_id"], s["sample"]): s for s in map(json.loads, (run_dir / "samples.jsonl").open())}
    return got, samples


def assert_same(trained: list, evaluated: dict, samples: dict, rewards: list[dict], tasks: list) -> None:
    """Each trained row is the eval's sample: every turn's ids, the text, finish reason, reward."""
    assert trained, "no rollouts recorded"
    for (i, k), prompt_ids, completion_ids, episode in trained:
        ev = evaluated[(tasks[i].id, k)]
        assert [(t.prompt_token_ids, t.token_ids, t.completion, t.finish_reason) for t in episode.turns] == [
            (t.prompt_token_ids, t.token_ids, t.completion, t.finish_reason) for t in ev.turns
        ]
        assert [(t.thinking, t.thinking_cut, t.thinking_tokens) for t in episode.turns] == [
            (t.thinking, t.thinking_cut, t.thinking_tokens) for t in ev.turns
        ]
        assert (prompt_ids, completion_ids) == flatten_episode(ev)[:2]
        sample = samples[(tasks[i].id, k)]
        assert sample["completion"] == episode.completion and sample["finish_reason"] == episode.turns[-1].finish_reason
        assert sample.get("thinking") == episode.turns[-1].thinking
    by_task = {}
    for line in rewards:
        if line["step"] == 1:
            by_task.setdefault(line["task_id"], []).append(line)
    for (i, k), *_ in trained:
        tid = tasks[i].id
        assert any(
            line["reward"] == samples[(tid, k)]["reward"] and line["completion"] == samples[(tid, k)]["completion"]
            for line in by_task[tid]
        )


def _train_one_step(card: Path, model: Path, algo: str, backend: str, run: Path) -> None:
    extra = ["--set", "prompts_per_step=1"] if algo == "ppo" else ["--set", "per_device_train_batch_size=2"]
    train_in_process(
        str(card),
        "--algo",
        algo,
        "--backend",
        backend,
        "--model",
        str(model),
        "--limit",
        "4",
        "--num-generations",
        str(GENERATIONS),
        "--max-tokens",
        str(TOKENS),
        "--temperature",
        "1.0",
        "--max-steps",
        "1",
        "--eval-limit",
        "0",
        "--seed",
        str(SEED),
        "--set",
        "num_fewshot=0",
        *extra,
        "--output",
        str(run),
    )


CARDS = ["gsm8k_stops", "countdown", "math_tool"]


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
@pytest.mark.parametrize("card_name", CARDS)
def test_every_trainer_consumes_exactly_the_eval_samples(
    tmp_path, tiny_model, monkeypatch, card_name, backend, vllm_environment
):
    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.catalog import load_card
    from arlecli.train.run import train_split

    if card_name == "gsm8k_stops":
        card = gsm8k_card(tmp_path, tiny_model)
    elif card_name == "math_tool":
        card = math_tool_card(tmp_path)
        from arlecli.engine import hf, vllm

        first_turn_calls_a_tool(monkeypatch, vllm.VLLMEngine if backend == "vllm" else hf.HFEngine)
    else:
        card = ROOT / "benchmarks" / "countdown.yaml"
    loaded = load_card(str(card))
    tasks, _ = load_tasks(loaded, EvalOptions(split=train_split(loaded, None), limit=4, num_fewshot=0))

    evaluated, samples = eval_episodes(card, tiny_model, backend, 1.0, monkeypatch, tmp_path / "eval")
    for algo in ("grpo", "rloo", "ppo"):
        recorder = Recorder(monkeypatch)
        run = tmp_path / f"train-{algo}"
        _train_one_step(card, tiny_model, algo, backend, run)
        rewards = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
        assert_same(recorder.rows(), evaluated, samples, rewards, tasks)
        assert all("finish_reason" in line for line in rewards)
        if card_name == "math_tool":
            assert all(CALL in r[3].turns[0].completion and len(r[3].turns) >= 2 for r in recorder.rows())

    # Greedy: what every trainer draws through (Rollouts.episodes) at temperature 0 is the greedy eval.
    evaluated, samples = eval_episodes(card, tiny_model, backend, 0.0, monkeypatch, tmp_path / "eval-greedy")
    greedy = _greedy_rollouts(card, tiny_model, backend, tasks)
    for (i, k), episode in greedy:
        ev = evaluated[(tasks[i].id, k)]
        assert [(t.token_ids, t.completion, t.finish_reason) for t in episode.turns] == [
            (t.token_ids, t.completion, t.finish_reason) for t in ev.turns
        ]


def _greedy_rollouts(card_path: Path, model: Path, backend: str, tasks: list) -> list:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlecli.catalog import resolve_references
    from arlecli.envs.episodes import Sampling
    from arlecli.catalog import load_card
    from arlecli.train.batches import PolicyBackend, Rollouts

    card = load_card(str(card_path))
    resolve_references(card)
    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(str(model), padding_side="left")
    engine = PolicyBackend(backend, str(model))
    rollouts = Rollouts(card, tasks, [], Sampling(temperature=0.0, max_tokens=TOKENS, seed=SEED), engine)
    indices = [i for i in range(len(tasks)) for _ in range(GENERATIONS)]
    try:
        episodes = rollouts.episodes(indices, 0, policy, tokenizer)
    finally:
        engine.close()
    return list(zip([(i, k) for i in range(len(tasks)) for k in range(GENERATIONS)], episodes))


def test_no_token_after_a_stop_string_reaches_grpo(tmp_path, tiny_model, monkeypatch):
    """A GRPO step on a gsm8k-format card whose model writes past the stop: the completion ids
    TRL receives end with the token that completes the stop string (the eval's cut)."""
    import arlecli.train.grpo as grpo
    from transformers import AutoTokenizer

    card = gsm8k_card(tmp_path, tiny_model)
    stop = yaml.safe_load(card.read_text())["prompt"]["stop"][-1]
    received: list[list[int]] = []
    build = grpo.build_trainer

    def spy(*args, **kwargs):
        trainer = build(*args, **kwargs)
        rollout_func = trainer.rollout_func

        def recording(prompts, trainer_):
            out = rollout_func(prompts, trainer_)
            received.extend(out["completion_ids"])
            return out

        trainer.rollout_func = recording
        return trainer

    monkeypatch.setattr(grpo, "build_trainer", spy)
    run = tmp_path / "run"
    train_in_process(
        str(card),
        "--model",
        str(tiny_model),
        "--limit",
        "4",
        "--num-generations",
        "4",
        "--max-tokens",
        str(TOKENS),
        "--max-steps",
        "1",
        "--eval-limit",
        "0",
        "--set",
        "num_fewshot=0",
        "--set",
        "per_device_train_batch_size=4",
        "--output",
        str(run),
    )
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    assert len(received) == 4
    stopped = 0
    for ids in received:
        if stop in tok.decode(ids, skip_special_tokens=True):
            stopped += 1
            # The stop completes only in the last token: nothing after it was generated or trained.
            assert stop not in tok.decode(ids[:-1], skip_special_tokens=True)
    assert stopped >= 1, "the test needs a model that writes the stop string"
    lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert all(stop not in line["completion"] for line in lines)
    assert sum(line["finish_reason"] == "stop" for line in lines) >= stopped


def test_tasks_travel_by_index_even_when_their_prompts_are_identical(tiny_model):
    """Two tasks with the same prompt text and different answers stay two tasks: each rollout
    belongs to the task whose index the trainer drew (the old multi-turn path keyed tasks by
    prompt text, so identical prompts collided)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlecli.envs.episodes import Sampling
    from arlecli.catalog import load_card
    from arlecli.train.reward import CardReward
    from arlecli.train.batches import PolicyBackend, Rollouts
    from arlecli.types import Task

    card = load_card("gsm8k")
    tasks = [Task("a", "What is 2 plus 2?", "#### 4"), Task("b", "What is 2 plus 2?", "#### 5")]
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model), padding_side="left")
    rollouts = Rollouts(card, tasks, [], Sampling(temperature=1.0, max_tokens=4, seed=SEED), PolicyBackend("hf", ""))
    episodes = rollouts.episodes([1, 0, 1], 0, policy, tokenizer)
    assert [e.task_id for e in episodes] == ["b", "a", "b"]
    assert rollouts.draws([1, 1], 0) == [(1, 2), (1, 3)]  # later draws of a task in one step: new samples
    assert rollouts.draws([1], 1) == [(1, 0)]  # a new step starts its samples afresh
    for episode in episodes:
        episode.turns[0].completion = "#### 5"
    scores = CardReward(card, tasks).score(episodes, [1, 0, 1])
    assert [s.correct for s in scores] == [True, False, True]


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_training_samples_the_eval_thinking(tmp_path, tiny_thinking_model, monkeypatch, backend, vllm_environment):
    """A thinking model (its template opens the thought): GRPO's rollouts are the eval's samples,
    thinking and all (the same split, the same cut thoughts scored the same), and the thinking
    tokens are in the sequence trained on."""
    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.catalog import load_card
    from arlecli.train.run import train_split

    card = ROOT / "benchmarks" / "countdown.yaml"
    loaded = load_card(str(card))
    tasks, _ = load_tasks(loaded, EvalOptions(split=train_split(loaded, None), limit=4, num_fewshot=0))
    evaluated, samples = eval_episodes(card, tiny_thinking_model, backend, 1.0, monkeypatch, tmp_path / "eval")
    assert all(s["thinking_cut"] for s in samples.values())  # its weights never close the thought
    recorder = Recorder(monkeypatch)
    run = tmp_path / "train-grpo"
    _train_one_step(card, tiny_thinking_model, "grpo", backend, run)
    rewards = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert_same(recorder.rows(), evaluated, samples, rewards, tasks)
    for _, _, completion_ids, episode in recorder.rows():
        assert episode.turns[-1].thinking and completion_ids == episode.turns[-1].token_ids
        assert all(
            line["thinking_cut"] and line["details"] == {"no_answer": "the turn ended inside its thinking"}
            for line in rewards
        )
