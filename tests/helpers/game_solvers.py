"""Oracle players for the single-player game cards (tests/test_games_single.py).

`solve_<card>(seed)` plays the card's game with `seed` on `arlecli.envs.textarena.Game`, reading
the hidden game state (the room, the mine layout, the secret code, the solution grid; for
2048 a copy of the game with its random state, so the next tile is known), and returns the
replies of a won game, one per turn. Each line is played to its end on the game itself and
checked to be a win, so a line returned here is a verified one.

`LOSERS[card](seed)` returns a lost line (the answers' "wrong" side), each card's three
fixture rows losing three ways (seed % 3): invalid moves, the game's own limit, a reply
with no move.
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from typing import Callable

from arlecli.envs.textarena import Game

# card name -> (TextArena game id, the game's constructor kwargs: the card's env params.game_params)
GAMES: dict[str, tuple[str, dict]] = {
    "tower_of_hanoi": ("TowerOfHanoi-v0", {}),
    "sokoban": ("Sokoban-v0", {}),
    "minesweeper": ("Minesweeper-v0-small", {}),
    "mastermind": ("Mastermind-v0", {}),
    "game_2048": ("2048-v0-mega-easy", {}),
    "crosswords": ("Crosswords-v0", {}),
}


def new_game(card: str, seed: int) -> Game:
    game_id, kwargs = GAMES[card]
    game = Game(game_id, seed, 1, kwargs)
    game.observe()
    return game


def verified(game: Game, replies: list[str]) -> list[str]:
    """`replies`, after checking that they won `game` (already played on it)."""
    assert game.done and game.outcome(0)["outcome"] == "win", (game.id, game.seed, game.outcome(0), replies)
    return replies


def play(game: Game, reply: str, replies: list[str]) -> None:
    """Play `reply` as a valid move of `game` and record it."""
    assert not game.done, (game.id, game.seed, replies)
    invalid = game.act(reply)
    assert not invalid, (game.id, game.seed, reply, game.state.game_info)
    replies.append(reply)


# --- Tower of Hanoi --------------------------------------------------------------------------


def solve_tower_of_hanoi(seed: int) -> list[str]:
    game = new_game("tower_of_hanoi", seed)
    disks = len(game.state.game_state["towers"]["A"])
    moves: list[tuple[str, str]] = []

    def hanoi(n: int, src: str, dst: str, via: str) -> None:
        if n:
            hanoi(n - 1, src, via, dst)
            moves.append((src, dst))
            hanoi(n - 1, via, dst, src)

    hanoi(disks, "A", "C", "B")
    replies: list[str] = []
    for src, dst in moves:
        play(game, f"[{src} {dst}]", replies)
    return verified(game, replies)


# --- Sokoban: breadth-first search over (player, boxes) ----------------------------------------

SOKOBAN_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def sokoban_plan(room_state, room_fixed) -> list[str]:
    """The shortest push sequence that puts every box on a goal (TextArena's codes: 0 wall,
    1 floor, 2 goal, 3 box on goal, 4 box, 5 player)."""
    rows, cols = len(room_fixed), len(room_fixed[0])
    walls = {(r, c) for r in range(rows) for c in range(cols) if room_fixed[r][c] == 0}
    goals = frozenset((r, c) for r in range(rows) for c in range(cols) if room_fixed[r][c] == 2)
    boxes = frozenset((r, c) for r in range(rows) for c in range(cols) if room_state[r][c] in (3, 4))
    [player] = [(r, c) for r in range(rows) for c in range(cols) if room_state[r][c] == 5]

    def inside(p: tuple[int, int]) -> bool:
        return 0 <= p[0] < rows and 0 <= p[1] < cols and p not in walls

    start = (player, boxes)
    parent: dict = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        (pr, pc), bx = state
        if bx <= goals:  # every box on a goal
            path = []
            while parent[state] is not None:
                state, move = parent[state]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in SOKOBAN_MOVES.items():
            step = (pr + dr, pc + dc)
            if not inside(step):
                continue
            nbx = bx
            if step in bx:
                beyond = (step[0] + dr, step[1] + dc)
                if not inside(beyond) or beyond in bx:
                    continue
                nbx = (bx - {step}) | {beyond}
            nxt = (step, nbx)
            if nxt not in parent:
                parent[nxt] = (state, move)
                queue.append(nxt)
    raise AssertionError("no Sokoban solution")


def solve_sokoban(seed: int) -> list[str]:
    game = new_game("sokoban", seed)
    env = game.env
    replies: list[str] = []
    for move in sokoban_plan(env.room_state.tolist(), env.room_fixed.tolist()):
        play(game, f"[{move}]", replies)
    return verified(game, replies)


# --- Minesweeper: a safe first move, then every safe cell the mine layout shows ------------------

MINESWEEPER_FIRST = "[2 2]"


def solve_minesweeper(seed: int) -> list[str]:
    game = new_game("minesweeper", seed)
    env = game.env
    replies: list[str] = []
    play(game, MINESWEEPER_FIRST, replies)  # mines are laid after the first move, away from it
    for r in range(env.rows):
        for c in range(env.cols):
            if env.grid[r][c] != -1 and not env.revealed[r][c] and not game.done:
                play(game, f"[{r} {c}]", replies)
    return verified(game, replies)


def minesweeper_mines(seed: int) -> list[tuple[int, int]]:
    """Where the mines lie after the first move MINESWEEPER_FIRST."""
    game = new_game("minesweeper", seed)
    game.act(MINESWEEPER_FIRST)
    env = game.env
    return [(r, c) for r in range(env.rows) for c in range(env.cols) if env.grid[r][c] == -1]


# --- Mastermind: one probe, then the secret code ------------------------------------------------


def solve_mastermind(seed: int) -> list[str]:
    game = new_game("mastermind", seed)
    secret = game.state.game_state["secret_code"]
    replies: list[str] = []
    probe = [1, 2, 3, 4]
    if probe != secret:
        play(game, "My first guess: [1 2 3 4]", replies)
    play(game, "[" + " ".join(map(str, secret)) + "]", replies)
    return verified(game, replies)


def wrong_codes(seed: int, n: int) -> list[str]:
    """`n` distinct valid guesses none of which is the secret code."""
    game = new_game("mastermind", seed)
    secret = game.state.game_state["secret_code"]
    digits = range(1, game.state.game_state["num_numbers"] + 1)
    codes = (list(p) for p in itertools.permutations(digits, game.state.game_state["code_length"]))
    return ["[" + " ".join(map(str, code)) + "]" for code in itertools.islice((c for c in codes if c != secret), n)]


# --- 2048: one-step lookahead on a copy of the game (its random state included) ----------------

DIRECTIONS_2048 = ("[Down]", "[Left]", "[Right]", "[Up]")


def _score_2048(board: list[list[int]]) -> float:
    """Empty cells, merge chances, and the biggest tile kept in the bottom-left corner."""
    n = len(board)
    empty = sum(v == 0 for row in board for v in row)
    pairs = sum(board[r][c] and (c + 1 < n and board[r][c] == board[r][c + 1]) for r in range(n) for c in range(n))
    pairs += sum(board[r][c] and (r + 1 < n and board[r][c] == board[r + 1][c]) for r in range(n) for c in range(n))
    top = max(max(row) for row in board)
    corner = 2 * top if board[n - 1][0] == top else 0
    weight = sum(board[r][c] * (r + 1) * (n - c) for r in range(n) for c in range(n)) / max(1, top)
    return 10 * empty + 5 * pairs + corner + weight


def solve_game_2048(seed: int, max_moves: int = 200) -> list[str]:
    game = new_game("game_2048", seed)
    replies: list[str] = []
    while not game.done:
        assert len(replies) < max_moves, f"2048 seed {seed}: no win in {max_moves} moves"
        best, best_score = None, None
        for move in DIRECTIONS_2048:
            trial = copy.deepcopy(game)
            if trial.act(move):
                continue
            if trial.done and trial.outcome(0)["outcome"] == "win":
                best, best_score = move, float("inf")
                break
            score = -1e9 if trial.done else _score_2048(trial.state.game_state["board"])
            if best_score is None or score > best_score:
                best, best_score = move, score
        assert best is not None, f"2048 seed {seed}: no legal move"
        play(game, best, replies)
    return verified(game, replies)


# --- Crosswords: one letter of the solution a turn -----------------------------------------------


def solve_crosswords(seed: int) -> list[str]:
    game = new_game("crosswords", seed)
    state = game.state.game_state
    replies: list[str] = []
    for r, row in enumerate(state["solution"]):
        for c, letter in enumerate(row):
            if letter != "." and state["board"][r][c] == "_":
                play(game, f"[{r} {c} {letter.upper()}]", replies)
    return verified(game, replies)


def crosswords_wrong_letter(seed: int) -> str:
    """A guess with a wrong letter for the first open cell."""
    game = new_game("crosswords", seed)
    solution = game.state.game_state["solution"]
    r, c = next((r, c) for r, row in enumerate(solution) for c, x in enumerate(row) if x != ".")
    wrong = "Q" if solution[r][c].upper() != "Q" else "Z"
    return f"[{r} {c} {wrong}]"


SOLVERS: dict[str, Callable[[int], list[str]]] = {
    "tower_of_hanoi": solve_tower_of_hanoi,
    "sokoban": solve_sokoban,
    "minesweeper": solve_minesweeper,
    "mastermind": solve_mastermind,
    "game_2048": solve_game_2048,
    "crosswords": solve_crosswords,
}


# --- losing lines (the answers' "wrong" side) ----------------------------------------------------


def sokoban_shuffle(seed: int) -> list[str]:
    """Step back and forth between two free floor cells until the game's move limit."""
    game = new_game("sokoban", seed)
    env = game.env
    r, c = (int(x) for x in env.player_position)
    back = {"up": "down", "down": "up", "left": "right", "right": "left"}
    for move, (dr, dc) in SOKOBAN_MOVES.items():
        if env.room_state[r + dr][c + dc] in (1, 2):  # free floor or an empty goal: no push
            return [f"[{move}]" if i % 2 == 0 else f"[{back[move]}]" for i in range(env.max_turns + 1)]
    raise AssertionError(f"sokoban seed {seed}: the player cannot step anywhere without a push")


