"""One plugin mechanism (arlecli/plugins.py): every kind of part a card names is found the same
way, by registered name, `module:attr`, `file.py:attr` next to the card, or an installed
package's `arle.<kind>` entry point; duplicates and typos fail at load with one line.

The installed package is tests/plugin_pkg (a reward, a tool, an env and a card): its
`*.dist-info` folder makes it an installed distribution for any process that has the folder on
PYTHONPATH, so no test needs pip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from arlecli.errors import UserError
from arlecli.plugins import Registry, anchor

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_PKG = Path(__file__).resolve().parent / "plugin_pkg"
ARLE = [sys.executable, "-m", "arlecli"]
NOWHERE = "http://127.0.0.1:9/v1"  # cards that fail at load never reach a model


def run(
    *args: str, pythonpath: Path | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess (as a user runs it), with `pythonpath` on its sys.path."""
    env = os.environ.copy()
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def arle(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return run(*ARLE, *args, **kw)


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    """The failed command's one stderr line (exit 2, no traceback)."""
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def samples(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------ an installed plugin package


def test_the_plugin_package_declares_the_same_entry_points_in_pyproject_and_dist_info():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = tomllib.loads((PLUGIN_PKG / "pyproject.toml").read_text())["project"]["entry-points"]
    dist = metadata.PathDistribution(PLUGIN_PKG / "arle_plugin_demo-0.1.0.dist-info")
    found: dict[str, dict[str, str]] = {}
    for ep in dist.entry_points:
        found.setdefault(ep.group, {})[ep.name] = ep.value
    assert found == declared and dist.metadata["Name"] == "arle-plugin-demo"


def test_an_installed_package_adds_a_reward_a_tool_an_env_and_a_card(tmp_path, tiny_model):
    out = arle(
        "eval",
        "demo_shout",
        "--model",
        str(tiny_model),
        "--max-tokens",
        "8",
        "--output",
        str(tmp_path / "run"),
        "--json",
        pythonpath=PLUGIN_PKG,
    )
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout)["metrics"]
    rows = samples(tmp_path / "run")
    assert len(rows) == 3 and set(metrics) >= {"accuracy", "exact", "chars"}
    # The package's reward scored them: its `chars` detail is the stripped reply's length.
    assert metrics["chars"]["value"] == pytest.approx(sum(len(s["completion"].strip()) for s in rows) / 3)
    assert all(s["details"]["exact"] == int(s["completion"].strip().lower() == s["target"].lower()) for s in rows)
    # The package's env gave the model the package's tool (text fallback: the schema in the prompt).
    assert '"name": "shout"' in rows[0]["prompt"][0]["content"]
    assert all(s["env_info"].keys() >= {"tool_calls", "tool_errors"} for s in rows)

    show = arle("bench", "show", "demo_shout", "--json", pythonpath=PLUGIN_PKG)
    assert show.returncode == 0, show.stderr
    origins = json.loads(show.stdout)["origins"]
    package = "from arle-plugin-demo 0.1.0"
    assert origins["card"].startswith(f"entry point arle.benchmarks 'demo = arle_plugin_demo:benchmarks' {package}")
    assert origins["reward"] == f"entry point arle.rewards 'demo_exact = arle_plugin_demo:exact' {package}"
    assert origins["env"] == f"entry point arle.envs 'demo_shout_env = arle_plugin_demo:shout_env' {package}"


def test_a_packages_backend_is_one_eval_and_model_setup_accept(tmp_path, tiny_model, isolated_home):
    # `--backend` takes a backend an installed package registers, like arle's own; a typo
    # still fails in one line, now naming the package's backend among the choices.
    out = arle(
        "eval",
        "demo_shout",
        "--model",
        str(tiny_model),
        "--backend",
        "demo_loud_hf",
        "--max-tokens",
        "4",
        "--limit",
        "1",
        "--output",
        str(tmp_path / "run"),
        pythonpath=PLUGIN_PKG,
    )
    assert out.returncode == 0, out.stderr
    assert "demo_loud_hf: running on arle's hf engine" in out.stderr
    assert len(samples(tmp_path / "run")) == 1
    setup = arle(
        "model",
        "setup",
        "--name",
        "loud",
        "--path",
        str(tiny_model),
        "--backend",
        "demo_loud_hf",
        pythonpath=PLUGIN_PKG,
    )
    assert setup.returncode == 0, setup.stderr
    line = one_line_error(
        arle("eval", "demo_shout", "--model", str(tiny_model), "--backend", "demo_loud_h", pythonpath=PLUGIN_PKG)
    )
    assert "unknown backend 'demo_loud_h'" in line and "demo_loud_hf" in line


def test_the_packages_tool_answers_a_tool_call_in_its_env():
    # The tiny model never calls a tool; drive the package's env with a call by hand.
    script = textwrap.dedent("""
        from arlecli.envs import make_env
        from arlecli.eval import EvalOptions, load_tasks
        from arlecli.catalog import load_card
        from arlecli.envs.tools import TOOLS

        card = load_card("demo_shout")
        task = load_tasks(card, EvalOptions(limit=1))[0][0]
        env = make_env(card, task)
        env.reset()
        step = env.step('<tool_call>{"name": "shout", "arguments": {"text": "hi there"}}</tool_call>')
        print(step.messages[0]["content"])
        print(TOOLS.origin("demo_shout"))
    """)
    out = run(sys.executable, "-c", script, pythonpath=PLUGIN_PKG)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "<tool_response>",
        "HI THERE",
        "</tool_response>",
        "entry point arle.tools 'demo_shout = arle_plugin_demo:shout' from arle-plugin-demo 0.1.0",
    ]


