"""FrozenLake as a text game: gymnasium's FrozenLake (not slippery), one board per task.

The board is a task's `map` column, gymnasium's own `desc` rows (`["SFFF", "FHFH", ...]`:
S start, F frozen, H hole, G goal), as the `frozenlake` generator makes them with
`gymnasium.envs.toy_text.frozen_lake.generate_random_map`. The moves run on gymnasium's
`FrozenLakeEnv(is_slippery=False)`, so the dynamics are gymnasium's (a move into the edge
leaves the player where it is).

Each turn the model sees the board with its position marked `P` and replies with a move:
one of left, down, right, up inside `<answer></answer>` (e.g. `<answer>down</answer>`);
a bare reply that is only move words is read too, and several moves separated by spaces
are taken in order. A reply with no readable move is an error observation (the turn is
used). Falling into a hole ends the episode ("fell_in_hole"), so does reaching the goal
("reached_goal"). The turn limit defaults to twice the corner-to-corner distance,
4 * (size - 1) turns (12 on 4x4, 20 on 6x6): a shortest path fits twice over, one move
per turn.

    env: {name: frozenlake, params: {max_turns: 12}}

`episode.info` holds reached_goal, fell_in_hole, the path taken, the position and the
count of invalid replies; the `frozenlake` reward reads the outcome from there.
"""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any

from arlecli.envs import Step, register_env
from arlecli.cards import render_prompt
from arlecli.data.generators import generator
from arlecli.errors import UserError
from arlecli.rewards import RewardFn, register
from arlecli.rewards.procedural import answer_tag
from arlecli.types import Episode, Score, Task

# gymnasium's action ids
MOVES = {"left": 0, "down": 1, "right": 2, "up": 3}
_DELTAS = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
MOVE_FORMAT = "one of left, down, right, up inside <answer></answer> tags, e.g. <answer>down</answer>"


def parse_moves(text: str) -> tuple[list[str], str | None]:
    """The moves a reply gives: the words of its last `<answer>` tag, else of the whole
    reply. Returns (moves, None), or ([], why) when a word is not a move or none is given."""
    tagged = answer_tag(text)
    body = tagged if tagged is not None else text
    words = re.findall(r"[a-z]+", body.lower())
    if not words:
        return [], "no move given"
    bad = [w for w in words if w not in MOVES]
    if bad:
        # Prose around a bare move ("I go down") is not a move: the format asks for a tag.
        return [], f"'{bad[0]}' is not a move"
    return words, None


def render_board(rows: list[str], position: tuple[int, int]) -> str:
    """The board as a grid with 1-based row/column numbers and the player marked P."""
    size = len(rows[0])
    lines = ["  " + " ".join(str(c + 1) for c in range(size))]
    for r, row in enumerate(rows):
        cells = ["P" if (r, c) == position else tile for c, tile in enumerate(row)]
        lines.append(f"{r + 1} " + " ".join(cells))
    return "\n".join(lines)


def where(position: tuple[int, int]) -> str:
    """The position in words, 1-based as the board shows it."""
    return f"row {position[0] + 1}, column {position[1] + 1}"


def question(rows: list[str]) -> str:
    """The task text for a board: the rules and the starting board."""
    n = len(rows)
    return (
        f"You are on a frozen lake, a {n}x{n} grid. S is the start, F is frozen ice (safe), "
        "H is a hole (falling in ends the game) and G is the goal; P marks where you are. "
        "You move one square at a time: left, down, right or up. The ice is not slippery; "
        "moving into the edge leaves you where you are.\n\n"
        f"{render_board(rows, (0, 0))}\n\nYou are at {where((0, 0))}. Reach G without falling into a hole."
    )


def shortest_path(rows: list[str]) -> list[str]:
    """A shortest list of moves from S to G avoiding holes (BFS); [] if G is unreachable."""
    n = len(rows)
    start = next((r, c) for r in range(n) for c in range(n) if rows[r][c] == "S")
    came: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if rows[cell[0]][cell[1]] == "G":
            path = []
            while came[cell] is not None:
                cell, move = came[cell]  # type: ignore[misc]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in _DELTAS.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and nxt not in came and rows[nxt[0]][nxt[1]] != "H":
                came[nxt] = (cell, move)
                queue.append(nxt)
    return []


