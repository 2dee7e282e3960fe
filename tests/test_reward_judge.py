"""The LLM-as-judge reward (issue 14, item 5): a judge model grades completions on a rubric.

The judge here is the fake OpenAI server with a stand-in grader (tests/helpers/fake_judge.py: a
response passes when it states the reference answer), so what is tested is everything arle
does around a judge: the prompt it sends, the verdict it reads, the cache, retries, failures,
bad params and the API key; and once, a local model (the tiny one) as the judge.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from arlecli.catalog import load_card_file, resolve_references
from arlecli.data.sources import read_rows_file, tasks_from_rows
from arlecli.errors import UserError
from arlecli.catalog import load_card
from arlecli.rewards import get_reward
from arlecli.rewards.llm_judge import Scale
from arlecli.types import Episode, Task, Turn

from helpers.cli import arle
from helpers.fake_judge import MUMBLE, grade_by_reference, judge_profile
from helpers.fake_openai import FakeOpenAIServer

CARD = "truthfulqa_judged"
SECRET = "sk-judge-secret-7f3a9c"


def fixture_tasks() -> list[Task]:
    card = load_card(CARD)
    return tasks_from_rows(card, read_rows_file(card.fixture_path), "fixture")


def episode(task: Task, completion: str) -> Episode:
    return Episode(task.id, [Turn(prompt=task.input, completion=completion)])


def judge_params(**extra: object) -> dict[str, object]:
    return {"model": "judge", "rubric": "PASS when the response states the reference answer.", **extra}


def judge_requests(srv: FakeOpenAIServer) -> int:
    return len(srv.bodies("/chat/completions"))


# ---------------------------------------------------------------- arle eval, end to end


def test_eval_of_the_judged_card_records_the_judges_reasoning_and_verdict_and_reruns_from_the_cache(
    tiny_model, tmp_path, monkeypatch
):
    monkeypatch.setenv("JUDGE_TEST_KEY", SECRET)
    card = load_card(CARD)
    with judge_profile("judge", api_key=SECRET, delay_s=0.2) as srv:
        args = [
            "eval",
            CARD,
            "--model",
            str(tiny_model),
            "--data",
            str(card.fixture_path),
            "--max-tokens",
            "12",
            "--json",
        ]
        first = arle(*args, "--output", str(tmp_path / "first"))
        assert first.returncode == 0, first.stderr
        asked = judge_requests(srv)
        again = arle(*args, "--output", str(tmp_path / "again"))
        assert again.returncode == 0, again.stderr
        # The second run graded from the cache: the judge was not asked again.
        assert judge_requests(srv) == asked == 3
        assert srv.max_in_flight == 3  # graded as one batch of concurrent requests, not one by one
        bodies = srv.bodies("/chat/completions")
        authorised = [r.headers.get("authorization") for r in srv.requests if r.method == "POST"]

    samples = [json.loads(line) for line in (tmp_path / "first" / "samples.jsonl").read_text().splitlines()]
    rows = read_rows_file(card.fixture_path)
    assert len(samples) == 3
    for sample in samples:
        details = sample["details"]
        assert details["judge_verdict"] in ("PASS", "FAIL") and details["judge_failed"] == 0.0
        assert "reference answer" in details["judge_reasoning"] and "Verdict" not in details["judge_reasoning"]
        assert sample["correct"] == (details["judge_verdict"] == "PASS")
        assert sample["reward"] == (1.0 if sample["correct"] else 0.0)
    # What the judge was shown: the question, the reference, the completion and the rubric's columns.
    prompts = {b["messages"][-1]["content"] for b in bodies}
    for sample, row in zip(samples, rows):
        prompt = next(p for p in prompts if row["question"] in p)
        assert row["best_answer"] in prompt and sample["completion"].strip() in prompt
        assert row["incorrect_answers"][0] in prompt  # {incorrect_answers} in the rubric
    assert all(b["temperature"] == 0.0 for b in bodies)
    results = json.loads(first.stdout)
    assert results["metrics"]["judge_failed"]["value"] == 0.0
    assert results["metrics"]["accuracy"] == json.loads(again.stdout)["metrics"]["accuracy"]
    again_samples = [json.loads(line) for line in (tmp_path / "again" / "samples.jsonl").read_text().splitlines()]
    assert [s["details"] for s in again_samples] == [s["details"] for s in samples]

    # The key went to the judge, and nowhere else: not the output, the run dirs or the cache.
    assert authorised == [f"Bearer {SECRET}"] * 3
    assert SECRET not in first.stdout + first.stderr + again.stdout + again.stderr
    home = Path(os.environ["ARLE_HOME"])
    for folder in (tmp_path / "first", tmp_path / "again", home):
        for path in folder.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


def test_a_judge_that_stays_down_stops_eval_with_one_line_and_resume_continues(tmp_path):
    with (
        FakeOpenAIServer(lambda body: "The answer is 42.") as model,
        judge_profile("judge", fail_first=1000, fail_status=503, retry_after=0) as srv,
    ):
        card = tmp_path / "judged.yaml"
        card.write_text(yaml.safe_dump(card_dict(max_retries=1)))
        proc = arle(
            "eval",
            str(card),
            "--base-url",
            model.base_url,
            "--data",
            str(load_card(CARD).fixture_path),
            "--output",
            str(tmp_path / "run"),
        )
        # Retried (max_retries: 1), then given up; the first request to give up cancels the rest.
        assert len(srv.requests) >= 2 and {r.status for r in srv.requests} == {503}
        srv.fail_first = 0  # the judge is back
        resumed = arle(
            "eval",
            str(card),
            "--base-url",
            model.base_url,
            "--data",
            str(load_card(CARD).fixture_path),
            "--output",
            str(tmp_path / "run"),
            "--resume",
            "--json",
        )
    # One error line (the engine's retry warnings go before it, as for the evaluated model's endpoint).
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "HTTP 503" in lines[0] and "--resume" in lines[0]
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["n_samples"] == 3


def test_a_rubric_naming_no_column_stops_eval_before_anything_is_generated(tmp_path):
    with FakeOpenAIServer(lambda body: "The answer is 42.") as model, judge_profile("judge") as srv:
        card = tmp_path / "judged.yaml"
        card.write_text(yaml.safe_dump(card_dict(rubric="PASS when it agrees with {best_answers}.")))
        proc = arle(
            "eval",
            str(card),
            "--base-url",
            model.base_url,
            "--data",
            str(load_card(CARD).fixture_path),
            "--output",
            str(tmp_path / "run"),
        )
        assert not model.bodies() and judge_requests(srv) == 0, "refused before any generation"
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        lines[0].startswith(
            f"error: {card}: card field 'reward.params.rubric' uses {{best_answers}}, which is not a column of the rows"
        )
        and "best_answer" in lines[0]
    )
    assert not (tmp_path / "run").exists()


def card_dict(**params: object) -> dict[str, object]:
    """The example card with its reward params changed (None removes one)."""
    data = yaml.safe_load(load_card(CARD).path.read_text())
    data["name"] = "judged"
    merged = {**data["reward"]["params"], **params}
    data["reward"]["params"] = {k: v for k, v in merged.items() if v is not None}
    data.pop("fixture")
    return data


@pytest.mark.parametrize(
    "params, needles",
    [
        ({"scale": "stars"}, ["param 'scale'", "pass/fail", "1-10"]),
        ({"scale": "10-1"}, ["scale '10-1'", "LO-HI"]),
        ({"model": None}, ["param 'model' is missing", "arle model setup"]),
        ({"model": "my-judge"}, ["'my-judge' is not a profile", "arle model setup --name my-judge"]),
        ({"threshold": 2}, ["threshold", "between 0 and 1"]),
        ({"rubric": None}, ["param 'rubric' is missing"]),
        ({"scale": 5}, ["reward.params.scale", "must be a string"]),
    ],
)
def test_bad_judge_params_are_one_line_naming_the_card_before_any_generation(tmp_path, params, needles):
    card = tmp_path / "judged.yaml"
    card.write_text(yaml.safe_dump(card_dict(**params)))
    with FakeOpenAIServer(lambda body: "The answer is 42.") as model:
        proc = arle(
            "eval",
            str(card),
            "--base-url",
            model.base_url,
            "--data",
            str(load_card(CARD).fixture_path),
            "--output",
            str(tmp_path / "run"),
        )
        assert not model.bodies(), "nothing is generated for a card whose judge is broken"
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(card) in lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]


# ---------------------------------------------------------------- the reward itself


def test_retries_transient_judge_errors_then_grades(tmp_path):
    tasks = fixture_tasks()
    for status in (500, 429):
        with judge_profile("judge", fail_first=2, fail_status=status, retry_after=0) as srv:
            score = get_reward("judge", judge_params(cache=False))
            result = score(tasks[0], episode(tasks[0], tasks[0].target))
            score.close()
            assert [r.status for r in srv.requests if r.method == "POST"] == [status, status, 200]
        assert result.correct and result.details["judge_verdict"] == "PASS"


def test_a_reply_without_a_verdict_scores_zero_with_the_error_recorded_and_counted(capsys):
    tasks = fixture_tasks()
    with judge_profile("judge"):
        score = get_reward("judge", judge_params())
        results = score.score_batch(
            tasks,
            [
                episode(tasks[0], f"{MUMBLE} {tasks[0].target}"),
                episode(tasks[1], tasks[1].target),
                episode(tasks[2], MUMBLE),
            ],
        )
        score.close()
    mumbled = [results[0], results[2]]
    for r in mumbled:
        assert r.reward == 0.0 and not r.correct and r.details["judge_failed"] == 1.0
        assert 'no "Verdict: PASS/FAIL" line' in r.details["judge_error"]
        assert "hard to say" in r.details["judge_error"] and "hard to say" in r.details["judge_reasoning"]
    assert results[1].correct and results[1].details["judge_failed"] == 0.0 and "judge_error" not in results[1].details
    assert "2 of 3 replies had no usable verdict" in capsys.readouterr().err


def test_numeric_scales_normalise_the_judges_score():
    tasks = fixture_tasks()
    with judge_profile("judge") as srv:
        score = get_reward("judge", judge_params(scale="1-5", threshold=0.75))
        right, wrong = score.score_batch(tasks[:2], [episode(tasks[0], tasks[0].target), episode(tasks[1], "no")])
        score.close()
        asked = srv.bodies("/chat/completions")[0]["messages"][-1]["content"]
    assert "whole number from 1 (worst) to 5 (best)" in asked
    assert (right.reward, right.correct, right.extracted) == (1.0, True, "5")
    assert (wrong.reward, wrong.correct, wrong.extracted) == (0.0, False, "1")


@pytest.mark.parametrize(
    "scale, reply, expected",
    [
        ("pass/fail", "Looks right.\nVerdict: PASS", (1.0, "PASS", "Looks right.")),
        ("pass/fail", "**Verdict:** fail", (0.0, "FAIL", "")),
        (
            "pass/fail",
            "Verdict: PASS at first sight... on reflection\nVerdict: FAIL",
            (0.0, "FAIL", "Verdict: PASS at first sight... on reflection"),
        ),
        ("1-10", "Mostly right.\nScore: 7/10", (6 / 9, "7", "Mostly right.")),
        ("0-100", "score = 85", (0.85, "85", "")),
        ("1-5", "Score: 3.5", (0.625, "3.5", "")),
    ],
)
def test_scales_read_the_last_verdict_line(scale, reply, expected):
    reward, verdict, reasoning = Scale.parse(scale).read(reply)
    assert (pytest.approx(reward), verdict, reasoning) == expected


@pytest.mark.parametrize(
    "scale, reply, error",
    [
        ("1-10", "Score: 11", "outside the scale 1-10"),
        ("1-10", "Verdict: PASS", 'no "Score: N" line'),
        ("pass/fail", "I give it 9 out of 10", 'no "Verdict: PASS/FAIL" line'),
    ],
)
def test_scales_refuse_a_reply_without_a_usable_verdict(scale, reply, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(")):
        Scale.parse(scale).read(reply)


def test_the_cache_is_keyed_by_judge_rubric_scale_and_completion(isolated_home):
    task = fixture_tasks()[0]
    done = episode(task, task.target)
    with judge_profile("judge") as srv:
        for _ in range(2):
            get_reward("judge", judge_params())(task, done)
        assert judge_requests(srv) == 1  # the second reward object read the first one's reply
        get_reward("judge", judge_params(rubric="PASS when it is short."))(task, done)
        get_reward("judge", judge_params(scale="1-10"))(task, done)
        get_reward("judge", judge_params())(task, episode(task, "Something else."))
        assert judge_requests(srv) == 4
        get_reward("judge", judge_params(cache=False))(task, done)
        assert judge_requests(srv) == 5
    with judge_profile("judge") as other:  # the same profile name, another endpoint: another judge
        get_reward("judge", judge_params())(task, done)
        assert judge_requests(other) == 1
    entries = list((isolated_home / "cache" / "judge").rglob("*.json"))
    assert len(entries) == 5 and not list((isolated_home / "cache" / "judge").rglob("*.tmp"))


def test_concurrent_graders_share_the_cache_without_torn_entries(isolated_home):
    from concurrent.futures import ThreadPoolExecutor

    tasks = fixture_tasks()
    with judge_profile("judge") as srv:
        scorers = [get_reward("judge", judge_params()) for _ in range(6)]  # as six processes would
        with ThreadPoolExecutor(6) as pool:
            runs = list(pool.map(lambda s: s.score_batch(tasks, [episode(t, t.target) for t in tasks]), scorers))
        assert all([r.correct for r in run] == [True, True, True] for run in runs)
        asked = judge_requests(srv)
        fresh = get_reward("judge", judge_params())
        assert [r.correct for r in fresh.score_batch(tasks, [episode(t, t.target) for t in tasks])] == [True] * 3
        assert judge_requests(srv) == asked  # every entry the racing writers left reads back whole
    entries = list((isolated_home / "cache" / "judge").rglob("*"))
    assert len([e for e in entries if e.suffix == ".json"]) == 3 and not [e for e in entries if e.suffix == ".tmp"]


def test_a_url_judge_with_its_model_name_and_key_env(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", SECRET)
    task = fixture_tasks()[0]
    with FakeOpenAIServer(grade_by_reference, api_key=SECRET, check_model=True, model="grader-1") as srv:
        score = get_reward("judge", judge_params(model=srv.base_url, model_name="grader-1", api_key_env="MY_JUDGE_KEY"))
        assert score(task, episode(task, task.target)).correct
        score.close()
        assert srv.bodies("/chat/completions")[0]["model"] == "grader-1"
    with pytest.raises(UserError, match="only apply when 'model' is an http"):
        get_reward("judge", judge_params(model_name="grader-1"))


def test_the_training_adapter_grades_a_batch_in_one_go(tmp_path):
    from arlecli.train.reward import CardReward

    card = load_card(CARD)
    tasks = fixture_tasks()
    with judge_profile("judge", delay_s=0.2) as srv:
        resolve_references(card)
        reward = CardReward(card, tasks, run_dir=tmp_path)
        episodes = [episode(tasks[i], tasks[i].target if i % 2 == 0 else "I have no comment.") for i in (0, 1, 2)]
        rewards = reward(prompts=[""] * 3, completions=[""] * 3, task_index=[0, 1, 2], episode=episodes)
        reward.close()  # what a training run does at its end: the judge's engine is released
        assert not reward.score_fn.engine_started
        # The three requests were in flight together, not one after another.
        assert srv.max_in_flight == 3
    assert rewards == [1.0, 0.0, 1.0]
    lines = [json.loads(line) for line in (tmp_path / "rewards.jsonl").read_text().splitlines()]
    assert [line["details"]["judge_verdict"] for line in lines] == ["PASS", "FAIL", "PASS"]


def test_a_local_model_can_judge(tiny_model):
    # The tiny random model writes no verdict: what matters is that the hf engine graded, and
    # that a judge's gibberish is a recorded failure, not a crash.
    task = fixture_tasks()[0]
    score = get_reward("judge", judge_params(model=str(tiny_model), max_tokens=8))
    results = score.score_batch([task, task], [episode(task, task.target), episode(task, "no")])
    score.close()
    assert score.spec.kind == "hf"
    for r in results:
        assert r.reward == 0.0 and r.details["judge_failed"] == 1.0 and "judge_error" in r.details


def test_the_example_card_loads_and_names_its_judge_metrics():
    card = load_card_file(load_card(CARD).path)
    assert card.reward == "judge" and card.reward_params["model"] == "judge"
    assert "judge_failed" in card.metrics


def test_a_rubric_placeholder_that_is_not_a_column_names_the_param():
    task = fixture_tasks()[0]
    with judge_profile("judge") as srv:
        score = get_reward("judge", judge_params(rubric="PASS when it agrees with {best_answers}."))
        with pytest.raises(UserError, match=r"'reward.params.rubric' uses \{best_answers\}.*best_answer"):
            score(task, episode(task, task.target))
        assert judge_requests(srv) == 0


def test_a_thinking_judge_is_read_by_its_answer_not_its_thought():
    # A judge that weighs the opposite verdict in its thought: the verdict it gives counts.
    from helpers.fake_openai import FakeOpenAIServer

    from arlecli import config

    def thinking_judge(body):
        verdict = grade_by_reference(body)
        flipped = verdict.replace("PASS", "TMP").replace("FAIL", "PASS").replace("TMP", "FAIL")
        return f"<think>\nFirst impression:\n{flipped}\n</think>\n\n{verdict}"

    tasks = fixture_tasks()
    with FakeOpenAIServer(thinking_judge) as srv:
        config.save_profile(config.ModelProfile(name="judge", base_url=srv.base_url, model=srv.model))
        score = get_reward("judge", judge_params())
        results = score.score_batch(tasks[:2], [episode(tasks[0], tasks[0].target), episode(tasks[1], "no idea")])
        score.close()
    assert results[0].correct and not results[1].correct
    assert "First impression" not in results[0].details["judge_reasoning"]


@pytest.mark.timeout(60)
def test_a_judge_reply_of_long_blank_runs_is_read_at_once() -> None:
    """Each position inside a long run of spaces began a scan of the rest of it (20,000: 8 s;
    200,000: minutes); a match now starts only where such a run starts, as the leftmost did."""
    from arlecli.rewards import llm_judge

    blank = " " * 200_000
    assert not list(llm_judge._VERDICT.finditer(blank + "x")) and not list(llm_judge._SCORE.finditer(blank))
    assert [m.group(1) for m in llm_judge._VERDICT.finditer(blank + "**Verdict:** PASS")] == ["PASS"]
