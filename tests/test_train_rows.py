"""`--rows FILE`: the benchmark's own rows from a local file, one word in `arle eval` and `arle
train`. A user who evaluated on their rows RL-trains on the same rows, read by the same loader
(eval.load_tasks), with no card to write; `arle eval --data` (the old name) still works. The
training run also shows its ETA and writes a model card that names its base model."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from helpers.train import train_in_process

# gsm8k's own schema (question, answer with "#### N"), ids of our own: the card's source is the
# hub, out of reach here, so every task these runs see can only come from this file.
ROWS = [
    {
        "id": f"mine-{i}",
        "question": f"Tom has {i} apples and buys {i + 2} more. How many apples?",
        "answer": f"{i} + {i + 2} = {2 * i + 2}\n#### {2 * i + 2}",
    }
    for i in range(3)
]


def write_rows(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def arle_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`arle ARGS` through the console script's entry point, in this process."""
    import arlecli.cli.main as main

    monkeypatch.setattr(sys, "argv", ["arle", *args])
    with pytest.raises(SystemExit) as exit_:
        main.main()
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_rows_are_the_rows_eval_scored(tmp_path, tiny_model, monkeypatch, capsys):
    rows = write_rows(tmp_path / "my_rows.jsonl")
    code, _, err = arle_main(
        monkeypatch,
        capsys,
        "eval",
        "gsm8k",
        "--rows",
        str(rows),
        "--model",
        str(tiny_model),
        "--num-fewshot",
        "0",
        "--max-tokens",
        "4",
        "-o",
        str(tmp_path / "eval"),
    )
    assert code == 0, err
    evaluated = lines(tmp_path / "eval" / "samples.jsonl")
    assert sorted(s["task_id"] for s in evaluated) == ["mine-0", "mine-1", "mine-2"]

    run = tmp_path / "train"
    train_in_process(
        "gsm8k",
        "--algo",
        "grpo",
        "--rows",
        str(rows),
        "--model",
        str(tiny_model),
        "--max-steps",
        "2",
        "--num-generations",
        "2",
        "--set",
        "max_completion_length=4",
        "--set",
        "per_device_train_batch_size=2",
        "--set",
        "num_fewshot=0",
        "--eval-limit",
        "3",
        "--set",
        "eval_max_tokens=4",
        "--output",
        str(run),
    )
    rewarded = lines(run / "rewards.jsonl")
    assert len(rewarded) == 4 and {r["task_id"] for r in rewarded} <= {"mine-0", "mine-1", "mine-2"}
    meta = json.loads((run / "meta.json").read_text())
    assert meta["train_split"] == meta["eval_split"] == str(rows) and meta["rows_hash"]
    # The held-out evaluations score the same rows, with the very prompts `arle eval` sent.
    heldout = {s["task_id"]: s["prompt"] for s in lines(run / "eval" / "step-0" / "samples.jsonl")}
    assert heldout == {s["task_id"]: s["prompt"] for s in evaluated}
    assert all(ROWS[int(tid[-1])]["question"] in prompt for tid, prompt in heldout.items())

    # The same run's step lines say the time left from the first step on, and its model card
    # names the base model (test_train_eta_card has the rest of both).
    err = capsys.readouterr().err
    steps = [line for line in err.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and re.search(r"eta \d:\d\d:\d\d$", steps[0]) and steps[1].endswith("eta 0:00:00"), err
    for card in (run / "README.md", run / "final" / "README.md"):
        text = card.read_text()
        assert "None" not in text and f'base_model: "{tiny_model}"' in text, text
        assert (
            "GRPO on the `gsm8k` benchmark for 2 steps" in text and f"arle eval gsm8k --model {run / 'final'}" in text
        )


def test_the_old_eval_spelling_works_with_a_note_and_bad_rows_are_one_line(tmp_path, tiny_model, monkeypatch, capsys):
    import io

    from rich.console import Console

    import arlecli.cli.eval as cli_eval

    rows = write_rows(tmp_path / "rows.jsonl")
    # On a terminal the old name gets a note; scripts and logs (no terminal) see their output unchanged.
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=200)
    plain_console = cli_eval.err_console
    monkeypatch.setattr(cli_eval, "err_console", lambda: terminal)
    code, _, err = arle_main(
        monkeypatch,
        capsys,
        "eval",
        "gsm8k",
        "--data",
        str(rows),
        "--model",
        str(tiny_model),
        "--num-fewshot",
        "0",
        "--max-tokens",
        "2",
        "--limit",
        "1",
        "-o",
        str(tmp_path / "old"),
    )
    assert code == 0, err
    assert "`arle eval --data` is now `--rows`" in screen.getvalue()
    monkeypatch.setattr(cli_eval, "err_console", plain_console)
    assert [s["task_id"] for s in lines(tmp_path / "old" / "samples.jsonl")] == ["mine-0"]

    def refused(*args: str, needles: tuple[str, ...]) -> None:
        code, _, err = arle_main(monkeypatch, capsys, *args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert all(n in err for n in needles), err

    refused("eval", "gsm8k", "--data", str(rows), "--rows", str(rows), needles=("--data", "--rows"))
    base = ["train", "gsm8k", "--model", str(tiny_model), "-o", str(tmp_path / "t")]
    refused(*base, "--rows", str(tmp_path / "nope.jsonl"), needles=("--rows", "nope.jsonl", "no such file"))
    refused(*base, "--rows", str(rows), "--split", "train", needles=("--split", "--rows"))
    refused(*base, "--algo", "sft", "--data", str(rows), "--rows", str(rows), needles=("--rows", "--eval-rows"))
    # The mix-up this option exists for: --data given to an RL run points at --rows.
    refused(*base, "--data", str(rows), needles=("--data", "--rows FILE"))
    assert not (tmp_path / "t").exists()
