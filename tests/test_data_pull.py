"""`arle data pull`: hub splits cached ahead of time, then read without the hub."""

from __future__ import annotations

import datasets
import pytest

from arlecli.cards import parse_card
from arlecli.data.sources import load_rows, pull, pulled_path
from arlecli.errors import UserError

CARD = {
    "name": "qa",
    "category": "qa",
    "reward": "number",
    "source": {
        "kind": "hub",
        "path": "org/qa",
        "config": ["easy", "hard"],
        "splits": {"test": "validation"},
        "params": {"revision": "v1"},
    },
}


def fake_hub(calls: list):
    def load_dataset(path, config, split, **kwargs):
        calls.append((path, config, split, kwargs))
        return datasets.Dataset.from_list([{"question": f"{config} {i}", "answer": str(i)} for i in range(3)])

    return load_dataset


def test_pull_caches_every_config_and_later_loads_skip_the_hub(tmp_path, monkeypatch):
    card = parse_card(CARD, tmp_path / "qa.yaml")
    calls: list = []
    monkeypatch.setattr(datasets, "load_dataset", fake_hub(calls))
    [(split, n_rows, path)] = pull(card)
    assert (split, n_rows) == ("test", 6) and path == pulled_path(card, "validation") and path.is_file()
    assert calls == [
        ("org/qa", "easy", "validation", {"revision": "v1"}),
        ("org/qa", "hard", "validation", {"revision": "v1"}),
    ]

    def offline(*args, **kwargs):
        raise AssertionError("the hub was called after a pull")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    rows = load_rows(card, "test")
    assert [r["config"] for r in rows] == ["easy"] * 3 + ["hard"] * 3
    assert rows[4]["question"] == "hard 1"


def test_unreachable_hub_says_what_to_do(tmp_path, monkeypatch):
    card = parse_card({**CARD, "source": {**CARD["source"], "config": "easy"}}, tmp_path / "qa.yaml")

    def unreachable(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(UserError, match=r"cannot load org/qa/easy split 'validation'.*--rows FILE"):
        load_rows(card, "test")


def test_pull_cli_refuses_offline_cards_politely():
    from typer.testing import CliRunner

    from arlecli.cli import main

    main.register_commands()
    out = CliRunner().invoke(main.app, ["data", "pull", "countdown"], catch_exceptions=False)
    assert out.exit_code == 0 and "countdown: generator data, nothing to pull" in out.output


def test_configs_with_differently_typed_null_columns_still_concatenate(tmp_path, monkeypatch):
    # mmlu-redux: a column that is all null is float64 in one config and string in another.
    def load_dataset(path, config, split, **kwargs):
        value = None if config == "easy" else "fixed"
        features = datasets.Features(
            {"question": datasets.Value("string"), "note": datasets.Value("float64" if config == "easy" else "string")}
        )
        return datasets.Dataset.from_list([{"question": config, "note": value}], features=features)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    card = parse_card(CARD, tmp_path / "qa.yaml")
    rows = load_rows(card, "test")
    assert [(r["question"], r["note"], r["config"]) for r in rows] == [
        ("easy", None, "easy"),
        ("hard", "fixed", "hard"),
    ]


def test_gated_dataset_says_how_to_get_access(tmp_path, monkeypatch):
    card = parse_card(
        {**CARD, "source": {"kind": "hub", "path": "Idavidrein/gpqa", "config": "gpqa_diamond"}}, tmp_path / "gpqa.yaml"
    )

    def gated(*args, **kwargs):
        raise ConnectionError("Dataset 'Idavidrein/gpqa' is a gated dataset on the Hub. You must be authenticated")

    monkeypatch.setattr(datasets, "load_dataset", gated)
    with pytest.raises(
        UserError,
        match=r"gated: accept its terms at https://huggingface.co/datasets/Idavidrein/gpqa, "
        r"run `hf auth login`, or give `arle eval`/`arle train` the rows with --rows FILE",
    ):
        load_rows(card, "test")
