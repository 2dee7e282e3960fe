"""Two-player game cards (tictactoe, connect_four, kuhn_poker) through `run_eval`, with
scripted engines: the recorded answers lines win and lose as recorded (and are what
tests/helpers/game_players.py computes now), seats alternate against a fixed opponent, the built-in
opponents play legal (scripted: winning, blocking) moves, self-play records both seats of
one game, an engine opponent plays the other seat unrecorded, bad opponents are one-line
errors, and a rerun gives the same samples."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from arlecli.engine.base import Completion
from arlecli.errors import UserError
from arlecli.eval import EvalOptions, run_eval
from arlecli.envs.textarena import Game, builtin_move, model_opponent, with_opponent
from arlecli.catalog import load_card

from helpers import game_players
from helpers.scripted_engine import Replies

GAMES = game_players.CARDS
FIXTURES = game_players.FIXTURES


class Reactive:
    """An engine that plays a game from what it reads: the seat from its first user turn
    ("You are Player k"), the position from all its user turns, the move ranked first by
    game_players (for `want` win or loss), plus `suffix`. It logs (request, reply)."""

    def __init__(self, game: str, want: str = "win", suffix: str = "", name: str = "reactive") -> None:
        self.moves, self.want, self.suffix, self.name = game_players.MOVES[game], want, suffix, name
        self.log: list[tuple[object, str]] = []

    def generate(self, requests):
        for i, request in enumerate(requests):
            users = [m["content"] for m in request.messages if m["role"] == "user"]
            seat = int(re.search(r"You are Player (\d)", users[0]).group(1))
            reply = self.moves("\n\n".join(users), seat, self.want)[0] + self.suffix
            self.log.append((request, reply))
            yield i, Completion(text=reply)

    def close(self) -> None:
        pass


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def stored_answers(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.answers.jsonl").read_text().splitlines() if line.strip()]


def evaluate(card, engine, run_dir: Path, **opts) -> tuple[dict, list[dict]]:
    """run_eval's results and samples (in sample id order)."""
    result = run_eval(card, engine, EvalOptions(**opts), model="scripted", run_dir=run_dir)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return result, sorted(samples, key=lambda s: (s["task_id"], s["sample"]))


def texts(sample: dict) -> list[str]:
    """Everything the recorded seat read, in order: its first prompt, then each observation."""
    out = [m["content"] for m in sample["prompt"] if m["role"] == "user"]
    return out + [m["content"] for turn in sample["turns"] for m in turn["observation"] if m["role"] == "user"]


def played(sample: dict) -> list[str]:
    return [turn["completion"] for turn in sample["turns"]]


def tagged(sample: dict, seat: int) -> list[str]:
    """The moves of player `seat` that the recorded seat read (`[Player k] move` lines)."""
    return [m for t in texts(sample) for m in re.findall(rf"^\[Player {seat}\] (.*)$", t, re.M)]


# --- the recorded answers ---------------------------------------------------------------


@pytest.mark.parametrize("name", GAMES)
def test_recorded_lines_win_and_lose_through_run_eval(name, tmp_path):
    card = load_card(name)
    assert card.env_params["opponent"] == "random"
    for row, answer in zip(rows(name), stored_answers(name), strict=True):
        data = tmp_path / f"{row['id']}.jsonl"
        data.write_text(json.dumps(row) + "\n")
        for key in ("correct", "wrong"):
            _, [s] = evaluate(card, Replies(answer[key]), tmp_path / f"{row['id']}-{key}", data=str(data))
            info = s["env_info"]
            assert info["seat"] == row["seed"] % 2 and info["seed"] == row["seed"] and info["opponent"] == "random"
            assert played(s) == answer[key], f"{row['id']} {key}: the line is not played to its end"
            if key == "correct":
                assert (s["end_reason"], s["correct"], s["reward"], info["invalid_moves"]) == ("win", True, 1.0, 0)
            else:
                assert s["end_reason"] in ("loss", "invalid_move") and not s["correct"] and s["reward"] == -1.0


@pytest.mark.parametrize("name", GAMES)
def test_recorded_lines_are_what_the_players_compute_now(name):
    assert stored_answers(name) == game_players.card_answers(name), (
        f"the game or its opponent plays differently now: rerun `python tests/helpers/game_players.py {name}`"
    )


# --- seats ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GAMES)
def test_seat_alternates_against_a_fixed_opponent(name, tmp_path):
    card = load_card(name)
    result, samples = evaluate(card, Reactive(card.env_params["game"]), tmp_path, split="test", limit=4, num_samples=2)
    assert len(samples) == 8
    for s in samples:
        assert s["env_info"]["seat"] == (s["env_info"]["seed"] + s["sample"]) % 2
        assert s["details"]["seat"] == s["env_info"]["seat"]
    per_seat = result["games"]["per_seat"]
    assert set(per_seat) == {"0", "1"} and sum(v["games"] for v in per_seat.values()) == 8
    for rates in per_seat.values():
        assert rates["win"] + rates["draw"] + rates["loss"] == pytest.approx(1.0)


