"""`arle data from-eval`: eval runs' episodes become chat-format SFT rows (or DPO pairs) that
replay exactly what the model saw, filtered as asked, with bad input refused in one line."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from arlecli.envs.episodes import sample_seed
from arlecli.eval import EvalOptions, run_eval
from arlecli.catalog import load_card

from helpers.runs import SEED, capture_prompt_ids, from_eval, read_rows, write_run
from helpers.tool_model import CALL, GSM8K_ROWS, first_turn_calls_a_tool, tool_template_model

# Helpers -----------------------------------------------------------------------------------


def render_ids(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """The ids a trainer gets from a row: the chat template with the generation prompt, tokenised."""
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def assert_rows_replay_the_engine(
    rows: list[dict[str, Any]], seen: dict[int, tuple[list[int], list[int]]], tok: Any
) -> None:
    """Each row's conversation, rendered by the model's chat template, is what the engine was sent:
    the first turn's prompt ids exactly; every later turn's ids extend the previous prompt and
    completion ids as generated and decode to the rendered conversation so far."""
    for row in rows:
        messages, tools = row["messages"], row.get("tools")
        assert messages[-1]["role"] == "assistant"
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        base = sample_seed(SEED, row["task_id"], row["sample"])
        previous: list[int] = []
        for t, at in enumerate(turns):
            prompt_ids, completion_ids = seen[base + t]
            if t == 0:
                assert render_ids(tok, messages[:at], tools) == prompt_ids
            else:
                assert prompt_ids[: len(previous)] == previous
                text = tok.apply_chat_template(messages[:at], tools=tools, add_generation_prompt=True, tokenize=False)
                assert tok.decode(prompt_ids, skip_special_tokens=False) == text
            previous = prompt_ids + completion_ids


def sample(
    task: str,
    k: int,
    *,
    correct: bool,
    reward: float | None = None,
    reply: str | None = None,
    question: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A samples.jsonl line as arle eval writes it for a single-turn chat card."""
    return {
        "id": f"{task}#{k}",
        "task_id": task,
        "sample": k,
        "prompt": [{"role": "user", "content": question or f"What is {task}?"}],
        "completion": reply if reply is not None else f"answer {k} to {task}",
        "reward": float(correct) if reward is None else reward,
        "correct": correct,
        "details": {},
        **extra,
    }


def agent_sample(task: str, k: int, correct: bool, answer: str) -> dict[str, Any]:
    """A two-turn tools-env sample: a tool call, its result, the answer."""
    return sample(
        task,
        k,
        correct=correct,
        reply=answer,
        turns=[
            {"completion": CALL, "observation": [{"role": "tool", "name": "calculator", "content": "6"}]},
            {"completion": answer, "observation": []},
        ],
        tools=[{"type": "function", "function": {"name": "calculator"}}],
        env_info={"tool_calls": 1, "tool_errors": 0},
    )


# Real runs on the tiny model ---------------------------------------------------------------


def test_single_turn_rows_render_to_the_prompt_ids_the_engine_used(tmp_path, tiny_model, monkeypatch, capsys):
    from transformers import AutoTokenizer

    from arlecli.engine.hf import HFEngine

    seen = capture_prompt_ids(monkeypatch)
    run = tmp_path / "run"
    run_eval(
        load_card("basic_arithmetic"),
        HFEngine(str(tiny_model), batch_size=4),
        EvalOptions(limit=3, num_samples=2, temperature=1.0, max_tokens=8),
        model="tiny",
        run_dir=run,
    )
    # --keep-cut: the tiny model's replies run to the token limit; every sample must make a row here
    code, out, err = from_eval(
        monkeypatch, capsys, str(run), "--all", "--keep-cut", "-o", str(tmp_path / "sft.jsonl"), "--json"
    )
    assert code == 0, err
    rows = read_rows(tmp_path / "sft.jsonl")
    samples = read_rows(run / "samples.jsonl")
    assert len(rows) == len(samples) == 6 and json.loads(out)["rows"] == 6
    for row, s in zip(rows, samples):
        assert row["messages"] == [*s["prompt"], {"role": "assistant", "content": s["completion"]}]
        assert "tools" not in row
        assert {k: row[k] for k in ("task_id", "sample", "reward", "correct")} == {
            k: s[k] for k in ("task_id", "sample", "reward", "correct")
        }
        assert (row["benchmark"], row["model"], row["run"]) == ("basic_arithmetic", "tiny", str(run))
    assert_rows_replay_the_engine(rows, seen, AutoTokenizer.from_pretrained(str(tiny_model)))


