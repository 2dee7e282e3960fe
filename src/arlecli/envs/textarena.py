"""TextArena games as arle envs: puzzles for one player, and two-player games against a fixed
opponent or the policy itself.

    env: {name: textarena, params: {game: Sokoban-v0, max_turns: 60}}
    env: {name: textarena, params: {game: TicTacToe-v0, players: 2, opponent: random}}

Any registered TextArena game id works (`game`); `game_params` go to the game's constructor
(e.g. `game_params: {num_disks: 4}` for TowerOfHanoi-v0; the game's own turn limit is its
`max_turns` there, apart from arle's cap below). The game is TextArena's own, unwrapped: its reset
with the task's seed (the `textarena` generator's `seed` column: task i of a split is seed
split_seed + i, so splits with disjoint seed ranges share no game), its observation text as the
user turns, the model's whole reply as the action, its rules for invalid moves (one warning,
then the game is lost), its rewards and its outcome. An episode ends with a recorded reason:
win, loss, draw, invalid_move (the game ended on an invalid move), turn_limit (the game's own
turn limit, or `max_turns` model turns of one player, arle's cap: a puzzle cut off there
scores the game's fraction done, as at its own limit).

Players. Seat 0 moves first. A two-player game's other seat is played by `opponent`:
`random` (a uniformly random legal move), `scripted` (a simple fixed strategy: win, else
block, else centre for the board games; bet the best card for Kuhn poker), `self` (the
policy: the engine being evaluated or trained) or any model arle can run (`arle eval
--opponent PROFILE`: the command line opens its engine and lends it to the games by name with
`model_opponent`; the card holds only the name, so it stays data). Against a fixed opponent the model's
seat alternates: seat = (game seed + sample number) % players. With `self`, samples pair up
into games: samples 2m and 2m+1 of a task play game m as seats 0 and 1, each recorded as its
own episode with its own outcome (self-play training trains both seats from one game); a
seat no sample fills is played by the policy, unrecorded.

Each player sees only its own observations: the game's messages to it since its last move
(the other player's move, the new board), never the other player's reasoning. In a seat's
token record the other player's moves are environment tokens, so training masks them.

TextArena seeds the global `random` module and draws from it on every step; each game here
keeps its own random state and swaps it in around every call, so concurrent games are
reproducible whatever the order their moves interleave in. (One TextArena quirk remains:
Crosswords reads several letters of one reply into a set, whose order, and so which letters
land before a wrong one, changes with the process's hash seed.)

`episode.info`: game, seed, seat, players, opponent, outcome (win/draw/loss), reward (the
game's own for this seat: 1/0/-1 for two players; 1 when a puzzle is solved, else the
fraction done), reason (the game's words), invalid_moves, turns (this seat's moves) and
game_turns. The `game` reward reads it.
"""

from __future__ import annotations

import contextlib
import importlib
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from arlecli.engine.phases import phased
from arlecli.envs import register_env
from arlecli.envs.episodes import Job, Transcript
from arlecli.cards import render_prompt
from arlecli.data.generators import generator
from arlecli.errors import ParamError, UserError
from arlecli.records import Sample
from arlecli.thinking import tags_for
from arlecli.types import Episode, Task

EXTRA = "pip install 'arle[games]' (TextArena 0.7.4)"
GAME_ID = -1  # TextArena's sender id of the game itself
BUILTIN_OPPONENTS = ("random", "scripted")
SELF = "self"
OPPONENT_NAMES = (*BUILTIN_OPPONENTS, SELF)  # every other --opponent names a model
_DEFAULT_MAX_TURNS = 100
_PARAMS = ("game", "players", "opponent", "max_turns", "game_params")


def textarena() -> Any:
    """The textarena module, or a one-line error naming the extra that installs it."""
    try:
        return importlib.import_module("textarena")
    except ImportError:
        raise UserError(f"game cards need TextArena: {EXTRA}") from None


def game_spec(game_id: str) -> Any:
    """TextArena's registry entry for `game_id`; an unknown id suggests near ones."""
    import difflib

    textarena()
    registry = importlib.import_module("textarena.envs.registration").ENV_REGISTRY
    if game_id not in registry:
        near = difflib.get_close_matches(game_id, list(registry), n=3)
        hint = f"; did you mean {', '.join(near)}" if near else ""
        raise UserError(f"unknown TextArena game '{game_id}'{hint}")
    return registry[game_id]


