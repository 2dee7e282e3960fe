"""The textarena env kind itself: card params checked at load, the games extra named when
TextArena is missing, arle's turn cap on a puzzle, each game's own random state, and
`arle eval --opponent` with a model playing the other seat."""

from __future__ import annotations

import json
import random
import sys
from dataclasses import replace

import pytest

from arlecli.catalog import resolve_references
from arlecli.errors import UserError
from arlecli.eval import EvalOptions, run_eval
from arlecli.envs.textarena import Game
from arlecli.catalog import load_card

from helpers.cli import arle
from helpers.scripted_engine import Replies


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"game": "Sokobn-v0"}, "game", "unknown TextArena game 'Sokobn-v0'; did you mean Sokoban-v0"),
        ({"opponent": "randm"}, "opponent", "'randm' is not one of random, scripted, self"),
        ({"max_rounds": 5}, "max_rounds", "is not a param of env 'textarena' (known: game, players, opponent"),
        ({"players": 0}, "players", "must be a whole number >= 1"),
        ({"game_params": [5]}, "game_params", "must be a mapping"),
    ],
)
def test_bad_game_params_fail_at_load_naming_the_field(change, field, message):
    card = load_card("tictactoe")
    bad = replace(card, env_params={**card.env_params, **change})
    with pytest.raises(UserError) as err:
        resolve_references(bad)
    assert f"field 'env.params.{field}': {message}" in str(err.value) and "\n" not in str(err.value)


def test_a_bad_opponent_on_the_command_line_is_one_line_and_leaves_no_run(tmp_path):
    out = arle("eval", "tower_of_hanoi", "--opponent", "random", "--output", str(tmp_path / "run"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "--opponent applies to two-player game cards" in out.stderr and not (tmp_path / "run").exists()


def test_without_textarena_a_game_card_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # import textarena -> ImportError
    with pytest.raises(UserError, match=r"game cards need TextArena: pip install 'arle\[games\]'"):
        resolve_references(load_card("sokoban"))


def test_arle_turn_cap_ends_a_puzzle_scored_by_its_fraction_done(tmp_path):
    """TowerOfHanoi's fraction done counts the disks in place on C from the base up."""
    card = load_card("tower_of_hanoi")
    line = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]"]
    for cap, reward in ((3, 0.0), (4, 1 / 3)):  # after 4 moves the biggest disk sits on C
        capped = replace(card, env_params={**card.env_params, "max_turns": cap})
        run_eval(capped, Replies(line), EvalOptions(limit=1), model="s", run_dir=tmp_path / str(cap))
        [sample] = [json.loads(x) for x in (tmp_path / str(cap) / "samples.jsonl").read_text().splitlines()]
        assert sample["end_reason"] == "turn_limit" and sample["num_turns"] == cap and not sample["correct"]
        assert sample["reward"] == pytest.approx(reward) and sample["env_info"]["reason"] == "arle's turn limit"


def test_each_game_keeps_its_own_random_state():
    """2048 draws a new tile from `random` after every move: two games interleaved move by
    move end exactly as each played alone, and the caller's random stream is untouched."""
    moves = ["[Left]", "[Up]", "[Right]", "[Down]"] * 6

    def board(game):
        return [row[:] for row in game.state.game_state["board"]]

    alone = []
    for seed in (5, 6):
        game = Game("2048-v0-mega-easy", seed)
        for move in moves:
            game.observe()
            game.act(move)
        alone.append(board(game))
    random.seed(99)
    expected_next = random.random()
    random.seed(99)
    a, b = Game("2048-v0-mega-easy", 5), Game("2048-v0-mega-easy", 6)
    for move in moves:
        for game in (a, b):
            game.observe()
            game.act(move)
    assert [board(a), board(b)] == alone and alone[0] != alone[1]
    assert random.random() == expected_next


def test_eval_against_a_model_opponent(tmp_path, tiny_model):
    """`arle eval tictactoe --opponent FOLDER`: the other seat is the tiny model on its own engine."""
    out = arle(
        "eval",
        "tictactoe",
        "--model",
        str(tiny_model),
        "--opponent",
        str(tiny_model),
        "--limit",
        "2",
        "--max-tokens",
        "4",
        "--output",
        str(tmp_path / "run"),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    assert results["games"]["games"] == 2 and set(results["games"]["per_seat"]) == {"0", "1"}
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert all(s["end_reason"] in ("win", "loss", "draw", "invalid_move", "turn_limit") for s in samples)
    assert {s["env_info"]["opponent"] for s in samples} == {"hf"}
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["options"]["opponent"] == str(tiny_model)


def test_a_seat_that_never_moved_is_a_sample_without_turns_and_no_sft_row(tmp_path):
    """Self-play where seat 0 forfeits on its second invalid move: seat 1 wins without a move.
    Its sample has no turns and no prompt, and `arle data from-eval` makes no row of it."""
    from arlecli.envs.textarena import with_opponent
    from arlecli.trajectories import load_runs, trajectories

    card = with_opponent(load_card("tictactoe"), "self")
    run_eval(card, Replies(["no move"]), EvalOptions(limit=1, num_samples=2), model="s", run_dir=tmp_path)
    samples = {s["env_info"]["seat"]: s for s in map(json.loads, (tmp_path / "samples.jsonl").read_text().splitlines())}
    assert samples[0]["end_reason"] == "invalid_move" and samples[0]["num_turns"] == 2
    assert samples[1]["end_reason"] == "win" and samples[1]["num_turns"] == 0 and samples[1]["prompt"] is None
    [run] = load_runs([tmp_path])
    assert [t.sample for t in trajectories(run)] == [samples[0]["sample"]]


def test_bench_show_renders_a_game_cards_first_observation():
    from typer.testing import CliRunner

    from arlecli.cli import main

    main.register_commands()
    out = CliRunner().invoke(main.app, ["bench", "show", "kuhn_poker"], catch_exceptions=False)
    assert out.exit_code == 0 and "Kuhn Poker" in out.output and "Your card is" in out.output