@pytest.mark.parametrize("native", [False, True], ids=["text-tools", "native-tools"])
def test_agent_rows_replay_every_turn_the_model_saw(native, tmp_path, tiny_model, monkeypatch, capsys):
    """math_tool on the tiny model (its first turn a fixed tool call, later turns its own): the
    rows hold the tool call, the env's result with its role, and the model's next turn, and
    render to the ids of every turn; with a tool-rendering template the schemas travel too."""
    from transformers import AutoTokenizer

    from arlecli.engine.hf import HFEngine

    model = tool_template_model(tiny_model, tmp_path / "model") if native else tiny_model
    first_turn_calls_a_tool(monkeypatch)
    seen = capture_prompt_ids(monkeypatch)
    run = tmp_path / "run"
    run_eval(
        load_card("math_tool"),
        HFEngine(str(model), batch_size=4),
        EvalOptions(data=GSM8K_ROWS, limit=2, max_tokens=8),
        model="tiny",
        run_dir=run,
    )
    code, _, err = from_eval(monkeypatch, capsys, str(run), "--all", "--keep-cut", "-o", str(tmp_path / "sft.jsonl"))
    assert code == 0, err
    rows = read_rows(tmp_path / "sft.jsonl")
    assert len(rows) == 2
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        # the tool schemas are in the template (native) or described in a system prompt (text)
        assert (
            roles[:3] == ["user", "assistant", "tool"]
            if native
            else roles[:4] == ["system", "user", "assistant", "user"]
        )
        assert row["messages"][roles.index("assistant")]["content"] == CALL
        assert "6" in row["messages"][roles.index("assistant") + 1]["content"]
        assert roles[-1] == "assistant" and roles.count("assistant") >= 2
        if native:
            assert [t["function"]["name"] for t in row["tools"]] == ["python", "calculator"]
        else:
            assert "tools" not in row
    assert_rows_replay_the_engine(rows, seen, AutoTokenizer.from_pretrained(str(model)))


# Filters and pairs on crafted runs ---------------------------------------------------------


def test_filters_keep_what_they_say_and_report_counts(tmp_path, monkeypatch, capsys):
    run = write_run(
        tmp_path / "run",
        [
            sample("a", 0, correct=True, reward=1.0),
            sample("a", 1, correct=True, reward=0.9),
            sample("a", 2, correct=True, reward=1.0, reply="answer 0 to a"),  # the same conversation as a#0
            sample("a", 3, correct=False, reward=0.6),
            sample("b", 0, correct=False, reward=0.2),
            sample("b", 1, correct=True, reward=0.7),
        ],
    )
    out = tmp_path / "sft.jsonl"

    def ids(*args: str) -> list[str]:
        code, stdout, err = from_eval(monkeypatch, capsys, str(run), "-o", str(out), *args)
        assert code == 0, err
        return [f"{r['task_id']}#{r['sample']}" for r in read_rows(out)]

    assert ids() == ["a#0", "a#1", "a#2", "b#1"]  # correct-only is the default
    assert ids("--all") == ["a#0", "a#1", "a#2", "a#3", "b#0", "b#1"]
    assert ids("--min-reward", "0.6") == ["a#0", "a#1", "a#2", "a#3", "b#1"]  # correctness no longer asked
    assert ids("--correct-only", "--min-reward", "0.95") == ["a#0", "a#2"]
    assert ids("--dedupe") == ["a#0", "a#1", "b#1"]
    assert ids("--all", "--max-per-task", "2") == ["a#0", "a#2", "b#0", "b#1"]  # the highest rewards of a task
    assert ids("--all", "--max-per-task", "1") == ["a#0", "b#1"]  # ties: the earlier sample
    assert ids("--dedupe", "--max-per-task", "2") == ["a#0", "a#1", "b#1"]

    code, stdout, err = from_eval(
        monkeypatch, capsys, str(run), "-o", str(out), "--dedupe", "--max-per-task", "1", "--json"
    )
    report = json.loads(stdout)
    assert [(f["filter"], f["kept"], f["of"]) for f in report["filters"]] == [
        ("read", 6, 6),
        ("complete", 6, 6),
        ("correct-only", 4, 6),
        ("dedupe", 3, 4),
        ("max-per-task 1", 2, 3),
    ]
    assert report["rows"] == 2 and report["runs"] == [{"run": str(run), "benchmark": "toy", "model": "m", "samples": 6}]
    assert "dedupe: kept 3 of 4 samples" in err and f"wrote 2 SFT rows to {out}" in err
    assert read_rows(out)[0] == {
        "messages": [{"role": "user", "content": "What is a?"}, {"role": "assistant", "content": "answer 0 to a"}],
        "benchmark": "toy",
        "run": str(run),
        "task_id": "a",
        "sample": 0,
        "reward": 1.0,
        "correct": True,
        "model": "m",
    }


