"""An 80-column terminal (issue 25, item 4): `arle runs list`, `arle compare`, `arle eval`'s
summary and `--help` print no cut number, no word broken across lines, no line over 80
columns and no type tokens (`<str>`, `<int range>`, `[x>=1]`, `{bench}`), in a pipe with
COLUMNS=80 and on an 80-column pseudo-terminal. Wide tables wrap by whole fields with short
headers; a bad option value is arle's one `error:` line.

The runs are real `arle eval` runs against a fake OpenAI-compatible endpoint (a few seconds).
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
from pathlib import Path
from typing import Iterator

import pytest

from helpers.cli import read_pty
from helpers.fake_openai import FakeOpenAIServer

ARLE = [sys.executable, "-m", "arlecli"]
WIDTH = 80
# Long names that must stay whole: a hub-style model name and run folders named like arle's own.
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
RUN_A, RUN_B = "runs/gsm8k-SmolLM2-135M-Instruct-20261202-030405", "runs/gsm8k-SmolLM2-135M-Instruct-20261202-040506"
ROWS = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(12)]
# Styling Rich writes on a terminal, and the cursor/erase sequences of a live display.
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TYPE_TOKENS = re.compile(
    r"<(?:str|int|float|bool|path|text|list\[\w+\])(?: range)?>|\[x[<>]=|\{[a-z_]+\}|"
    r"\b(?:TEXT|INTEGER|FLOAT|BOOLEAN|PATH)\b"
)


@pytest.fixture(autouse=True)
def fresh_consoles() -> Iterator[None]:
    """The consoles are made once per process (output.console is cached): one made at 80
    columns here must not be what the next test file in this worker prints with."""
    from arlecli.cli import output

    output.console.cache_clear()
    output.err_console.cache_clear()
    yield
    output.console.cache_clear()
    output.err_console.cache_clear()


def env80() -> dict[str, str]:
    return {**os.environ, "COLUMNS": str(WIDTH), "LINES": "50"}


def arle(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI in a pipe (no terminal), told the terminal is 80 columns wide."""
    return subprocess.run([*ARLE, *args], capture_output=True, text=True, timeout=300, env=env80(), cwd=cwd)


