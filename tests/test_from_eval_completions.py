"""Runs of completion-format cards (HumanEval, gsm8k: plain-text prompts, no chat messages)
become TRL prompt/completion rows with `arle data from-eval` (pairs with --pairs), and `arle
train --algo sft|dpo|rft` trains on them: the prompt carries no loss, the completion and the
EOS appended after it do, as TRL's SFTTrainer does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from arlecli.errors import UserError
from arlecli.catalog import load_card

from helpers.runs import from_eval, read_rows, write_run
from helpers.train import train_in_process

TINY = ["--set", "per_device_train_batch_size=2", "--eval-limit", "0"]


def eval_run(monkeypatch, capsys, tmp_path: Path, name: str, *args: str) -> Path:
    import arlecli.cli.main as main

    run = tmp_path / name
    monkeypatch.setattr(sys, "argv", ["arle", "eval", *args, "--max-tokens", "6", "-o", str(run)])
    with pytest.raises(SystemExit) as exit_:
        main.main()
    _, err = capsys.readouterr()
    assert not exit_.value.code, err
    return run


def test_completion_runs_become_prompt_completion_rows_that_sft_trains_on(tmp_path, tiny_model, monkeypatch, capsys):
    from transformers import AutoTokenizer

    from arlecli.train.sft import sft_dataset

    model = str(tiny_model)
    humaneval = eval_run(
        monkeypatch, capsys, tmp_path, "humaneval", "humaneval", "--model", model, "--limit", "2", "--sandbox", "auto"
    )
    gsm8k = eval_run(
        monkeypatch,
        capsys,
        tmp_path,
        "gsm8k",
        "gsm8k",
        "--model",
        model,
        "--rows",
        str(load_card("gsm8k").fixture_path),
        "--num-fewshot",
        "0",
        "--limit",
        "2",
    )
    written = []
    for run in (humaneval, gsm8k):
        # --all --keep-cut: the tiny model is always wrong and runs to its token limit
        code, _, err = from_eval(monkeypatch, capsys, str(run), "--all", "--keep-cut", "-o", str(run) + ".jsonl")
        assert code == 0, err
        rows, samples = read_rows(Path(str(run) + ".jsonl")), read_rows(run / "samples.jsonl")
        assert len(rows) == len(samples) == 2
        for row, s in zip(rows, samples):
            assert isinstance(s["prompt"], str) and "messages" not in row
            assert (row["prompt"], row["completion"], row["task_id"]) == (s["prompt"], s["completion"], s["task_id"])
        written += rows
    prompts = {r["task_id"]: r["prompt"] for r in written}
    assert prompts["HumanEval/0"].startswith("from typing import List")  # its signature and docstring
    assert (
        prompts["0"] == "Question: A baker makes 14 loaves in the morning and 9 in the afternoon. He sells 17 "
        "loaves. How many loaves are left?\nAnswer:"
    )

    # What SFT trains on: the prompt as the engine encoded it (no loss), the completion and EOS (loss).
    tok = AutoTokenizer.from_pretrained(model)
    example = sft_dataset(tok, written[2:3])[0]
    prompt_ids = tok(written[2]["prompt"])["input_ids"]
    completion_ids = tok(written[2]["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert example["input_ids"] == prompt_ids + completion_ids
    assert example["labels"] == [-100] * len(prompt_ids) + completion_ids

    data = tmp_path / "both.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in written))
    run = tmp_path / "sft"
    train_in_process(
        "gsm8k", "--algo", "sft", "--data", str(data), "--model", model, "--max-steps", "2", *TINY, "--output", str(run)
    )
    metrics = read_rows(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["loss"] > 0 for m in metrics)
    assert (run / "final" / "model.safetensors").exists()


def text_sample(task: str, k: int, correct: bool, reply: str) -> dict:
    return {
        "id": f"{task}#{k}",
        "task_id": task,
        "sample": k,
        "prompt": f"Question: {task}?\nAnswer:",
        "completion": reply,
        "reward": float(correct),
        "correct": correct,
        "details": {},
    }


def test_completion_pairs_and_their_tokens(tmp_path, tiny_model, monkeypatch, capsys):
    from transformers import AutoTokenizer

    from arlecli.train.dpo import dpo_dataset

    run = write_run(
        tmp_path / "run",
        [text_sample("2+3", 0, True, " 5"), text_sample("2+3", 1, False, " 6"), text_sample("1+1", 0, False, " 3")],
        benchmark="gsm8k",
    )
    code, _, err = from_eval(monkeypatch, capsys, str(run), "--pairs", "-o", str(tmp_path / "pairs.jsonl"))
    assert code == 0, err
    (pair,) = read_rows(tmp_path / "pairs.jsonl")
    assert {k: pair[k] for k in ("prompt", "chosen", "rejected", "task_id")} == {
        "prompt": "Question: 2+3?\nAnswer:",
        "chosen": " 5",
        "rejected": " 6",
        "task_id": "2+3",
    }
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    (ex,) = dpo_dataset(tok, [pair], max_length=None)
    assert ex["prompt_ids"] == tok(pair["prompt"])["input_ids"]
    for side in ("chosen", "rejected"):
        ids = tok(pair[side], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert ex[f"{side}_ids"] == ids and ex[f"{side}_mask"] == [1] * len(ids)
    # A text row of the wrong shape is one line naming the line and the fix.
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "Q", "completion": ["A"]}) + "\n")
    from arlecli.train.offline import read_rows as read_training_rows

    with pytest.raises(UserError, match=r"bad.jsonl:1: `prompt` and `completion` must both be text"):
        read_training_rows(bad, "sft")
    read_training_rows(tmp_path / "pairs.jsonl", "dpo")  # the pairs from-eval wrote are DPO rows


def test_rft_trains_on_a_completion_card(tmp_path, tiny_model):
    """A round of rft on gsm8k (plain-text prompts): its kept rows are prompt/completion text and
    its SFT step trains on them."""
    run = tmp_path / "rft"
    train_in_process(
        "gsm8k",
        "--algo",
        "rft",
        "--rows",
        str(load_card("gsm8k").fixture_path),
        "--model",
        str(tiny_model),
        "--set",
        "rounds=1",
        "--set",
        "num_generations=2",
        "--set",
        "tasks_per_round=2",
        "--set",
        "min_reward=0",
        "--set",
        "keep_cut=true",
        "--set",
        "max_completion_length=6",
        "--set",
        "num_fewshot=0",
        *TINY,
        "--output",
        str(run),
    )
    rows = read_rows(run / "checkpoint-1" / "rows.jsonl")
    assert len(rows) == 4 and all(
        r["prompt"].startswith("Question: ") and isinstance(r["completion"], str) for r in rows
    )
    (metrics,) = read_rows(run / "metrics.jsonl")
    assert metrics["kept"] == 4 and metrics["sft_steps"] >= 1
