"""README command 1's job: `arle eval humaneval` on the embedded default model, no --model."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_eval_with_no_model_uses_the_embedded_smollm2(smollm2_path, isolated_home, tmp_path):
    # Point this test's cache at the session's converted copy instead of converting again.
    models = isolated_home / "cache" / "models"
    models.mkdir(parents=True)
    (models / smollm2_path.name).symlink_to(smollm2_path, target_is_directory=True)
    out = subprocess.run([sys.executable, "-m", "arlecli", "eval", "humaneval", "--limit", "2", "--max-tokens", "48",
                          "--output", str(tmp_path / "run")], capture_output=True, text=True, timeout=600,
                         env=os.environ.copy())
    assert out.returncode == 0, out.stderr
    assert "pass@1" in out.stdout and "SmolLM2-135M-Instruct" in out.stdout  # the summary table
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["model"] == "SmolLM2-135M-Instruct" and meta["engine"] == "hf"
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["task_id"] for s in samples) == ["HumanEval/0", "HumanEval/1"]
    assert all(s["num_tokens"] > 0 for s in samples)  # the model really generated
