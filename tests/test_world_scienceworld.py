"""The scienceworld env kind: recorded gold and wrong paths (tests/fixtures/scienceworld/paths.jsonl)
re-checked against the simulator and played through `run_eval` (what `arle eval` runs) by a
stand-in model; the generator's splits are the simulator's own; invalid actions, the tiny
model, one GRPO step; bad input is one line; every JVM this module starts is gone at its end.

The whole module shares one JVM (the env's process pool): starting one costs seconds."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml


def _missing(why: str) -> None:
    """Skip on a developer's machine without it; fail in CI, which installs it (.ci/run)."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must have it: {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


if importlib.util.find_spec("scienceworld") is None:
    _missing("the arle[worlds] extra is not installed")
if not os.environ.get("JAVA_HOME") and not shutil.which("java"):
    _missing("ScienceWorld needs a Java runtime (apt-get install default-jre-headless)")

from arlecli.catalog import load_card, resolve_references  # noqa: E402
from arlecli.data.generators import generate_rows  # noqa: E402
from arlecli.data.sources import read_rows_file, tasks_from_rows  # noqa: E402
from arlecli.envs import scienceworld as sw  # noqa: E402
from arlecli.errors import UserError  # noqa: E402
from arlecli.eval import EvalOptions, run_eval  # noqa: E402

from helpers.cli import arle, assert_one_line_error  # noqa: E402
from helpers.scripted_engine import Replies  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "benchmarks" / "fixtures"
PATHS = [
    json.loads(x)
    for x in (Path(__file__).parent / "fixtures" / "scienceworld" / "paths.jsonl").read_text().splitlines()
]


