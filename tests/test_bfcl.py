"""BFCL cards: arle's scores equal bfcl-eval's own verdicts one for one, on fixed model outputs
(right, wrong, malformed, no call; text and native) for every single-turn category; the prompt
is bfcl-eval's; model text is never run; a bad category is one line, exit 2; `arle eval` on the
tiny model finishes with a score, in text and in native tool-call mode.

The expected side calls bfcl-eval directly: its own text decoder (`default_decode_ast_prompting`,
safe on these fixed outputs), its output-format checks and its `ast_checker`, in the steps of
its eval runner. Native answers are decoded as its Qwen FC handler does (`qwen_fc_decode`
below: that handler's module imports the API clients, so its 5 lines are copied here)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from arlecli.catalog import list_cards, load_card
from arlecli.data.bfcl import bfcl_row
from arlecli.envs import make_env
from arlecli.envs.episodes import Job, run_episodes
from arlecli.engine.base import SamplingParams
from arlecli.errors import UserError
from arlecli.rewards import get_reward
from arlecli.rewards import bfcl as reward_module
from arlecli.rewards.bfcl import CATEGORIES, bfcl, decode_python, decode_text
from arlecli.types import Task

from helpers.cli import arle, assert_one_line_error
from helpers.scripted_engine import Replies

HERE = Path(__file__).parent / "fixtures" / "bfcl"
ENTRIES = {e["id"]: e for e in map(json.loads, (HERE / "entries.jsonl").read_text().splitlines())}
CASES = [json.loads(line) for line in (HERE / "outputs.jsonl").read_text().splitlines()]


BFCL_CARDS = [c for c in list_cards() if c.name.startswith("bfcl")]


def card_for(category: str):
    [card] = [c for c in BFCL_CARDS if category in c.source.params["categories"]]
    return card


def qwen_fc_decode(text: str) -> list[dict]:
    # bfcl_eval/model_handler/local_inference/qwen_fc.py: QwenFCHandler.decode_ast and _extract_tool_calls.
    calls = []
    for match in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL):
        try:
            calls.append(json.loads(match))
        except Exception:
            pass
    if type(calls) is not list or any(type(item) is not dict for item in calls):
        raise ValueError("Model did not return a list of function calls")
    return [{call["name"]: {k: v for k, v in call["arguments"].items()}} for call in calls]


def bfcl_eval_verdict(entry: dict, output: str, native: bool) -> bool:
    """bfcl-eval's eval runner on one entry (_evaluate_single_ast_entry / _relevance_entry)."""
    b = bfcl()
    category = b.utils.extract_test_category_from_id(entry["id"])
    language = "java" if category == "simple_java" else "javascript" if category == "simple_javascript" else "python"
    fmt = {"java": b.enums.ReturnFormat.JAVA, "javascript": b.enums.ReturnFormat.JAVASCRIPT}.get(
        language, b.enums.ReturnFormat.PYTHON
    )
    relevance = "relevance" in category
    try:
        if native:
            decoded = qwen_fc_decode(output)
        else:
            decoded = b.handler_utils.default_decode_ast_prompting(
                output, b.enums.ReturnFormat.PYTHON if relevance else fmt, False
            )
        called = not b.utils.is_empty_output(decoded)
    except Exception:
        if not relevance:
            return False
        called = False
    if relevance:
        return not called if "irrelevance" in category else called
    if not b.utils.is_function_calling_format_output(decoded):
        return False
    lang = {"java": b.enums.Language.JAVA, "javascript": b.enums.Language.JAVASCRIPT}.get(
        language, b.enums.Language.PYTHON
    )
    return bool(
        b.checker.ast_checker(entry["function"], decoded, entry["ground_truth"], lang, category, "arle")["valid"]
    )


