"""IFEval through lm-eval's own checks: strict/loose, prompt/instruction level, no network."""

from __future__ import annotations

import sys

import nltk
import pytest

from arlecli.errors import UserError
from arlecli.rewards import REWARDS
from arlecli.rewards import ifeval as ie
from arlecli.types import Episode, Score, Task, Turn


def run(ids: list[str], kwargs: list[dict], completion: str, prompt: str = "Write something.") -> Score:
    fields = {"prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}
    score = REWARDS["ifeval"]()
    return score(Task("t", prompt, ids, fields), Episode("t", [Turn(prompt, completion)]))


@pytest.fixture
def no_download(monkeypatch):
    """Any NLTK download is a test failure: tests never touch the network."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"nltk.download{args} attempted")

    monkeypatch.setattr(nltk, "download", refuse)


def test_loading_lm_evals_checks_downloads_nothing_and_leaves_no_trace(no_download):
    before = {m for m in sys.modules if m.startswith("lm_eval")}
    modules = ie.lm_eval_ifeval(fresh=True)
    assert "punctuation:no_comma" in modules["instructions_registry"].INSTRUCTION_DICT
    # lm-eval's task manager (datasets, evaluate, sacrebleu...) was not imported, and our
    # private copies are not registered under lm-eval's names.
    assert {m for m in sys.modules if m.startswith("lm_eval")} == before


def test_all_instructions_followed_is_correct(no_download):
    ids = ["punctuation:no_comma", "change_case:english_lowercase"]
    s = run(ids, [{"num_words": None}, {}], "cats sleep in the sun all day and purr at night")
    assert s.correct and s.reward == 1.0
    assert s.details == {
        "prompt_level_strict_acc": 1,
        "prompt_level_loose_acc": 1,
        "inst_level_strict_acc": 1.0,
        "inst_level_loose_acc": 1.0,
        "n_instructions": 2,
    }
    assert s.extracted == [True, True]


def test_one_instruction_broken_fails_the_prompt_but_counts_per_instruction(no_download):
    ids = ["punctuation:no_comma", "change_case:english_lowercase"]
    s = run(ids, [{}, {}], "cats, dogs and birds are all fine pets to keep at home")
    assert not s.correct and s.reward == 0.0
    assert s.details["prompt_level_strict_acc"] == 0
    assert s.details["inst_level_strict_acc"] == 0.5
    assert s.extracted == [False, True]


def test_loose_forgives_a_preamble_line_that_strict_does_not(no_download):
    s = run(["change_case:english_lowercase"], [{}], "Sure!\nhere is my answer written in lowercase letters only")
    assert s.details["prompt_level_strict_acc"] == 0 and not s.correct
    assert s.details["prompt_level_loose_acc"] == 1


def test_kwargs_with_null_keys_as_in_the_hub_rows(no_download):
    kwargs = [{"num_words": 5, "relation": "at least", "keywords": None, "num_bullets": None}]
    assert run(["length_constraints:number_words"], kwargs, "one two three four five six").correct
    assert not run(["length_constraints:number_words"], kwargs, "one two").correct


def test_empty_and_odd_text_score_zero_without_crashing(no_download):
    ids = ["punctuation:no_comma", "startend:quotation"]
    for text in ["", "   ", "\x00\ufffd", "*" * 50]:
        s = run(ids, [{}, {}], text)
        assert not s.correct and s.details["prompt_level_loose_acc"] in (0, 1)
    assert run(ids, [{}, {}], "").details["inst_level_loose_acc"] == 0.0


def test_missing_kwargs_list_and_random_defaults_are_deterministic(no_download):
    # No kwargs at all: lm-eval draws a random threshold; our copies use a reseeded RNG.
    results = {
        run(["length_constraints:number_words"], [], "word " * 40).details["inst_level_strict_acc"] for _ in range(5)
    }
    assert len(results) == 1


def test_language_detection_is_deterministic(no_download):
    text = "das ist ein kurzer satz auf deutsch und nicht auf englisch"
    results = {run(["language:response_language"], [{"language": "de"}], text).correct for _ in range(5)}
    assert results == {True}


def test_unknown_instruction_is_a_user_error(no_download):
    with pytest.raises(UserError, match="not:a_check"):
        run(["not:a_check"], [{}], "anything")


def test_punkt_checks_fail_clearly_offline_when_the_data_is_missing(monkeypatch):
    def missing(*args, **kwargs):
        raise LookupError("punkt_tab")

    monkeypatch.setattr(nltk.data, "find", missing)
    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)  # as if offline
    with pytest.raises(UserError, match="punkt_tab"):
        run(["length_constraints:number_sentences"], [{"num_sentences": 2, "relation": "less than"}], "One. Two.")


@pytest.fixture
def small_punkt(tmp_path, monkeypatch):
    """A punkt_tab model that knows one abbreviation, in a private NLTK data dir: the real
    model is a download, and tests never download (the checks only need its file layout)."""
    model = tmp_path / "tokenizers" / "punkt_tab" / "english"
    model.mkdir(parents=True)
    for name in ("collocations.tab", "sent_starters.txt", "ortho_context.tab"):
        (model / name).write_text("")
    (model / "abbrev_types.txt").write_text("dr\n")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path), *nltk.data.path])
    return model


def test_sentence_count_with_punkt(no_download, small_punkt):
    kwargs = [{"num_sentences": 3, "relation": "less than"}]
    assert run(["length_constraints:number_sentences"], kwargs, "Dr. Smith had one idea. Two ideas.").correct
    assert not run(["length_constraints:number_sentences"], kwargs, "One. Two. Three. Four.").correct