class Lake:
    """One game on gymnasium's FrozenLakeEnv (not slippery): moves, position, outcome."""

    def __init__(self, rows: list[str]) -> None:
        from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

        if not rows or any(len(r) != len(rows[0]) for r in rows):
            raise UserError(f"frozenlake: the map must be equal-length rows of S/F/H/G, got {rows!r}")
        self.rows = list(rows)
        self.size = len(rows[0])
        self.game = FrozenLakeEnv(desc=self.rows, is_slippery=False)
        state, _ = self.game.reset(seed=0)  # not slippery: the seed changes nothing
        self.position = divmod(int(state), self.size)
        self.path: list[str] = []
        self.reached_goal = self.fell_in_hole = False

    @property
    def over(self) -> bool:
        """Whether the game has ended (goal or hole)."""
        return self.reached_goal or self.fell_in_hole

    def move(self, name: str) -> bool:
        """Take one move; returns False when the edge stopped it. No-op once the game is over."""
        if self.over:
            return True
        state, reward, terminated, _, _ = self.game.step(MOVES[name])
        before, self.position = self.position, divmod(int(state), self.size)
        self.path.append(name)
        if terminated:
            self.reached_goal = reward > 0
            self.fell_in_hole = not self.reached_goal
        return self.position != before

    def play(self, moves: list[str]) -> list[str]:
        """Take `moves` in order until the game ends; returns the moves the edge stopped."""
        blocked = []
        for name in moves:
            if self.over:
                break
            if not self.move(name):
                blocked.append(name)
        return blocked

    def outcome(self) -> dict[str, Any]:
        """What a reward needs: the outcome, the path and the final position (1-based)."""
        return {
            "reached_goal": self.reached_goal,
            "fell_in_hole": self.fell_in_hole,
            "path": list(self.path),
            "position": [self.position[0] + 1, self.position[1] + 1],
        }


def replay(rows: list[str], completions: list[str]) -> Lake:
    """The game the env would have played on these replies (invalid replies skipped)."""
    lake = Lake(rows)
    for text in completions:
        moves, error = parse_moves(text)
        if error is None:
            lake.play(moves)
        if lake.over:
            break
    return lake


class FrozenLakeTextEnv:
    """The card's prompt with the starting board, then one board per reply until the end."""

    tools: list[dict[str, Any]] | None = None

    def __init__(self, card: Any, task: Task, exemplars: list[Task], max_turns: int | None = None) -> None:
        rows = task.fields.get("map")
        if not isinstance(rows, list):
            raise UserError(f"{card.name}: env 'frozenlake' needs a 'map' column (rows of S/F/H/G) in the task")
        self.lake = Lake([str(r) for r in rows])
        self.max_turns = max_turns or 4 * (self.lake.size - 1)
        self.card, self.task, self.exemplars = card, task, exemplars
        self.invalid = 0

    def reset(self) -> list[dict[str, Any]]:
        rendered = render_prompt(self.card.prompt, self.task, self.exemplars)
        if isinstance(rendered, str):
            raise UserError(f"{self.card.name}: env 'frozenlake' needs a chat card (prompt.format: chat)")
        return rendered

    def step(self, completion: str) -> Step:
        moves, error = parse_moves(completion)
        if error is not None:
            self.invalid += 1
            return self._say(
                f"Invalid move: {error}. Reply with {MOVE_FORMAT}.\n\n"
                f"{render_board(self.lake.rows, self.lake.position)}\n\n"
                f"You are still at {where(self.lake.position)}."
            )
        blocked = self.lake.play(moves)
        if self.lake.reached_goal:
            return Step(self._say("You reached the goal.").messages, done=True, reason="reached_goal")
        if self.lake.fell_in_hole:
            return Step(self._say("You fell into a hole.").messages, done=True, reason="fell_in_hole")
        note = f" (the edge stopped: {', '.join(blocked)})" if blocked else ""
        return self._say(
            f"You moved {', '.join(moves)}{note}.\n\n"
            f"{render_board(self.lake.rows, self.lake.position)}\n\n"
            f"You are at {where(self.lake.position)}. Your next move?"
        )

    def info(self) -> dict[str, Any]:
        return {**self.lake.outcome(), "invalid_moves": self.invalid}

    @staticmethod
    def _say(text: str) -> Step:
        return Step([{"role": "user", "content": text}])