# --- the built-in opponents -------------------------------------------------------------


def position(game_id: str, moves: list[str], seed: int = 0, **kwargs) -> Game:
    game = Game(game_id, seed, 2, kwargs)
    for move in moves:
        assert not game.act(move), f"{move} refused"
    return game


@pytest.mark.parametrize(
    "moves, expected",
    [
        (["[0]", "[4]", "[1]"], "[2]"),  # X (seat 1) blocks O's 0-1-2
        (["[4]", "[0]", "[2]", "[6]", "[3]", "[8]"], "[5]"),  # O (seat 0) wins 3-4-5 rather than block 6-7-8
        (["[0]"], "[4]"),  # nothing to win or block: the centre
    ],
)
def test_scripted_tictactoe_wins_else_blocks(moves, expected):
    import random

    game = position("TicTacToe-v0", moves)
    seat = game.state.current_player_id
    assert builtin_move("scripted", game, seat, random.Random(0)) == expected
    assert not game.act(expected)


@pytest.mark.parametrize(
    "moves, expected",
    [
        (["[col 0]", "[col 6]", "[col 0]", "[col 5]", "[col 0]"], "[col 0]"),  # O blocks X's column 0
        # O has three in column 6, X three in column 0: O wins rather than block
        (["[col 0]", "[col 6]", "[col 0]", "[col 6]", "[col 1]", "[col 6]", "[col 0]"], "[col 6]"),
    ],
)
def test_scripted_connect_four_wins_else_blocks(moves, expected):
    import random

    game = position("ConnectFour-v0", moves)
    assert builtin_move("scripted", game, game.state.current_player_id, random.Random(0)) == expected
    game.act(expected)
    if expected == "[col 6]":
        assert game.done and game.outcome(1)["outcome"] == "win"


def test_scripted_kuhn_poker_bets_its_best_cards():
    import random

    opens = {"K": "[bet]", "Q": "[check]", "J": "[check]"}
    answers_bet = {"K": "[call]", "Q": "[call]", "J": "[fold]"}
    seen = set()
    for seed in range(12):
        game = position("KuhnPoker-v0", [], seed=seed, max_rounds=5)
        cards = game.state.game_state["player_cards"]
        opener = game.state.current_player_id
        card = "JQK"[cards[opener]]
        assert builtin_move("scripted", game, opener, random.Random(0)) == opens[card]
        assert not game.act("[bet]")
        other = "JQK"[cards[1 - opener]]
        assert builtin_move("scripted", game, 1 - opener, random.Random(0)) == answers_bet[other]
        seen |= {card, other}
    assert seen == {"J", "Q", "K"}


@pytest.mark.parametrize("game_id", ["TicTacToe-v0", "ConnectFour-v0", "KuhnPoker-v0"])
def test_builtin_opponents_only_play_legal_moves(game_id):
    import random

    for seed in range(25):
        game = Game(game_id, seed, 2, {"max_rounds": 5} if game_id == "KuhnPoker-v0" else {})
        players = {0: "random", 1: "random" if seed % 2 else "scripted"}
        rngs = {p: random.Random(f"{seed}:{p}") for p in players}
        moves = 0
        while not game.done:
            pid = game.state.current_player_id
            move = builtin_move(players[pid], game, pid, rngs[pid])
            assert not game.act(move), f"{game_id} seed {seed}: {players[pid]} played {move!r}, refused"
            moves += 1
            assert moves < 100
        assert not any(game.outcome(p).get("invalid_move") for p in (0, 1))


# How these games end when nobody moves invalidly (TextArena 0.7.4's reasons).
GAME_OVER = r"has won!|is a draw|wins by connecting four|won by having more chips|same number of chips|ended in a draw"


def test_random_opponent_never_loses_on_an_invalid_move_in_run_eval(tmp_path):
    """Many games against the seeded random opponent: every one ends on a real result."""
    for name in GAMES:
        card = load_card(name)
        _, samples = evaluate(
            card, Reactive(card.env_params["game"], want="loss"), tmp_path / name, split="test", limit=20
        )
        for s in samples:
            assert s["env_info"]["invalid_moves"] == 0 and re.search(GAME_OVER, s["env_info"]["reason"]), s["id"]
            assert s["end_reason"] in ("win", "draw", "loss")


# --- self-play and engine opponents -----------------------------------------------------


