"""The textworld env kind and its cards (textworld_coin, textworld_treasure, textworld_cooking,
and alfworld_style, arle's own household games):
each fixture game's own walkthrough, played through `arle eval` by a stand-in model, wins with
full score and a wrong path does not (both recorded in the fixtures and re-checked against
TextWorld's engine here); commands are read and counted invalid as documented; games are
seeded, cached atomically and refused in one line when out of range; the cards run on the
tiny model and one GRPO step trains on one."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest
import yaml

from arlecli.catalog import load_card, resolve_references
from arlecli.data.generators import generate_rows
from arlecli.data.sources import read_rows_file, tasks_from_rows
from arlecli.engine.base import Completion, GenerationRequest, SamplingParams
from arlecli.envs import make_env
from arlecli.envs.episodes import Job, run_episodes
from arlecli.errors import UserError
from arlecli.eval import EvalOptions, run_eval
from arlecli.rewards import get_reward
from arlecli.types import Episode, Turn

import arlecli.envs.textworld_env as tw_env
from arlecli.envs import household
from arlecli.envs.textworld_env import GameSpec, World, game_file, parse_command, textworld_rows

from helpers.cli import arle

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "benchmarks" / "fixtures"
CARDS = ["textworld_coin", "textworld_treasure", "textworld_cooking", "alfworld_style"]
GENERATOR = "arlecli.envs.textworld_env:textworld_rows"


@pytest.fixture(scope="module")
def games_dir(tmp_path_factory) -> Path:
    """One game cache for the module: each game compiles once (Inform 7, ~1 s), not per test."""
    return tmp_path_factory.mktemp("textworld_games")


@pytest.fixture(autouse=True)
def shared_games(games_dir, monkeypatch):
    monkeypatch.setattr(tw_env, "cache_root", lambda: games_dir)


def rows_of(card: str) -> list[dict]:
    return read_rows_file(FIXTURES / f"{card}.jsonl")


def answers_of(card: str) -> list[dict]:
    return [json.loads(x) for x in (FIXTURES / f"{card}.answers.jsonl").read_text().splitlines()]


class ScriptedAgent:
    """Answers turn k of an episode with script(first user message)[k] (the last repeats)."""

    name = "scripted"

    def __init__(self, script: Callable[[str], list[str]]) -> None:
        self.script = script

    def generate(self, requests: list[GenerationRequest]):
        for i, request in enumerate(requests):
            messages = request.messages or []
            first = next(m["content"] for m in messages if m["role"] == "user")
            replies = self.script(first)
            turn = sum(m["role"] == "assistant" for m in messages)
            yield i, Completion(text=replies[min(turn, len(replies) - 1)])

    def close(self) -> None:
        pass


def by_game(card: str, key: str) -> Callable[[str], list[str]]:
    """The fixture's recorded replies (`correct` or `wrong`) of the game the prompt opens."""
    scripts = {}
    for row, answer in zip(rows_of(card), answers_of(card)):
        with World(GameSpec.of(row["game"], row["settings"], row["seed"])) as world:
            scripts[world.intro()] = answer[key]
    return lambda prompt: next(r for intro, r in scripts.items() if intro in prompt)


def evaluate(card_name: str, agent, run: Path) -> list[dict]:
    card = load_card(card_name)
    run_eval(card, agent, EvalOptions(data=str(FIXTURES / f"{card_name}.jsonl")), model="scripted", run_dir=run)
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


# The walkthroughs ------------------------------------------------------------------------


@pytest.mark.parametrize("card", CARDS)
def test_recorded_walkthroughs_are_the_engines_own(card):
    """The fixture's `answer` and its `correct` replies are the walkthrough TextWorld generates
    for that (game, settings, seed) today: a TextWorld change that moves the games fails here."""
    for row, answer in zip(rows_of(card), answers_of(card)):
        with World(GameSpec.of(row["game"], row["settings"], row["seed"])) as world:
            walkthrough = world.walkthrough
        assert walkthrough and row["answer"] == " > ".join(walkthrough)
        assert [parse_command(r) for r in answer["correct"]] == [c.lower() for c in walkthrough]