# ------------------------------------------------------------------ a card with Python files next to it

PARTS = '''
from arlecli.rewards import register
from arlecli.types import Score


@register("length_reward", metrics=["chars"])
def score_length(min_chars: int = 0):
    """Correct when the reply has at least `min_chars` characters; detail `chars`."""

    def score(task, episode):
        n = len(episode.completion)
        return Score(1.0, n >= min_chars, episode.completion, {"chars": n})

    return score


def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: Any text.
    """
    return len(text.split())


def rows(*, seed, size, params=None):
    return [{"id": f"w{seed}-{i}", "word": f"word{i}"} for i in range(size)]


def shape(row):
    return {**row, "question": "Count the words of: " + row["word"], "answer": "1"}
'''

CARD = """
name: my_words
category: agent
description: Everything but the env comes from my_parts.py, next to this card.
source:
  kind: generator
  path: my_parts.py:rows
  splits: {test: {seed: 3, size: 4}}
transform: my_parts.py:shape
fields: {input: question, target: answer}
prompt: {format: chat, max_tokens: 8}
env: {name: tools, params: {tools: ["my_parts.py:word_count"], max_turns: 2}}
reward: {name: my_parts.py:score_length, params: {min_chars: 0}}
metrics: [accuracy, chars, pass@1]
"""


def test_a_card_uses_a_reward_tool_generator_and_transform_from_a_file_next_to_it(tmp_path, tiny_model):
    folder = tmp_path / "my_bench"
    folder.mkdir()
    (folder / "my_parts.py").write_text(PARTS)
    (folder / "my_words.yaml").write_text(CARD)
    elsewhere = tmp_path / "elsewhere"  # the files are found relative to the card, not the cwd
    elsewhere.mkdir()
    out = arle(
        "eval",
        str(folder / "my_words.yaml"),
        "--model",
        str(tiny_model),
        "--limit",
        "3",
        "--output",
        str(tmp_path / "run"),
        "--json",
        cwd=elsewhere,
    )
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout)["metrics"]
    rows = samples(tmp_path / "run")
    assert len(rows) == 3 and metrics["accuracy"]["value"] == 1.0  # min_chars 0: every reply counts
    assert metrics["chars"]["value"] == pytest.approx(sum(len(s["completion"]) for s in rows) / 3)
    # The file's generator's ids (samples are written as episodes finish, in no fixed order).
    assert sorted(s["task_id"] for s in rows) == ["w3-0", "w3-1", "w3-2"]
    first = next(s for s in rows if s["task_id"] == "w3-0")
    assert first["prompt"][-1]["content"] == "Count the words of: word0"  # ... through its transform
    assert '"name": "word_count"' in rows[0]["prompt"][0]["content"]  # ... with its tool

    show = arle("bench", "show", str(folder / "my_words.yaml"), "--json", cwd=elsewhere)
    assert show.returncode == 0, show.stderr
    origins = json.loads(show.stdout)["origins"]
    parts = folder.resolve() / "my_parts.py"
    assert origins["reward"] == f"file {parts}:score_length"
    assert origins["tools.my_parts.py:word_count"] == f"file {parts}:word_count"
    assert origins["generator"] == f"file {parts}:rows"
    assert origins["transform"] == f"file {parts}:shape"
    assert origins["env"] == "builtin arlecli.envs.tools"
    assert origins["card"] == f"path {folder / 'my_words.yaml'}"


# ------------------------------------------------------------------ mistakes: one line, exit 2


