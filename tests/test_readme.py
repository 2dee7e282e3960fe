"""The README's two set-up commands stay true: CI runs the test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", setup)


def test_readme_starts_with_the_two_setup_commands():
    commands = _setup_commands()
    assert len(commands) == 2
    main_job, tests = commands
    assert "arle eval" in main_job and "--model" not in main_job  # the embedded default model
    assert "pytest" in tests and '".[dev,' in tests


def test_ci_runs_the_readme_test_command():
    tests = _setup_commands()[1]
    after_venv = tests.split(". .venv/bin/activate && ", 1)[1]
    assert after_venv in (ROOT / ".ci" / "run").read_text()