@pytest.mark.parametrize("card", CARDS)
def test_the_walkthrough_wins_with_full_score_through_arle_eval(card, tmp_path):
    samples = evaluate(card, ScriptedAgent(by_game(card, "correct")), tmp_path)
    assert len(samples) == len(rows_of(card)) >= 3
    for s in samples:
        assert s["correct"] and s["reward"] == 1.0 and s["end_reason"] == "won"
        info = s["env_info"]
        assert info["won"] and info["score"] == 1.0 and info["raw_score"] == info["max_score"] >= 1
        assert info["steps"] == len(s["turns"]) == len(info["walkthrough"])
        # TextWorld's cooking walkthroughs open some doors twice: a no-op, so an invalid command.
        noops = [t for t in s["turns"] if t["observation"] and t["observation"][0]["content"] == "That's already open."]
        assert info["invalid_actions"] == len(noops) and (card == "textworld_cooking" or not noops)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["world"]["success_rate"] == 1.0 and results["world"]["mean_score"] == 1.0
    assert results["metrics"]["accuracy"]["value"] == 1.0


@pytest.mark.parametrize("card", CARDS)
def test_a_wrong_path_does_not_win(card, tmp_path):
    """The walkthrough without its last command, then `look` until the turn limit: not won,
    the score short of the maximum (cooking: the recipe's earlier points are kept)."""
    samples = evaluate(card, ScriptedAgent(by_game(card, "wrong")), tmp_path)
    max_turns = load_card(card).env_params["max_turns"]
    for s in samples:
        assert not s["correct"] and s["reward"] < 1.0 and s["end_reason"] == "turn_limit"
        assert len(s["turns"]) == max_turns and not s["env_info"]["won"]
    if card == "textworld_cooking":
        assert all(0 < s["reward"] < 1 for s in samples)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["world"]["success_rate"] == 0.0 and results["world"]["steps_to_success"] is None


def test_a_wrong_cooking_step_loses_the_game():
    """Cooking an ingredient twice burns it: the cooking game is lost, the episode ends "lost"
    and keeps the points scored before."""
    row = rows_of("textworld_cooking")[0]
    walkthrough = [parse_command(r) for r in answers_of("textworld_cooking")[0]["correct"]]
    cook = next(i for i, c in enumerate(walkthrough) if c.startswith("cook "))
    replies = [f"<answer>{c}</answer>" for c in walkthrough[: cook + 1] + [walkthrough[cook]]]
    episode = one_episode("textworld_cooking", row, replies)
    assert episode.end_reason == "lost" and len(episode.turns) == cook + 2
    assert episode.info["lost"] and not episode.info["won"] and 0 < episode.info["score"] < 1


# Commands -------------------------------------------------------------------------------


# The household games (alfworld_style) -----------------------------------------------------


def test_household_fixtures_hold_every_task_type_and_the_generator_still_makes_them():
    """One fixture game per ALFWorld task type (pick_and_place_simple: the next test's), and `plan`
    (pure Python, no TextWorld) still draws each fixture's walkthrough from its seed: a generator
    change that moves the games without a new household.VERSION (part of every cache key) fails here."""
    rows = rows_of("alfworld_style")
    assert [r["settings"]["task"] for r in rows] == list(household.TASKS[1:])
    for row in rows:
        layout = household.plan(row["settings"]["task"], row["settings"]["distractors"], row["seed"])
        assert " > ".join(layout.walkthrough) == row["answer"]
    heat = rows[2]
    with World(GameSpec.of(heat["game"], heat["settings"], heat["seed"])) as world:
        goal = household.plan("pick_heat_then_place_in_recep", 4, heat["seed"]).goal
        assert world.intro().startswith(f"Your task is to: {goal}") and goal.startswith("put a hot ")


def household_row(task: str, seed: int) -> dict:
    [row] = textworld_rows(seed=seed, size=1, params={"game": "household", "settings": {"task": task}})
    return row


def answers(commands: list[str]) -> list[str]:
    return [f"<answer>{c}</answer>" for c in commands]