def write_card(folder: Path, name: str = "typo", **changes: object) -> Path:
    import yaml

    card = yaml.safe_load((ROOT / "benchmarks" / "gsm8k.yaml").read_text())
    card.update(name=name, fixture=None, **changes)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(card))
    return path


def test_a_metric_the_reward_does_not_report_fails_at_load(tmp_path, isolated_home):
    card = write_card(tmp_path, metrics=["strict_match", "strict_mach"])
    line = one_line_error(arle("eval", str(card), "--base-url", NOWHERE))
    assert line == (
        f"error: {card}: field 'metrics': reward 'gsm8k' does not report 'strict_mach'; did you mean "
        "'strict_match'? it reports: accuracy, strict_match, flexible_extract, math_verify, pass@k"
    )
    # `arle bench list` shows such a card in the user's dir as broken, and lists the rest.
    (isolated_home / "benchmarks").mkdir()
    write_card(isolated_home / "benchmarks", metrics=["acuracy"])
    listed = arle("bench", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    broken = [c for c in json.loads(listed.stdout) if "broken" in c]
    assert [c["name"] for c in broken] == ["typo"] and "did you mean 'accuracy'?" in broken[0]["broken"]


def test_a_plain_file_reward_reports_only_accuracy_and_says_how_to_declare_more(tmp_path):
    (tmp_path / "plain.py").write_text(
        "from arlecli.types import Score\n\n"
        "def exact():\n    return lambda task, ep: Score(0.0, False, '', {'em': 0})\n"
    )
    card = write_card(tmp_path, reward={"name": "plain.py:exact"}, metrics=["accuracy", "em"])
    line = one_line_error(arle("eval", str(card), "--base-url", NOWHERE))
    assert "does not report 'em'" in line and "@register(..., metrics=[...])" in line


@pytest.mark.parametrize(
    "reward, message",
    [
        ("gsm8kk", "field 'reward': unknown reward 'gsm8kk' (did you mean gsm8k"),
        ("missing.py:score", "field 'reward': cannot load reward"),
        ("arlecli.rewards.math:no_such_reward", "has no attribute 'no_such_reward'"),
    ],
)
def test_an_unknown_reward_fails_at_load(tmp_path, reward, message):
    card = write_card(tmp_path, reward={"name": reward})
    line = one_line_error(arle("eval", str(card), "--base-url", NOWHERE))
    assert str(card) in line and message in line
    if reward.endswith(".py:score"):
        assert f"no file {tmp_path.resolve() / 'missing.py'}" in line  # relative to the card


def test_an_unknown_tool_or_rollout_function_fails_at_load(tmp_path):
    card = write_card(
        tmp_path, prompt={"format": "chat"}, env={"name": "tools", "params": {"tools": ["python", "calculater"]}}
    )
    line = one_line_error(arle("eval", str(card), "--base-url", NOWHERE))
    assert "field 'env.params.tools[1]': unknown tool 'calculater' (did you mean calculator?)" in line
    card = write_card(tmp_path, env={"name": "rollout", "params": {"function": "agent.py:solve"}})
    line = one_line_error(arle("eval", str(card), "--base-url", NOWHERE))
    assert (
        f"field 'env.params.function': cannot load rollout function 'agent.py:solve': ImportError: "
        f"no file {tmp_path.resolve() / 'agent.py'}" in line
    )


SIZED_ENV = """
from arlecli.envs import register_env
from arlecli.errors import ParamError


def check(params, base):
    if not 1 <= params["size"] <= 9:  # a card without `size`: a KeyError, a bug in this check
        raise ParamError("size", f"must be 1 to 9, got {params['size']}")


@register_env("sized", check=check)
def sized(card, task, exemplars, native_tools, size=1):
    raise AssertionError("a card whose params fail its check never builds an env")
"""


def test_a_file_env_refuses_its_bad_params_at_load_through_its_own_check(tmp_path):
    (tmp_path / "sized_env.py").write_text(SIZED_ENV)
    card = write_card(tmp_path, env={"name": "sized_env.py:sized", "params": {"size": 12}})
    line = one_line_error(arle("eval", str(card), "--base-url", NOWHERE))
    assert line == f"error: {card}: field 'env.params.size': must be 1 to 9, got 12"
    card = write_card(tmp_path, env={"name": "sized_env.py:sized", "params": {}})
    line = one_line_error(arle("eval", str(card), "--base-url", NOWHERE))
    assert line == (
        f"error: {card}: field 'env.params': env '{(tmp_path / 'sized_env.py').resolve()}:sized' "
        "could not check its params: KeyError: 'size'"
    )


def test_an_entry_point_that_takes_a_builtin_name_fails_naming_both(tmp_path):
    dist = tmp_path / "clash-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: clash\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[arle.rewards]\ngsm8k = clash_rewards:gsm8k\n")
    (tmp_path / "clash_rewards.py").write_text("def gsm8k():\n    raise AssertionError('never imported')\n")
    line = one_line_error(arle("eval", "gsm8k", "--base-url", NOWHERE, pythonpath=tmp_path))
    assert (
        "reward 'gsm8k' is registered twice: by builtin arlecli.rewards.math and by entry point "
        "arle.rewards 'gsm8k = clash_rewards:gsm8k' from clash 0.1" in line
    )


