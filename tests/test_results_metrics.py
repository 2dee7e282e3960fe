"""results.json's efficiency, consistency and cost blocks: pass^k, all-agree, cost and
cost-of-pass against hand-computed values; tokens/time/agents from real runs (the tiny model,
a fake endpoint with `usage`); resume; prices from profiles and the command line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from arlecli.efficiency import Prices, agent_stats, cost_stats, percentile, time_stats
from arlecli.eval import EvalOptions, run_eval
from arlecli.catalog import load_card
from arlecli.results import aggregate, pass_at_k, pass_hat_k, read_samples

from helpers.cli import arle
from helpers.fake_openai import FakeOpenAIServer
from helpers.tool_model import CALL, GSM8K_ROWS, first_turn_calls_a_tool

# The blocks that count things: a resumed run must reproduce them exactly (time may differ).
COUNT_BLOCKS = ("metrics", "n_tasks", "n_samples", "tokens", "agents", "consistency", "cost")


def sample(task: str, k: int, correct: bool, extracted: Any = None, **extra: Any) -> dict[str, Any]:
    """A minimal samples.jsonl line."""
    return {"id": f"{task}#{k}", "task_id": task, "correct": correct, "details": {}, "extracted": extracted, **extra}


def rows_file(tmp_path: Path, n: int) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(n))
    )
    return str(path)


# ------------------------------------------------------------------ consistency: pass^k, all-agree


def test_pass_hat_k_by_hand() -> None:
    assert pass_hat_k(5, 3, 2) == pytest.approx(3 / 10)  # C(3,2)/C(5,2)
    assert pass_hat_k(4, 3, 2) == pytest.approx(3 / 6)  # C(3,2)/C(4,2)
    assert pass_hat_k(4, 2, 1) == pytest.approx(0.5)  # pass^1 is the success rate
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_hat_k(4, 3, 4) == 0.0 and pass_hat_k(8, 0, 1) == 0.0
    for n, c, k in [(10, 7, 3), (16, 9, 8), (40, 31, 16)]:
        assert pass_hat_k(n, c, k) == pytest.approx(math.comb(c, k) / math.comb(n, k))
    with pytest.raises(ValueError):
        pass_hat_k(2, 1, 3)


def test_pass_hat_k_and_all_agree_in_results_by_hand() -> None:
    # a: 3 of 4 correct, answers 1,1,1,2 / b: none correct, all answer 5 / c: all correct, all answer 3
    samples = [sample("a", k, k < 3, 1 if k < 3 else 2) for k in range(4)]
    samples += [sample("b", k, False, 5) for k in range(4)] + [sample("c", k, True, 3) for k in range(4)]
    res = aggregate(samples, [], 4)
    m = res["metrics"]
    assert m["accuracy"]["value"] == pytest.approx((0.75 + 0 + 1) / 3)
    assert m["pass^1"]["value"] == pytest.approx((0.75 + 0 + 1) / 3)
    assert m["pass^2"]["value"] == pytest.approx((3 / 6 + 0 + 1) / 3)
    assert m["pass^4"]["value"] == pytest.approx(1 / 3)
    assert m["pass@2"]["value"] == pytest.approx(2 / 3)  # a: 1 - C(1,2)/C(4,2) = 1
    assert m["pass^4"]["n"] == 3 and m["pass^2"]["stderr"] > 0
    assert res["consistency"] == {
        "samples_per_task": 4,
        "tasks": 3,
        "all_agree": pytest.approx(2 / 3),
        "same_answer": pytest.approx(2 / 3),
    }
    # One sample per task: pass^k and the consistency block are not reported.
    single = aggregate([sample("a", 0, True), sample("b", 0, False)], [], 1)
    assert "consistency" not in single and not any(k.startswith("pass^") for k in single["metrics"])


def test_pass_hat_k_skips_tasks_with_fewer_samples_than_k() -> None:
    # An unfinished run: task b has 1 of its 2 samples, so pass^2 is over task a only.
    samples = [sample("a", 0, True), sample("a", 1, False), sample("b", 0, True)]
    m = aggregate(samples, [], 2)["metrics"]
    assert m["pass^2"]["value"] == 0.0 and m["pass^2"]["n"] == 1
    assert pass_at_k(2, 1, 2) == 1.0


# ------------------------------------------------------------------ cost and cost-of-pass


def test_cost_and_cost_of_pass_by_hand() -> None:
    prices = Prices(1.0, 2.0)  # USD per 1M input / output tokens
    samples = [
        sample("a", 0, True, prompt_tokens=1000, completion_tokens=500),  # 0.001 + 0.001 = 0.002
        sample("b", 0, False, prompt_tokens=3000, completion_tokens=1000),
    ]  # 0.003 + 0.002 = 0.005
    cost = aggregate(samples, [], 1, prices=prices)["cost"]
    assert cost["currency"] == "USD" and cost["price_input_per_1m"] == 1.0 and cost["price_output_per_1m"] == 2.0
    assert cost["total"] == pytest.approx(0.007)
    assert cost["per_task"] == pytest.approx(0.0035) and cost["per_sample"] == pytest.approx(0.0035)
    assert cost["cost_of_pass"] == pytest.approx(0.0035 / 0.5)  # cost per task / accuracy
    # Two samples per task: cost-of-pass is the cost of one correct sample (total / correct samples).
    two = samples + [
        sample("a", 1, True, prompt_tokens=1000, completion_tokens=500),
        sample("b", 1, False, prompt_tokens=1000, completion_tokens=0),
    ]  # 0.002, 0.001
    cost = aggregate(two, [], 2, prices=prices)["cost"]
    assert cost["total"] == pytest.approx(0.010) and cost["per_task"] == pytest.approx(0.005)
    assert cost["per_sample"] == pytest.approx(0.0025) and cost["cost_of_pass"] == pytest.approx(0.010 / 2)


def test_no_cost_without_prices_and_no_made_up_numbers() -> None:
    samples = [sample("a", 0, False, prompt_tokens=10, completion_tokens=5)]
    assert "cost" not in aggregate(samples, [], 1)
    nothing_passed = aggregate(samples, [], 1, prices=Prices(1.0, 1.0))["cost"]
    assert nothing_passed["total"] == pytest.approx(15e-6) and nothing_passed["cost_of_pass"] is None
    unknown = cost_stats(
        [*samples, sample("b", 0, True, prompt_tokens=None, completion_tokens=None)], 2, Prices(1.0, 1.0)
    )
    assert unknown is not None and unknown["samples_without_counts"] == 1
    assert unknown["total"] is unknown["per_task"] is unknown["cost_of_pass"] is None


# ------------------------------------------------------------------ time and agents by hand


def test_time_adds_up_sessions_and_latency_percentiles() -> None:
    samples = [
        sample("a", 0, True, session_started_at=100.0, finished_at=104.0, completion_tokens=10, latency_s=1.0),
        sample("b", 0, True, session_started_at=100.0, finished_at=106.0, completion_tokens=20, latency_s=2.0),
        # resumed an hour later: the pause is not the run's time
        sample("c", 0, True, session_started_at=3700.0, finished_at=3704.0, completion_tokens=30, latency_s=3.0),
        sample("d", 0, True, session_started_at=3700.0, finished_at=3703.0, completion_tokens=40, latency_s=4.0),
    ]
    t = time_stats(samples)
    assert t is not None
    assert t["wall_s"] == pytest.approx(10.0) and t["sessions"] == 2
    assert t["samples_per_s"] == pytest.approx(0.4) and t["completion_tokens_per_s"] == pytest.approx(10.0)
    assert t["latency_s"] == {"p50": pytest.approx(2.5), "p95": pytest.approx(3.85), "mean": pytest.approx(2.5), "n": 4}
    assert percentile([5.0], 95) == 5.0
    assert time_stats([sample("a", 0, True)]) is None  # a line from before these fields: no block


def test_agent_block_by_hand() -> None:
    samples = [
        sample(
            "a",
            0,
            True,
            num_turns=2,
            tool_calls=1,
            tool_errors=0,
            end_reason="answered",
            prompt_tokens=100,
            completion_tokens=20,
        ),
        sample(
            "b",
            0,
            False,
            num_turns=5,
            tool_calls=4,
            tool_errors=2,
            end_reason="turn_limit",
            prompt_tokens=400,
            completion_tokens=80,
        ),
        sample(
            "c",
            0,
            True,
            num_turns=3,
            tool_calls=2,
            tool_errors=1,
            end_reason="answered",
            prompt_tokens=200,
            completion_tokens=40,
        ),
    ]
    a = agent_stats(samples)
    assert a == {
        "episodes": 3,
        "turns_per_episode": pytest.approx(10 / 3),
        "tool_calls_per_episode": pytest.approx(7 / 3),
        "tool_errors_per_episode": pytest.approx(1.0),
        "end_reasons": {"answered": 2, "turn_limit": 1},
        "successes": 2,
        "steps_to_success": pytest.approx(2.5),
        "tokens_per_success": pytest.approx(420.0),
    }
    assert agent_stats([sample("a", 0, True)]) is None  # single-turn samples: no agents block
    assert agent_stats([sample("a", 0, False, num_turns=1)])["steps_to_success"] is None


# ------------------------------------------------------------------ real runs


def test_tiny_model_agent_eval_reports_tokens_time_and_agents(tmp_path, tiny_model, monkeypatch) -> None:
    from arlecli.engine.hf import HFEngine

    first_turn_calls_a_tool(monkeypatch, latency_s=0.001)  # timed: every turn has a latency
    engine = HFEngine(str(tiny_model))
    try:
        res = run_eval(
            load_card("math_tool"),
            engine,
            EvalOptions(data=GSM8K_ROWS, limit=3, max_tokens=8),
            model="tiny",
            run_dir=tmp_path,
        )
    finally:
        engine.close()
    samples = read_samples(tmp_path)
    assert len(samples) == 3
    for s in samples:  # the engine's own counts: every turn's prompt ids and generated ids
        assert s["num_turns"] == len(s["turns"]) >= 2 and s["tool_calls"] >= 1
        assert s["prompt_tokens"] == sum(t["prompt_tokens"] for t in s["turns"]) > 0
        assert s["completion_tokens"] == s["num_tokens"] == sum(t["completion_tokens"] for t in s["turns"])
        assert s["latency_s"] > 0 and all(t["latency_s"] > 0 for t in s["turns"])
        assert s["finished_at"] >= s["session_started_at"]
    tokens = res["tokens"]
    assert tokens["completion"]["total"] == sum(s["completion_tokens"] for s in samples)
    assert tokens["prompt"]["mean"] == pytest.approx(sum(s["prompt_tokens"] for s in samples) / 3)
    assert res["time"]["wall_s"] > 0 and res["time"]["sessions"] == 1 and res["time"]["latency_s"]["n"] == 3
    assert res["time"]["samples_per_s"] == pytest.approx(3 / res["time"]["wall_s"])
    agents = res["agents"]
    assert agents["episodes"] == 3
    assert agents["turns_per_episode"] == pytest.approx(sum(s["num_turns"] for s in samples) / 3)
    assert agents["tool_calls_per_episode"] >= 1
    assert sum(agents["end_reasons"].values()) == 3
    assert "cost" not in res and "consistency" not in res
    assert json.loads((tmp_path / "results.json").read_text())["agents"] == agents


def test_tiny_model_cli_eval_prints_the_efficiency_block_and_cost(tmp_path, tiny_model) -> None:
    out = arle(
        "eval",
        "countdown",
        "--model",
        str(tiny_model),
        "--limit",
        "3",
        "--max-tokens",
        "8",
        "--price-input",
        "2",
        "--price-output",
        "10",
        "--output",
        str(tmp_path / "run"),
    )
    assert out.returncode == 0, out.stderr
    assert "tokens: prompt" in out.stdout and "samples/s" in out.stdout and "cost: $" in out.stdout
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    samples = read_samples(tmp_path / "run")
    assert all(0 < s["completion_tokens"] <= 9 and s["prompt_tokens"] > 0 for s in samples)  # 8 + EOS at most
    total = sum(s["prompt_tokens"] * 2 + s["completion_tokens"] * 10 for s in samples) / 1e6
    assert res["cost"]["total"] == pytest.approx(total) and res["cost"]["per_task"] == pytest.approx(total / 3)
    assert "agents" not in res


def _tool_agent(body: dict) -> str:
    """A scripted endpoint agent for math_tool: a calculator call first, then the answer."""
    answered = sum(m["role"] == "assistant" for m in body["messages"])
    return CALL if answered == 0 else "So 6 are left.\n#### 6"


def test_endpoint_usage_is_what_samples_count(tmp_path) -> None:
    # strict: a hosted API that returns no token ids, so `usage` is the only count there is.
    with FakeOpenAIServer(_tool_agent, strict=True) as srv:
        from arlecli.engine.openai import OpenAIEngine

        with OpenAIEngine(srv.base_url, srv.model) as engine:
            res = run_eval(
                load_card("math_tool"),
                engine,
                EvalOptions(data=GSM8K_ROWS, limit=2, num_fewshot=0),
                model="fake",
                run_dir=tmp_path,
                prices=Prices(1.0, 4.0),
            )
        # The requests answered (the first ones were refused for vLLM's return_token_ids).
        bodies = [r.body for r in srv.requests if r.status == 200 and r.path.endswith("/chat/completions")]
    samples = read_samples(tmp_path)
    # The fake server counts one token per character: usage = characters sent and returned.
    sent = sum(len("".join(m["content"] for m in b["messages"])) for b in bodies)
    assert sum(s["prompt_tokens"] for s in samples) == sent == res["tokens"]["prompt"]["total"]
    replies = len(CALL) + len("So 6 are left.\n#### 6")
    assert all(s["completion_tokens"] == replies and s["num_tokens"] == 0 for s in samples)
    assert res["agents"]["turns_per_episode"] == 2 and res["agents"]["tool_calls_per_episode"] == 1
    # Only the first fixture row's answer is 6: one success, reached in 2 turns.
    assert res["agents"]["end_reasons"] == {"answered": 2} and res["agents"]["successes"] == 1
    assert res["agents"]["steps_to_success"] == 2
    assert res["agents"]["tokens_per_success"] == pytest.approx(sent + 2 * replies)
    assert res["cost"]["cost_of_pass"] == pytest.approx(res["cost"]["total"])
    assert res["cost"]["total"] == pytest.approx((sent * 1.0 + 2 * replies * 4.0) / 1e6)
    assert res["time"]["latency_s"]["n"] == 2


def test_endpoint_without_usage_or_ids_gives_null_counts_not_guesses(tmp_path) -> None:
    with FakeOpenAIServer(lambda body: "#### 1", strict=True, usage=False) as srv:
        from arlecli.engine.openai import OpenAIEngine

        with OpenAIEngine(srv.base_url, srv.model) as engine:
            res = run_eval(
                load_card("gsm8k"),
                engine,
                EvalOptions(data=rows_file(tmp_path, 2), num_fewshot=0),
                model="fake",
                run_dir=tmp_path / "run",
                prices=Prices(1.0, 1.0),
            )
    assert all(s["prompt_tokens"] is None and s["completion_tokens"] is None for s in read_samples(tmp_path / "run"))
    assert "tokens" not in res and "completion_tokens_per_s" not in res["time"]
    assert res["cost"]["total"] is None and res["cost"]["samples_without_counts"] == 2


def test_malformed_usage_is_one_line(tmp_path) -> None:
    from arlecli.engine.openai import MalformedReply, parse_completion

    reply = {
        "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2},
    }
    comp = parse_completion(reply, True, [])
    assert (comp.prompt_tokens, comp.completion_tokens) == (7, 2)
    with pytest.raises(MalformedReply, match="usage.completion_tokens"):
        parse_completion({**reply, "usage": {"prompt_tokens": 7, "completion_tokens": "2"}}, True, [])


def test_resumed_run_counts_equal_an_uninterrupted_one(tmp_path) -> None:
    from arlecli.engine.openai import OpenAIEngine

    card, prices = load_card("math_tool"), Prices(0.5, 1.5)
    opts = EvalOptions(data=GSM8K_ROWS, limit=4, num_fewshot=0, num_samples=2, temperature=0.7)
    with FakeOpenAIServer(_tool_agent) as srv, OpenAIEngine(srv.base_url, srv.model) as engine:
        full = run_eval(card, engine, opts, model="fake", run_dir=tmp_path / "full", prices=prices)
        # An interrupted run: half of the samples written (the last line torn), no results.json.
        part = tmp_path / "part"
        part.mkdir()
        shutil.copy(tmp_path / "full" / "meta.json", part / "meta.json")
        lines = (tmp_path / "full" / "samples.jsonl").read_text().splitlines(keepends=True)
        (part / "samples.jsonl").write_text("".join(lines[:4]) + lines[4][:20])
        resumed = run_eval(card, engine, opts, model="fake", run_dir=part, resume=True, prices=prices)
    for key in COUNT_BLOCKS:
        assert resumed[key] == full[key], key
    assert resumed["time"]["sessions"] == 2 and full["time"]["sessions"] == 1
    assert resumed["consistency"]["samples_per_task"] == 2 and "pass^2" in resumed["metrics"]


# ------------------------------------------------------------------ prices: profiles, overrides, bad values


def test_profile_prices_and_cli_override(tmp_path) -> None:
    rows = rows_file(tmp_path, 3)
    with FakeOpenAIServer(lambda body: "#### 1") as srv:
        setup = arle(
            "model",
            "setup",
            "--name",
            "priced",
            "--base-url",
            srv.base_url,
            "--model",
            srv.model,
            "--price-input",
            "1.5",
            "--price-output",
            "6",
        )
        assert setup.returncode == 0, setup.stderr
        shown = json.loads(arle("model", "show", "priced", "--json").stdout)
        assert shown["price_input"] == 1.5 and shown["price_output"] == 6.0
        common = ["eval", "gsm8k", "--data", rows, "--num-fewshot", "0", "--model", "priced", "--json"]
        from_profile = arle(*common, "--output", str(tmp_path / "a"))
        overridden = arle(*common, "--price-output", "60", "--output", str(tmp_path / "b"))
        no_prices = arle(
            "eval",
            "gsm8k",
            "--data",
            rows,
            "--num-fewshot",
            "0",
            "--base-url",
            srv.base_url,
            "--json",
            "--output",
            str(tmp_path / "c"),
        )
    assert from_profile.returncode == overridden.returncode == no_prices.returncode == 0, from_profile.stderr
    a, b = json.loads(from_profile.stdout)["cost"], json.loads(overridden.stdout)["cost"]
    assert (a["price_input_per_1m"], a["price_output_per_1m"]) == (1.5, 6.0)
    assert (b["price_input_per_1m"], b["price_output_per_1m"]) == (1.5, 60.0)  # only the output price overridden
    samples = read_samples(tmp_path / "a")
    expect = sum(s["prompt_tokens"] * 1.5 + s["completion_tokens"] * 6.0 for s in samples) / 1e6
    assert a["total"] == pytest.approx(expect)
    assert "cost" not in json.loads(no_prices.stdout)
    assert "cost" not in json.loads((tmp_path / "c" / "results.json").read_text())


@pytest.mark.parametrize(
    "args, says",
    [
        (["--price-input", "abc", "--price-output", "1"], "--price-input"),
        (["--price-input", "1", "--price-output", "-2"], "--price-output"),
        (["--price-input", "nan", "--price-output", "1"], "--price-input"),
        (["--price-input", "1"], "--price-output too"),
    ],
)
def test_bad_prices_are_one_line_exit_2(tmp_path, args, says) -> None:
    out = arle(
        "eval",
        "gsm8k",
        "--data",
        rows_file(tmp_path, 1),
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--output",
        str(tmp_path / "run"),
        *args,
    )
    assert out.returncode == 2 and says in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_bad_profile_prices_are_one_line_exit_2(isolated_home) -> None:
    setup = arle("model", "setup", "--name", "p", "--hub-id", "org/m", "--price-input", "inf", "--price-output", "1")
    half = arle("model", "setup", "--name", "p", "--hub-id", "org/m", "--price-output", "1")
    (isolated_home / "models.yaml").write_text("profiles:\n  q: {hub_id: org/m, price_input: cheap, price_output: 1}\n")
    edited = arle("model", "list")
    for out, says in ((setup, "--price-input"), (half, "--price-input too"), (edited, "price_input")):
        assert out.returncode == 2 and says in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