def test_any_object_and_receptacle_of_the_goals_kinds_wins():
    """As in ALFWorld, "put a mug in cabinet" is won by any mug in any cabinet: here the second
    object of the kind, put in/on the last receptacle of the kind, not the walkthrough's. The
    walkthrough wins too and a wrong path does not (pick_and_place_simple's gold path: the card's
    fixture holds the other five task types)."""

    def two_of_each(p: household.Plan) -> bool:
        places = [r for r in p.receptacles if r.kind == p.destination]
        return sum(o.kind == p.target for o in p.objects) == 2 and len(places) >= 2

    task = "pick_and_place_simple"
    seed = next(s for s in range(1000) if two_of_each(household.plan(task, 4, s)))
    layout = household.plan(task, 4, seed)
    obj = [o for o in layout.objects if o.kind == layout.target][1]
    place = [r.name for r in layout.receptacles if r.kind == layout.destination][-1]
    assert obj.where is not None

    def opening(name: str) -> list[str]:
        return [f"open {name}"] if household.closed_at_start(layout.kind_of(name)) else []

    put = "insert {} into {}" if household.inside(layout.kind_of(place)) else "put {} on {}"
    commands = [*opening(obj.where), f"take {obj.name} from {obj.where}", *opening(place), put.format(obj.name, place)]
    assert obj.name not in " ".join(layout.walkthrough) and place not in " ".join(layout.walkthrough)
    row = household_row(task, seed)
    episode = one_episode("alfworld_style", row, answers(commands))
    assert episode.end_reason == "won" and len(episode.turns) == len(commands) and episode.info["score"] == 1.0
    gold = one_episode("alfworld_style", row, answers(list(layout.walkthrough)))  # the game's own path
    assert gold.end_reason == "won" and gold.info["walkthrough"] == list(layout.walkthrough)
    wrong = one_episode("alfworld_style", row, answers([*layout.walkthrough[:-1], "look"]), max_turns=5)
    assert wrong.end_reason == "turn_limit" and not wrong.info["won"]


def test_a_household_verb_needs_its_appliance():
    """Heating with the fridge does nothing (the game says so), so the heat task's object put in
    place is not hot and the game is not won; the walkthrough's own path wins."""
    row = rows_of("alfworld_style")[2]
    assert row["settings"]["task"] == "pick_heat_then_place_in_recep"
    walkthrough = row["answer"].split(" > ")
    [heat] = [i for i, c in enumerate(walkthrough) if c.startswith("heat ")]
    wrong = [*walkthrough[:heat], walkthrough[heat].replace("microwave 1", "fridge 1"), *walkthrough[heat + 1 :]]
    episode = one_episode("alfworld_style", row, answers(wrong), max_turns=len(wrong))
    assert "You cannot heat anything with the fridge 1." in episode.turns[heat].observation[0]["content"]
    assert episode.end_reason == "turn_limit" and not episode.info["won"] and episode.info["score"] == 0.0
    assert one_episode("alfworld_style", row, answers(walkthrough)).end_reason == "won"


@pytest.mark.parametrize(
    "text, command",
    [
        ("<answer>go east</answer>", "go east"),
        ("I should look around.\n<answer>Take  Coin.</answer>", "take coin"),
        ("> open door", "open door"),
        ("go north", "go north"),
        ("<answer>go west</answer> then <answer>go east</answer>", "go east"),
    ],
)
def test_a_reply_gives_one_command(text, command):
    assert parse_command(text) == command


@pytest.mark.parametrize("text", ["I think I go east.\nThen north.", "<answer> </answer>", ""])
def test_a_reply_without_a_command(text):
    assert parse_command(text) is None


def one_episode(card_name: str, row: dict, replies: list[str], **params) -> Episode:
    card = load_card(card_name)
    card.env_params = {**card.env_params, **params}
    [task] = tasks_from_rows(card, [row])
    agent = ScriptedAgent(lambda _: replies)
    [(_, episode)] = list(run_episodes(agent, [Job(task, make_env(card, task), SamplingParams())]))
    return episode


def test_invalid_commands_are_counted_and_end_the_episode_at_the_limit():
    row = rows_of("textworld_coin")[0]
    replies = ["I am not sure.\nMaybe east?", "<answer>dance wildly</answer>", "<answer>restart</answer>", "xyzzy"]
    episode = one_episode("textworld_coin", row, replies, max_invalid=4)
    seen = [t.observation[0]["content"] for t in episode.turns[:3]]  # the last turn ends it: no answer shown
    assert seen[0].startswith("No command read from your reply")
    assert "not a verb" in seen[1].lower()  # the game's own words
    assert seen[2] == "'restart' is not a command of this game."  # never sent to the interpreter
    assert episode.end_reason == "invalid_actions" and len(episode.turns) == 4
    assert episode.info["invalid_actions"] == 4 and episode.info["steps"] == 4
    # `look` is admissible: a valid command, however little it changes.
    episode = one_episode("textworld_coin", row, ["<answer>look</answer>"], max_turns=2, max_invalid=1)
    assert episode.end_reason == "turn_limit" and episode.info["invalid_actions"] == 0


