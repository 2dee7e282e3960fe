"""Test-side players for the two-player game cards (tictactoe, connect_four, kuhn_poker).

They compute the recorded answers lines of benchmarks/fixtures/<card>.answers.jsonl: a won
and a lost line of replies, one per model turn, for a fixture row played the way
tests/test_catalog.py plays it (sample 0: seat = seed % 2, against the card's default,
seeded opponent). Every line is found by playing the real game through the card's own env
(`explore` replays a prefix of replies from the start: games are deterministic given the
seed and the replies), so a line is verified by construction; `answers` recomputes all of a
card's lines, and tests/test_games_two_player.py checks the stored files equal them.

    python tests/helpers/game_players.py      # rewrite the three answers files
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from arlecli.engine.base import Completion
from arlecli.envs.episodes import Sampling, collect
from arlecli.envs.textarena import four_in_a_row
from arlecli.types import Episode, Task

CARDS = ("tictactoe", "connect_four", "kuhn_poker")
FIXTURES = Path(__file__).resolve().parents[2] / "benchmarks" / "fixtures"


class _Needs(Exception):
    """The game wants a reply past the prefix: `observation` is everything the player has
    read so far (its user turns, joined), the latest last."""

    def __init__(self, observation: str) -> None:
        self.observation = observation


class _Prefix:
    """An engine that plays `replies` in order, then stops the game at the next turn."""

    name = "prefix"

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies

    def generate(self, requests):
        for i, request in enumerate(requests):
            messages = request.messages or []
            turn = sum(m["role"] == "assistant" for m in messages)
            if turn >= len(self.replies):
                raise _Needs("\n\n".join(m["content"] for m in messages if m["role"] == "user"))
            yield i, Completion(text=self.replies[turn])


def explore(card: Any, task: Task, replies: list[str], sample: int = 0) -> Episode | str:
    """Play `replies` as sample `sample` of `task`: the Episode if the game ended within them,
    else all the player has read when it must answer next (its user turns, joined)."""
    try:
        [(_, episode)] = list(collect(card, _Prefix(replies), [task], [], [(0, sample)], Sampling(seed=0)))
    except _Needs as need:
        return need.observation
    return episode


def seat_of(task: Task, sample: int = 0) -> int:
    """The recorded seat against a fixed opponent (envs/textarena.py): (seed + sample) % 2."""
    return (int(task.fields["seed"]) + sample) % 2


# --- reading observations ---------------------------------------------------------------


def tictactoe_cells(observation: str) -> list[str]:
    """The 9 cells of the last board shown: 'X', 'O' or '' (free)."""
    block = observation.rsplit("Current Board:", 1)[1]
    rows = [line for line in block.splitlines() if "|" in line][:3]
    cells = [c.strip() for row in rows for c in row.split("|")]
    return ["" if c.isdigit() else c for c in cells]


def connect_four_board(observation: str) -> list[list[str]]:
    """The rows (top first) of the last board shown, '.' empty."""
    block = observation.rsplit("Board state:", 1)[1].strip().splitlines()
    return [line.split() for line in block[2:8]]


def kuhn_state(observation: str) -> tuple[str, list[str]]:
    """(this round's card J/Q/K, the legal actions) from the last lines shown."""
    card = re.findall(r"Your card is: '([JQK])'", observation)[-1]
    legal = re.findall(r"'\[(\w+)\]'", observation.rsplit("Your available actions are:", 1)[1].splitlines()[0])
    return card, legal


# --- move orderings: the most promising reply first (for a win or, losing, for a loss) -----

LINES3 = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def tictactoe_moves(observation: str, seat: int, want: str) -> list[str]:
    cells = tictactoe_cells(observation)
    mine = "X" if seat == 1 else "O"  # TextArena: player 1 plays X, player 0 plays O
    theirs = "O" if mine == "X" else "X"

    def completes(cell: int, who: str) -> bool:
        return any(cell in line and [cells[i] for i in line].count(who) == 2 for line in LINES3)

    free = [i for i, c in enumerate(cells) if c == ""]
    if want == "win":  # win, block, centre, corners, edges
        rank = {c: k for k, c in enumerate((4, 0, 2, 6, 8, 1, 3, 5, 7))}
        order = sorted(free, key=lambda c: (not completes(c, mine), not completes(c, theirs), rank[c]))
    else:  # never win, never block
        order = sorted(free, key=lambda c: (completes(c, mine), completes(c, theirs), c))
    return [f"[{c}]" for c in order]


def _drop(board: list[list[str]], col: int) -> int | None:
    rows = [r for r in range(len(board)) if board[r][col] == "."]
    return max(rows) if rows else None


def _wins(board: list[list[str]], col: int, disc: str) -> bool:
    r = _drop(board, col)
    if r is None:
        return False
    board[r][col] = disc
    won = four_in_a_row(board, r, col)
    board[r][col] = "."
    return won


def connect_four_moves(observation: str, seat: int, want: str) -> list[str]:
    """Win, else block, else a column that gives the opponent no win on top, nearest the centre."""
    board = connect_four_board(observation)
    mine = "X" if seat == 0 else "O"  # TextArena: player 0 drops X
    theirs = "O" if mine == "X" else "X"
    cols = [c for c in range(len(board[0])) if board[0][c] == "."]

    def gives(col: int) -> bool:  # the opponent could win on the cell above
        r = _drop(board, col)
        board[r][col] = mine
        bad = _wins(board, col, theirs)
        board[r][col] = "."
        return bad

    centre = len(board[0]) // 2
    order = sorted(
        cols, key=lambda c: (not _wins(board, c, mine), not _wins(board, c, theirs), gives(c), abs(c - centre), c)
    )
    return [f"[col {c}]" for c in order]


KUHN_PLAN = {
    "win": {"K": ("bet", "call", "check"), "Q": ("check", "call", "bet"), "J": ("check", "fold", "bet")},
    "loss": {"K": ("fold", "check", "call"), "Q": ("fold", "bet", "check"), "J": ("bet", "call", "check")},
}


def kuhn_poker_moves(observation: str, seat: int, want: str) -> list[str]:
    card, legal = kuhn_state(observation)
    order = [a for a in KUHN_PLAN[want][card] if a in legal] + sorted(set(legal) - set(KUHN_PLAN[want][card]))
    return [f"[{a}]" for a in order]


MOVES: dict[str, Callable[[str, int, str], list[str]]] = {
    "TicTacToe-v0": tictactoe_moves,
    "ConnectFour-v0": connect_four_moves,
    "KuhnPoker-v0": kuhn_poker_moves,
}


# --- the search -------------------------------------------------------------------------


def line(card: Any, task: Task, want: str, budget: int = 2000) -> list[str] | None:
    """A line of replies with which the fixture's seat ends the game with outcome `want`
    (win or loss), only legal moves, found depth first in the order the game's player ranks
    them (with a budget of `budget` replays); None if there is none within the budget."""
    moves = MOVES[card.env_params["game"]]
    seat, left = seat_of(task), [budget]

    def search(prefix: list[str]) -> list[str] | None:
        if left[0] <= 0:
            return None
        left[0] -= 1
        got = explore(card, task, prefix)
        if isinstance(got, Episode):
            ok = got.info["outcome"] == want and not got.info["invalid_moves"]
            return prefix if ok else None
        for move in moves(got, seat, want):
            found = search([*prefix, move])
            if found is not None:
                return found
        return None

    return search([])


INVALID = {
    "TicTacToe-v0": ["[9]", "[9]"],
    "ConnectFour-v0": ["[col 7]", "[col 7]"],
    "KuhnPoker-v0": ["[raise]", "[raise]"],
}


def answers(card: Any, tasks: list[Task]) -> list[dict[str, list[str]]]:
    """One answers line per task: `correct` a won line, `wrong` a lost one: legal moves that
    lose where the search finds them (tictactoe, kuhn_poker), else two invalid moves."""
    game = card.env_params["game"]
    out = []
    for task in tasks:
        won = line(card, task, "win")
        assert won is not None, f"{card.name}/{task.id}: no winning line found"
        lost = INVALID[game] if game == "ConnectFour-v0" else line(card, task, "loss")
        out.append({"correct": won, "wrong": lost or INVALID[game]})
    return out


def card_answers(name: str) -> list[dict[str, list[str]]]:
    """The answers lines of card `name`'s fixture, computed now."""
    from arlecli.data.sources import read_rows_file, tasks_from_rows
    from arlecli.catalog import load_card

    card = load_card(name)
    return answers(card, tasks_from_rows(card, read_rows_file(card.fixture_path), "fixture"))


def write_answers(name: str) -> Path:
    path = FIXTURES / f"{name}.answers.jsonl"
    path.write_text("".join(json.dumps(a) + "\n" for a in card_answers(name)))
    return path


if __name__ == "__main__":
    for name in sys.argv[1:] or CARDS:
        print(write_answers(name))