def test_a_file_that_registers_a_taken_name_fails_naming_both(tmp_path):
    (tmp_path / "mine.py").write_text(
        "from arlecli.rewards import register\n\n@register('math', metrics=[])\ndef mine():\n    pass\n"
    )
    card = write_card(tmp_path, reward={"name": "mine.py:mine"})
    line = one_line_error(arle("eval", str(card), "--base-url", NOWHERE))
    assert (
        f"reward 'math' is registered twice: by builtin arlecli.rewards.math and by file "
        f"{(tmp_path / 'mine.py').resolve()}" in line
    )


# ------------------------------------------------------------------ the registry itself


def test_a_registry_finds_a_name_a_module_attr_and_a_file_attr_the_same_way(tmp_path, monkeypatch):
    widgets: Registry = Registry("widgets", "widget")
    widgets.decorator("twice")(lambda x: 2 * x)
    (tmp_path / "more_widgets.py").write_text("def thrice(x):\n    return 3 * x\n\nNOT_CALLABLE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert widgets.get("twice")(2) == 4
    assert widgets.get("more_widgets:thrice")(2) == 6
    assert widgets.get("more_widgets.py:thrice", tmp_path)(2) == 6
    assert (
        str(widgets.origin("more_widgets.py:thrice", tmp_path)) == f"file {tmp_path.resolve()}/more_widgets.py:thrice"
    )
    assert str(widgets.origin("more_widgets:thrice")) == "module more_widgets:thrice"
    with pytest.raises(
        UserError,
        match=r"unknown widget 'twicee' \(did you mean twice\?\); known: twice; "
        r"or name one as 'module:attr' or 'file.py:attr'",
    ):
        widgets.get("twicee")
    with pytest.raises(UserError, match="widget 'more_widgets:NOT_CALLABLE' is not a function or class"):
        widgets.get("more_widgets:NOT_CALLABLE")
    with pytest.raises(UserError, match="cannot load widget 'more_widgets.py:nope'.*has no attribute 'nope'"):
        widgets.get("more_widgets.py:nope", tmp_path)


def test_a_registry_refuses_a_second_definition_under_one_name(tmp_path):
    widgets: Registry = Registry("widgets", "widget")

    def first() -> None: ...

    widgets.add("w", first)
    widgets.add("w", first)  # the same function again (a module imported twice) is no clash
    (tmp_path / "other.py").write_text("from arlecli.plugins import Registry\n\ndef w():\n    pass\n")
    from arlecli.plugins import import_file

    second = import_file(tmp_path / "other.py").w
    with pytest.raises(
        UserError,
        match=rf"widget 'w' is registered twice: by module {__name__} and by file "
        rf"{tmp_path.resolve()}/other.py; rename one",
    ):
        widgets.add("w", second)


def test_entry_points_are_imported_only_when_named(tmp_path, monkeypatch):
    (tmp_path / "lazy_widgets.py").write_text("def slow(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = metadata.entry_points
    fake = [metadata.EntryPoint("slow", "lazy_widgets:slow", "arle.widgets")]
    monkeypatch.setattr(
        metadata, "entry_points", lambda group=None, **kw: fake if group == "arle.widgets" else real(group=group, **kw)
    )
    widgets: Registry = Registry("widgets", "widget")
    assert widgets.names() == ["slow"] and "lazy_widgets" not in sys.modules
    assert widgets.get("slow")(1) == 2 and "lazy_widgets" in sys.modules
    assert str(widgets.origin("slow")) == "entry point arle.widgets 'slow = lazy_widgets:slow'"


def test_anchor_makes_only_relative_file_specs_absolute(tmp_path):
    assert anchor("my.py:f", tmp_path) == f"{tmp_path.resolve()}/my.py:f"
    assert anchor("./sub/my.py:f", tmp_path) == f"{tmp_path.resolve()}/sub/my.py:f"
    assert anchor("/abs/my.py:f", tmp_path) == "/abs/my.py:f"
    for spec in ("gsm8k", "reasoning_gym:gsm_symbolic", "pkg.mod:f"):
        assert anchor(spec, tmp_path) == spec


def test_every_builtin_reward_declares_its_metrics():
    from arlecli.rewards import REWARDS, declared_metrics, reward_names

    builtin = [n for n in reward_names() if REWARDS.origin(n).how == "builtin"]
    assert len(builtin) >= 18
    assert [n for n in builtin if declared_metrics(REWARDS.get(n)) is None] == []


def test_engines_generators_and_the_old_decorators_share_the_registry(tmp_path):
    from arlecli.data.generators import GENERATORS, generate_rows
    from arlecli.engine import ENGINES, choose_backend, make_engine, register_engine
    from arlecli.envs import ENVS, env_kind
    from arlecli.models import ModelSpec

    assert {"hf", "vllm", "openai"} <= set(ENGINES.names())
    made = []

    class Recording:
        name = "recording"

        def generate(self, requests):
            return iter(())

        def close(self):
            pass

    @register_engine("test_recording_engine")
    def recording(spec, **options):
        made.append((spec.name, options["batch_size"]))
        return Recording()

    spec = ModelSpec(kind="hf", name="m", path_or_id="/nowhere", backend="test_recording_engine")
    assert choose_backend(spec) == "test_recording_engine"
    engine = make_engine(spec, batch_size=3)
    assert isinstance(engine, Recording) and made == [("m", 3)]
    assert engine.think_tags.end == "</think>" and not engine.thinks  # make_engine configures a plugin's too
    assert {"countdown", "arc_agi", "frozenlake", "reasoning_gym"} <= set(GENERATORS.names())
    assert generate_rows("reasoning_gym:chain_sum", seed=1, size=2)[1]["id"] == "chain_sum-1-1"
    with pytest.raises(UserError, match=r"unknown generator 'countdwn' \(did you mean countdown"):
        generate_rows("countdwn", seed=0, size=1)
    assert env_kind("single_turn") is ENVS.get("single_turn") and not env_kind("single_turn").multi_turn


# ------------------------------------------------------------------ the README's examples stay true


def test_the_readmes_add_your_own_benchmark_examples_run(tmp_path, isolated_home):
    import re

    import yaml

    from helpers.fake_openai import FakeOpenAIServer

    section = (ROOT / "README.md").read_text().split("## Add your own benchmark", 1)[1].split("\n## ", 1)[0]
    card_only, card_lines, _toml = re.findall(r"```(?:yaml|toml)\n(.+?)```", section, re.DOTALL)
    (reward_py,) = re.findall(r"```python\n(.+?)```", section, re.DOTALL)
    rows = "".join(
        json.dumps({"question": f"What is the capital of {c}?", "answer": a}) + "\n"
        for c, a in [("France", "Paris"), ("Japan", "Tokyo")]
    )
    (isolated_home / "benchmarks").mkdir()
    (isolated_home / "benchmarks" / "capitals.yaml").write_text(card_only)
    (isolated_home / "benchmarks" / "capitals.jsonl").write_text(rows)
    mine = tmp_path / "mine"
    mine.mkdir()
    card = {**yaml.safe_load(card_only), **yaml.safe_load(card_lines), "name": "capitals2"}
    (mine / "capitals2.yaml").write_text(yaml.safe_dump(card))
    (mine / "capitals.jsonl").write_text(rows)
    (mine / "my_reward.py").write_text(reward_py)
    (mine / "my_tools.py").write_text(
        'def population(city: str) -> str:\n    """A city\'s population.\n\n'
        '    Args:\n        city: The city.\n    """\n    return "2.1 million"\n'
    )

    def reply(body: dict) -> str:
        return "Paris" if "France" in body["messages"][-1]["content"] else "tokyo is it"

    with FakeOpenAIServer(reply) as srv:
        first = arle("eval", "capitals", "--base-url", srv.base_url, "--output", str(tmp_path / "a"), "--json")
        second = arle(
            "eval", str(mine / "capitals2.yaml"), "--base-url", srv.base_url, "--output", str(tmp_path / "b"), "--json"
        )
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    m = json.loads(first.stdout)["metrics"]
    assert (m["exact_match"]["value"], m["f1"]["value"]) == (0.5, 0.75)  # "tokyo is it": F1 0.5
    m = json.loads(second.stdout)["metrics"]
    assert (m["accuracy"]["value"], m["first_word"]["value"]) == (0.5, 0.5)  # case counts: "tokyo" is wrong