def test_admissible_commands_param_lists_them_each_turn():
    row = rows_of("textworld_coin")[0]
    first = answers_of("textworld_coin")[0]["correct"][0]
    episode = one_episode("textworld_coin", row, [first], max_turns=1, admissible_commands=True)
    assert "Admissible commands:" in episode.turns[0].prompt[-1]["content"]
    assert parse_command(first) in episode.turns[0].prompt[-1]["content"].split("Admissible commands:")[1]


def test_the_reward_replays_an_episode_scored_outside_the_env():
    row, answer = rows_of("textworld_coin")[0], answers_of("textworld_coin")[0]
    [task] = tasks_from_rows(load_card("textworld_coin"), [row])
    score = get_reward("arlecli.envs.textworld_env:textworld")
    won = score(task, Episode(task.id, [Turn("", r) for r in answer["correct"]]))
    assert won.correct and won.reward == 1.0 and won.details["steps"] == len(answer["correct"])
    lost = score(task, Episode(task.id, [Turn("", r) for r in answer["wrong"]]))
    assert not lost.correct and lost.reward == 0.0


# Games: seeded, cached, checked ----------------------------------------------------------


def test_rows_are_seeded_specs_and_splits_share_no_seed():
    params = load_card("textworld_coin").source.params
    rows = generate_rows(GENERATOR, seed=7, size=6, params=params)
    assert generate_rows(GENERATOR, seed=7, size=2, params=params) == rows[:2]
    assert [r["seed"] for r in rows] == list(range(7, 13)) and rows[0]["id"] == "coin_collector-7"
    for name in CARDS:
        splits = load_card(name).source.splits
        seeds = [range(s["seed"], s["seed"] + s["size"]) for s in splits.values()]
        assert not set(seeds[0]) & set(seeds[1]), name
    cooking = load_card("textworld_cooking")
    assert {s["food_split"] for s in cooking.source.splits.values()} == {"train", "test"}
    [row] = generate_rows(GENERATOR, seed=0, size=1, params={**cooking.source.params, "food_split": "train"})
    assert row["settings"]["split"] == "train"


@pytest.mark.parametrize(
    "card, index, other",
    [("textworld_coin", 1, {"level": 106}), ("alfworld_style", 0, {"task": "pick_and_place_simple", "distractors": 3})],
)
def test_a_game_is_rebuilt_the_same_for_its_seed_and_cached_atomically(games_dir, tmp_path, card, index, other):
    """A fixture game generated and compiled afresh (no shipped copy; HOME missing, as Inform 7
    must cope with) is the game shipped for its (game, settings, seed); the build lands in
    the cache by one rename, leaving no build folder, and is read from there next time."""
    import lzma

    import textworld

    row = rows_of(card)[index]  # coin: level 105, the smallest fixture game
    spec = GameSpec.of(row["game"], row["settings"], row["seed"])
    fresh_root = tmp_path / "fresh"
    path = game_file(spec, fresh_root, use_prebuilt=False)
    assert path.parent == fresh_root / spec.key() and (path.parent / "game.json").is_file()
    assert [p.name for p in fresh_root.iterdir()] == [spec.key()]  # no build folder left
    assert game_file(spec, fresh_root) == path  # read from the cache
    shipped = tw_env.prebuilt(spec)
    assert shipped is not None
    (tmp_path / "shipped.json").write_bytes(lzma.decompress(shipped[1].read_bytes()))
    assert textworld.Game.load(str(path.parent / "game.json")) == textworld.Game.load(str(tmp_path / "shipped.json"))
    with World(spec, root=fresh_root) as fresh, World(spec) as unpacked:
        assert fresh.intro() == unpacked.intro() and fresh.walkthrough == unpacked.walkthrough
    assert GameSpec.of(row["game"], row["settings"], row["seed"] + 1).key() != spec.key()
    assert GameSpec.of(row["game"], other, row["seed"]).key() != spec.key()
    assert Path(tw_env.__file__).parent not in path.parents and games_dir not in path.parents


