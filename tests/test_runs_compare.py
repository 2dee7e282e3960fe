"""`arle runs list|show` and `arle compare` (issue 13, items 2 and 3).

The statistics (exact McNemar, paired stderr) are checked against hand-computed values and
scipy; the commands run as a user runs them (a subprocess) over run directories written by
results.aggregate, and over two real eval runs of the tiny model. Bad input is one line,
exit 2, and leaves the run directory byte-identical.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from arlecli.compare import compare_samples, mcnemar_exact, paired_difference
from arlecli.results import aggregate

from helpers.cli import arle, assert_one_line_error, snapshot


def sample(tid: str, correct: bool, k: int = 0, group: str | None = None) -> dict[str, Any]:
    """A samples.jsonl line as eval.py writes it (the fields aggregation and compare read)."""
    s = {
        "id": f"{tid}#{k}",
        "task_id": tid,
        "sample": k,
        "prompt": f"question {tid}",
        "completion": "answer",
        "extracted": "1" if correct else "2",
        "target": "1",
        "reward": float(correct),
        "correct": correct,
        "details": {"accuracy": int(correct)},
        "finish_reason": "stop",
        "num_tokens": 3,
    }
    if group is not None:
        s["group"] = group
    return s


def write_eval_run(
    run: Path,
    correct: list[bool],
    *,
    benchmark: str = "gsm8k",
    split: str = "test",
    groups: list[str] | None = None,
    finished: bool = True,
    expected: int | None = None,
) -> Path:
    """An eval run directory: meta.json, samples.jsonl and (when finished) results.json from aggregate."""
    run.mkdir(parents=True)
    samples = [sample(str(i), c, group=groups[i] if groups else None) for i, c in enumerate(correct)]
    meta = {
        "command": ["arle", "eval", benchmark],
        "benchmark": benchmark,
        "card_version": 1,
        "card_hash": "abc",
        "model": "tiny",
        "engine": "hf",
        "created": "2025-01-02T03:04:05+0000",
        "options": {
            "split": split,
            "limit": expected,
            "num_samples": 1,
            "temperature": 0.0,
            "seed": 1234,
            "data": None,
        },
        "data_hash": None,
    }
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    if finished:
        results = {
            "benchmark": benchmark,
            "card_version": 1,
            "model": "tiny",
            "split": split,
            "num_samples": 1,
            **aggregate(samples, ["accuracy"], 1, "subject" if groups else None),
        }
        (run / "results.json").write_text(json.dumps(results))
    return run


def write_train_run(run: Path) -> Path:
    """A finished 2-step training run: meta.json (kind train), metrics.jsonl, summary.json, and
    held-out evals eval/step-0 and eval/step-2 (ordinary eval runs)."""
    run.mkdir(parents=True)
    meta = {
        "command": ["arle", "train", "gsm8k"],
        "kind": "train",
        "benchmark": "gsm8k",
        "model": "tiny",
        "algo": "grpo",
        "train_split": "train",
        "eval_split": "test",
        "created": "2025-01-03T00:00:00+0000",
        "options": {"eval_limit": 6},
        "trainer": {"max_steps": 2},
    }
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward": 0.1 * s, "loss": 0.5}) + "\n" for s in (1, 2))
    )
    write_eval_run(run / "eval" / "step-0", [False, False, True, False, False, True])
    write_eval_run(run / "eval" / "step-2", [True, False, True, True, False, True])
    (run / "summary.json").write_text(
        json.dumps(
            {
                "benchmark": "gsm8k",
                "model": "tiny",
                "algo": "grpo",
                "global_step": 2,
                "before": {"label": "step-0"},
                "after": {"label": "step-2"},
            }
        )
    )
    return run


# ---------------------------------------------------------------------------------------------
# The statistics


@pytest.mark.parametrize(
    "a_only, b_only, expected",
    [
        (0, 0, 1.0),  # no discordant pairs: no evidence either way
        (0, 5, 2 / 32),  # 2 * C(5,0) / 2^5
        (1, 5, 2 * 7 / 64),  # 2 * (C(6,0) + C(6,1)) / 2^6
        (5, 1, 2 * 7 / 64),  # symmetric
        (3, 3, 1.0),  # 2 * 42 / 64 > 1, capped
        (2, 8, 2 * 56 / 1024),  # 2 * (1 + 10 + 45) / 2^10
    ],
)
def test_mcnemar_hand_computed(a_only, b_only, expected):
    assert mcnemar_exact(a_only, b_only) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_matches_scipy_exact_binomial():
    for a_only in range(0, 31):
        for b_only in range(0, 31):
            n = a_only + b_only
            if n == 0:
                continue
            want = stats.binomtest(min(a_only, b_only), n, 0.5, alternative="two-sided").pvalue
            assert mcnemar_exact(a_only, b_only) == pytest.approx(want, rel=1e-9, abs=1e-300), (a_only, b_only)
    # Thousands of flips: exact integers, no overflow.
    want = stats.binomtest(950, 2000, 0.5).pvalue
    assert mcnemar_exact(950, 1050) == pytest.approx(want, rel=1e-9)
    # Far past 0.5**1074 (where a float power of two underflows), the tail is still exact: ~1.6e-85.
    assert mcnemar_exact(200, 800) == pytest.approx(stats.binomtest(200, 1000, 0.5).pvalue, rel=1e-9)


def test_paired_stderr_hand_computed_and_scipy():
    # d = b - a = [0, 1, -1, 0]: mean 0, sample variance 2/3, stderr sqrt(2/3 / 4) = sqrt(1/6)
    got = paired_difference([1, 0, 1, 1], [1, 1, 0, 1])
    assert got.diff == 0 and got.n == 4
    assert got.stderr == pytest.approx(math.sqrt(1 / 6), rel=1e-12)
    assert (got.ci_low, got.ci_high) == pytest.approx(
        (-1.959963984540054 * math.sqrt(1 / 6), 1.959963984540054 * math.sqrt(1 / 6))
    )
    # d = [1, 1, 0, 1, 0]: mean 0.6, variance (3 * 0.16 + 2 * 0.36) / 4 = 0.3, stderr sqrt(0.3 / 5)
    got = paired_difference([0, 0, 1, 0, 1], [1, 1, 1, 1, 1])
    assert got.diff == pytest.approx(0.6) and got.stderr == pytest.approx(math.sqrt(0.06), rel=1e-12)
    rng = random.Random(0)
    a = [rng.random() for _ in range(50)]
    b = [x + rng.gauss(0.1, 0.2) for x in a]
    got = paired_difference(a, b)
    d = [y - x for x, y in zip(a, b)]
    assert got.diff == pytest.approx(sum(d) / 50)
    assert got.stderr == pytest.approx(stats.sem(d), rel=1e-10)  # scipy: ddof=1
    assert math.isnan(paired_difference([1.0], [0.0]).stderr)  # one task: no spread to estimate


def test_compare_samples_counts_flips_groups_and_non_binary():
    # A right on 0,1,2,3; B right on 2,3,4,5,6; task 7 wrong in both; task 8 only in A.
    a = [sample(str(i), i < 4, group="x" if i % 2 else "y") for i in range(9)]
    b = [sample(str(i), 2 <= i <= 6, group="x" if i % 2 else "y") for i in range(8)]
    cmp = compare_samples(a, b, ["accuracy"])
    m = cmp.metrics[0]
    assert (cmp.shared, cmp.only_a, cmp.only_b) == (8, 1, 0)
    assert (m.won, m.lost, m.tied) == (3, 2, 3)
    assert cmp.gained == ["4", "5", "6"] and cmp.lost == ["0", "1"]
    assert (m.a, m.b, m.diff) == pytest.approx((4 / 8, 5 / 8, 1 / 8))
    assert m.mcnemar_p == pytest.approx(stats.binomtest(2, 5, 0.5).pvalue)
    assert m.stderr == pytest.approx(stats.sem([-1, -1, 0, 0, 1, 1, 1, 0]))
    assert set(cmp.groups) == {"x", "y"} and sum(g[0].n for g in cmp.groups.values()) == 8
    # Two samples per task: per-task accuracy is 0, 0.5 or 1, so no McNemar; pass@2 pairs too.
    a2 = [sample(str(i), k == 0 or i == 0, k) for i in range(3) for k in range(2)]
    b2 = [sample(str(i), True, k) for i in range(3) for k in range(2)]
    cmp2 = compare_samples(a2, b2, ["accuracy", "pass@2"])
    acc, p2 = cmp2.metrics
    assert acc.mcnemar_p is None and (acc.a, acc.b) == pytest.approx((4 / 6, 1.0))
    assert p2.metric == "pass@2" and p2.mcnemar_p == 1.0 and (p2.a, p2.b) == (1.0, 1.0)
    json.dumps(cmp2.as_dict(), allow_nan=False)  # strict JSON: NaN never leaks out


# ---------------------------------------------------------------------------------------------
# arle runs


def test_runs_list_marks_interrupted_resumable_and_lists_training(tmp_path):
    runs = tmp_path / "runs"
    write_eval_run(runs / "gsm8k-tiny-done", [True, False, True, True])
    # Killed after 2 of 5 samples (--limit 5): no results.json yet, and a torn third line.
    cut = write_eval_run(runs / "gsm8k-tiny-cut", [True, False], finished=False, expected=5)
    with open(cut / "samples.jsonl", "a") as f:
        f.write('{"id": "2#0", "task_')
    # Finished, then its last line torn: a resume drops that line and redoes the sample.
    torn = write_eval_run(runs / "gsm8k-tiny-torn", [True, True, False])
    (torn / "samples.jsonl").write_bytes((torn / "samples.jsonl").read_bytes()[:-5])
    write_train_run(runs / "train-gsm8k-tiny")
    (runs / "notes").mkdir()  # not a run: skipped
    before = snapshot(runs)

    out = arle("runs", "list", "--json", cwd=tmp_path)  # ./runs by default
    assert out.returncode == 0, out.stderr
    rows = {Path(r["path"]).name: r for r in json.loads(out.stdout)}
    assert set(rows) == {"gsm8k-tiny-done", "gsm8k-tiny-cut", "gsm8k-tiny-torn", "train-gsm8k-tiny"}  # not eval/step-N
    assert (rows["gsm8k-tiny-torn"]["status"], rows["gsm8k-tiny-torn"]["resumable"]) == ("interrupted", True)
    done, cut_row, train = rows["gsm8k-tiny-done"], rows["gsm8k-tiny-cut"], rows["train-gsm8k-tiny"]
    assert (done["kind"], done["status"], done["resumable"], done["done"], done["expected"]) == (
        "eval",
        "complete",
        False,
        4,
        4,
    )
    assert done["value"] == 0.75 and done["stderr"] == pytest.approx(stats.sem([1, 0, 1, 1]))
    assert (cut_row["status"], cut_row["resumable"], cut_row["done"], cut_row["expected"]) == (
        "interrupted",
        True,
        2,
        5,
    )
    assert (train["kind"], train["status"], train["done"], train["expected"], train["unit"]) == (
        "train",
        "complete",
        2,
        2,
        "steps",
    )
    assert train["metric"] == "accuracy@step-2" and train["value"] == pytest.approx(4 / 6)

    text = arle("runs", "list", str(runs))
    assert text.returncode == 0, text.stderr
    assert "interrupted: resumable" in text.stdout and "2/5" in text.stdout and "2/2 steps" in text.stdout
    assert snapshot(runs) == before

    empty = arle("runs", "list", cwd=runs / "notes")  # no ./runs here: a message, not an error
    assert empty.returncode == 0 and "no runs" in empty.stdout


def test_runs_show_prints_metrics_blocks_and_failed_samples(tmp_path):
    run = write_eval_run(tmp_path / "run", [True, False, True, False], groups=["a", "b", "a", "b"])
    # A block this command has never heard of (e.g. item 1's efficiency/cost) is printed as it stands.
    results = json.loads((run / "results.json").read_text())
    results["cost"] = {"total_usd": 0.0123, "per_task_usd": 0.0031, "cost_of_pass_usd": None}
    (run / "results.json").write_text(json.dumps(results))
    out = arle("runs", "show", str(run))
    assert out.returncode == 0, out.stderr
    for needle in (
        "accuracy",
        "0.5000",
        "cost:",
        "total_usd: 0.0123",
        "cost_of_pass_usd: null",
        "failed samples (first 2 of 2)",
        "1#0",
        "3#0",
    ):
        assert needle in out.stdout, (needle, out.stdout)
    data = json.loads(arle("runs", "show", str(run), "--json").stdout)
    assert data["results"]["cost"]["total_usd"] == 0.0123 and [s["id"] for s in data["failed"]] == ["1#0", "3#0"]

    train = write_train_run(tmp_path / "train")
    out = arle("runs", "show", str(train))
    assert out.returncode == 0, out.stderr
    assert "step-0" in out.stdout and "step-2" in out.stdout
    assert f"arle compare {train / 'eval' / 'step-0'} {train / 'eval' / 'step-2'}" in out.stdout


# ---------------------------------------------------------------------------------------------
# arle compare


def test_compare_training_run_held_out_evals(tmp_path):
    train = write_train_run(tmp_path / "train")
    out = arle("compare", str(train / "eval" / "step-0"), str(train / "eval" / "step-2"), "--json")
    assert out.returncode == 0, out.stderr
    cmp = json.loads(out.stdout)
    acc = cmp["metrics"][0]
    assert (acc["won"], acc["lost"], acc["tied"]) == (2, 0, 4) and cmp["gained"] == ["0", "3"]
    assert acc["mcnemar_p"] == pytest.approx(0.5)
    # The training run itself is not an eval run: the line names the held-out evals to use.
    assert_one_line_error(
        arle("compare", str(train), str(train / "eval" / "step-2")), "training run", str(train / "eval" / "step-0")
    )


def test_compare_refuses_other_benchmark_or_split_unless_forced(tmp_path):
    a = write_eval_run(tmp_path / "a", [True, False, True])
    b = write_eval_run(tmp_path / "b", [True, True, False], benchmark="svamp")
    c = write_eval_run(tmp_path / "c", [True, True, False], split="train")
    assert_one_line_error(arle("compare", str(a), str(b)), "different benchmarks", "gsm8k", "svamp", "--force")
    assert_one_line_error(arle("compare", str(a), str(c)), "different splits", "--force")
    forced = arle("compare", str(a), str(b), "--force")
    assert forced.returncode == 0 and "different benchmarks" in forced.stderr and "warning" in forced.stderr


MMLU_ROWS = [
    {
        "question": f"Question number {i}: which option is right?",
        "subject": ["astronomy", "college_mathematics"][i % 2],
        "choices": ["one", "two", "three", "four"],
        "answer": i % 4,
    }
    for i in range(40)
]


def test_compare_two_real_tiny_model_runs_with_different_seeds(tiny_model, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in MMLU_ROWS))
    runs = []
    for seed in ("1", "2"):
        run = tmp_path / f"seed{seed}"
        out = arle(
            "eval",
            "mmlu",
            "--data",
            str(data),
            "--model",
            str(tiny_model),
            "--backend",
            "hf",
            "--temperature",
            "1.0",
            "--seed",
            seed,
            "--max-tokens",
            "8",
            "--output",
            str(run),
        )
        assert out.returncode == 0, out.stderr
        runs.append(run)
    out = arle("compare", str(runs[0]), str(runs[1]), "--json")
    assert out.returncode == 0, out.stderr
    cmp = json.loads(out.stdout)

    # Recompute from the samples, independently of arle.compare.
    def outcomes(run: Path) -> dict[str, bool]:
        lines = (run / "samples.jsonl").read_text().splitlines()
        return {json.loads(line)["task_id"]: json.loads(line)["correct"] for line in lines}

    a, b = outcomes(runs[0]), outcomes(runs[1])
    assert len(a) == len(b) == 40 and cmp["shared"] == 40 and cmp["benchmark"] == "mmlu"
    a_only = sorted((t for t in a if a[t] and not b[t]), key=int)
    b_only = sorted((t for t in a if b[t] and not a[t]), key=int)
    acc = cmp["metrics"][0]
    assert acc["metric"] == "accuracy"
    assert (acc["won"], acc["lost"], acc["tied"]) == (len(b_only), len(a_only), 40 - len(a_only) - len(b_only))
    assert cmp["gained"] == b_only and cmp["lost"] == a_only
    want_p = (
        stats.binomtest(min(len(a_only), len(b_only)), len(a_only) + len(b_only), 0.5).pvalue
        if a_only or b_only
        else 1.0
    )
    assert acc["mcnemar_p"] == pytest.approx(want_p)
    d = [float(b[t]) - float(a[t]) for t in a]
    assert acc["diff"] == pytest.approx(sum(d) / 40)
    if any(d):
        assert acc["stderr"] == pytest.approx(stats.sem(d))
    assert set(cmp["groups"]) == {"astronomy", "college_mathematics"}
    assert sum(g[0]["n"] for g in cmp["groups"].values()) == 40

    text = arle("compare", str(runs[0]), str(runs[1]))
    assert text.returncode == 0 and "McNemar p" in text.stdout and "astronomy" in text.stdout
    shown = arle("runs", "show", str(runs[0]))
    assert shown.returncode == 0 and "college_mathematics" in shown.stdout

    # The same run as if killed after 25 samples: meta.json alone says 40 were expected.
    cut = tmp_path / "cut" / "seed1"
    shutil.copytree(runs[0], cut)
    (cut / "results.json").unlink()
    lines = (cut / "samples.jsonl").read_text().splitlines(keepends=True)
    (cut / "samples.jsonl").write_text("".join(lines[:25]))
    row = json.loads(arle("runs", "list", str(tmp_path / "cut"), "--json").stdout)[0]
    assert (row["status"], row["resumable"], row["done"], row["expected"]) == ("interrupted", True, 25, 40)


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing modified


def _torn(run: Path) -> None:
    path = run / "samples.jsonl"
    path.write_bytes(path.read_bytes()[:-20])  # the last line loses its end (and its newline)


def _no_results(run: Path) -> None:
    (run / "results.json").unlink()


def _not_a_run(run: Path) -> None:
    (run / "meta.json").unlink()


@pytest.mark.parametrize(
    "damage, needle",
    [(_torn, "torn line"), (_no_results, "no results.json"), (_not_a_run, "not a run directory")],
    ids=["torn-samples", "missing-results", "not-a-run"],
)
@pytest.mark.parametrize("command", ["show", "compare"])
def test_bad_run_directory_is_one_line_and_untouched(tmp_path, damage, needle, command):
    good = write_eval_run(tmp_path / "good", [True, False, True, False])
    bad = write_eval_run(tmp_path / "bad", [True, True, False, False])
    damage(bad)
    before = snapshot(tmp_path)
    args = ("runs", "show", str(bad)) if command == "show" else ("compare", str(good), str(bad))
    line = assert_one_line_error(arle(*args), needle, str(bad))
    if damage is not _not_a_run:
        assert "--resume" in line  # what to do about it
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# Thinking budgets: accuracy against compute (issue 24)

ESC_THOUGHT = "thought \x1b]52;c;cHduZWQ=\x07 of task"
# (correct, thinking tokens, cut) per task at each budget: the bigger budget answers more.
BUDGETS = {
    64: [
        (True, 40, False),
        (False, 64, True),
        (False, 64, True),
        (True, 50, False),
        (False, 64, True),
        (False, 30, False),
    ],
    256: [
        (True, 40, False),
        (True, 120, False),
        (False, 200, False),
        (True, 50, False),
        (False, 256, True),
        (True, 30, False),
    ],
    1024: [
        (True, 40, False),
        (True, 120, False),
        (True, 400, False),
        (True, 50, False),
        (True, 700, False),
        (True, 30, False),
    ],
}


def write_thinking_run(run: Path, budget: int) -> Path:
    """An eval run of a thinking model at thinking budget `budget` (samples as eval.py writes them)."""
    run.mkdir(parents=True)
    samples = []
    for i, (correct, tokens, cut) in enumerate(BUDGETS[budget]):
        s = sample(str(i), correct)
        answer = 0 if cut else 5
        s.update(
            completion="" if cut else "answer",
            thinking=f"{ESC_THOUGHT} {i}",
            thinking_cut=cut,
            thinking_tokens=tokens,
            answer_tokens=answer,
            completion_tokens=tokens + answer,
            num_tokens=tokens + answer,
        )
        samples.append(s)
    meta = {
        "command": ["arle", "eval", "gsm8k"],
        "benchmark": "gsm8k",
        "card_version": 1,
        "card_hash": "abc",
        "model": "thinker",
        "engine": "hf",
        "created": "2025-01-02T03:04:05+0000",
        "options": {
            "split": "test",
            "limit": None,
            "num_samples": 1,
            "temperature": 0.0,
            "seed": 1234,
            "data": None,
            "max_tokens": budget + 64,
            "max_thinking_tokens": budget,
        },
        "data_hash": None,
    }
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    results = {
        "benchmark": "gsm8k",
        "card_version": 1,
        "model": "thinker",
        "split": "test",
        "num_samples": 1,
        **aggregate(samples, ["accuracy"], 1, None),
    }
    (run / "results.json").write_text(json.dumps(results))
    return run


def test_compare_two_thinking_budgets_is_accuracy_against_compute(tmp_path):
    a, b = write_thinking_run(tmp_path / "t64", 64), write_thinking_run(tmp_path / "t256", 256)
    out = arle("compare", str(a), str(b), "--json")
    assert out.returncode == 0, out.stderr
    cmp = json.loads(out.stdout)
    short, long = cmp["compute"]
    assert (short["run"], long["run"]) == (str(a), str(b))
    assert short["accuracy"] == pytest.approx(2 / 6) and long["accuracy"] == pytest.approx(4 / 6)
    assert short["thinking_tokens"] == pytest.approx(312 / 6) and long["thinking_tokens"] == pytest.approx(696 / 6)
    assert short["cut_share"] == pytest.approx(3 / 6) and long["cut_share"] == pytest.approx(1 / 6)
    assert short["completion_tokens_total"] == 312 + 15 and long["completion_tokens_total"] == 696 + 25
    assert (short["max_thinking_tokens"], long["max_thinking_tokens"]) == (64, 256)
    acc = cmp["metrics"][0]
    assert acc["metric"] == "accuracy" and acc["diff"] == pytest.approx(2 / 6) and (acc["won"], acc["lost"]) == (2, 0)

    text = arle("compare", str(a), str(b))
    assert text.returncode == 0, text.stderr
    table = text.stdout[text.stdout.index("accuracy against compute") :]
    for needle in (
        "thinking tokens",
        "total completion",
        "52.0",
        "116.0",
        "327",
        "721",
        "50.0%",
        "16.7%",
        "64/128",
        "256/320",
        "+0.3333 ±",
    ):
        assert needle in table, (needle, table)


def test_compare_several_budgets_prints_the_curve(tmp_path):
    runs = [write_thinking_run(tmp_path / f"t{n}", n) for n in (64, 256, 1024)]
    out = arle("compare", *map(str, runs), "--json")
    assert out.returncode == 0, out.stderr
    curve = json.loads(out.stdout)
    points = curve["points"]
    assert [p["run"] for p in points] == list(map(str, runs))
    assert [p["accuracy"] for p in points] == pytest.approx([2 / 6, 4 / 6, 1.0])
    assert [p["thinking_tokens"] for p in points] == pytest.approx([312 / 6, 696 / 6, 1340 / 6])
    assert points[0]["accuracy_diff"] is None
    assert [p["accuracy_diff"]["diff"] for p in points[1:]] == pytest.approx([2 / 6, 4 / 6])
    assert [(p["run_a"], p["run_b"]) for p in curve["pairs"]] == [(str(runs[0]), str(r)) for r in runs[1:]]

    text = arle("compare", *map(str, runs))
    assert text.returncode == 0, text.stderr
    assert "3 runs, each paired with the first" in text.stdout
    assert all(f"{label}: {run}" in text.stdout for label, run in zip("ABC", runs))
    rows = [line.split() for line in text.stdout.splitlines() if line.strip()[:2] in ("│ ", "| ")]
    rows = [r for r in rows if len(r) > 1 and r[1] in ("A", "B", "C")]
    assert [r[1] for r in rows] == ["A", "B", "C"]
    assert "223.3" in text.stdout and "+0.6667 ±" in text.stdout
    assert_one_line_error(arle("compare", str(runs[0])), "pass two eval runs")


def test_runs_show_prints_a_samples_thinking_above_its_answer_escaped(tmp_path):
    run = write_thinking_run(tmp_path / "t64", 64)
    out = arle("runs", "show", str(run), "--failed", "4")
    assert out.returncode == 0, out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("1#0"))
    assert lines[at + 1].strip() == r"thinking (64 tokens, cut: no answer): thought \x1b]52;c;cHduZWQ=\x07 of task 1"
    assert lines[at + 2].strip() == "answer:"
    uncut = next(i for i, line in enumerate(lines) if line.strip().startswith("5#0"))
    assert lines[uncut + 1].strip().startswith("thinking (30 tokens): thought")
    assert lines[uncut + 2].strip() == "answer: answer"
