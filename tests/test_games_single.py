"""Single-player game cards (tower_of_hanoi, sokoban, minesweeper, mastermind, game_2048,
crosswords): the recorded lines in each card's answers file are what the oracle players of
tests/helpers/game_solvers.py find (so fixtures cannot rot when the game changes), and `arle eval`'s
code path plays them through the card: won lines score correct with end_reason 'win', lost
ones do not, and a garbage reply twice loses on an invalid move."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from arlecli.data.generators import generate_rows
from arlecli.data.sources import read_rows_file
from arlecli.engine.base import Completion
from arlecli.envs.episodes import sample_seed
from arlecli.eval import EvalOptions, run_eval
from arlecli.catalog import load_card

from helpers.game_solvers import GAMES, LOSERS, SOLVERS

FIXTURES = Path(__file__).resolve().parents[1] / "benchmarks" / "fixtures"
CARDS = tuple(SOLVERS)
SEED = EvalOptions().seed


class LineAgent:
    """An engine that replays lines[task id]: turn k of a task's game gets its line's k-th
    reply (the last one repeats; a task with no line gets `default`). The task is known from
    the request's sampling seed: a sample's seed (envs/episodes.sample_seed of the run's seed,
    the task id and the sample number) plus the turn."""

    name = "scripted"

    def __init__(self, lines: dict[str, list[str]], default: list[str] | None = None) -> None:
        self.by_seed = {sample_seed(SEED, task_id, 0): line for task_id, line in lines.items()}
        self.default = default

    def generate(self, requests):
        for i, request in enumerate(requests):
            turn = sum(m["role"] == "assistant" for m in request.messages or [])
            line = self.by_seed.get(request.params.seed - turn, self.default)
            assert line is not None, "a request for a task with no line"
            yield i, Completion(text=line[min(turn, len(line) - 1)])

    def close(self) -> None:
        pass


def rows(card: str) -> list[dict]:
    return read_rows_file(FIXTURES / f"{card}.jsonl")


def answers(card: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{card}.answers.jsonl").read_text().splitlines() if line.strip()]


def moves(line: list[str]) -> list[str]:
    """Each reply's move: its last bracketed group (what the games read), or the reply."""
    return [(re.findall(r"\[[^\[\]]*\]", reply) or [reply])[-1] for reply in line]


def evaluate(card_name: str, agent: LineAgent, run_dir: Path, **opts) -> tuple[list[dict], dict]:
    """run_eval of the card (`arle eval`'s code path): its samples and results.json."""
    card = load_card(card_name)
    run_eval(card, agent, EvalOptions(num_fewshot=0, **opts), model="scripted", run_dir=run_dir)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return samples, json.loads((run_dir / "results.json").read_text())


@pytest.mark.parametrize("card_name", CARDS)
def test_card_plays_the_game_its_fixture_and_solver_name(card_name):
    card = load_card(card_name)
    game_id, kwargs = GAMES[card_name]
    assert card.env == "textarena" and card.reward == "game"
    assert card.env_params["game"] == card.source.params["game"] == game_id
    assert card.env_params.get("game_params", {}) == kwargs
    assert rows(card_name) == generate_rows("textarena", seed=31337, size=3, params={"game": game_id})
    assert card.source.splits["test"]["seed"] == 1000 and card.source.splits["train"]["seed"] == 0


@pytest.mark.parametrize("card_name", CARDS)
def test_recorded_lines_are_the_solvers_wins_and_lose(card_name):
    for row, answer in zip(rows(card_name), answers(card_name), strict=True):
        solved = SOLVERS[card_name](row["seed"])
        assert moves(answer["correct"]) == moves(solved), f"{card_name} seed {row['seed']}: the game changed"
        if card_name in LOSERS:
            assert answer == {"correct": solved, "wrong": LOSERS[card_name](row["seed"])}


@pytest.mark.parametrize("card_name", CARDS)
def test_eval_scores_won_games_correct_and_lost_games_wrong(card_name, tmp_path):
    data = str(FIXTURES / f"{card_name}.jsonl")
    ids = [row["id"] for row in rows(card_name)]
    lines = answers(card_name)

    right, results = evaluate(
        card_name, LineAgent({i: a["correct"] for i, a in zip(ids, lines)}), tmp_path / "right", data=data
    )
    assert sorted(s["task_id"] for s in right) == sorted(ids)
    for sample in right:
        assert sample["correct"] and sample["reward"] == 1.0 and sample["end_reason"] == "win", sample
        line = lines[ids.index(sample["task_id"])]["correct"]
        assert sample["env_info"]["turns"] == len(line) and sample["env_info"]["invalid_moves"] == 0
    games = results["games"]
    assert games["games"] == 3 and games["per_seat"]["0"]["win"] == 1.0 and games["invalid_move_rate"] == 0
    assert results["metrics"]["accuracy"]["value"] == 1.0 and results["metrics"]["invalid_move"]["value"] == 0

    wrong, results = evaluate(
        card_name, LineAgent({i: a["wrong"] for i, a in zip(ids, lines)}), tmp_path / "wrong", data=data
    )
    assert len(wrong) == 3
    for sample in wrong:
        assert not sample["correct"] and sample["end_reason"] in ("invalid_move", "turn_limit", "loss"), sample
        assert 0 <= sample["reward"] < 1
    assert results["games"]["games"] == 3 and results["games"]["per_seat"]["0"]["win"] == 0
    assert results["metrics"]["accuracy"]["value"] == 0


@pytest.mark.parametrize("card_name", CARDS)
def test_a_garbage_reply_twice_loses_on_an_invalid_move(card_name, tmp_path):
    samples, results = evaluate(card_name, LineAgent({}, default=["I am not sure what to do here."]), tmp_path, limit=2)
    assert len(samples) == 2
    for sample in samples:
        assert not sample["correct"] and sample["end_reason"] == "invalid_move", sample
        info = sample["env_info"]
        assert info["invalid_moves"] == 2 and info["turns"] == 2 and info["invalid_move"] is True
        assert info["seed"] in (1000, 1001)  # the default split: the test split, seeds from 1000
    assert results["games"]["invalid_move_rate"] == 1.0