def java_children() -> list[int]:
    """Java processes whose parent is this test process."""
    me, found = os.getpid(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            name, ppid = stat[stat.index("(") + 1 : stat.rindex(")")], int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and name == "java":
            found.append(int(proc.name))
    return found


@pytest.fixture(scope="module", autouse=True)
def one_jvm():
    """The module's JVM, shut at its end; no java process is left behind."""
    yield sw.POOL
    sw.shutdown()
    assert java_children() == [], "a ScienceWorld JVM outlived the tests"


def row_for(path: dict) -> dict:
    return sw.task_row(sw.task_type(path["task_type"]), path["variation"], "test")


def card_with(**env: object):
    card = load_card("scienceworld")
    return replace(card, env_params={**card.env_params, **env})


def play(tmp_path: Path, row: dict, replies: list[str], **env: object) -> tuple[dict, dict]:
    """run_eval of the card on one row with a stand-in model replying `replies` in order; the
    sample and results.json it wrote."""
    data = tmp_path / "row.jsonl"
    data.write_text(json.dumps(row) + "\n")
    run = tmp_path / "run"
    run_eval(card_with(**env), Replies(replies), EvalOptions(data=str(data)), model="stand-in", run_dir=run)
    [sample] = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    return sample, json.loads((run / "results.json").read_text())


# Replies and task types (no JVM) ------------------------------------------------------------


@pytest.mark.parametrize(
    "text, action",
    [
        ("<answer>open door to kitchen</answer>", "open door to kitchen"),
        ("I should look.\n<answer>look at  stove</answer>", "look at stove"),
        ("Let me think.\n\n> go to kitchen", "go to kitchen"),
        ("Action: focus on water", "focus on water"),
        ("0", "0"),  # a choice between ambiguous actions
        ("<answer>pick up\nmetal pot</answer>", "pick up"),  # a tag's first line
    ],
)
def test_a_reply_is_one_action(text, action):
    assert sw.parse_action(text) == (action, None)


@pytest.mark.parametrize("text", ["", "   \n", "<answer></answer>", "<answer>" + "x" * 400 + "</answer>"])
def test_a_reply_without_an_action_is_refused(text):
    action, why = sw.parse_action(text)
    assert action is None and why


def test_task_types_by_name_id_paper_name_and_topic():
    assert len(sw.task_types()) == 30 and sw.task_types("all") == sw.task_types()
    assert [t.name for t in sw.task_types(["1-1", "Matter Changes of State (Melting)", "freeze"])] == [
        "boil",
        "melt",
        "freeze",
    ]
    assert {t.topic for t in sw.task_types(["Electricity"])} == {"Electricity"} and len(sw.task_types("Forces")) == 3
    with pytest.raises(UserError, match="unknown ScienceWorld task type 'boill'; did you mean boil"):
        sw.task_types(["boill"])


# The simulator's own splits --------------------------------------------------------------------


def test_generator_rows_are_the_simulators_splits_seeded_and_round_robin():
    params = {"task_types": ["boil", "find-living-thing"], "split": "test"}
    rows = generate_rows("scienceworld", seed=3, size=6, params=params)
    assert generate_rows("scienceworld", seed=3, size=6, params=params) == rows  # reproducible
    assert generate_rows("scienceworld", seed=3, size=3, params=params) == rows[:3]  # a prefix is the same rows
    assert [r["task_type"] for r in rows] == ["boil", "find-living-thing"] * 3  # round-robin over task types
    assert [r["variation"] for r in generate_rows("scienceworld", seed=4, size=6, params=params)] != [
        r["variation"] for r in rows
    ]
    for kind in sw.task_types(params["task_types"]):
        world = sw.World(kind, 0)
        try:
            splits = {s: world.variations(s) for s in sw.SPLITS}
        finally:
            world.close()
        assert splits == sw.variation_sets(kind) and all(splits.values())
        assert not set(splits["train"]) & set(splits["test"]) and not set(splits["dev"]) & set(splits["test"])
        train = generate_rows("scienceworld", seed=0, size=500, params={"task_types": [kind.name], "split": "train"})
        assert sorted(r["variation"] for r in train) == sorted(splits["train"])  # the whole split, no more
        test = [r["variation"] for r in rows if r["task_type"] == kind.name]
        assert set(test) <= set(splits["test"])
    capped = generate_rows("scienceworld", seed=0, size=50, params={**params, "per_task": 2})
    assert len(capped) == 4
    with pytest.raises(UserError, match="split must be one of train, dev, test"):
        generate_rows("scienceworld", seed=0, size=1, params={"split": "valid"})
    with pytest.raises(UserError, match="unknown params for scienceworld: variant"):
        generate_rows("scienceworld", seed=0, size=1, params={"variant": 1})


# Recorded paths: gold wins, wrong does not ---------------------------------------------------


def test_recorded_gold_paths_are_the_simulators():
    """record.py kept only task types whose gold path is the same on every load."""
    for path in (p for p in PATHS if p["kind"] == "gold"):
        world = sw.World(sw.task_type(path["task_type"]), path["variation"], path["simplification"], gold=True)
        try:
            assert world.gold() == path["actions"], path["task_type"]
        finally:
            world.close()


@pytest.mark.parametrize("path", PATHS, ids=lambda p: f"{p['task_type']}-{p['variation']}-{p['kind']}")
def test_recorded_paths_play_through_eval_as_recorded(tmp_path, path):
    replies = [f"<answer>{a}</answer>" for a in path["actions"]]
    sample, results = play(tmp_path, row_for(path), replies, simplification=path["simplification"])
    info = sample["env_info"]
    assert sample["end_reason"] == path["end_reason"] and info["raw_score"] == path["score"]
    assert sample["correct"] == path["won"] == info["won"]
    assert sample["reward"] == pytest.approx(max(0, path["score"]) / 100)
    if path["kind"] == "gold":
        # the world may say "won" before the gold path's last action (a closing "wait1")
        assert sample["correct"] and sample["reward"] == 1.0 and info["steps"] == path["steps"]
    else:
        assert not sample["correct"] and sample["reward"] < 1.0
    world = results["world"]
    assert world["episodes"] == 1 and world["success_rate"] == float(path["won"])


def test_the_cards_reference_answers_are_the_recorded_paths():
    rows = read_rows_file(FIXTURES / "scienceworld.jsonl")
    answers = [json.loads(x) for x in (FIXTURES / "scienceworld.answers.jsonl").read_text().splitlines()]
    recorded = {(p["task_type"], p["variation"], p["kind"]): p["actions"] for p in PATHS}
    for row, answer in zip(rows, answers, strict=True):
        for key, kind in (("correct", "gold"), ("wrong", "wrong")):
            actions = [sw.parse_action(r)[0] for r in answer[key]]
            assert actions == recorded[(row["task_type"], row["variation"], kind)]


# Episodes ------------------------------------------------------------------------------------


def test_invalid_actions_are_counted_and_end_the_episode_in_a_row(tmp_path):
    path = PATHS[0]
    sample, results = play(tmp_path, row_for(path), ["look around", "", "xyzzy plugh"], max_invalid=3)
    info = sample["env_info"]
    # turn 1 is a bare valid action; then an empty reply and a world-unknown action, repeated
    assert sample["end_reason"] == "invalid_actions" and sample["num_turns"] == 4
    assert info["invalid_actions"] == 3 and info["steps"] == 3  # the empty reply never reached the world
    assert results["world"]["invalid_actions_per_episode"] == 3.0 and not sample["correct"]


def test_the_turn_limit_ends_a_wandering_episode(tmp_path):
    sample, _ = play(tmp_path, row_for(PATHS[0]), ["<answer>look around</answer>"], max_turns=3)
    assert sample["end_reason"] == "turn_limit" and sample["num_turns"] == 3 and sample["env_info"]["steps"] == 3


def test_concurrent_episodes_are_worlds_in_one_jvm():
    """Two games stepped in turn in the one JVM see what each sees alone: the same scores,
    endings and observation lines (the simulator lists a room's objects in an order of its own
    that can change from one load to the next, alone too)."""
    [a, b] = [p for p in PATHS if p["kind"] == "gold"][:2]

    def world(path):
        return sw.World(sw.task_type(path["task_type"]), path["variation"], path["simplification"])

    def seen(outcomes):
        return [(o.raw_score, o.completed, sorted(o.observation.split("\n"))) for o in outcomes]

    alone = []
    for path in (a, b):
        w = world(path)
        alone.append(seen([w.step(x) for x in path["actions"]]))
        w.close()
    wa, wb = world(a), world(b)
    assert len(sw.POOL.running()) == 1 and sw.POOL.current is not None and sw.POOL.current.live == 2
    together: list[list] = [[], []]
    for i in range(max(len(a["actions"]), len(b["actions"]))):
        for k, (w, path) in enumerate(((wa, a), (wb, b))):
            if i < len(path["actions"]):
                together[k].append(w.step(path["actions"][i]))
    wa.close()
    wb.close()
    assert [seen(t) for t in together] == alone
    assert alone[0][-1][:2] == (100, True) and alone[1][-1][:2] == (100, True)
    assert sw.POOL.current is not None and sw.POOL.current.live == 0


def test_episodes_run_in_waves_of_max_live_worlds(tmp_path, monkeypatch):
    acquire, peak = sw.POOL.acquire, []

    def counting():
        jvm = acquire()
        peak.append(jvm.live)
        return jvm

    monkeypatch.setattr(sw.POOL, "acquire", counting)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row_for(p)) + "\n" for p in PATHS if p["kind"] == "gold"))
    card = card_with(max_turns=2, max_live=2)
    run_eval(card, Replies(["look around"]), EvalOptions(data=str(data)), model="s", run_dir=tmp_path / "r")
    samples = [json.loads(x) for x in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 and all(s["end_reason"] == "turn_limit" for s in samples)
    assert peak and max(peak) == 2 and sw.POOL.current.live == 0  # 3 episodes, never more than 2 worlds


def test_the_tiny_model_plays_two_episodes_to_an_end(tmp_path, tiny_model):
    from arlecli.engine.hf import HFEngine

    card = card_with(max_turns=4, max_invalid=2)
    result = run_eval(
        card,
        HFEngine(str(tiny_model), batch_size=4),
        EvalOptions(limit=2, max_tokens=8),
        model="tiny",
        run_dir=tmp_path / "run",
    )
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert result["n_tasks"] == 2 and len(samples) == 2
    assert all(s["end_reason"] in ("won", "lost", "invalid_actions", "turn_limit") for s in samples)
    assert all(s["env_info"]["world"] == "scienceworld" and s["num_turns"] >= 1 for s in samples)
    world = json.loads((tmp_path / "run" / "results.json").read_text())["world"]
    assert world["episodes"] == 2


@pytest.mark.parametrize("algo, backend", [("grpo", "hf"), ("rloo", "hf"), ("ppo", "hf"), ("grpo", "vllm")])
def test_one_training_step_on_the_tiny_model(tmp_path, tiny_model, request, algo, backend):
    """Every RL algorithm trains on the world card (multi-turn, env tokens masked) on both
    rollout backends."""
    from helpers.train import train_in_process

    if backend == "vllm":
        request.getfixturevalue("vllm_environment")
    per_step = ["--set", "prompts_per_step=1"] if algo == "ppo" else ["--set", "per_device_train_batch_size=2"]

    data = yaml.safe_load((ROOT / "benchmarks" / "scienceworld.yaml").read_text())
    data["source"] = {"kind": "files", "path": str(FIXTURES / "scienceworld.jsonl")}
    data["env"]["params"].update(max_turns=2, max_invalid=5)
    data.pop("fixture")
    (tmp_path / "sw.yaml").write_text(yaml.safe_dump(data))
    run = tmp_path / "run"
    train_in_process(
        str(tmp_path / "sw.yaml"), "--algo", algo, "--backend", backend, "--model", str(tiny_model),
        "--num-generations", "2", "--max-steps", "1", "--eval-limit", "0", "--max-tokens", "8",
        *per_step, "--output", str(run),
    )  # fmt: skip
    lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(x["turns"] == 2 and x["end_reason"] == "turn_limit" for x in lines)
    assert (run / "final").is_dir()


# Bad input -----------------------------------------------------------------------------------


def test_an_unknown_task_type_is_refused_before_any_turn(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({**row_for(PATHS[0]), "task_type": "boill"}) + "\n")
    with pytest.raises(UserError) as err:
        run_eval(load_card("scienceworld"), Replies(["look around"]), EvalOptions(data=str(data)), model="s",
                 run_dir=tmp_path / "r")  # fmt: skip
    assert str(err.value) == "unknown ScienceWorld task type 'boill'; did you mean boil"


def test_without_java_arle_eval_says_to_install_one_and_exits_2(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    out = arle("eval", "scienceworld", "--limit", "1", "--output", str(tmp_path / "run"))
    assert_one_line_error(out, "needs a Java runtime", "apt-get install default-jre-headless")
    assert not (tmp_path / "run").exists()


def test_a_variation_out_of_range_is_refused_before_any_turn(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({**row_for(PATHS[0]), "variation": 100000}) + "\n")
    with pytest.raises(UserError) as err:
        run_eval(
            load_card("scienceworld"),
            Replies(["look around"]),
            EvalOptions(data=str(data)),
            model="s",
            run_dir=tmp_path / "r",
        )
    message = str(err.value)
    assert "task type 'lifespan-longest-lived' has variations 0-" in message and "got 100000" in message
    assert "\n" not in message


def test_without_the_package_or_java_the_card_says_what_to_install(monkeypatch):
    card = load_card("scienceworld")
    monkeypatch.setitem(sys.modules, "scienceworld", None)
    with pytest.raises(UserError, match=r"pip install 'arle\[worlds\]'") as err:
        resolve_references(card)
    assert "\n" not in str(err.value)
    monkeypatch.delitem(sys.modules, "scienceworld")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(UserError, match="needs a Java runtime.*apt-get install default-jre-headless") as err:
        resolve_references(card)
    assert "\n" not in str(err.value)


def test_bad_env_params_fail_at_load_naming_the_field():
    card = load_card("scienceworld")
    for change, message in (
        ({"simplification": "hard"}, "'hard' is not one of easy"),
        ({"action_hints": "all"}, "must be one of templates, valid, none"),
        ({"max_invalid": 0}, "must be a whole number >= 1"),
        ({"step_limit": 5}, "is not a param of env 'scienceworld'"),
    ):
        with pytest.raises(UserError, match=message):
            resolve_references(replace(card, env_params={**card.env_params, **change}))
    [task] = tasks_from_rows(card, [{**row_for(PATHS[0]), "variation": -1}])
    with pytest.raises(UserError, match="'variation' must be a whole number >= 0"):
        sw.scienceworld_env(card, task, [], False)