def arle_on_a_terminal(*args: str, cwd: Path) -> str:
    """stdout of the CLI on an 80x50 pseudo-terminal (stderr, where progress goes, on a pipe)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, WIDTH, 0, 0))
    env = {**env80(), "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [*ARLE, *args], stdin=slave, stdout=slave, stderr=subprocess.PIPE, env=env, cwd=cwd, close_fds=True
    )
    os.close(slave)
    out = read_pty(master, proc)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert proc.wait(30) == 0, out.decode(errors="replace") + stderr
    return CSI.sub("", out.decode()).replace("\r\n", "\n")


def assert_fits(text: str, *whole: str) -> None:
    """No line over 80 columns, nothing cut with `…`, no type token, no number ending one line
    and going on at the start of the next, and each of `whole` on one line, unbroken."""
    from rich.cells import cell_len

    lines = text.splitlines()
    assert lines, "nothing printed"
    too_long = [line for line in lines if cell_len(line) > WIDTH]
    assert not too_long, "lines over 80 columns:\n" + "\n".join(too_long)
    assert "…" not in text, text
    assert not TYPE_TOKENS.search(text), TYPE_TOKENS.search(text)
    for line, after in zip(lines, lines[1:]):
        end, start = line.rstrip(" │┃"), after.lstrip(" │┃")
        assert not (re.search(r"[\d.]$", end) and re.match(r"[\d.%]", start)), f"a number split:\n{line}\n{after}"
    for piece in whole:
        assert any(piece in line for line in lines), f"{piece!r} is not whole on one line:\n{text}"


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Iterator[tuple[Path, str, str]]:
    """A folder holding two real gsm8k runs (A: 6 of 12 right, B: 9 of 12), made by `arle eval`
    on a fake endpoint, A in a pipe and B on a terminal; yields it with both summaries."""
    root = tmp_path_factory.mktemp("columns")
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))

    def answer(right: int):
        def respond(body: dict) -> str:
            question = json.dumps(body)
            n = next(i for i in range(len(ROWS) - 1, -1, -1) if f"What is {i} plus" in question)
            return f"The answer is #### {n + 1}" if n < right else "#### 0"

        return respond

    def args(srv: FakeOpenAIServer, run: str) -> list[str]:
        return [
            "eval",
            "gsm8k",
            "--base-url",
            srv.base_url,
            "--model",
            MODEL,
            "--num-fewshot",
            "0",
            "--rows",
            "rows.jsonl",
            "--price-input",
            "0.15",
            "--price-output",
            "0.6",
            "-o",
            run,
        ]

    with FakeOpenAIServer(answer(6), model=MODEL) as srv:
        out = arle(*args(srv, RUN_A), cwd=root)
    assert out.returncode == 0, out.stderr
    with FakeOpenAIServer(answer(9), model=MODEL) as srv:
        on_a_terminal = arle_on_a_terminal(*args(srv, RUN_B), cwd=root)
    yield root, out.stdout, on_a_terminal


def test_eval_summary_fits_80_columns(project) -> None:
    root, summary, on_a_terminal = project
    for run, text in ((RUN_A, summary), (RUN_B, on_a_terminal)):
        acc = json.loads((root / run / "results.json").read_text())["metrics"]["accuracy"]
        assert_fits(text, f"{acc['value']:.4f}", f"{acc['stderr']:.4f}", MODEL, f"run directory: {run}", "cost:")


def test_runs_list_fits_80_columns_by_whole_fields(project) -> None:
    root, _, _ = project
    out = arle("runs", "list", "runs", cwd=root)
    assert out.returncode == 0, out.stderr
    # Wrapped as records: each run's name, then its fields, never a cell folded into 4-8 lines.
    assert_fits(out.stdout, RUN_A, RUN_B, MODEL, "0.500 ± 0.151", "0.750 ± 0.131", "12/12")
    on_a_terminal = arle_on_a_terminal("runs", "list", "runs", cwd=root)
    assert_fits(on_a_terminal, RUN_A, RUN_B, MODEL, "0.500 ± 0.151", "0.750 ± 0.131")


def test_compare_fits_80_columns_without_cutting_numbers(project) -> None:
    root, _, _ = project
    out = arle("compare", RUN_A, RUN_B, cwd=root)
    assert out.returncode == 0, out.stderr
    pieces = ("+0.2500", "0.5000", "0.7500", "3/0/9", RUN_A, RUN_B)
    assert_fits(out.stdout, *pieces)
    assert_fits(arle_on_a_terminal("compare", RUN_A, RUN_B, cwd=root), *pieces)


COMMANDS = [
    "",
    "eval",
    "train",
    "serve",
    "compare",
    "report",
    "runs",
    "runs list",
    "runs show",
    "bench",
    "bench list",
    "bench show",
    "model",
    "model setup",
    "model list",
    "model show",
    "model remove",
    "model default",
    "data",
    "data from-eval",
]


def test_help_fits_80_columns_without_type_tokens(monkeypatch, capsys) -> None:
    # In-process (one subprocess per command would take a second each): the console script's main().
    from arlecli.cli import main as cli

    monkeypatch.setenv("COLUMNS", str(WIDTH))
    cli.register_commands()
    root = cli.typer.main.get_command(cli.app)
    for command in COMMANDS:
        monkeypatch.setattr(sys, "argv", ["arle", *command.split(), "--help"])
        with pytest.raises(SystemExit) as done:
            cli.main()
        assert done.value.code == 0, command
        text = capsys.readouterr().out
        node = root
        for part in command.split():
            node = node.commands[part]  # type: ignore[attr-defined]
        options = [o for p in node.params for o in p.opts if o.startswith("--")]
        assert_fits(text, *options)
        usage = next(line for line in text.splitlines() if "Usage:" in line)
        assert "<" not in usage and "{" not in usage, usage


def test_help_on_an_80_column_terminal(tmp_path) -> None:
    text = arle_on_a_terminal("eval", "--help", cwd=tmp_path)
    assert_fits(text, "--max-thinking-tokens", "SmolLM2-135M-Instruct.", "BENCH-MODEL-TIMESTAMP).")
    assert "Usage: arle eval [OPTIONS] BENCH" in text


def test_a_bad_option_value_is_one_error_line(monkeypatch, capsys) -> None:
    from arlecli.cli import main as cli

    for args, needle in (
        (["eval", "gsm8k", "--limit", "0"], "--limit"),
        (["eval", "gsm8k", "--bogus"], "--bogus"),
        (["eval"], "BENCH"),
    ):
        monkeypatch.setattr(sys, "argv", ["arle", *args])
        with pytest.raises(SystemExit) as done:
            cli.main()
        out = capsys.readouterr()
        lines = out.err.strip().splitlines()
        assert done.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.err
        assert needle in lines[0] and "arle eval --help" in lines[0] and not out.out, out.err


def test_bench_list_fits_80_columns(monkeypatch, capsys) -> None:
    from arlecli.cli import main as cli
    from arlecli.cli import output

    monkeypatch.setenv("COLUMNS", str(WIDTH))
    monkeypatch.setattr(sys, "argv", ["arle", "bench", "list"])
    output.console.cache_clear()  # a console made earlier in this process has another width
    try:
        with pytest.raises(SystemExit) as done:
            cli.main()
    finally:
        output.console.cache_clear()
    assert done.value.code == 0
    # MMLU's 57 subjects as a count, not one unbreakable cell; every card on its own record.
    assert_fits(capsys.readouterr().out, "gsm8k:", "hub:cais/mmlu [all]", "mmlu_redux:", "57 configs")
