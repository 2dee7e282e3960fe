"""perf/serve_tools.py runs end to end in --quick mode (no timing is asserted): `arle serve`
answers every variant, and the tools variant's prompts are the same tokens as same_prompt's
(what makes its comparison one of arle's function-calling work alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PERF = Path(__file__).resolve().parent.parent / "perf"


def test_serve_tools_perf_quick(tmp_path):
    out = tmp_path / "serve_tools.json"
    proc = subprocess.run(
        [sys.executable, str(PERF / "serve_tools.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "ARLE_HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    med = json.loads(out.read_text())["backends"]["hf"]["median"]
    assert med["tools"]["prompt_tokens"] == med["same_prompt"]["prompt_tokens"] > med["plain"]["prompt_tokens"]
    assert all(med[v]["completion_tokens"] > 0 and med[v]["stream_first_tokens"] == 4 for v in med)
    assert "| hf | throughput (tok/s) |" in proc.stdout