def sokoban_wall(seed: int) -> list[str]:
    """Walk into a wall twice: a warning, then the game is lost."""
    game = new_game("sokoban", seed)
    r, c = (int(x) for x in game.env.player_position)
    move = next(m for m, (dr, dc) in SOKOBAN_MOVES.items() if game.env.room_fixed[r + dr][c + dc] == 0)
    return [f"I will go {move}. [{move}]", f"[{move}]"]


def lose_sokoban(seed: int) -> list[str]:
    return [sokoban_wall, sokoban_shuffle, lambda s: ["I think I should push the box up.", "Up!"]][seed % 3](seed)


def lose_minesweeper(seed: int) -> list[str]:
    mines = minesweeper_mines(seed)
    return [
        lambda: [MINESWEEPER_FIRST, *(f"[{r} {c}]" for r, c in mines[:2])],  # two mines in a row
        lambda: [MINESWEEPER_FIRST, MINESWEEPER_FIRST],  # an opened cell, again
        lambda: [MINESWEEPER_FIRST, "I reveal row 0, column 0."],
    ][seed % 3]()


def lose_mastermind(seed: int) -> list[str]:
    return [
        lambda: wrong_codes(seed, 21),  # the guess limit runs out
        lambda: ["[1 1 2 2]", "[3 3 4 4]"],  # repeated digits
        lambda: wrong_codes(seed, 1) * 3,
    ][seed % 3]()  # the same guess again


def lose_game_2048(seed: int) -> list[str]:
    return [["[Up]"], ["I slide everything to the left."], ["[Left]", "[Right]"]][seed % 3]


def crosswords_black_cell(seed: int) -> str:
    board = new_game("crosswords", seed).state.game_state["board"]
    r, c = next((r, c) for r, row in enumerate(board) for c, x in enumerate(row) if x == ".")
    return f"[{r} {c} A]"


def lose_crosswords(seed: int) -> list[str]:
    solved = solve_crosswords(seed)
    return [
        lambda: [crosswords_wrong_letter(seed)] * 2,  # a wrong letter, twice
        lambda: [crosswords_black_cell(seed), "[99 99 A]"],  # a black cell, then off the grid
        lambda: [*solved[:3], crosswords_wrong_letter(seed)],
    ][seed % 3]()  # three letters, then wrong ones


LOSERS: dict[str, Callable[[int], list[str]]] = {
    "sokoban": lose_sokoban,
    "minesweeper": lose_minesweeper,
    "mastermind": lose_mastermind,
    "game_2048": lose_game_2048,
    "crosswords": lose_crosswords,
}
