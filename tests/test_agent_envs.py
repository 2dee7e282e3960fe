"""Agent cards: frozenlake (a text game), hotpotqa_search and finqa_tools (tools bound to the
row), countdown_solver_judge (two roles in one episode). Scripted agents play each card's
fixture through `run_eval`, right and wrong; malformed replies and turn limits end or
continue episodes with a recorded reason; the offline cards run on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from arlecli.data.generators import generate_rows
from arlecli.data.sources import read_rows_file, tasks_from_rows
from arlecli.engine.base import Completion, GenerationRequest, SamplingParams
from arlecli.envs import make_env
from arlecli.envs.episodes import Job, run_episodes
from arlecli.envs.frozenlake import Lake, parse_moves, shortest_path
from arlecli.envs.row_tools import match_label, rank_paragraphs
from arlecli.envs.tools import get_tool
from arlecli.errors import UserError
from arlecli.eval import EvalOptions, run_eval
from arlecli.catalog import load_card
from arlecli.rewards import get_reward
from arlecli.types import Episode, Task, Turn

FIXTURES = Path(__file__).resolve().parents[1] / "benchmarks" / "fixtures"


class ScriptedAgent:
    """An engine that answers turn k of an episode with script(first user message)[k]
    (the last reply repeats), so one agent can play every fixture row its own way."""

    name = "scripted"

    def __init__(self, script: Callable[[str], list[str]] | list[str]) -> None:
        self.script = script
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: list[GenerationRequest]):
        for i, request in enumerate(requests):
            self.requests.append(request)
            messages = request.messages or []
            first_user = next(m["content"] for m in messages if m["role"] == "user")
            replies = self.script(first_user) if callable(self.script) else self.script
            turn = sum(m["role"] == "assistant" for m in messages)
            yield i, Completion(text=replies[min(turn, len(replies) - 1)])

    def close(self) -> None:
        pass


def rows_of(card_name: str) -> list[dict]:
    return read_rows_file(FIXTURES / f"{card_name}.jsonl")


def by_question(script: dict[str, list[str]]) -> Callable[[str], list[str]]:
    """A script keyed by each row's question: the replies for the row the prompt shows
    (a row the script leaves out gets a reply that is no answer)."""

    def replies(prompt: str) -> list[str]:
        return next((r for q, r in script.items() if q in prompt), ["(no idea)"])

    return replies


def evaluate(card_name: str, agent: ScriptedAgent, tmp_path: Path) -> list[dict]:
    """run_eval of the card on its fixture; the samples it wrote."""
    card = load_card(card_name)
    opts = EvalOptions(data=str(FIXTURES / f"{card_name}.jsonl"), num_fewshot=0)
    run_eval(card, agent, opts, model="scripted", run_dir=tmp_path)
    return [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]


def one_episode(card_name: str, row: dict, replies: list[str]) -> Episode:
    card = load_card(card_name)
    [task] = tasks_from_rows(card, [row])
    [(_, episode)] = list(run_episodes(ScriptedAgent(replies), [Job(task, make_env(card, task), SamplingParams())]))
    return episode


def tool_call(name: str, **arguments: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# FrozenLake ---------------------------------------------------------------------------------


def test_frozenlake_generator_is_seeded_solvable_and_sized():
    rows = generate_rows("frozenlake", seed=7, size=12)
    assert generate_rows("frozenlake", seed=7, size=3) == rows[:3]  # row i depends only on (seed, i)
    assert {r["size"] for r in rows} == {4, 6}
    for r in rows:
        assert r["map"][0][0] == "S" and r["map"][-1][-1] == "G" and len(r["map"]) == r["size"]
        lake = Lake(r["map"])
        lake.play(r["answer"].split())
        assert lake.reached_goal and r["question"].count("\n") >= r["size"]
    assert [r["map"] for r in generate_rows("frozenlake", seed=8, size=12)] != [r["map"] for r in rows]
    with pytest.raises(UserError, match="unknown params"):
        generate_rows("frozenlake", seed=0, size=1, params={"slippery": True})


@pytest.mark.parametrize(
    "text, moves",
    [
        ("<answer>down</answer>", ["down"]),
        ("Left", ["left"]),
        ("think... <answer>Right, right down</answer>", ["right", "right", "down"]),
    ],
)
def test_frozenlake_reads_moves(text, moves):
    assert parse_moves(text) == (moves, None)


@pytest.mark.parametrize(
    "text, why",
    [
        ("<answer>jump</answer>", "'jump' is not a move"),
        ("I go down", "'i' is not a move"),
        ("<answer></answer>", "no move"),
    ],
)
def test_frozenlake_rejects_what_is_not_a_move(text, why):
    moves, error = parse_moves(text)
    assert moves == [] and why in error


def frozenlake_script(wrong: bool) -> Callable[[str], list[str]]:
    rows = rows_of("frozenlake")
    answers = [json.loads(x) for x in (FIXTURES / "frozenlake.answers.jsonl").read_text().splitlines()]
    script = {}
    for row, answer in zip(rows, answers):
        moves = parse_moves(answer["wrong"])[0] if wrong else row["answer"].split()
        script[row["question"]] = [f"<answer>{m}</answer>" for m in moves]  # one move a turn
    return by_question(script)


def test_frozenlake_scripted_path_reaches_the_goal(tmp_path):
    samples = evaluate("frozenlake", ScriptedAgent(frozenlake_script(wrong=False)), tmp_path)
    rows = {r["id"]: r for r in rows_of("frozenlake")}
    assert len(samples) == 4 and all(s["correct"] and s["reward"] == 1.0 for s in samples)
    for s in samples:
        assert s["end_reason"] == "reached_goal" and s["env_info"]["reached_goal"] is True
        assert len(s["turns"]) == len(rows[s["task_id"]]["answer"].split()) == s["details"]["moves"]
        assert "P" in s["turns"][0]["observation"][0]["content"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["metrics"]["accuracy"]["value"] == 1.0


def test_frozenlake_wrong_moves_fail(tmp_path):
    samples = {s["task_id"]: s for s in evaluate("frozenlake", ScriptedAgent(frozenlake_script(wrong=True)), tmp_path)}
    assert not any(s["correct"] for s in samples.values())
    # Three wrong paths end in a hole; the last (no hole on the board) stalls at the edge.
    assert [samples[f"frozenlake-31337-{i}"]["end_reason"] for i in range(4)] == ["fell_in_hole"] * 3 + ["turn_limit"]
    last = samples["frozenlake-31337-3"]
    assert len(last["turns"]) == 12 and last["details"]["fell_in_hole"] == 0  # 4 * (4 - 1) turns


def test_frozenlake_invalid_move_is_an_observation_and_the_game_goes_on():
    row = rows_of("frozenlake")[1]  # 4x4, hole right of the start
    episode = one_episode(
        "frozenlake",
        row,
        [
            "I would go down",
            "<answer>up</answer>",
            "<answer>down</answer>",
            "<answer>down down right right right</answer>",
        ],
    )
    first, second = episode.turns[0].observation[0]["content"], episode.turns[1].observation[0]["content"]
    assert first.startswith("Invalid move: 'i' is not a move") and "row 1, column 1" in first
    assert "the edge stopped: up" in second
    assert episode.end_reason == "reached_goal" and len(episode.turns) == 4
    assert episode.info["invalid_moves"] == 1 and episode.info["path"] == [
        "up",
        "down",
        "down",
        "down",
        "right",
        "right",
        "right",
    ]


def test_frozenlake_turn_limit_and_its_param():
    row = rows_of("frozenlake")[0]  # 6x6: 20 turns by default
    episode = one_episode("frozenlake", row, ["<answer>left</answer>"])
    assert episode.end_reason == "turn_limit" and len(episode.turns) == 20
    assert episode.info["reached_goal"] is False and episode.info["position"] == [1, 1]
    card = load_card("frozenlake")
    card.env_params = {"max_turns": 3}
    [task] = tasks_from_rows(card, [row])
    assert make_env(card, task).max_turns == 3


def test_frozenlake_reward_reads_the_env_outcome_and_replays_a_single_reply():
    row = rows_of("frozenlake")[1]
    [task] = tasks_from_rows(load_card("frozenlake"), [row])
    score = get_reward("frozenlake")
    # The env's outcome wins over what the text says (an episode the env played).
    told = Episode(
        task.id,
        [Turn("", "<answer>right</answer>")],
        "reached_goal",
        {"reached_goal": True, "fell_in_hole": False, "path": ["down"] * 3 + ["right"] * 3},
    )
    assert score(task, told).correct
    # Without env info (one reply scored alone) the moves are replayed on the task's map.
    replayed = score(task, Episode(task.id, [Turn("", f"<answer>{row['answer']}</answer>")]))
    assert replayed.correct and replayed.extracted == row["answer"]
    hole = score(task, Episode(task.id, [Turn("", "<answer>right down</answer>")]))
    assert not hole.correct and hole.details == {"reached_goal": 0, "fell_in_hole": 1, "moves": 1}


def test_frozenlake_shortest_path_avoids_holes():
    assert shortest_path(["SH", "FG"]) == ["down", "right"]
    assert shortest_path(["SH", "HG"]) == []


# HotpotQA with search -----------------------------------------------------------------------

HOTPOT_SEARCHES = {
    "Which river flows": [tool_call("search", query="Glasswork Museum of Varrow"), tool_call("search", query="Varrow")],
    "Are the Moravec": [tool_call("search", query="Moravec Tower") + tool_call("search", query="Linde Bridge")],
    "Who founded": [tool_call("search", query="Night Harbour"), tool_call("search", query="Bellbird Records")],
    "In what year": [tool_call("search", query="Pellin Library"), tool_call("search", query="Oskar Brandvik born")],
}


def answers_of(card_name: str, key: str) -> dict[str, str]:
    rows = rows_of(card_name)
    lines = (FIXTURES / f"{card_name}.answers.jsonl").read_text().splitlines()
    return {row["question"]: json.loads(line)[key] for row, line in zip(rows, lines)}


@pytest.mark.parametrize("key", ["correct", "wrong"])
def test_hotpotqa_search_scripted_agent(tmp_path, key):
    finals = answers_of("hotpotqa_search", key)
    script = {q: [*calls, finals[q]] for q in finals for p, calls in HOTPOT_SEARCHES.items() if q.startswith(p)}
    samples = evaluate("hotpotqa_search", ScriptedAgent(by_question(script)), tmp_path)
    assert len(samples) == 4 and all(s["correct"] is (key == "correct") for s in samples)
    assert all(s["end_reason"] == "answered" and s["env_info"]["tool_errors"] == 0 for s in samples)
    first = next(s for s in samples if s["task_id"] == "fx-hps-1")
    prompt = first["prompt"][-1]["content"]
    assert "- Varrow" in prompt and "Dellen" not in prompt  # titles only: the facts need a search
    found = first["turns"][1]["observation"][0]["content"]
    assert found.startswith("<tool_response>\nVarrow: Varrow is a market town") and "Dellen River" in found


def test_search_ranks_title_matches_then_word_overlap():
    paras = [
        ("Kell River", "A short river."),
        ("Varrow", "A town. The Dellen River flows through Varrow."),
        ("Glasswork Museum of Varrow", "A museum in Varrow."),
    ]
    assert [t for t, _ in rank_paragraphs("Varrow", paras)] == ["Varrow", "Glasswork Museum of Varrow"]
    assert [t for t, _ in rank_paragraphs("the museum of glass", paras)][0] == "Glasswork Museum of Varrow"
    assert [t for t, _ in rank_paragraphs("Dellen river", paras)] == ["Varrow", "Kell River"]
    search = get_tool("search", Task("t", "", "", {"context": {"title": ["A"], "sentences": [["x y."]]}}))
    assert search(query="nothing of the sort") == "No paragraph matches 'nothing of the sort'. Titles: A"


def test_hotpotqa_search_bad_calls_and_turn_limit():
    row = rows_of("hotpotqa_search")[0]
    episode = one_episode(
        "hotpotqa_search",
        row,
        [
            '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
            "<tool_call>{oops}</tool_call>",
            "Answer: Dellen River",
        ],
    )
    assert "error: bad arguments for search" in episode.turns[0].observation[0]["content"]
    assert "not valid JSON" in episode.turns[1].observation[0]["content"]
    assert episode.end_reason == "answered" and episode.info == {"tool_calls": 2, "tool_errors": 2}
    looping = one_episode("hotpotqa_search", row, [tool_call("search", query="Varrow")])
    assert looping.end_reason == "turn_limit" and len(looping.turns) == 5 and looping.info["tool_errors"] == 0


# FinQA with table_lookup --------------------------------------------------------------------

FINQA_SCRIPTS = {
    "change in revenue": [
        tool_call("table_lookup", row="Revenue", column="2019")
        + tool_call("table_lookup", row="revenue", column="2018"),
        tool_call("calculator", expression="5829 - 5735"),
    ],
    "percentage change in operating": [
        tool_call("table_lookup", row="operating income", column="2019"),
        tool_call("table_lookup", row="operating income", column="2018"),
        tool_call("calculator", expression="(1210 - 1102) / 1102"),
    ],
    "total number of shares": [
        tool_call("table_lookup", row="Q1", column="shares purchased")
        + tool_call("table_lookup", row="q2", column="shares"),
        tool_call("calculator", expression="1200 + 800"),
    ],
}


@pytest.mark.parametrize("key", ["correct", "wrong"])
def test_finqa_tools_scripted_agent(tmp_path, key):
    finals = answers_of("finqa_tools", key)
    script = {q: [*calls, finals[q]] for q in finals for p, calls in FINQA_SCRIPTS.items() if p in q}
    samples = evaluate("finqa_tools", ScriptedAgent(by_question(script)), tmp_path)
    assert len(samples) == 3 and all(s["correct"] is (key == "correct") for s in samples)
    assert all(s["env_info"]["tool_errors"] == 0 and s["end_reason"] == "answered" for s in samples)
    first = next(s for s in samples if "change in revenue" in s["prompt"][-1]["content"])
    assert "5829" not in first["prompt"][-1]["content"]  # the values are hidden; the labels are shown
    assert "Table row labels: revenue; operating income" in first["prompt"][-1]["content"]
    looked_up = "\n".join(
        f"<tool_response>\nrevenue / {year}: $ {value}\n</tool_response>"
        for year, value in [("2019", 5829), ("2018", 5735)]
    )
    assert first["turns"][0]["observation"][0]["content"] == looked_up
    assert first["turns"][1]["observation"][0]["content"] == "<tool_response>\n94\n</tool_response>"


def test_table_lookup_matches_labels_loosely_and_says_what_exists():
    labels = ["revenue", "operating income", "net revenue growth"]
    assert match_label("Operating Income", labels, "row") == 1
    assert match_label("revenu", labels, "row") == 0  # a typo: the closest spelling
    assert match_label("growth", labels, "row") == 2  # inside exactly one label
    with pytest.raises(ValueError, match="no row 'cash'; rows: revenue; operating income"):
        match_label("cash", labels, "row")


def test_finqa_tools_bad_lookup_is_an_error_observation_and_turns_run_out():
    row = rows_of("finqa_tools")[0]
    episode = one_episode(
        "finqa_tools",
        row,
        [tool_call("table_lookup", row="cash", column="2019"), tool_call("table_lookup", row="revenue"), "Answer: 94"],
    )
    assert (
        "error: ValueError: no row 'cash'; rows: revenue; operating income"
        in episode.turns[0].observation[0]["content"]
    )
    assert "error: bad arguments for table_lookup" in episode.turns[1].observation[0]["content"]
    assert episode.end_reason == "answered" and episode.info == {"tool_calls": 2, "tool_errors": 2}
    looping = one_episode("finqa_tools", row, [tool_call("calculator", expression="1 + 1")])
    assert looping.end_reason == "turn_limit" and len(looping.turns) == 6


# Countdown, solver then judge ---------------------------------------------------------------


@pytest.mark.parametrize(
    "solver, judge, correct, solver_correct, fixed",
    [
        ("<answer>(8 + 9) + 81</answer>", "Verdict: incorrect\n<answer>(8 * 9) + 81</answer>", True, 0, 1),
        ("<answer>(8 * 9) + 81</answer>", "Verdict: correct\n<answer>(8 * 9) + 81</answer>", True, 1, 0),
        ("<answer>(8 * 9) + 81</answer>", "Verdict: incorrect\n<answer>(8 + 9) + 81</answer>", False, 1, 0),
    ],
)
def test_solver_judge_scores_the_judges_final_answer(tmp_path, solver, judge, correct, solver_correct, fixed):
    row = rows_of("countdown_solver_judge")[1]
    agent = ScriptedAgent(by_question({row["question"]: [solver, judge]}))
    card = load_card("countdown_solver_judge")
    opts = EvalOptions(data=str(FIXTURES / "countdown_solver_judge.jsonl"), num_fewshot=0, limit=2)
    run_eval(card, agent, opts, model="scripted", run_dir=tmp_path)
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    sample = next(s for s in samples if s["task_id"] == row["id"])
    assert sample["correct"] is correct and sample["end_reason"] == "judged" and len(sample["turns"]) == 2
    assert sample["details"]["solver_correct"] == solver_correct and sample["details"]["judge_fixed"] == fixed
    judge_prompt = sample["turns"][0]["observation"][0]["content"]
    assert judge_prompt.startswith("Now switch roles: you are the judge.")
    assert "numbers [8, 9, 81] and the target 153" in judge_prompt
    assert judge_prompt.endswith(f"Proposal: {solver[8:-9]}")
    assert sample["env_info"]["verdict"] == judge.split("\n")[0].split(": ")[1]


def test_solver_judge_plays_every_fixture_row(tmp_path):
    finals = answers_of("countdown_solver_judge", "correct")
    agent = ScriptedAgent(by_question({q: ["<answer>1 + 1</answer>", final] for q, final in finals.items()}))
    samples = evaluate("countdown_solver_judge", agent, tmp_path)
    assert len(samples) == 3 and all(s["correct"] and s["details"]["judge_fixed"] for s in samples)


def test_solver_judge_untagged_proposal_and_missing_verdict():
    row = rows_of("countdown_solver_judge")[0]
    episode = one_episode("countdown_solver_judge", row, ["Maybe this:\n58 + 59 - 46", "Looks fine to me."])
    assert "Proposal: Maybe this:\n58 + 59 - 46" in episode.turns[0].observation[0]["content"]
    assert episode.end_reason == "judged" and episode.info == {"proposal": "Maybe this:\n58 + 59 - 46", "verdict": None}
    [task] = tasks_from_rows(load_card("countdown_solver_judge"), [row])
    score = get_reward("solver_judge", {"reward": "countdown"})(task, episode)
    assert not score.correct and score.details["solver_correct"] == 1  # the judge dropped a right answer


# The offline cards on the tiny model --------------------------------------------------------


@pytest.mark.parametrize("card_name", ["frozenlake", "countdown_solver_judge"])
def test_offline_agent_cards_run_on_the_tiny_model(card_name, tiny_model, tmp_path):
    from arlecli.engine.hf import HFEngine

    engine = HFEngine(str(tiny_model), batch_size=4)
    result = run_eval(load_card(card_name), engine, EvalOptions(limit=2, max_tokens=8), model="tiny", run_dir=tmp_path)
    assert result["n_tasks"] == 2
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2
    for s in samples:
        assert s["end_reason"] in {"reached_goal", "fell_in_hole", "turn_limit", "judged"}
        assert len(s["turns"]) >= 2 and s["turns"][0]["observation"]  # the env answered the first turn
