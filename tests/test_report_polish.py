"""The report in words a reader needs (issue 25, item 6), checked on the HTML and its data
block without a browser (tests/test_report.py renders it in Chromium on CI): efficiency in
plain labels and units, rounded; every sample row carries its question, target and extracted
answer; sort orders by task, reward, latency and length; a chart of several runs compares the
tasks they all hold and says how many."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from arlecli.report import build_report, question_of
from arlecli.results import aggregate

# Latencies and token counts that would print unrounded (33.8932 s) from the raw blocks.
LATENCY = [33.8932, 2.5, 12.25, 0.4, 7.0]


def sample(task: int, *, correct: bool, latency: float, tokens: int, group: str = "addition") -> dict:
    return {
        "id": f"one_digit_sums-1000-{task}#0",
        "task_id": f"one_digit_sums-1000-{task}",
        "sample": 0,
        "prompt": [{"role": "system", "content": "Answer."}, {"role": "user", "content": f"{task} + 1 ="}],
        "completion": f"It is {task + 1 if correct else task}",
        "extracted": str(task + 1 if correct else task),
        "target": str(task + 1),
        "reward": float(correct),
        "correct": correct,
        "details": {},
        "finish_reason": "stop",
        "num_tokens": tokens,
        "prompt_tokens": 20,
        "completion_tokens": tokens,
        "latency_s": latency,
        "group": group,
        "session_started_at": 1000.0,
        "finished_at": 1000.0 + task + 1,
    }


def write_run(folder: Path, tasks: list[int], wrong: set[int] = frozenset()) -> Path:
    samples = [
        sample(
            t,
            correct=t not in wrong,
            latency=LATENCY[t % len(LATENCY)],
            tokens=5 + 3 * (t % 4),
            group="addition" if t % 2 else "subtraction",
        )
        for t in tasks
    ]
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(
        json.dumps({"benchmark": "one_digit_sums", "model": "m", "options": {"num_samples": 1}, "created": "now"})
    )
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    results = {
        "benchmark": "one_digit_sums",
        "model": "m",
        "split": "test",
        **aggregate(samples, ["accuracy"], 1, group_by="group"),
    }
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def page_data(text: str) -> dict:
    return json.loads(
        re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S).group(1)
    )


def test_efficiency_is_in_plain_labels_and_rounded_units(tmp_path):
    text = build_report([write_run(tmp_path / "run", list(range(5)))])
    efficiency = text[text.index("Efficiency, cost and consistency") : text.index('class="browser"')]
    assert "latency_s" not in efficiency and "wall_s" not in efficiency and "33.8932" not in efficiency
    cells = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", efficiency))
    assert cells["latency per sample, median"] == "7.00 s"
    assert cells["latency per sample, 95th percentile"] == "29.6 s"  # 33.8932 among 5, interpolated
    assert cells["wall time"] == "5.00 s" and cells["samples per second"] == "1.00/s"
    assert cells["completion tokens per sample"] == "8.6" and cells["completion tokens in all"] == "43"
    assert "<th>Time</th>" in efficiency and "<th>Tokens</th>" in efficiency


def test_sample_rows_carry_question_target_extracted_and_sort_orders(tmp_path):
    run = write_run(tmp_path / "run", [2, 10, 1, 3, 0], wrong={10, 3})
    text = build_report([run])
    (browser,) = page_data(text)["browsers"]
    samples = browser["samples"]
    assert [s["question"] for s in samples] == ["2 + 1 =", "10 + 1 =", "1 + 1 =", "3 + 1 =", "0 + 1 ="]
    assert all("target" in s and "extracted" in s for s in samples)
    ids = [s["task_id"].rsplit("-", 1)[1] for s in samples]
    orders = browser["orders"]
    assert [ids[i] for i in orders["task"]] == ["0", "1", "2", "3", "10"]  # natural order, not "10" < "2"
    assert [samples[i]["reward"] for i in orders["reward"]] == [1.0, 1.0, 1.0, 0.0, 0.0]
    latencies = [samples[i]["latency_s"] for i in orders["latency"]]
    assert latencies == sorted(latencies, reverse=True) and latencies[0] == 33.8932
    lengths = [samples[i]["completion_tokens"] for i in orders["length"]]
    assert lengths == sorted(lengths, reverse=True)
    # The page's script builds the collapsed row from those fields and offers the sorts.
    for needle in (
        'el("span","question", s.question)',
        "extracted ",
        "target ",
        "sort by task",
        "sort by reward",
        "sort by latency",
        "sort by length",
        "payload.orders[sort.value]",
    ):
        assert needle in text


@pytest.mark.parametrize(
    "prompt, question",
    [
        (
            [
                {"role": "user", "content": "Q1"},
                {"role": "assistant", "content": "A1"},
                {"role": "user", "content": "Q2 ?"},
            ],
            "Q2 ?",
        ),
        ("Question: 1+1?\nAnswer: 2\n\nQuestion: 2+2?\nAnswer:", "Question: 2+2? Answer:"),  # after the exemplars
        ([{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]}], "look"),
        (None, ""),
    ],
)
def test_the_question_of_a_prompt(prompt, question):
    assert question_of(prompt) == question
    assert len(question_of("x" * 1000)) == 300


def test_several_runs_are_charted_on_the_tasks_they_share_and_say_so(tmp_path):
    big = write_run(tmp_path / "big", list(range(50)), wrong=set(range(30, 50)))  # right on the first 30
    small = write_run(tmp_path / "small", list(range(30)), wrong=set(range(0, 30, 2)))
    text = build_report([big, small])
    note = re.search(r'<p class="note compared-tasks" data-shared="(\d+)">([^<]*)</p>', text)
    assert note and note.group(1) == "30"
    assert "on the 30 tasks all of them hold (paired), out of 50, 30" in note.group(2)
    figures = {f["layout"]["title"]["text"]: f for f in page_data(text)["figures"]}
    chart = figures["Runs side by side on the 30 shared tasks: accuracy per group"]
    by_run = {trace["name"]: dict(zip(trace["x"], trace["y"])) for trace in chart["data"]}
    # big on the shared 30 is all right (its wrong ones are tasks 30-49, which small lacks)
    assert by_run["big"] == {"addition": 1.0, "subtraction": 1.0}
    assert by_run["small"] == {"addition": 1.0, "subtraction": 0.0}

    text = build_report([big, small], all_tasks=True)
    assert "each run on all of its own tasks (50, 30)" in text
    figures = {f["layout"]["title"]["text"]: f for f in page_data(text)["figures"]}
    own = {t["name"]: dict(zip(t["x"], t["y"])) for t in figures["Runs side by side: accuracy per group"]["data"]}
    assert own["big"] == {"addition": 0.6, "subtraction": 0.6}

    same = build_report([small, write_run(tmp_path / "again", list(range(30)))])
    assert "compares the runs on the same 30 tasks" in same


class Answers:
    """An engine that answers every request "7"."""

    name = "fixed"

    def generate(self, requests):
        from arlecli.engine.base import Completion

        for i, _ in enumerate(requests):
            yield i, Completion(text="7")

    def close(self) -> None:
        pass


def test_generator_task_ids_are_named_after_the_card_and_old_runs_resume_as_they_were(tmp_path):
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.catalog import load_card

    card = load_card("one_digit_sums")  # reasoning_gym:chain_sum's rows
    run_eval(card, Answers(), EvalOptions(limit=3), model="m", run_dir=tmp_path / "new")
    new = [json.loads(line)["task_id"] for line in (tmp_path / "new" / "samples.jsonl").read_text().splitlines()]
    assert sorted(new) == ["one_digit_sums-1000-0", "one_digit_sums-1000-1", "one_digit_sums-1000-2"]
    chain = load_card("chain_sum")  # a card named as its generator keeps its ids
    run_eval(chain, Answers(), EvalOptions(limit=1), model="m", run_dir=tmp_path / "chain")
    assert json.loads((tmp_path / "chain" / "samples.jsonl").read_text())["task_id"].startswith("chain_sum-")

    # A run written before (ids chain_sum-...), interrupted after 2 of its 3 tasks: the resume
    # finishes it under its own ids, never running those 2 again under new names.
    old = tmp_path / "old"
    run_eval(card, Answers(), EvalOptions(limit=3), model="m", run_dir=old)
    lines = [json.loads(line) for line in (old / "samples.jsonl").read_text().splitlines()]
    for s in lines:
        s["id"], s["task_id"] = (x.replace("one_digit_sums-", "chain_sum-") for x in (s["id"], s["task_id"]))
    (old / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in lines[:2]))
    (old / "results.json").unlink()
    results = run_eval(card, Answers(), EvalOptions(limit=3), model="m", run_dir=old, resume=True)
    resumed = [json.loads(line)["task_id"] for line in (old / "samples.jsonl").read_text().splitlines()]
    assert results["n_tasks"] == 3 and sorted(resumed) == [t.replace("one_digit_sums-", "chain_sum-") for t in new]


def test_the_page_style_and_script_are_the_packaged_files(tmp_path):
    from importlib.resources import files

    text = build_report([write_run(tmp_path / "run", [0, 1])])
    assets = files("arlecli") / "report_assets"
    css, js = ((assets / name).read_text(encoding="utf-8") for name in ("report.css", "report.js"))
    assert f"<style>\n{css}</style>" in text and f"<script>\n{js}</script></body>" in text