@register_env("frozenlake")
def frozenlake_env(
    card: Any, task: Task, exemplars: list[Task], native_tools: bool, max_turns: int | None = None
) -> FrozenLakeTextEnv:
    """Env factory for `env: {name: frozenlake, params: {max_turns: N}}` (see the module doc)."""
    return FrozenLakeTextEnv(card, task, exemplars, max_turns)


# The reward ------------------------------------------------------------------------------
# Beside the env whose rules it replays (an episode scored outside the env).


@register("frozenlake", metrics=["reached_goal", "fell_in_hole", "moves"], fields=["map"])
def frozenlake() -> RewardFn:
    """FrozenLake: 1 when the player reached the goal, else 0.

    The outcome is the env's (`episode.info["reached_goal"]`, written by the env above).
    An episode without it (scored outside the env: a single completion, as the catalog test
    scores reference answers) is replayed: the moves of every turn, parsed as the env parses
    them, are played on the task's `map` in order, so a reply that spells out a whole path
    (`<answer>down down right ...</answer>`) is scored exactly as the env would play it.

    Takes no params. Details: reached_goal (0/1), fell_in_hole (0/1), moves (the number
    taken). `extracted` is the path taken, space-separated.
    """

    def score(task: Task, episode: Episode) -> Score:
        outcome = episode.info if "reached_goal" in episode.info else _replayed(task, episode)
        reached = bool(outcome.get("reached_goal"))
        path = list(outcome.get("path") or [])
        details = {
            "reached_goal": int(reached),
            "fell_in_hole": int(bool(outcome.get("fell_in_hole"))),
            "moves": len(path),
        }
        return Score(float(reached), reached, " ".join(path), details)

    return score


def _replayed(task: Task, episode: Episode) -> dict[str, Any]:
    rows = task.fields.get("map")
    if not isinstance(rows, list):
        raise ValueError(f"task {task.id}: the frozenlake reward needs the task's 'map' column")
    return replay([str(r) for r in rows], [t.completion for t in episode.turns]).outcome()


# FrozenLake ------------------------------------------------------------------------------
# Boards from gymnasium's own generator (a random map with a path from S to G, each tile
# frozen with probability p); this env plays them. Small boards repeat across
# seeds (a 4x4 board has 14 free tiles and most have no more than two holes), so train and
# test share some 4x4 boards; 6x6 boards rarely repeat.


@generator("frozenlake")
def frozenlake_rows(*, seed: int, size: int, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`size` FrozenLake boards (see generate_rows): params `sizes` (board sides to draw
    from, default [4, 6]) and `p` (probability a tile is frozen, default 0.8, >= 0.5 so
    gymnasium's rejection sampling finds a solvable board quickly)."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    cfg = {"sizes": [4, 6], "p": 0.8, **(params or {})}
    unknown = sorted(set(cfg) - {"sizes", "p"})
    if unknown:
        raise UserError(f"unknown params for frozenlake: {', '.join(unknown)}; known: sizes, p")
    if not cfg["sizes"] or any(not isinstance(n, int) or not 2 <= n <= 12 for n in cfg["sizes"]):
        raise UserError(f"frozenlake: sizes must be board sides from 2 to 12, got {cfg['sizes']!r}")
    if not 0.5 <= float(cfg["p"]) <= 1:
        raise UserError(f"frozenlake: p must be in [0.5, 1], got {cfg['p']!r}")
    rows = []
    for i in range(size):
        rng = random.Random(f"arle-frozenlake:{seed}:{i}")  # row i depends only on (seed, i)
        side = rng.choice(cfg["sizes"])
        board = generate_random_map(size=side, p=float(cfg["p"]), seed=rng.randrange(2**31))
        rows.append(
            {
                "id": f"frozenlake-{seed}-{i}",
                "size": side,
                "map": board,
                "question": question(board),
                "answer": " ".join(shortest_path(board)),
            }
        )
    return rows
