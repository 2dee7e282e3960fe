"""A plugin's code-running reward is held to the sandbox like arle's own (issue 26, item 3).

Whether a reward runs programs is its own declaration (`@register(runs_code=True)`), not a table
of arle's reward names: a card scored by a user's `file.py:attr` reward that declares it must
have the jail's isolation checked, and under `--sandbox require` refused, before anything is
generated, in `arle eval` and in `arle train` alike. The jail is made unusable (no bubblewrap)
in a child process, as tests/test_sandbox_jail.py does for arle's own code cards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from arlecli.sandbox import jail

from helpers.fake_openai import FakeOpenAIServer

REWARD = '''
from arlecli.rewards import register
from arlecli.types import Score


@register("user_runs_code", runs_code=True, needs_target=False)
def user_runs_code():
    """A user's reward that runs the model's code (declared; what it runs does not matter here)."""
    def score(task, episode):
        return Score(0.0, False)
    return score
'''

# The child makes bubblewrap unavailable, then runs arle's CLI with the given argv.
CHILD = (
    "import sys\nfrom arlecli.sandbox import jail\n"
    "jail.bwrap_binary = lambda: None\n"
    "from arlecli.cli.main import main\n"
    "sys.argv = ['arle', *sys.argv[1:]]\n"
    "main()\n"
)


def plugin_card(tmp_path: Path) -> Path:
    (tmp_path / "user_reward.py").write_text(REWARD)
    (tmp_path / "rows.jsonl").write_text(json.dumps({"question": "Write f.", "answer": ""}) + "\n")
    card = {
        "name": "user_code",
        "category": "code",
        "source": {"kind": "files", "path": "rows.jsonl"},
        "fields": {"input": "question", "target": "answer"},
        "prompt": {"format": "chat", "template": "{input}", "max_tokens": 8},
        "reward": {"name": "user_reward.py:user_runs_code"},
    }
    path = tmp_path / "user_code.yaml"
    path.write_text(yaml.safe_dump(card))
    return path


def run_child(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": "/usr/bin:/bin",
        "ARLE_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(Path(jail.__file__).resolve().parents[2]),
    }
    return subprocess.run(
        [sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )


def assert_refused(done: subprocess.CompletedProcess[str], run: Path) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "code sandbox cannot isolate" in lines[0] and "Traceback" not in done.stderr
    assert not run.exists()


def test_eval_checks_a_plugin_reward_that_runs_code_before_generating(tmp_path):
    card = plugin_card(tmp_path)
    with FakeOpenAIServer(lambda body: "def f(): pass") as srv:
        done = run_child(
            tmp_path,
            "eval",
            str(card),
            "--base-url",
            srv.base_url,
            "--sandbox",
            "require",
            "--output",
            str(tmp_path / "run"),
        )
        assert not srv.bodies(), "nothing may be generated before the sandbox is checked"
    assert_refused(done, tmp_path / "run")


def test_train_checks_a_plugin_reward_that_runs_code_before_loading_anything(tmp_path):
    card = plugin_card(tmp_path)
    done = run_child(tmp_path, "train", str(card), "--max-steps", "1", "--output", str(tmp_path / "run"))
    assert_refused(done, tmp_path / "run")


def test_the_declaration_is_what_decides(tmp_path):
    """The same reward without `runs_code` is no code card: eval runs it (sandbox not consulted)."""
    card = plugin_card(tmp_path)
    (tmp_path / "user_reward.py").write_text(REWARD.replace("runs_code=True, ", ""))
    with FakeOpenAIServer(lambda body: "def f(): pass") as srv:
        done = run_child(
            tmp_path,
            "eval",
            str(card),
            "--base-url",
            srv.base_url,
            "--sandbox",
            "require",
            "--output",
            str(tmp_path / "run"),
            "--json",
        )
        assert srv.bodies()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n_samples"] == 1