def arle_score(entry: dict, output: str, native: bool):
    """The score `arle eval` gives: the category's card, its env (native or text) and reward."""
    card = card_for(bfcl_row(entry)["category"])
    row = bfcl_row(entry)
    task = Task(row["id"], row["query"], row["ground_truth"], row)
    env = make_env(card, task, native_tools=native)
    [(_, episode)] = list(run_episodes(Replies([output]), [Job(task, env, SamplingParams())]))
    return get_reward(card.reward, card.reward_params)(task, episode)


def test_every_single_turn_category_has_a_card_and_fixed_outputs_both_ways():
    categories = {bfcl_row(ENTRIES[c["id"]])["category"] for c in CASES}
    assert categories == set(CATEGORIES)
    for category in CATEGORIES:
        card_for(category)
        verdicts = {
            bfcl_eval_verdict(ENTRIES[c["id"]], c["output"], c["mode"] == "native")
            for c in CASES
            if bfcl_row(ENTRIES[c["id"]])["category"] == category
        }
        assert verdicts == {True, False}, category  # each category's outputs hold a valid and an invalid one


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['id']}-{c['case']}-{c['mode']}")
def test_arle_scores_equal_bfcl_eval_verdicts(case):
    entry = ENTRIES[case["id"]]
    native = case["mode"] == "native"
    expected = bfcl_eval_verdict(entry, case["output"], native)
    score = arle_score(entry, case["output"], native)
    assert score.correct is expected and score.reward == float(expected), (score, case)
    assert score.details["mode"] == case["mode"]
    irrelevance = "irrelevance" in bfcl_row(entry)["category"]
    if case["case"] in ("right", "right_fenced", "arithmetic") or case["case"] == "call" and not irrelevance:
        assert score.correct, case
    wrong = ("wrong_value", "wrong_function", "malformed", "extra_call", "missing_call", "not_calls")
    if case["case"] in wrong and "relevance" not in bfcl_row(entry)["category"]:
        assert not score.correct and score.details.get("error_type"), case


def test_prompts_are_bfcl_evals_own():
    b = bfcl()
    entry = ENTRIES["simple_python_0"]
    card = card_for("simple_python")
    row = bfcl_row(entry)
    task = Task(row["id"], row["query"], row["ground_truth"], row)
    hinted = b.utils.add_language_specific_hint_to_function_doc([json.loads(json.dumps(entry))])[0]["function"]
    text = make_env(card, task, native_tools=False)
    assert text.tools is None
    assert text.reset() == b.handler_utils.system_prompt_pre_processing_chat_model(
        json.loads(json.dumps(entry["question"][0])), hinted, entry["id"]
    )
    assert "[func_name1(params_name1=params_value1" in text.reset()[0]["content"]
    native = make_env(card, task, native_tools=True)
    assert native.reset() == entry["question"][0]  # no system prompt: the template's tools carry the docs
    assert native.tools == [{"type": "function", "function": f} for f in hinted]
    assert "Python 3 syntax" in native.tools[0]["function"]["description"]
    assert row["function"] == entry["function"]  # the checker reads the docs without the hint
    with pytest.raises(UserError, match="mode native needs"):
        make_env(dataclasses.replace(card, env_params={"mode": "native"}), task, native_tools=False)


def test_text_decoding_never_runs_model_text(tmp_path):
    marker = tmp_path / "ran"
    attack = f"[calculate_triangle_area(base=__import__('pathlib').Path({str(marker)!r}).touch() or 10, height=5)]"
    attack = attack.replace(" or 10", " + 10")  # a binary operation: what bfcl-eval's decoder evals
    score = arle_score(ENTRIES["simple_python_0"], attack, native=False)
    assert not score.correct and score.details["error_type"] == "ast_decoder:decoder_failed"
    assert not marker.exists()
    with pytest.raises(TypeError):  # bfcl-eval's own decoder runs it (and then fails to add None + 10)
        bfcl().handler_utils.default_decode_ast_prompting(attack)
    assert marker.exists()
    for bomb in ["[f(a=9**9**9**9)]", "[f(a='x'*10**10)]", "[f(a=2**10**8)]"]:
        with pytest.raises(ValueError, match="too large|too long"):
            decode_python(bomb)
    deep = "[f(a=" + "[" * 5000 + "]" * 5000 + ")]"
    with pytest.raises((RecursionError, SyntaxError, MemoryError)):
        decode_text(deep)
    assert not arle_score(ENTRIES["simple_python_0"], deep, native=False).correct


