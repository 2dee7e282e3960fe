"""perf/serve_streaming.py runs end to end (--quick; no timing is asserted): every streamed
reply gets its text in more than one chunk, and the first token comes no later than the last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PERF = Path(__file__).resolve().parent.parent / "perf"


def test_serve_streaming_perf_quick(tmp_path):
    out = tmp_path / "serve_streaming.json"
    proc = subprocess.run(
        [sys.executable, str(PERF / "serve_streaming.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    med = json.loads(out.read_text())["results"]["hf"]["median"]
    assert med["replies_with_content"] == 4 and med["content_chunks_per_reply"] > 1
    assert med["ttft_p50_s"] <= med["last_token_p50_s"]
    assert "| hf |" in proc.stdout
