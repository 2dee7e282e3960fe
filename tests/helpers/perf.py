"""A perf/ script's `--quick` form, run from a test: its JSON result (no timing is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PERF = Path(__file__).resolve().parents[2] / "perf"


def run_quick(script: str, out: Path, *args: str) -> dict[str, Any]:
    """Run `perf/<script>.py --quick ARGS --out OUT` in a fresh interpreter (the scripts pin
    threads and environment variables for their whole process) and return what it wrote to
    OUT; a non-zero exit fails the test with the end of its stderr."""
    argv = [sys.executable, str(PERF / f"{script}.py"), "--quick", *args, "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())