@pytest.mark.parametrize("name", GAMES)
def test_self_play_records_both_seats_of_one_game(name, tmp_path):
    card = with_opponent(load_card(name), "self")
    engine = Reactive(card.env_params["game"])
    result, samples = evaluate(card, engine, tmp_path, split="test", limit=3, num_samples=2)
    assert len(samples) == 6 and result["n_samples"] == 6
    by_task: dict[str, list[dict]] = {}
    for s in samples:
        by_task.setdefault(s["task_id"], []).append(s)
    for pair in by_task.values():
        seat0, seat1 = pair
        assert [s["sample"] for s in pair] == [0, 1] and [s["env_info"]["seat"] for s in pair] == [0, 1]
        assert seat0["env_info"]["seed"] == seat1["env_info"]["seed"]
        assert seat0["env_info"]["game_turns"] == seat1["env_info"]["game_turns"]
        assert {seat0["end_reason"], seat1["end_reason"]} in ({"win", "loss"}, {"draw"})
        assert seat0["reward"] + seat1["reward"] == 0
        for me, other in ((seat0, seat1), (seat1, seat0)):
            # the other seat's moves reach this one tagged, in the order they were played
            seen = tagged(me, other["env_info"]["seat"])
            assert seen and other_moves_prefix(played(other), seen)
    # each request carries only its own seat's replies as assistant turns
    for request, _ in engine.log:
        users = [m["content"] for m in request.messages if m["role"] == "user"]
        seat = int(re.search(r"You are Player (\d)", users[0]).group(1))
        mine = [m["content"] for m in request.messages if m["role"] == "assistant"]
        assert any(texts(p[seat])[0] == users[0] and played(p[seat])[: len(mine)] == mine for p in by_task.values())
    assert set(result["games"]["per_seat"]) == {"0", "1"}


def other_moves_prefix(moves: list[str], tagged: list[str]) -> bool:
    """The tagged moves one seat read are the other seat's moves, all or all but its last
    (a move that ends the game is not shown)."""
    return moves[: len(tagged)] == tagged and len(moves) - len(tagged) in (0, 1)


def test_an_engine_opponent_plays_the_other_seat_unrecorded(tmp_path):
    card = load_card("connect_four")
    other = Reactive("ConnectFour-v0", want="win", suffix=" (other)", name="other-engine")
    me = Reactive("ConnectFour-v0", want="loss")
    with model_opponent("other-engine", other):  # what `arle eval --opponent PROFILE` does with its engine
        result, samples = evaluate(
            with_opponent(card, "other-engine"), me, tmp_path, split="test", limit=2, num_samples=2
        )
    assert len(samples) == 4 and other.log and me.log
    # games: the other engine's requests, by their game's sampling seed (turn k samples with seed + k)
    games: dict[int, list[str]] = {}
    for request, reply in other.log:
        mine = [m["content"] for m in request.messages if m["role"] == "assistant"]
        assert all(m.endswith("(other)") for m in mine) and mine == games.get(request.params.seed - len(mine), [])
        games.setdefault(request.params.seed - len(mine), []).append(reply)
    assert len(games) == 4
    for s in samples:
        assert s["env_info"]["seat"] == (s["env_info"]["seed"] + s["sample"]) % 2
        assert s["env_info"]["opponent"] == "other-engine"
        assert not any("(other)" in c for c in played(s))  # never recorded as the model's
        seen = tagged(s, 1 - s["env_info"]["seat"])
        assert seen and all(m.endswith("(other)") for m in seen)
        assert any(other_moves_prefix(moves, seen) for moves in games.values())
    assert result["n_samples"] == 4


# --- errors -----------------------------------------------------------------------------


def test_unknown_builtin_opponent_is_a_one_line_error(tmp_path):
    card = load_card("tictactoe")
    bad = replace(card, env_params={**card.env_params, "opponent": "randm"})
    with pytest.raises(UserError) as err:
        run_eval(bad, Replies(["[4]"]), EvalOptions(data=str(card.fixture_path)), model="scripted", run_dir=tmp_path)
    assert "randm" in str(err.value) and "\n" not in str(err.value)


def test_with_opponent_refuses_a_one_player_card():
    with pytest.raises(UserError) as err:
        with_opponent(load_card("tower_of_hanoi"), Replies(["[A C]"]))
    assert "tower_of_hanoi" in str(err.value) and "\n" not in str(err.value)


# --- determinism ------------------------------------------------------------------------


def outcome_view(samples: list[dict]) -> list[tuple]:
    return [
        (s["id"], played(s), texts(s), s["end_reason"], s["reward"], {k: v for k, v in s["env_info"].items()})
        for s in samples
    ]


@pytest.mark.parametrize("name", GAMES)
def test_the_same_eval_twice_gives_the_same_samples(name, tmp_path):
    card = load_card(name)
    game = card.env_params["game"]
    _, first = evaluate(card, Reactive(game), tmp_path / "a", split="test", limit=4, num_samples=2)
    _, again = evaluate(card, Reactive(game), tmp_path / "b", split="test", limit=4, num_samples=2)
    assert outcome_view(first) == outcome_view(again)
    # each game keeps its own random state: the first task plays the same alone
    _, alone = evaluate(card, Reactive(game), tmp_path / "c", split="test", limit=1, num_samples=2)
    assert outcome_view(alone) == outcome_view(first)[:2]
