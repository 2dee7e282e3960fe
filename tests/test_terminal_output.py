"""Model text on the user's terminal (issue 23, item 6): a completion, a task id or a card that
holds terminal escape sequences (OSC 52 clipboard writes, window titles, CSI cursor moves, C1
controls) is shown escaped, readable, by every command that prints it, in a pipe and under a
pseudo-terminal; `--json` escapes what JSON itself leaves raw.

The commands run as a user runs them: `python -m arlecli` in a subprocess.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import tty
from pathlib import Path
from typing import Any

import pytest
import yaml

from arlecli.cli.output import json_text, terminal_text
from arlecli.results import aggregate

from helpers.cli import read_pty

ROOT = Path(__file__).resolve().parents[1]
ARLE = [sys.executable, "-m", "arlecli"]
OSC52 = "\x1b]52;c;SGVsbG8=\x07"  # write "Hello" to the clipboard
TITLE = "\x1b]0;pwned\x1b\\"  # set the window title (ST-terminated)
CURSOR = "\x1b[2J\x1b[H\x1b[3A\x1b[1;31m"  # clear the screen, home, up 3, red
C1 = "\x9b2J\x9d0;c1 title\x9c\x85"  # CSI, OSC and ST as single C1 characters; NEL
OTHERS = "\r\x08\x7f\u2028\u202e"  # carriage return, backspace, DEL, line separator, RTL override
HOSTILE = f"the answer is 42{OSC52}{TITLE}{CURSOR}{C1}{OTHERS} (really)"
SHOWN = [
    r"\x1b]52;c;SGVsbG8=\x07",
    "\\x1b]0;pwned\\x1b\\",
    r"\x1b[2J\x1b[H\x1b[3A\x1b[1;31m",
    r"\x9b2J\x9d0;c1 title\x9c\x85",
    r"\x0d\x08\x7f\u2028\u202e",
]
# Anything a terminal acts on: C0 but \t and \n, DEL, C1, and the separators and bidi controls.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What Rich itself writes to a terminal: colour and style (SGR) sequences, nothing else.
SGR = re.compile("\x1b\\[[0-9;]*m")


def arle(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run([*ARLE, *args], capture_output=True, timeout=300, env=env, cwd=cwd)


def arle_in_a_terminal(*args: str) -> str:
    """stdout and stderr of the CLI run on a pseudo-terminal (raw mode: what the program wrote,
    byte for byte), 400 columns wide."""
    master, slave = pty.openpty()
    tty.setraw(slave)
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 400, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "400"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([*ARLE, *args], stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = read_pty(master, proc)
    assert proc.wait(30) == 0, out.decode(errors="replace")
    return out.decode("utf-8")


def assert_safe(text: str, *, terminal: bool = False) -> None:
    """No character a terminal acts on (under a terminal: none but Rich's own SGR styling)."""
    if terminal:
        text = SGR.sub("", text)
    found = RAW.findall(text)
    assert not found, f"raw control characters reached the terminal: {found!r}"


def squashed(text: str) -> str:
    """`text` without whitespace and table borders: what is left when Rich wraps a long line or
    folds a cell."""
    return re.sub(r"[\s│┃]", "", text)


def sample(tid: str, correct: bool, completion: str) -> dict[str, Any]:
    return {
        "id": f"{tid}#0",
        "task_id": tid,
        "sample": 0,
        "prompt": f"question {tid}",
        "completion": completion,
        "extracted": "1" if correct else f"9{OSC52}",
        "target": "1",
        "reward": float(correct),
        "correct": correct,
        "details": {"accuracy": int(correct)},
        "finish_reason": "stop",
        "num_tokens": 3,
    }


def write_run(run: Path, correct: list[bool], model: str = f"tiny{TITLE}") -> Path:
    """An eval run whose completions, task ids, extracted answers and model name hold HOSTILE text."""
    run.mkdir(parents=True)
    samples = [sample(f"task{k}{CURSOR}", c, HOSTILE) for k, c in enumerate(correct)]
    meta = {
        "command": ["arle", "eval", "gsm8k"],
        "benchmark": "gsm8k",
        "card_version": 1,
        "card_hash": "abc",
        "model": model,
        "engine": "hf",
        "created": "2025-01-02T03:04:05+0000",
        "options": {"split": "test", "limit": None, "num_samples": 1, "temperature": 0.0, "seed": 1234, "data": None},
        "data_hash": None,
    }
    (run / "meta.json").write_text(json.dumps(meta))
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    results = {
        "benchmark": "gsm8k",
        "card_version": 1,
        "model": model,
        "split": "test",
        "num_samples": 1,
        **aggregate(samples, ["accuracy"], 1, None),
    }
    (run / "results.json").write_text(json.dumps(results))
    return run


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    write_run(tmp_path / "runs" / "a", [False, False, True, False])
    write_run(tmp_path / "runs" / "b", [True, False, True, True])
    return tmp_path / "runs"


# ------------------------------------------------------------------ the helper


def test_terminal_text_escapes_what_a_terminal_acts_on_and_keeps_the_rest():
    assert terminal_text(HOSTILE) == "the answer is 42" + "".join(SHOWN) + " (really)"
    kept = "line one\n\tindented, é, 😀, 中文, ∑, \u00a0nbsp, emoji 👩\u200d💻"
    assert terminal_text(kept) == kept
    assert terminal_text("lone \ud800 surrogate") == "lone \\ud800 surrogate"  # stdout could not encode it
    for code in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, 0x202E, 0x2066]:
        shown = terminal_text(chr(code))
        assert shown.startswith("\\") and not RAW.search(shown) and len(shown) in (4, 6), (hex(code), shown)


