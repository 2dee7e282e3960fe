"""perf/eval_vs_lmeval.py: its data, its lm-eval task and its sample comparison (no model runs).

The timed comparison itself is `python perf/eval_vs_lmeval.py --quick` (minutes on CPU);
these checks are what the figures rest on: both tools read the same rows, lm-eval's task
is its own gsm8k task on those rows, and a disagreement between the tools is reported.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("eval_vs_lmeval", ROOT / "perf" / "eval_vs_lmeval.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["eval_vs_lmeval"] = mod
    spec.loader.exec_module(mod)
    return mod


perf = _load()


def _inputs(tmp_path: Path):
    rows = perf.make_rows(6, seed=7)
    test = perf.write_jsonl(tmp_path / "test.jsonl", rows)
    train = perf.write_jsonl(tmp_path / "train.jsonl", perf.make_rows(5, seed=11))
    return rows, perf.Inputs(tmp_path, test, train, tmp_path / "model")


def test_rows_are_deterministic_gsm8k_rows() -> None:
    rows = perf.make_rows(40, seed=7)
    assert rows == perf.make_rows(40, seed=7)
    for r in rows:
        assert set(r) == {"question", "answer"}
        gold = r["answer"].split("#### ")[-1]
        assert re.fullmatch(r"-?\d+", gold)
        assert f">>{gold} " in r["answer"]  # the rationale's last step computes the gold number


def test_lmeval_task_is_lmeval_gsm8k_on_local_files(tmp_path: Path) -> None:
    import lm_eval

    _, inp = _inputs(tmp_path)
    setting = perf.Setting("5-shot", 6, 5, 48, 1)
    perf.lmeval_task_yaml(inp, setting, perf.TASK, tmp_path / "tasks", 48)
    ours = yaml.safe_load((tmp_path / "tasks" / f"{perf.TASK}.yaml").read_text())
    theirs = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text())
    for key in ("doc_to_text", "doc_to_target", "metric_list", "filter_list", "output_type"):
        assert ours[key] == theirs[key]
    assert ours["dataset_path"] == "json"
    assert ours["dataset_kwargs"]["data_files"] == {"train": str(inp.train), "test": str(inp.test)}
    assert ours["generation_kwargs"]["until"] == theirs["generation_kwargs"]["until"]
    assert ours["generation_kwargs"]["max_gen_toks"] == 48 and ours["generation_kwargs"]["do_sample"] is False
    assert ours["num_fewshot"] == 5 and "fewshot_config" not in ours  # lm-eval's default sampler, as arle's card


def test_arle_card_copy_keeps_the_prompt_and_reward(tmp_path: Path) -> None:
    _, inp = _inputs(tmp_path)
    card = yaml.safe_load(perf.arle_card(inp).read_text())
    shipped = yaml.safe_load((ROOT / "benchmarks" / "gsm8k.yaml").read_text())
    for key in ("prompt", "reward", "metrics", "fields"):
        assert card[key] == shipped[key]
    assert card["source"]["splits"] == {"test": "test.jsonl", "train": "train.jsonl"}


def test_compare_agrees_on_identical_outputs_and_flags_a_difference() -> None:
    rows = perf.make_rows(3, seed=7)
    texts = [" 2 + 3 = 5\n#### 5", " the answer is 12.", " no number"]
    arle = {
        i: {"text": t, "prompt": f"Question: {r['question']}\nAnswer:"} for i, (t, r) in enumerate(zip(texts, rows))
    }

    def lm_doc(i: int, text: str) -> dict:
        ex = perf.arle_extractions(text, rows[i]["answer"])
        return {"text": text, "question": rows[i]["question"], "prompt": arle[i]["prompt"], **ex}

    same = perf.compare(rows, arle, {i: lm_doc(i, t) for i, t in enumerate(texts)})
    assert same["identical_texts"] == same["identical_prompts"] == 3
    assert same["extraction_or_score_mismatches"] == 0
    assert same["scores"]["arle"] == same["scores"]["lm-eval"]

    changed = {i: lm_doc(i, t) for i, t in enumerate(texts)}
    changed[1] = lm_doc(1, " the answer is 13.")
    diff = perf.compare(rows, arle, changed)
    assert diff["identical_texts"] == 2
    assert diff["extraction_or_score_mismatches"] >= 1
    assert {m["doc"] for m in diff["mismatches"]} == {1}