class Game:
    """One TextArena game, unwrapped, with its own random state."""

    def __init__(self, game_id: str, seed: int, players: int = 1, kwargs: dict[str, Any] | None = None) -> None:
        spec = game_spec(game_id)
        entry = spec.entry_point
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            entry = getattr(importlib.import_module(module), attr)
        self.id, self.seed, self.players = game_id, seed, players
        self._rng = random.Random(seed).getstate()
        with self.own_random():
            try:
                self.env = entry(**{**spec.kwargs, **(kwargs or {})})
            except TypeError as exc:
                raise UserError(f"bad params for TextArena game '{game_id}': {exc}") from None
            self.env.reset(num_players=players, seed=seed)
        self.done = False

    @contextlib.contextmanager
    def own_random(self) -> Iterator[None]:
        """Run with this game's random state in the global `random` module (TextArena's)."""
        outside = random.getstate()
        random.setstate(self._rng)
        try:
            yield
        finally:
            self._rng = random.getstate()
            random.setstate(outside)

    @property
    def state(self) -> Any:
        """TextArena's State (the board in `.game_state`, whose turn in `.current_player_id`)."""
        return self.env.state

    def observe(self) -> tuple[int, list[tuple[int, str, Any]]]:
        """(the player to move, the messages it has not seen yet)."""
        with self.own_random():
            return self.env.get_observation()

    def act(self, text: str) -> bool:
        """Play `text` as the current player's move; True if the game counted it invalid."""
        state = self.state
        player, turn = state.current_player_id, state.turn
        with self.own_random():
            self.done, _ = self.env.step(text)
        flagged = bool(state.game_info.get(player, {}).get("invalid_move"))
        return flagged or (not self.done and state.turn == turn)

    def outcome(self, seat: int) -> dict[str, Any]:
        """This seat's result: outcome, the game's reward, its reason (an unfinished game: none)."""
        rewards = self.state.rewards if self.done else None
        info = self.state.game_info.get(seat, {})
        if not rewards:  # cut off by arle's cap: a puzzle scores its fraction done, as at its own limit
            done = getattr(self.env, "_get_percentage_completion", None) if self.players == 1 else None
            with self.own_random():
                reward = float(done()) if done is not None else 0.0
            return {
                "outcome": "loss" if self.players == 1 else "unfinished",
                "reward": reward,
                "reason": "arle's turn limit",
                "game_turns": self.state.turn,
            }
        reward = float(rewards.get(seat, 0.0))
        if self.players == 1:
            outcome = "win" if reward >= 1 else "loss"
        else:
            outcome = "win" if reward > 0 else "loss" if reward < 0 else "draw"
        return {
            "outcome": outcome,
            "reward": reward,
            "reason": str(info.get("reason", "")),
            "invalid_move": bool(info.get("invalid_move")),
            "game_turns": self.state.turn,
        }

    def turn_limit_reached(self) -> bool:
        """Whether the game ended on its own turn limit."""
        limit = getattr(self.state, "max_turns", None)
        return limit is not None and self.state.turn >= limit


def render(messages: list[tuple[int, str, Any]], seat: int) -> str:
    """What a player reads: the game's messages to it, and the other players' moves tagged
    with who made them. Its own moves are left out: they are its turns already."""
    ta = textarena()
    parts = []
    for sender, text, kind in messages:
        if kind == ta.ObservationType.PLAYER_ACTION and sender in (seat, GAME_ID):
            continue
        text = str(text).strip()
        if text:
            parts.append(text if sender in (GAME_ID, seat) else f"[Player {sender}] {text}")
    return "\n\n".join(parts)


# --- built-in opponents: (game, seat, rng) -> a move in the game's own format -------------


def game_name(game_id: str) -> str:
    """The game's name without its version and variant: "TicTacToe-v0" -> "TicTacToe"."""
    return game_id.split("-v")[0]