def test_a_bad_category_is_one_line_exit_2(tmp_path):
    card = (Path(__file__).resolve().parents[1] / "benchmarks" / "bfcl_simple.yaml").read_text()
    for category, needles in [
        ("simple_pyton", ("unknown BFCL category 'simple_pyton'", "did you mean simple_python")),
        ("multi_turn_base", ("BFCL category 'multi_turn_base' is not offered", "eval()")),
    ]:
        path = tmp_path / f"{category}.yaml"
        path.write_text(
            card.replace("categories: [simple_python]", f"categories: [{category}]").replace(
                "fixture: fixtures/bfcl_simple.jsonl\n", ""
            )
        )
        proc = arle("eval", str(path), "--base-url", "http://127.0.0.1:9/v1", "--limit", "1", cwd=tmp_path)
        assert_one_line_error(proc, *needles)


def test_without_bfcl_eval_a_card_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setattr(reward_module, "_LOADED", None)
    for name in [m for m in sys.modules if m == "bfcl_eval" or m.startswith("bfcl_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # import bfcl_eval raises ImportError
    with pytest.raises(UserError) as err:
        bfcl()
    assert "pip install 'arle[bfcl]' && pip install --no-deps bfcl-eval==2026.3.23" in str(err.value)
    assert "\n" not in str(err.value)


def test_arle_eval_finishes_with_a_score_on_the_tiny_model(tiny_model, tmp_path):
    proc = arle(
        "eval", "bfcl_javascript", "--model", str(tiny_model), "--limit", "2", "--max-tokens", "4",
        "--output", "run", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "run" / "results.json").read_text())
    assert result["n_tasks"] == 2 and 0.0 <= result["metrics"]["accuracy"]["value"] <= 1.0
    samples = [json.loads(s) for s in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [s["details"]["mode"] for s in samples] == ["text", "text"]  # no tool format in its template


def test_native_tool_calls_through_the_hf_engine_score_as_bfcl_eval_does(tiny_model, tmp_path, monkeypatch):
    """The tiny model with Qwen2.5's tool template: the docs go to the template as tools, and a
    scripted right call (wrong on the second task) is scored by bfcl-eval's checker."""
    from arlecli.engine.hf import HFEngine
    from arlecli.eval import EvalOptions, run_eval

    from helpers.tool_model import build_tool_model, script_generate

    model = build_tool_model(tiny_model, tmp_path / "tool_model")
    right = '<tool_call>\n{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}\n</tool_call>'
    seen = []

    def reply(request):
        seen.append(request)
        return right

    script_generate(monkeypatch, HFEngine, reply)
    engine = HFEngine(str(model))
    result = run_eval(load_card("bfcl_simple"), engine, EvalOptions(limit=2), model="tiny", run_dir=tmp_path / "run")
    samples = [json.loads(s) for s in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    by_id = {s["task_id"]: s for s in samples}
    assert by_id["simple_python_0"]["correct"] and not by_id["simple_python_1"]["correct"]
    assert by_id["simple_python_1"]["details"]["error_type"] == "simple_function_checker:wrong_func_name"
    assert {s["details"]["mode"] for s in samples} == {"native"}
    assert result["metrics"]["accuracy"]["value"] == 0.5
    assert all(r.tools and r.tools[0]["function"]["name"] for r in seen)
    prompt = engine.tokenizer.decode(engine.encode(seen[0]))
    assert "<tools>" in prompt and "calculate_triangle_area" in prompt