@pytest.mark.parametrize(
    "game, settings, seed, message",
    [
        ("coin_collector", {"level": 0}, 1, "setting 'level' must be a whole number 1-300"),
        ("coin_collector", {"levels": 3}, 1, "unknown setting 'levels'"),
        ("cooking", {"recipe": 1, "take": 2}, 1, "'take' (2) must be <= 'recipe' (1)"),
        ("mansion", {}, 1, "unknown TextWorld game 'mansion'"),
        ("household", {"task": "boil_water"}, 1, "setting 'task' must be one of pick_and_place_simple"),
        ("household", {"distractors": 11}, 1, "setting 'distractors' must be a whole number 0-10"),
        ("coin_collector", {"level": 3}, -1, "game seed -1 is out of range"),
        ("coin_collector", {"level": 3}, 2**32, "is out of range (a whole number 0-4294967295)"),
    ],
)
def test_bad_games_are_one_line_errors(game, settings, seed, message):
    with pytest.raises(UserError) as err:
        GameSpec.of(game, settings, seed)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_seed_out_of_range_on_the_command_line_is_one_line_and_exit_2(tmp_path, tiny_model):
    """Refused when the tasks load (the cards' transform), before any game is built or any
    model loads: the error is all of stderr, with no loading or progress line before it."""
    row = {**rows_of("textworld_coin")[0], "seed": 2**32}
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    out = arle(
        "eval", "textworld_coin", "--model", str(tiny_model), "--data", str(data), "--output", str(tmp_path / "run")
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: textworld: game seed 4294967296 is out of range (a whole number 0-4294967295)"
    ]


def test_a_bad_row_refuses_a_training_run_before_its_run_directory_exists(tmp_path, tiny_model):
    """`arle train --rows` loads and checks its tasks before the run directory is made (and any
    model loads): one line, exit 2, and the rerun with the row fixed needs no new --output."""
    row = {**rows_of("textworld_coin")[0], "seed": 2**32}
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    run = tmp_path / "run"
    out = arle("train", "textworld_coin", "--model", str(tiny_model), "--rows", str(data), "--output", str(run))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: textworld: game seed 4294967296 is out of range (a whole number 0-4294967295)"
    ]
    assert not run.exists()


def test_a_split_past_the_seed_range_is_refused():
    with pytest.raises(UserError, match="out of range"):
        generate_rows(GENERATOR, seed=2**32 - 2, size=3, params={"game": "coin_collector"})


def test_bad_env_params_fail_at_load_naming_the_field():
    card = load_card("textworld_coin")
    bad = replace(card, env_params={**card.env_params, "max_steps": 5})
    with pytest.raises(UserError, match=r"field 'env.params.max_steps'.*not a param of env 'textworld'"):
        resolve_references(bad)


def test_without_textworld_a_card_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "textworld", None)  # import textworld -> ImportError
    with pytest.raises(UserError, match=r"TextWorld cards need TextWorld: pip install 'arle\[worlds\]'"):
        resolve_references(load_card("textworld_coin"))


# The tiny model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(tiny_model):
    from arlecli.engine.hf import HFEngine

    return HFEngine(str(tiny_model), batch_size=8)


@pytest.mark.parametrize("card_name", CARDS)
def test_eval_limit_2_on_the_tiny_model_ends_each_episode_with_a_reason(card_name, tiny_engine, tmp_path):
    card = load_card(card_name)
    card.env_params = {**card.env_params, "max_turns": 4}  # the card's 50-80 turns only cost time here
    result = run_eval(card, tiny_engine, EvalOptions(limit=2, max_tokens=8), model="tiny", run_dir=tmp_path)
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert result["n_tasks"] == 2 and len(samples) == 2
    assert all(s["end_reason"] in ("won", "lost", "turn_limit", "invalid_actions") for s in samples)
    assert all(s["env_info"]["world"] == "textworld" and s["env_info"]["steps"] == len(s["turns"]) for s in samples)
    assert json.loads((tmp_path / "results.json").read_text())["world"]["episodes"] == 2


