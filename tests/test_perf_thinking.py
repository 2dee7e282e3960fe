"""perf/thinking.py runs end to end on a few rows (no timing is asserted): its three variants
sample the same number of tokens, and only `scoring` leaves every thought cut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PERF = Path(__file__).resolve().parent.parent / "perf"


def test_thinking_perf_variants_sample_the_same_tokens(tmp_path):
    out = tmp_path / "thinking.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(PERF / "thinking.py"),
            "--rows",
            "4",
            "--thinking",
            "6",
            "--answer",
            "3",
            "--batch",
            "4",
            "--repeats",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    med = result["median"]
    assert med["off"]["sampled_tokens"] == med["scoring"]["sampled_tokens"] == med["forcing"]["sampled_tokens"] == 36
    assert (med["off"]["thinking_cut"], med["scoring"]["thinking_cut"], med["forcing"]["thinking_cut"]) == (0, 4, 0)
    assert "| wall vs off |" in proc.stdout