def test_rows_from_several_runs_and_an_agent_episode(tmp_path, monkeypatch, capsys):
    one = write_run(tmp_path / "one", [agent_sample("a", 0, True, "#### 6")], model="teacher")
    two = write_run(tmp_path / "two", [sample("a", 0, correct=True)], model="other")
    out = tmp_path / "sft.jsonl"
    code, _, err = from_eval(monkeypatch, capsys, str(one), str(two), "-o", str(out))
    assert code == 0, err
    agent, plain = read_rows(out)
    assert [m["role"] for m in agent["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert agent["messages"][1]["content"] == CALL and agent["messages"][-1]["content"] == "#### 6"
    assert agent["tools"] == [{"type": "function", "function": {"name": "calculator"}}]
    assert (agent["model"], agent["run"], plain["model"], plain["run"]) == ("teacher", str(one), "other", str(two))


def test_an_episode_cut_at_the_token_limit_makes_no_row_unless_kept(tmp_path, monkeypatch, capsys):
    """The chat template would end a cut turn with an end-of-turn token the model never produced."""
    cut_agent = agent_sample("b", 0, True, "#### 6")
    cut_agent["turns"][0]["finish_reason"] = "length"  # its tool call was cut; the answer was not
    run = write_run(
        tmp_path / "run",
        [
            sample("a", 0, correct=True, finish_reason="length"),
            sample("a", 1, correct=True, finish_reason="stop"),
            sample("a", 2, correct=False, finish_reason="length"),
            cut_agent,
        ],
    )
    out = tmp_path / "rows.jsonl"

    def rows(*args: str) -> list[str]:
        code, _, err = from_eval(monkeypatch, capsys, str(run), "-o", str(out), *args)
        assert code == 0, err
        return [f"{r['task_id']}#{r['sample']}" for r in read_rows(out)]

    assert rows() == ["a#1"]
    assert rows("--keep-cut") == ["a#0", "a#1", "b#0"]
    assert rows("--all") == ["a#1"]
    # Pairs: a cut correct episode is never chosen; a cut wrong one may be rejected.
    code, _, err = from_eval(monkeypatch, capsys, str(run), "--pairs", "-o", str(out))
    assert code == 0, err
    assert [(r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in read_rows(out)] == [
        ("answer 1 to a", "answer 2 to a")
    ]
    assert "complete when correct: kept 2 of 4 samples" in err

    only_cut = write_run(tmp_path / "cut", [sample("a", 0, correct=True, finish_reason="length")])
    code, _, err = from_eval(monkeypatch, capsys, str(only_cut), "-o", str(tmp_path / "none.jsonl"))
    assert code == 2 and "complete kept 0 of 1 samples" in err and "--keep-cut" in err and "--max-tokens" in err


def test_pairs_match_each_correct_episode_with_a_distinct_wrong_one(tmp_path, monkeypatch, capsys):
    run = write_run(
        tmp_path / "run",
        [
            sample("a", 0, correct=True),
            sample("a", 1, correct=False, reward=0.1),
            sample("a", 2, correct=True),
            sample("a", 3, correct=False),
            sample("a", 4, correct=False),  # 2 correct, 3 wrong: 2 pairs
            sample("b", 0, correct=True),
            sample("b", 1, correct=True),  # no wrong one: no pair
            sample("c", 0, correct=False),  # no correct one: no pair
            sample("d", 0, correct=False),
            sample("d", 1, correct=True),  # 1 pair
        ],
    )
    out = tmp_path / "pairs.jsonl"
    code, stdout, err = from_eval(monkeypatch, capsys, str(run), "--pairs", "-o", str(out), "--json")
    assert code == 0, err
    rows = read_rows(out)
    assert [(r["task_id"], r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows] == [
        ("a", "answer 0 to a", "answer 1 to a"),
        ("a", "answer 2 to a", "answer 3 to a"),
        ("d", "answer 1 to d", "answer 0 to d"),
    ]
    assert rows[0] == {
        "prompt": [{"role": "user", "content": "What is a?"}],
        "chosen": [{"role": "assistant", "content": "answer 0 to a"}],
        "rejected": [{"role": "assistant", "content": "answer 1 to a"}],
        "benchmark": "toy",
        "run": str(run),
        "task_id": "a",
        "model": "m",
        "chosen_reward": 1.0,
        "rejected_reward": 0.1,
    }
    assert [(f["filter"], f["kept"], f["of"]) for f in json.loads(stdout)["filters"]] == [
        ("read", 10, 10),
        ("complete when correct", 10, 10),
        ("tasks with a correct and a wrong sample", 2, 4),
    ]

    code, _, err = from_eval(monkeypatch, capsys, str(run), "--pairs", "--max-per-task", "1", "-o", str(out))
    assert code == 0, err
    assert [(r["task_id"], r["chosen"][0]["content"]) for r in read_rows(out)] == [
        ("a", "answer 0 to a"),
        ("d", "answer 1 to d"),
    ]
    assert "max-per-task 1: kept 2 of 3 pairs" in err


def test_agent_pairs_keep_the_tool_turns_in_chosen_and_rejected(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "run", [agent_sample("a", 0, True, "#### 6"), agent_sample("a", 1, False, "#### 7")])
    code, _, err = from_eval(monkeypatch, capsys, str(run), "--pairs", "-o", str(tmp_path / "p.jsonl"))
    assert code == 0, err
    [row] = read_rows(tmp_path / "p.jsonl")
    assert row["prompt"] == [{"role": "user", "content": "What is a?"}] and row["tools"]
    assert (
        [m["role"] for m in row["chosen"]] == [m["role"] for m in row["rejected"]] == ["assistant", "tool", "assistant"]
    )
    assert (row["chosen"][-1]["content"], row["rejected"][-1]["content"]) == ("#### 6", "#### 7")


def test_pairs_never_join_episodes_that_saw_different_prompts(tmp_path, monkeypatch, capsys):
    one = write_run(tmp_path / "one", [sample("a", 0, correct=True, question="v1 of a")])
    two = write_run(tmp_path / "two", [sample("a", 0, correct=False, question="v2 of a")])
    code, _, err = from_eval(monkeypatch, capsys, str(one), str(two), "--pairs", "-o", str(tmp_path / "p.jsonl"))
    assert code == 2 and "none of the 2 tasks has both a correct and a wrong sample" in err


# Bad input: one line, exit 2, nothing half-written -----------------------------------------


def one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_bad_input_is_one_line_and_leaves_the_output_alone(tmp_path, monkeypatch, capsys):
    good = write_run(tmp_path / "good", [sample("a", 0, correct=True), sample("a", 1, correct=False)])
    out = tmp_path / "sft.jsonl"
    out.write_text("an earlier export\n")

    def refused(*args: str, needles: tuple[str, ...]) -> None:
        code, stdout, err = from_eval(monkeypatch, capsys, *args)
        one_line(code, err, *needles)
        assert stdout == "" and out.read_text() == "an earlier export\n"

    (tmp_path / "plain").mkdir()
    refused(str(tmp_path / "plain"), "-o", str(out), needles=("is not a run directory", "meta.json"))
    refused(str(tmp_path / "nowhere"), "-o", str(out), needles=("no such folder",))

    torn = write_run(tmp_path / "torn", [sample("a", 0, correct=True)])
    with open(torn / "samples.jsonl", "a") as f:
        f.write('{"id": "a#1", "task_id": "a", "sam')
    refused(str(torn), "-o", str(out), needles=("torn line", "--resume"))

    other = write_run(tmp_path / "other", [sample("a", 0, correct=True)], benchmark="gsm8k")
    refused(str(good), str(other), "-o", str(out), needles=("different benchmarks", "toy", "gsm8k", "--force"))
    code, _, err = from_eval(monkeypatch, capsys, str(good), str(other), "--force", "-o", str(tmp_path / "mixed.jsonl"))
    assert code == 0 and {r["benchmark"] for r in read_rows(tmp_path / "mixed.jsonl")} == {"toy", "gsm8k"}

    refused(str(good), str(good), "-o", str(out), needles=("given twice",))
    refused(str(good), "-o", str(tmp_path / "missing" / "sft.jsonl"), needles=("does not exist",))
    refused(str(good), "-o", str(out / "sft.jsonl"), needles=(f"{out} is a file, not a folder",))
    refused(str(out), "-o", str(tmp_path / "x.jsonl"), needles=("is not a run directory: a file",))
    refused(str(good), "-o", str(tmp_path), needles=("is a folder",))
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    for own in ("samples.jsonl", "meta.json", "./x/../results.json"):  # the run it reads: never written over
        code, _, err = from_eval(monkeypatch, capsys, str(good), "-o", str(good / own))
        one_line(code, err, "is part of the run", "outside it")
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    code, _, _ = from_eval(monkeypatch, capsys, str(good), "-o", str(good / "sft.jsonl"))  # beside them: fine
    assert code == 0

    wrong = write_run(tmp_path / "wrong", [sample("a", 0, correct=False, reward=0.3)])
    refused(str(wrong), "-o", str(out), needles=("correct-only kept 0 of 1 samples", "--all"))
    refused(str(wrong), "--min-reward", "0.5", "-o", str(out), needles=("min-reward 0.5 kept 0 of 1", "0.3"))
    refused(str(wrong), "--pairs", "-o", str(out), needles=("none of the 1 tasks has both",))
    refused(str(good), "--pairs", "--all", "-o", str(out), needles=("--pairs",))
    refused(str(good), "--max-per-task", "0", "-o", str(out), needles=("--max-per-task must be at least 1",))

    exemplar = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    shots = write_run(
        tmp_path / "shots", [{**sample("a", 0, correct=True), "prompt": [*exemplar, {"role": "user", "content": "a?"}]}]
    )
    refused(str(shots), "-o", str(out), needles=("few-shot exemplars", "--num-fewshot 0"))

    # A completion-format run is prompt/completion rows (test_from_eval_completions); one whose
    # model thought apart from its answer has no text row to carry the thought.
    completion = write_run(
        tmp_path / "completion", [{**sample("a", 0, correct=True), "prompt": "Question: a?", "thinking": "hmm"}]
    )
    refused(str(completion), "-o", str(out), needles=("completion-format", "--drop-thinking"))

    old = agent_sample("a", 0, True, "#### 6")
    del old["tools"]
    refused(str(write_run(tmp_path / "old", [old])), "-o", str(out), needles=("older arle", "tool schemas"))

    train = tmp_path / "train"
    train.mkdir()
    (train / "meta.json").write_text(json.dumps({"kind": "train", "benchmark": "toy"}))
    refused(str(train), "-o", str(out), needles=("is a training run", "held-out evals"))

    unfinished = write_run(tmp_path / "unfinished", [sample("a", 0, correct=True)])
    (unfinished / "results.json").unlink()
    refused(str(unfinished), "-o", str(out), needles=("no results.json",))

    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left behind


# Thinking (issue 24) -----------------------------------------------------------------------


def thinking_sample(
    task: str, k: int, thinking: str, *, correct: bool, cut: bool = False, **extra: Any
) -> dict[str, Any]:
    """A samples.jsonl line of a model that thought (eval.py's fields); a cut thought has no answer."""
    s = sample(task, k, correct=correct, reply="" if cut else None, **extra)
    s.update(thinking=thinking, thinking_cut=cut, thinking_tokens=len(thinking.split()), answer_tokens=0 if cut else 4)
    return s


def thinking_agent_sample(task: str, k: int, correct: bool, answer: str, cut_first: bool = False) -> dict[str, Any]:
    """A two-turn tools-env sample whose turns thought (the first cut, with no answer, if `cut_first`)."""
    s = agent_sample(task, k, correct, answer)
    s["turns"][0].update(thinking="I should call the calculator", thinking_cut=cut_first, thinking_tokens=5)
    if cut_first:
        s["turns"][0]["completion"] = ""
    s["turns"][1].update(thinking="the tool said 6", thinking_cut=False, thinking_tokens=4)
    s.update(thinking="the tool said 6", thinking_cut=False, thinking_tokens=9, answer_tokens=6)
    return s


def test_rows_keep_the_thinking_unless_dropped_and_cut_thoughts_are_never_rows(tmp_path, monkeypatch, capsys):
    run = write_run(
        tmp_path / "run",
        [
            thinking_sample("a", 0, "a is one more than zero", correct=True),
            thinking_sample("a", 1, "a is, hmm, let me check again", correct=False, cut=True, finish_reason="length"),
            thinking_sample("b", 0, "b is two", correct=False),
            thinking_sample("b", 1, "b is three", correct=True),
            thinking_sample("b", 2, "b is, wait", correct=False, cut=True, finish_reason="length"),
            thinking_agent_sample("c", 0, True, "#### 6"),
            thinking_agent_sample("c", 1, True, "#### 6", cut_first=True),
        ],
    )
    out = tmp_path / "rows.jsonl"

    def rows(*args: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        code, stdout, err = from_eval(monkeypatch, capsys, str(run), "-o", str(out), "--json", *args)
        assert code == 0, err
        return read_rows(out), json.loads(stdout)

    kept, report = rows()
    assert [f"{r['task_id']}#{r['sample']}" for r in kept] == ["a#0", "b#1", "c#0"]
    assert kept[0]["messages"] == [
        {"role": "user", "content": "What is a?"},
        {"role": "assistant", "content": "answer 0 to a", "reasoning_content": "a is one more than zero"},
    ]
    agent = kept[2]["messages"]
    assert [(m["role"], m.get("reasoning_content")) for m in agent] == [
        ("user", None),
        ("assistant", "I should call the calculator"),
        ("tool", None),
        ("assistant", "the tool said 6"),
    ]
    assert ("answered", 4, 7) in [(f["filter"], f["kept"], f["of"]) for f in report["filters"]]

    dropped, _ = rows("--drop-thinking")
    assert [r["messages"] for r in dropped] == [
        [{k: v for k, v in m.items() if k != "reasoning_content"} for m in r["messages"]] for r in kept
    ]
    assert not any("reasoning_content" in m for r in dropped for m in r["messages"])

    # Not even --keep-cut --all makes a row of a thought with no answer.
    everything, _ = rows("--all", "--keep-cut")
    assert [f"{r['task_id']}#{r['sample']}" for r in everything] == ["a#0", "b#0", "b#1", "c#0"]

    # Pairs: a cut thought is neither chosen nor rejected; both sides keep their thinking.
    code, _, err = from_eval(monkeypatch, capsys, str(run), "--pairs", "-o", str(out))
    assert code == 0, err
    [pair] = read_rows(out)
    assert (pair["task_id"], pair["chosen"], pair["rejected"]) == (
        "b",
        [{"role": "assistant", "content": "answer 1 to b", "reasoning_content": "b is three"}],
        [{"role": "assistant", "content": "answer 0 to b", "reasoning_content": "b is two"}],
    )

    only_cut = write_run(tmp_path / "cut", [thinking_sample("a", 0, "hmm", correct=False, cut=True)])
    code, _, err = from_eval(monkeypatch, capsys, str(only_cut), "--all", "--keep-cut", "-o", str(out))
    one_line(code, err, "answered kept 0 of 1", "inside its thinking", "--max-tokens")


def test_a_real_eval_of_a_thinking_endpoint_exports_its_thinking(tmp_path, monkeypatch, capsys):
    """`arle eval` against an endpoint that returns reasoning_content (answers to additions,
    thoughts cut short for subtractions): the rows hold each answered sample's thinking as
    recorded, and none of the cut ones."""
    import re
    import subprocess

    from helpers.fake_openai import FakeOpenAIServer, Reply

    def reply(body: dict[str, Any]) -> Reply:
        a, op, b = re.search(r"(\d) ([+-]) (\d) =", json.dumps(body["messages"])).groups()
        if op == "+":
            return Reply(str(int(a) + int(b)), reasoning_content=f"{a} plus {b} is {int(a) + int(b)}")
        return Reply("", reasoning_content=f"{a} minus {b} is, let me see", finish_reason="length")

    run = tmp_path / "run"
    with FakeOpenAIServer(reply) as srv:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "arlecli",
                "eval",
                "one_digit_sums",
                "--base-url",
                srv.base_url,
                "--limit",
                "8",
                "--output",
                str(run),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    samples = read_rows(run / "samples.jsonl")
    answered = [s for s in samples if not s["thinking_cut"]]
    assert answered and len(answered) < len(samples)
    code, _, err = from_eval(monkeypatch, capsys, str(run), "--all", "-o", str(tmp_path / "sft.jsonl"))
    assert code == 0, err
    rows = read_rows(tmp_path / "sft.jsonl")
    assert [r["messages"][-1] for r in rows] == [
        {"role": "assistant", "content": s["completion"], "reasoning_content": s["thinking"]} for s in answered
    ]
    assert all(" plus " in r["messages"][-1]["reasoning_content"] for r in rows)
    assert f"answered: kept {len(answered)} of {len(samples)} samples" in err


@pytest.mark.parametrize("thinks", [True, False], ids=["template-renders-it", "template-ignores-it"])
def test_a_trainer_renders_a_rows_thinking_and_trains_on_it(thinks, tiny_model, tiny_thinking_model):
    """SFT/DPO tokenise rows through trajectories.for_template: a template that renders
    reasoning_content (Qwen3's shape) gets the row as written; for one that ignores it the
    thinking goes inline between think tags. Either way the thinking carries loss."""
    from transformers import AutoTokenizer

    from arlecli.train.sft import tokenize_conversation
    from arlecli.trajectories import for_template, template_renders_reasoning

    tok = AutoTokenizer.from_pretrained(str(tiny_thinking_model if thinks else tiny_model))
    row = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "two and two make four"},
    ]
    assert template_renders_reasoning(tok) is thinks
    messages = for_template(tok, row)
    if thinks:
        assert messages is row
    else:
        assert messages[1] == {"role": "assistant", "content": "<think>\ntwo and two make four\n</think>\n\n4"}
    ids, mask = tokenize_conversation(tok, messages)
    trained = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert trained == ("" if thinks else "<think>\n") + "two and two make four\n</think>\n\n4<|im_end|>"
    # The answer alone when the row has no thinking (--drop-thinking): nothing changes.
    plain = [row[0], {"role": "assistant", "content": "4"}]
    assert for_template(tok, plain) is plain
