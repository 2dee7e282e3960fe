"""Run directories from tests: a finished eval run written by hand, its rows read back,
`arle data from-eval` in this process, and the prompt ids the hf engine generated from."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

SEED = 1234  # EvalOptions' default seed: turn t of sample k of task i is sampled with sample_seed(...) + t


def from_eval(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `arle data from-eval ARGS` through the console script's entry point, in this process;
    (exit code, stdout, stderr)."""
    import arlecli.cli.main as main

    monkeypatch.setattr(sys, "argv", ["arle", "data", "from-eval", *args])
    with pytest.raises(SystemExit) as exit_:
        main.main()
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of `path`."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def capture_prompt_ids(monkeypatch) -> dict[int, tuple[list[int], list[int]]]:
    """Record, by each request's seed, the prompt ids the hf engine generated from and the ids it
    generated: what the model saw, straight from the engine (samples.jsonl keeps no ids)."""
    from arlecli.engine.hf import HFEngine

    seen: dict[int, tuple[list[int], list[int]]] = {}
    generate = HFEngine.generate

    def recording(self, requests):
        requests = list(requests)
        for i, comp in generate(self, requests):
            seen[requests[i].params.seed] = (list(comp.prompt_token_ids), list(comp.token_ids))
            yield i, comp

    monkeypatch.setattr(HFEngine, "generate", recording)
    return seen


def write_run(folder: Path, samples: list[dict[str, Any]], benchmark: str = "toy", model: str = "m") -> Path:
    """A finished eval run directory holding `samples`."""
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"benchmark": benchmark, "model": model, "options": {}}))
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (folder / "results.json").write_text(json.dumps({"benchmark": benchmark, "metrics": {}, "n_samples": len(samples)}))
    return folder