def _lines3() -> list[tuple[int, int, int]]:
    return [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def _tictactoe(game: Game, seat: int, rng: random.Random, scripted: bool) -> str:
    cells = [c for row in game.state.game_state["board"] for c in row]
    free = [i for i, c in enumerate(cells) if c == ""]
    if scripted:
        mine = "X" if seat == 1 else "O"  # TextArena: player 1 plays X, player 0 plays O
        theirs = "O" if mine == "X" else "X"
        for who in (mine, theirs):  # win, else block
            for line in _lines3():
                marks = [cells[i] for i in line]
                if marks.count(who) == 2 and marks.count("") == 1:
                    return f"[{line[marks.index('')]}]"
        for cell in (4, 0, 2, 6, 8, 1, 3, 5, 7):
            if cell in free:
                return f"[{cell}]"
    return f"[{rng.choice(free)}]"


def _connect_four(game: Game, seat: int, rng: random.Random, scripted: bool) -> str:
    board = game.state.game_state["board"]
    rows, cols = len(board), len(board[0])
    open_cols = [c for c in range(cols) if board[0][c] == "."]
    if scripted:
        mine = "X" if seat == 0 else "O"
        for disc in (mine, "O" if mine == "X" else "X"):  # win, else block
            for c in open_cols:
                r = max(r for r in range(rows) if board[r][c] == ".")
                board[r][c] = disc
                won = four_in_a_row(board, r, c)
                board[r][c] = "."
                if won:
                    return f"[col {c}]"
        return f"[col {min(open_cols, key=lambda c: abs(c - cols // 2))}]"
    return f"[col {rng.choice(open_cols)}]"


def four_in_a_row(board: list[list[str]], r: int, c: int) -> bool:
    """Whether the disc at (r, c) completes a line of four (Connect Four)."""
    disc = board[r][c]
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        run = 1
        for sign in (1, -1):
            rr, cc = r + sign * dr, c + sign * dc
            while 0 <= rr < len(board) and 0 <= cc < len(board[0]) and board[rr][cc] == disc:
                run += 1
                rr, cc = rr + sign * dr, cc + sign * dc
        if run >= 4:
            return True
    return False


def _kuhn_poker(game: Game, seat: int, rng: random.Random, scripted: bool) -> str:
    state = game.state.game_state
    legal = list(state["current_legal_action_tree"])
    if scripted:  # K: bet or call; Q: check or call; J: check or fold
        card = state["player_cards"][seat]
        wants = {2: ("bet", "call"), 1: ("check", "call"), 0: ("check", "fold")}[card]
        return f"[{next(a for a in wants if a in legal)}]"
    return f"[{rng.choice(legal)}]"


_PLAYERS: dict[str, Callable[[Game, int, random.Random, bool], str]] = {
    "TicTacToe": _tictactoe,
    "ConnectFour": _connect_four,
    "KuhnPoker": _kuhn_poker,
}


def builtin_move(name: str, game: Game, seat: int, rng: random.Random) -> str:
    """The move built-in opponent `name` (random, scripted) makes in `game` as `seat`."""
    play = _PLAYERS.get(game_name(game.id))
    if play is None:
        raise UserError(
            f"no built-in opponent plays {game.id}: use --opponent self or a model "
            f"(built-in players: {', '.join(sorted(_PLAYERS))})"
        )
    return play(game, seat, rng, name == "scripted")


# --- the env kind --------------------------------------------------------------------------


@dataclass
class GameSetup:
    """One episode's game as the card sets it up; the `textarena` driver plays it (not the
    turn-by-turn Env protocol: a game has several players)."""

    card: Any
    task: Task
    game: str
    players: int
    opponent: str  # a built-in name, "self", or a model lent with `model_opponent`
    max_turns: int
    game_params: dict[str, Any]

    @property
    def seed(self) -> int:
        return int(self.task.fields.get("seed", 0))

    def reset(self) -> Any:
        """What the first player sees first (`arle bench show`); the driver plays the game."""
        game = Game(self.game, self.seed, self.players, self.game_params)
        player, messages = game.observe()
        return self.first_prompt(render(messages, player))

    def first_prompt(self, text: str) -> Any:
        """The card's prompt around the game's first observation for this player."""
        rendered = render_prompt(self.card.prompt, replace(self.task, input=text))
        if isinstance(rendered, str):
            raise UserError(f"{self.card.name}: env 'textarena' needs a chat card (prompt.format: chat)")
        return rendered


@dataclass
class _Seat:
    engine: Any = None  # who answers: an engine, or None for a built-in player
    builtin: str | None = None
    job: int | None = None  # the recorded job, if any
    params: Any = None
    transcript: Transcript | None = None
    invalid: int = 0
    rng: random.Random | None = None


@dataclass
class _Match:
    setup: GameSetup
    game: Game
    seats: list[_Seat]
    end: str | None = None
    waiting: int | None = None  # the seat whose model reply is awaited
    finished: list[tuple[int, Episode]] = field(default_factory=list)


def _matches(engine: Any, jobs: list[Job]) -> list[_Match]:
    """Group jobs into games and give every seat its player (see the module doc)."""
    groups: dict[tuple[str, int], dict[int, int]] = {}
    for j, job in enumerate(jobs):
        setup: GameSetup = job.env  # type: ignore[assignment]
        if setup.opponent == SELF:
            key, seat = (job.task.id, job.sample // setup.players), job.sample % setup.players
        else:
            key, seat = (job.task.id, job.sample), (setup.seed + job.sample) % setup.players
        groups.setdefault(key, {})[seat] = j
    matches = []
    for (_, game_no), by_seat in groups.items():
        first = jobs[next(iter(by_seat.values()))]
        setup = first.env  # type: ignore[assignment]
        seats = []
        for seat in range(setup.players):
            recorded = by_seat.get(seat)
            if recorded is not None:
                seats.append(_Seat(engine=engine, job=recorded, params=jobs[recorded].params))
            elif setup.opponent not in BUILTIN_OPPONENTS:
                other = engine if setup.opponent == SELF else _lent(setup.opponent)
                # An unrecorded seat samples with its own seeds, apart from every recorded sample's.
                params = replace(
                    first.params, seed=None if first.params.seed is None else first.params.seed + 1_000_003 * (seat + 1)
                )
                seats.append(_Seat(engine=other, params=params))
            else:
                seats.append(
                    _Seat(builtin=setup.opponent, rng=random.Random(f"arle-opponent:{setup.seed}:{game_no}:{seat}"))
                )
        game = Game(setup.game, setup.seed, setup.players, setup.game_params)
        matches.append(_Match(setup, game, seats))
    return matches


def _advance(match: _Match, tokenizers: dict[int, Any]) -> None:
    """Play built-in moves until a model must move (match.waiting) or the game is over."""
    game, setup = match.game, match.setup
    while not game.done:
        pid, messages = game.observe()
        seat = match.seats[pid]
        text = render(messages, pid)
        if seat.builtin is not None:
            assert seat.rng is not None  # _matches gives every built-in seat its rng
            seat.invalid += game.act(builtin_move(seat.builtin, game, pid, seat.rng))
            continue
        if seat.transcript is None:
            seat.transcript = Transcript(setup.first_prompt(text), Episode(setup.task.id))
        elif len(seat.transcript.episode.turns) >= setup.max_turns:
            match.end = "turn_limit"
            return
        else:
            seat.transcript.extend(
                [{"role": "user", "content": text}],
                tokenizers.get(id(seat.engine)),
                None,
                getattr(seat.engine, "chat_template_kwargs", None),
            )
        match.waiting = pid
        return


def _finish(match: _Match) -> None:
    """Close the game and record every recorded seat's episode."""
    game, setup = match.game, match.setup
    for pid, seat in enumerate(match.seats):
        if seat.job is None:
            continue
        result = game.outcome(pid)
        if match.end == "turn_limit":
            reason = "turn_limit"
        elif result.get("invalid_move"):
            reason = "invalid_move"
        elif result["outcome"] == "loss" and setup.players == 1 and game.turn_limit_reached():
            reason = "turn_limit"
        else:
            reason = result["outcome"]
        episode = seat.transcript.episode if seat.transcript else Episode(setup.task.id)
        turns = len(episode.turns)
        episode.end_reason = reason
        episode.info = {
            "game": setup.game,
            "seed": setup.seed,
            "seat": pid,
            "players": setup.players,
            "opponent": _opponent_name(setup.opponent),
            **result,
            "invalid_moves": seat.invalid,
            "turns": turns,
            **({"seams": seat.transcript.seams} if seat.transcript and seat.transcript.seams else {}),
        }
        match.finished.append((seat.job, episode))


def _opponent_name(opponent: str) -> str | None:
    """What episode.info calls the opponent: its own name, or a lent model's engine name."""
    if opponent in OPPONENT_NAMES or opponent not in _LENT:
        return opponent
    lent = _LENT[opponent]
    return getattr(lent, "name", None) or type(lent).__name__


# Engines lent to the games for model opponents, by the name a card's `opponent` holds.
_LENT: dict[str, Any] = {}


@contextlib.contextmanager
def model_opponent(name: str, engine: Any) -> Iterator[None]:
    """While inside, a game whose `opponent` is `name` has its other seats played by `engine`
    (`arle eval --opponent PROFILE` opens the engine; `with_opponent(card, PROFILE)` names it)."""
    _LENT[name] = engine
    try:
        yield
    finally:
        _LENT.pop(name, None)


def _lent(name: str) -> Any:
    engine = _LENT.get(name)
    if engine is None:
        raise UserError(
            f"opponent '{name}' is not one of {', '.join(OPPONENT_NAMES)} and no model plays under "
            "that name (a model plays through `arle eval --opponent PROFILE`)"
        )
    return engine


def run_games(engine: Any, jobs: list[Job]) -> Iterator[tuple[int, Episode]]:
    """The textarena driver: play every job's game to its end, batching each round's model
    moves into one `generate` call per engine; yield (job index, Episode) as games end."""
    matches = _matches(engine, jobs)
    tokenizers: dict[int, Any] = {}
    for match in matches:
        for seat in match.seats:
            if seat.engine is not None:
                tokenizers[id(seat.engine)] = getattr(seat.engine, "tokenizer", None)
    live = matches
    while live:
        by_engine: dict[int, list[_Match]] = {}
        engines: dict[int, Any] = {}
        waiting: list[_Match] = []
        for match in live:
            match.waiting = None
            _advance(match, tokenizers)
            if match.waiting is None:
                _finish(match)
                yield from match.finished
                continue
            seat = match.seats[match.waiting]
            by_engine.setdefault(id(seat.engine), []).append(match)
            engines[id(seat.engine)] = seat.engine
            waiting.append(match)
        for key, batch in by_engine.items():
            seats = [m.seats[m.waiting] for m in batch]  # type: ignore[index]
            requests = [s.transcript.request(s.params, None) for s in seats]  # type: ignore[union-attr]
            engine = phased(engines[key])  # a thinking model's moves: stops and budget on the answer only
            tags = tags_for(engine)
            for r, comp in engine.generate(requests):
                match, seat = batch[r], seats[r]
                turn = seat.transcript.record(comp, tags, tokenizers[key])
                seat.invalid += match.game.act(turn.completion)  # the answer, not a move thought about
        live = waiting


def check_params(params: dict[str, Any], base: Path | None = None) -> None:
    """Refuse a textarena card's bad env params when it loads (ParamError names the param;
    the game id must be TextArena's)."""
    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        raise ParamError(
            unknown[0],
            f"is not a param of env 'textarena' (known: {', '.join(_PARAMS)}; "
            "the game's own constructor arguments go in params.game_params)",
        )
    game = params.get("game")
    if not isinstance(game, str) or not game:
        raise ParamError("game", "is required: a TextArena game id (e.g. Sokoban-v0)")
    textarena()  # missing extra: its own one-line error, not a bad param
    try:
        game_spec(game)
    except UserError as exc:
        raise ParamError("game", str(exc)) from None
    for key in ("players", "max_turns"):
        value = params.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ParamError(key, f"must be a whole number >= 1, got {value!r}")
    game_params = params.get("game_params")
    if game_params is not None and not isinstance(game_params, dict):
        raise ParamError("game_params", f"must be a mapping of the game's constructor arguments, got {game_params!r}")
    opponent = params.get("opponent", "random")
    if params.get("players", 1) > 1 and not isinstance(opponent, str):
        raise ParamError("opponent", f"must be a name, got {type(opponent).__name__}")
    if params.get("players", 1) > 1 and opponent not in OPPONENT_NAMES and opponent not in _LENT:
        raise ParamError(
            "opponent",
            f"'{opponent}' is not one of {', '.join(OPPONENT_NAMES)} "
            "(a model plays through `arle eval --opponent PROFILE`)",
        )


def game_stats(samples: list[Sample]) -> dict[str, Any]:
    """results.json's `games` block (the env kind's `stats`; samples whose env_info has a seat
    and an outcome): games, per_seat {seat: {games, win, draw, loss}} (rates), invalid_move_rate
    (the share of games lost to an invalid move), invalid_moves_per_turn and turns_per_game of
    the recorded player."""
    games = [
        s.env_info for s in samples if isinstance(s.env_info, dict) and "outcome" in s.env_info and "seat" in s.env_info
    ]
    if not games:
        return {}
    per_seat: dict[str, dict[str, Any]] = {}
    for seat in sorted({int(g["seat"]) for g in games}):
        mine = [g for g in games if int(g["seat"]) == seat]
        per_seat[str(seat)] = {
            "games": len(mine),
            **{o: sum(g["outcome"] == o for g in mine) / len(mine) for o in ("win", "draw", "loss")},
        }
    turns = sum(int(g.get("turns", 0)) for g in games)
    return {
        "games": {
            "games": len(games),
            "per_seat": per_seat,
            "invalid_move_rate": sum(bool(g.get("invalid_move")) for g in games) / len(games),
            "invalid_moves_per_turn": sum(int(g.get("invalid_moves", 0)) for g in games) / turns if turns else None,
            "turns_per_game": turns / len(games),
        }
    }


# The factory makes a GameSetup, not an Env: run_games plays it (a game has several players).
@register_env("textarena", driver=run_games, check=check_params, stats=game_stats)  # type: ignore[arg-type]
def textarena_env(
    card: Any,
    task: Task,
    exemplars: list[Task],
    native_tools: bool,
    game: str | None = None,
    players: int = 1,
    opponent: str = "random",
    max_turns: int = _DEFAULT_MAX_TURNS,
    game_params: dict[str, Any] | None = None,
) -> GameSetup:
    """Env factory for `env: {name: textarena, params: {game, players, opponent, max_turns,
    game_params}}` (see the module doc)."""
    params = {
        "game": game,
        "players": players,
        "opponent": opponent,
        "max_turns": max_turns,
        "game_params": game_params,
    }
    try:  # a card built in code, not loaded (its check ran at load otherwise)
        check_params(params)
    except ParamError as exc:
        raise UserError(f"{card.name}: env 'textarena' {exc}") from None
    return GameSetup(card, task, str(game), int(players), opponent, int(max_turns), dict(game_params or {}))


def with_opponent(card: Any, opponent: str) -> Any:
    """`card` with its game's other seats played by `opponent` (a built-in name, "self" or the
    name of a model lent with `model_opponent`). A card that is not a two-player game is
    refused in one line."""
    if not is_multiplayer(card):
        raise UserError(f"--opponent applies to two-player game cards; {card.name} is not one")
    return replace(card, env_params={**card.env_params, "opponent": opponent})


def is_multiplayer(card: Any) -> bool:
    """Whether `card` is a game for two or more players (an opponent plays the other seats)."""
    return card.env == "textarena" and int(card.env_params.get("players", 1)) > 1


# TextArena games ----------------------------------------------------------------------------
# A game task is only a seed: the env resets the game with it, so row i of a split
# is game seed `seed + i` and splits with disjoint seed ranges share no game.


@generator("textarena")
def textarena_rows(*, seed: int, size: int, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`size` games of TextArena game `params.game` (see generate_rows): row i is
    {id, game, seed: seed + i, question, answer}; `question` names the game and seed (the env shows
    the game's own first observation in its place), `answer` is "win" (what a player aims for)."""
    cfg = dict(params or {})
    game = cfg.pop("game", None)
    if not isinstance(game, str) or not game:
        raise UserError("textarena generator: params.game must name a TextArena game, e.g. Sokoban-v0")
    if cfg:
        raise UserError(f"unknown params for textarena: {', '.join(sorted(cfg))}; known: game")
    name = game_name(game).lower()
    return [
        {
            "id": f"{name}-{seed + i}",
            "game": game,
            "seed": seed + i,
            "question": f"{game}, seed {seed + i}",
            "answer": "win",
        }
        for i in range(size)
    ]