def test_json_output_escapes_what_json_leaves_raw_and_still_parses_the_same():
    data = {"completion": HOSTILE + "\ud800", "id": f"x{C1}"}
    text = json_text(data, indent=2)
    assert not RAW.search(text) and "\ud800" not in text
    text.encode("utf-8")
    assert json.loads(text) == data


# ------------------------------------------------------------------ the commands


def test_runs_show_in_a_pipe_shows_model_text_escaped(runs):
    out = arle("runs", "show", str(runs / "a"), "--failed", "3")
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode("utf-8")
    assert_safe(text)
    assert_safe(out.stderr.decode("utf-8"))
    flat = squashed(text)
    for shown in SHOWN:  # still readable: every sequence is there, escaped
        assert squashed(shown) in flat, (shown, text)
    assert r"task0\x1b[2J" in flat and r"tiny\x1b]0;pwned" in flat and r"9\x1b]52;c;" in flat


def test_runs_show_on_a_terminal_writes_no_escape_sequence_but_its_own_colours(runs):
    text = arle_in_a_terminal("runs", "show", str(runs / "a"))
    assert_safe(text, terminal=True)
    assert "\x1b]" not in text and "\x07" not in text
    flat = squashed(SGR.sub("", text))
    for shown in SHOWN:
        assert squashed(shown) in flat, (shown, flat)


def test_runs_show_json_has_no_raw_c1_or_separators_and_reads_back(runs):
    out = arle("runs", "show", str(runs / "a"), "--json")
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode("utf-8")
    assert not RAW.search(text)
    data = json.loads(text)
    assert data["failed"][0]["completion"] == HOSTILE and data["meta"]["model"] == f"tiny{TITLE}"


def test_runs_list_and_compare_show_names_and_task_ids_escaped(runs):
    listed = arle("runs", "list", str(runs))
    assert listed.returncode == 0, listed.stderr.decode()
    assert_safe(listed.stdout.decode())
    assert squashed("tiny\\x1b]0;pwned\\x1b\\") in squashed(listed.stdout.decode())
    compared = arle("compare", str(runs / "a"), str(runs / "b"))
    assert compared.returncode == 0, compared.stderr.decode()
    assert_safe(compared.stdout.decode())
    assert_safe(compared.stderr.decode())
    assert r"task0\x1b[2J\x1b[H" in squashed(compared.stdout.decode())  # a flipped task, by its id


def test_runs_list_shows_rich_markup_in_a_model_name_as_text(tmp_path):
    write_run(tmp_path / "runs" / "a", [True], model="[link=https://example.invalid]click me[/link][/bold]")
    listed = arle("runs", "list", str(tmp_path / "runs"))
    assert listed.returncode == 0 and b"Traceback" not in listed.stderr, listed.stderr.decode()
    assert "[link=https://example.invalid]clickme[/link][/bold]" in squashed(listed.stdout.decode())


def test_bench_show_shows_a_cards_text_escaped(tmp_path):
    card = yaml.safe_load((ROOT / "benchmarks" / "countdown.yaml").read_text())
    card["name"] = "hostile_countdown"
    card["description"] = f"Countdown, described by someone {OSC52}{CURSOR}{C1} with [bold]brackets[/bold]"
    card["prompt"]["template"] = "{input}" + TITLE + "\nAnswer."
    card.pop("fixture")
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(card))
    out = arle("bench", "show", str(path))
    assert out.returncode == 0, out.stderr.decode()
    text = out.stdout.decode("utf-8")
    assert_safe(text)
    for shown in (SHOWN[0], SHOWN[2], SHOWN[3], SHOWN[1]):  # description, then the rendered prompt
        assert squashed(shown) in squashed(text), (shown, text)
    assert "[bold]brackets[/bold]" in text


def test_an_error_line_quoting_a_path_shows_it_escaped(tmp_path):
    out = arle("runs", "show", str(tmp_path / f"no{TITLE}such"))
    err = out.stderr.decode("utf-8")
    assert out.returncode == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert_safe(err)
    assert r"no\x1b]0;pwned\x1b\such" in err


def test_eval_progress_and_summary_show_a_card_name_escaped(tmp_path, tiny_model):
    card = yaml.safe_load((ROOT / "benchmarks" / "countdown.yaml").read_text())
    card["name"] = f"count{TITLE}down"
    card.pop("fixture")
    (tmp_path / "card.yaml").write_text(yaml.safe_dump(card))
    out = arle(
        "eval",
        str(tmp_path / "card.yaml"),
        "--model",
        str(tiny_model),
        "--limit",
        "2",
        "--max-tokens",
        "4",
        "--output",
        str(tmp_path / "run"),
    )
    assert out.returncode == 0, out.stderr.decode()
    for stream in (out.stdout.decode("utf-8"), out.stderr.decode("utf-8")):
        assert_safe(stream)
        assert "count\\x1b]0;pwned\\x1b\\down" in stream  # the summary's first line; the progress lines
