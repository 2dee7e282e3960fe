"""The catalog: every packaged card's whole path runs offline from its fixture.

Each card ships `benchmarks/fixtures/<name>.jsonl` (3-5 rows in the dataset's real schema)
and `benchmarks/fixtures/<name>.answers.jsonl`: one line per fixture row,
`{"correct": <a completion the card must score correct>, "wrong": <a plausible wrong one>}`;
for a multi-turn card an answer may be a list of replies, one per turn, which the card's own
env plays (a game: the moves of a won game and of a lost one).
The reference answers go through the card's own transform, prompt and reward, the same
code `arle eval` and `arle train` run, so a card with a broken field map, transform or
reward parameter fails here.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from arlecli.cards import Card, render_prompt
from arlecli.data.sources import read_rows_file, tasks_from_rows
from arlecli.eval import EvalOptions, run_eval
from arlecli.catalog import list_cards, resolve_references
from arlecli.rewards import get_reward
from arlecli.types import Episode, Task, Turn

from helpers.scripted_engine import Replies

CARDS = list_cards()
OFFLINE_KINDS = ("package", "generator")


def answers_path(card: Card) -> Path:
    assert card.fixture_path is not None, f"{card.name}: add `fixture: fixtures/{card.name}.jsonl`"
    return card.fixture_path.with_name(card.fixture_path.stem + ".answers.jsonl")


def fixture_tasks(card: Card) -> list[Task]:
    rows = read_rows_file(card.fixture_path)
    assert 3 <= len(rows) <= 5, f"{card.name}: a fixture holds 3-5 rows, found {len(rows)}"
    return tasks_from_rows(card, rows, "fixture")


def test_catalog_has_at_least_fifty_named_cards():
    from typer.testing import CliRunner

    from arlecli.cli import main

    main.register_commands()
    out = CliRunner().invoke(main.app, ["bench", "list", "--json"], catch_exceptions=False)
    listed = json.loads(out.output)
    assert len({c["name"] for c in listed}) >= 50 and len(listed) == len(CARDS)
    assert all(c["source"] and c["reward"] and c["category"] for c in listed)


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.name)
def test_reference_answers_score_correct_and_wrong_answers_do_not(card: Card, request):
    if card.reward == "judge":  # graded by a model: a stand-in judge on the fake server (tests/helpers/fake_judge.py)
        from helpers.fake_judge import judge_profile

        stack = contextlib.ExitStack()
        request.addfinalizer(stack.close)
        stack.enter_context(judge_profile(card.reward_params["model"]))
    resolve_references(card)
    tasks = fixture_tasks(card)
    path = answers_path(card)
    assert path.is_file(), f"{card.name}: add {path.relative_to(path.parents[1])}"
    answers = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(answers) == len(tasks), f"{card.name}: one answers line per fixture row"
    score = get_reward(card.reward, card.reward_params)
    for task, answer in zip(tasks, answers):
        prompt = render_prompt(card.prompt, task)
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        assert task.input and task.input in text, f"{card.name}/{task.id}: the prompt lost the input"
        right, wrong = (
            score(
                task,
                played(card, task, answer[key])
                if isinstance(answer[key], list)
                else Episode(task.id, [Turn(prompt=prompt, completion=answer[key])]),
            )
            for key in ("correct", "wrong")
        )
        assert right.correct and right.reward > 0, f"{card.name}/{task.id}: reference scored {right}"
        assert not wrong.correct, f"{card.name}/{task.id}: wrong answer scored {wrong}"
        for metric in card.metrics:
            if metric != "accuracy" and not metric.startswith("pass@"):
                assert metric in right.details, f"{card.name}: metric {metric} is not a detail of {card.reward}"


def played(card: Card, task: Task, replies: list[str]) -> Episode:
    """The episode the card's env plays when the model's turns are `replies`, in order."""
    from arlecli.envs.episodes import Sampling, collect

    [(_, episode)] = list(collect(card, Replies(replies), [task], [], [(0, 0)], Sampling(seed=0)))
    return episode


@pytest.fixture(scope="module")
def tiny_engine(tiny_model):
    from arlecli.engine.hf import HFEngine

    return HFEngine(str(tiny_model), batch_size=8)


@pytest.mark.parametrize("card", [c for c in CARDS if c.source.kind in OFFLINE_KINDS], ids=lambda c: c.name)
def test_offline_card_runs_end_to_end_on_the_tiny_model(card: Card, tiny_engine, tmp_path):
    opts = EvalOptions(limit=2, max_tokens=8)
    result = run_eval(card, tiny_engine, opts, model="tiny", run_dir=tmp_path / card.name)
    assert result["n_tasks"] == 2
    samples = (tmp_path / card.name / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 and all(json.loads(s)["completion"] is not None for s in samples)
