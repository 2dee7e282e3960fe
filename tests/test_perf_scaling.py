"""Behaviour of perf/scaling.py and perf/backends.py's pure parts (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

PERF = Path(__file__).resolve().parent.parent / "perf"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"perf_{name}", PERF / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


scaling = _load("scaling")
backends = _load("backends")


def test_fit_line_recovers_an_exact_line() -> None:
    a, b, r2 = scaling.fit_line([32, 128, 512], [1.0 + 0.01 * n for n in (32, 128, 512)])
    assert a == pytest.approx(1.0)
    assert b == pytest.approx(0.01)
    assert r2 == pytest.approx(1.0)


def test_agreement_counts_identical_texts_and_where_they_part() -> None:
    a = {
        "t1#0": {"completion": "abcd", "correct": True},
        "t2#0": {"completion": "xyz", "correct": False},
        "only_a#0": {"completion": "q", "correct": False},
    }
    b = {"t1#0": {"completion": "abcd", "correct": True}, "t2#0": {"completion": "xyQ", "correct": True}}
    got = backends.agreement(a, b)
    assert got["n"] == 2 and got["identical_text"] == 1 and got["same_correct"] == 1
    assert got["correct_a"] == 1 and got["correct_b"] == 2
    assert got["first_diff_frac"] == [pytest.approx(2 / 3, abs=1e-3)]


def test_concurrency_curve_reaches_each_concurrency(tmp_path: Path) -> None:
    # Each request takes 0.2 s on the fake server: long enough that all 4 are launched before the
    # first returns even on a machine busy with other tests (at 0.01 s a loaded CI core saw only 3).
    args = scaling.parse(["--quick", "--concurrency", "1,4", "--conc-n", "8", "--delay", "0.2", "--repeats", "1"])
    got = scaling.concurrency_curve(args)
    rows = {r["concurrency"]: r for r in got["rows"]}
    assert set(rows) == {1, 4}
    assert rows[1]["max_in_flight"] == 1
    assert rows[4]["max_in_flight"] == 4  # the engine really keeps 4 requests in flight
    assert rows[4]["ideal_s"] == pytest.approx(2 * 0.2)
