"""README command 1's job: `arle eval one_digit_sums` on the embedded default model (no --model),
then `arle report` with no argument, which writes the newest run's HTML report."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _use_the_session_model(smollm2_path, isolated_home) -> None:
    """Point this test's cache at the session's converted copy instead of converting again."""
    models = isolated_home / "cache" / "models"
    models.mkdir(parents=True)
    (models / smollm2_path.name).symlink_to(smollm2_path, target_is_directory=True)


def test_eval_with_no_model_uses_the_embedded_smollm2_and_reports(smollm2_path, isolated_home, tmp_path):
    _use_the_session_model(smollm2_path, isolated_home)

    def arle(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "arlecli", *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=os.environ.copy(),
            cwd=tmp_path,
        )

    out = arle("eval", "one_digit_sums", "--limit", "20")
    assert out.returncode == 0, out.stderr
    assert "accuracy" in out.stdout and "SmolLM2-135M-Instruct" in out.stdout  # the summary table
    assert "arle report runs/one_digit_sums-SmolLM2-135M-Instruct-" in out.stdout
    # The first thing a newcomer sees has no library advice they cannot take (transformers' BPE clean-up line).
    assert "clean_up_tokenization_spaces" not in out.stderr + out.stdout
    (run,) = (tmp_path / "runs").iterdir()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["model"] == "SmolLM2-135M-Instruct" and meta["engine"] == "hf"
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().split("\n") if line]
    assert len(samples) == 20 and all(s["num_tokens"] > 0 for s in samples)  # the model really generated
    # A newcomer's first number means something: neither 0 nor 1 (greedy: 7 of these 20 are right).
    accuracy = json.loads((run / "results.json").read_text())["metrics"]["accuracy"]["value"]
    assert 0.1 < accuracy < 0.9, accuracy
    report = arle("report")
    assert report.returncode == 0, report.stderr
    assert (run / "report.html").stat().st_size > 3_000_000  # plotly.js inside: it opens offline


def test_the_startup_perf_script_times_every_stage_it_names(smollm2_path, isolated_home, tmp_path):
    """perf/startup.py's quick run: both sides timed, and its timeline still finds the arle
    functions it times (a rename would fail it here, not in a perf run)."""
    from helpers.perf import run_quick

    _use_the_session_model(smollm2_path, isolated_home)
    result = run_quick("startup", tmp_path / "startup.json")
    assert set(result["runs"]) == {"arle eval", "arle eval, transformers' classes", "transformers script"}
    assert all(len(runs) == 1 and runs[0] > 0 for runs in result["runs"].values())
    stages = result["timeline"]
    assert all(
        stages[s] > 0 for s in ("import torch", "model and tokenizer load", "fused forward (probes, stacking, packing)")
    )
    assert stages["total"] >= sum(v for k, v in stages.items() if k not in ("total", "model classes imported")) - 0.01
    assert stages["model classes imported"] is False  # engine.native loaded the embedded model