@pytest.mark.parametrize(
    "name, algo, backend",
    [
        ("textworld_coin", "grpo", "hf"),
        ("textworld_coin", "rloo", "hf"),
        ("textworld_coin", "ppo", "hf"),
        ("textworld_coin", "grpo", "vllm"),
        ("textworld_treasure", "grpo", "hf"),
        ("textworld_cooking", "grpo", "hf"),
        ("alfworld_style", "grpo", "hf"),
    ],
    ids=lambda x: str(x),
)
def test_one_training_step_on_a_textworld_card(tmp_path, tiny_model, request, name, algo, backend):
    """Every RL algorithm trains on a world card, multi-turn, env tokens masked (the trainers'
    shared path; the world is only the env), on both rollout backends."""
    from helpers.train import train_in_process

    if backend == "vllm":
        request.getfixturevalue("vllm_environment")
    per_step = ["--set", "prompts_per_step=1"] if algo == "ppo" else ["--set", "per_device_train_batch_size=2"]

    card_file = file_card(name, tmp_path, max_turns=2)  # two turns: multi-turn, and quick
    run = tmp_path / "run"
    train_in_process(
        str(card_file),
        "--algo",
        algo,
        "--backend",
        backend,
        "--model",
        str(tiny_model),
        "--limit",
        "2",
        "--num-generations",
        "2",
        "--max-tokens",
        "6",
        *per_step,
        "--max-steps",
        "1",
        "--eval-limit",
        "0",
        "--output",
        str(run),
    )
    [metrics] = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics["step"] == 1
    lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(x["end_reason"] and x["turns"] >= 1 for x in lines)
    assert any(x["turns"] == 2 for x in lines), "the test needs multi-turn episodes"
    assert (run / "final" / "model.safetensors").exists()


def file_card(name: str, folder: Path, **env_params) -> Path:
    """The card `name` over its fixture rows (a files source), its env params overridden."""
    card = yaml.safe_load((ROOT / "benchmarks" / f"{name}.yaml").read_text())
    card["env"]["params"] = {**card["env"]["params"], **env_params}
    card["fixture"] = str(FIXTURES / f"{name}.jsonl")
    card["source"] = {"kind": "files", "path": str(FIXTURES / f"{name}.jsonl")}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(card))
    return folder / f"{name}.yaml"


def test_rft_keeps_the_won_household_episodes_and_trains_on_them(tmp_path, tiny_model, monkeypatch):
    """--algo rft on a world card: a model that plays each game's walkthrough wins every episode,
    the round keeps them all (the card's own `correct`, no min_reward) as multi-turn rows whose
    assistant turns are the commands played and whose user turns are the world's text, and an
    SFT step trains on them."""
    from arlecli.engine.hf import HFEngine

    from helpers.tool_model import script_generate
    from helpers.train import train_in_process

    script = by_game("alfworld_style", "correct")

    def reply(request: GenerationRequest) -> str:
        messages = request.messages or []
        first = next(m["content"] for m in messages if m["role"] == "user")
        return script(first)[sum(m["role"] == "assistant" for m in messages)]

    script_generate(monkeypatch, HFEngine, reply)
    run = tmp_path / "run"
    train_in_process(
        str(file_card("alfworld_style", tmp_path)),
        "--algo",
        "rft",
        "--model",
        str(tiny_model),
        "--limit",
        "2",
        "--num-generations",
        "2",
        "--max-tokens",
        "48",
        "--eval-limit",
        "0",
        "--set",
        "rounds=1",
        "--set",
        "tasks_per_round=2",
        "--set",
        "per_device_train_batch_size=2",
        "--output",
        str(run),
    )
    (metric,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert (metric["samples"], metric["kept"]) == (4, 4) and metric["sft_steps"] >= 1 and metric["loss"] is not None
    rows = [json.loads(x) for x in (run / "checkpoint-1" / "rows.jsonl").read_text().splitlines()]
    walkthroughs = {r["answer"] for r in rows_of("alfworld_style")[:2]}
    assert len(rows) == 4
    for row in rows:
        said = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert " > ".join(parse_command(t) or "" for t in said) in walkthroughs
        assert "Your task is to: " in next(m["content"] for m in row["messages"] if m["role"] == "user")
    assert json.loads((run / "summary.json").read_text())["algo"] == "rft" and (run / "final").is_dir()
