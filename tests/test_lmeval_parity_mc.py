"""Loglikelihood scoring of the multiple-choice cards against lm-evaluation-harness 0.4.13, offline.

Each card's fixture rows go through arle (`arle eval --scoring loglikelihood`'s documents) and
through lm-eval's own task config with its dataset swapped for the same rows
(tests/helpers/lmeval_local.py). Asserted: the very same requests (context strings with their few-shot
exemplars, continuations) zero-shot and few-shot (lm-eval's seeded default sampler, with the
document itself left out where lm-eval leaves it out; MMLU's per-subject first 5 dev rows),
and on the tiny model the same per-document acc / acc_norm as lm-eval's own HFLM and
process_results, with loglikelihoods within 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.lmeval_local import lmeval_docs, lmeval_task

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "benchmarks" / "fixtures"

# card -> (lm-eval task, its folder under lm_eval/tasks, lm-eval's eval split)
CARDS = {
    "arc_easy": ("arc_easy", "arc", "test"),
    "arc_challenge": ("arc_challenge", "arc", "test"),
    "hellaswag": ("hellaswag", "hellaswag", "validation"),
    "winogrande": ("winogrande", "winogrande", "validation"),
    "piqa": ("piqa", "piqa", "validation"),
    "boolq": ("boolq", "super_glue/boolq", "validation"),
    "openbookqa": ("openbookqa", "openbookqa", "test"),
    "sciq": ("sciq", "sciq", "test"),
    "commonsense_qa": ("commonsense_qa", "commonsense_qa", "validation"),
    "truthfulqa_mc1": ("truthfulqa_mc1", "truthfulqa", "validation"),
}
# Cards whose loglikelihood scoring deviates from lm-eval's task, with the reason (none do).
DEVIATIONS: dict[str, str] = {}
MMLU_SUBJECTS = ("astronomy", "college_mathematics", "high_school_biology", "high_school_world_history")


def rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def local_card(tmp_path: Path, name: str, splits: dict[str, list[dict[str, Any]]]):
    """The card with its source swapped for local files, one per split (default split kept)."""
    from arlecli.catalog import load_card

    data = yaml.safe_load((ROOT / "benchmarks" / f"{name}.yaml").read_text())
    folder = tmp_path / name
    folder.mkdir()
    for split, split_rows in splits.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in split_rows))
    data["source"] = {
        "kind": "files",
        "path": f"{data['source']['default_split']}.jsonl",
        "splits": {s: f"{s}.jsonl" for s in splits},
        "default_split": data["source"]["default_split"],
    }
    (folder / "card.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return load_card(str(folder / "card.yaml"))


def arle_docs(card: Any, num_fewshot: int | None = None):
    from arlecli.eval import EvalOptions
    from arlecli.loglik import load_docs

    return load_docs(card, EvalOptions(num_fewshot=num_fewshot))


def arle_requests(docs: list[Any]) -> list[list[tuple[str, str]]]:
    return [list(zip(d.contexts, d.continuations)) for d in docs]


def lm_requests(docs: list[Any]) -> list[list[tuple[str, str]]]:
    return [[tuple(r) for r in d.requests] for d in docs]


def test_every_lmeval_mc_card_is_listed():
    """Each card whose loglikelihood block names an lm-eval task is covered here (or listed as deviating)."""
    from arlecli.catalog import load_card

    named = {
        p.stem
        for p in (ROOT / "benchmarks").glob("*.yaml")
        if "loglikelihood:" in p.read_text() and load_card(p.stem).loglikelihood is not None
    }
    assert named == set(CARDS) | {"mmlu"} | set(DEVIATIONS)


@pytest.mark.parametrize("name", sorted(CARDS))
def test_zero_shot_requests_are_lmevals(name, tmp_path):
    task, folder, split = CARDS[name]
    data = rows(name)
    card = local_card(tmp_path, name, {split: data})
    lm = lmeval_docs(task, {split: data, "train": data, "validation": data, "test": data}, folder=folder)
    assert arle_requests(arle_docs(card)) == lm_requests(lm)


@pytest.mark.parametrize("name", sorted(n for n in CARDS if n != "truthfulqa_mc1"))  # lm-eval's: no few-shot split
def test_few_shot_requests_are_lmevals(name, tmp_path):
    """Two exemplars per document from the train split, drawn by lm-eval's Random(1234) sampler
    document after document (the pool holds the documents themselves: the tasks where lm-eval
    leaves the document out of its own exemplars must do so here too)."""
    task, folder, split = CARDS[name]
    data = rows(name)
    # A bigger pool, the documents among it; a second copy of each (an id made unique) too, so
    # lm-eval's redraw when a copy of the document itself was drawn is exercised.
    train = data + [{**r, **({"id": f"{r['id']}-copy"} if "id" in r else {})} for r in data[::-1]]
    card = local_card(tmp_path, name, {split: data, "train": train})
    lm = lmeval_docs(
        task, {split: data, "train": train, "validation": data, "test": data}, folder=folder, num_fewshot=2
    )
    docs = arle_docs(card, num_fewshot=2)
    assert arle_requests(docs) == lm_requests(lm)
    assert all(len(d.fewshot) == 2 for d in docs)


def mmlu_dev() -> list[dict[str, Any]]:
    """Six dev rows per fixture subject in cais/mmlu's schema ("all" sorts dev by subject); the
    sixth must never be shown: lm-eval shows the first five of the subject."""
    out = []
    for subject in sorted(MMLU_SUBJECTS):
        for k in range(6):
            out.append(
                {
                    "question": f" Dev question {k} about {subject.replace('_', ' ')}? ",
                    "subject": subject,
                    "choices": [f"first {k}", f"second {k}", f"third {k}", f"fourth {k}"],
                    "answer": k % 4,
                }
            )
    return out


def test_mmlu_is_lmevals_per_subject_five_shot_from_dev(tmp_path):
    test_rows, dev = rows("mmlu"), mmlu_dev()
    card = local_card(tmp_path, "mmlu", {"test": test_rows, "dev": dev})
    docs = arle_docs(card)  # the card's default: 5-shot
    for doc in docs:
        subject = doc.task.fields["subject"]
        lm = lmeval_docs(
            f"mmlu_{subject}",
            {
                "test": [r for r in test_rows if r["subject"] == subject],
                "dev": [r for r in dev if r["subject"] == subject],
            },
            folder="mmlu/default",
            num_fewshot=5,
        )
        assert list(zip(doc.contexts, doc.continuations)) == [tuple(r) for r in lm[0].requests]
        assert doc.contexts[0].startswith(
            f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        )
        assert "Dev question 5" not in doc.contexts[0] and "Dev question 4" in doc.contexts[0]


# ------------------------------------------------------------------- acc / acc_norm on the tiny model


@pytest.fixture(scope="module")
def engines(tiny_model):
    """arle's hf engine and lm-eval's HFLM on the same tiny model."""
    import torch
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlecli.engine.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=4, device="cpu")
    arle = HFEngine(str(tiny_model), batch_size=4, device="cpu")
    yield arle, lm
    arle.close()


def lmeval_results(task_obj: Any, lm: Any, docs: list[Any]) -> list[dict[str, Any]]:
    """lm-eval's own loglikelihoods and process_results for each document."""
    from lm_eval.api.instance import Instance

    out = []
    for d in docs:
        insts = [
            Instance(request_type="loglikelihood", doc=d.doc, arguments=r, idx=k) for k, r in enumerate(d.requests)
        ]
        lls = lm.loglikelihood(insts, disable_tqdm=True)
        metrics = task_obj.process_results(d.doc, lls)
        out.append({"lls": [ll for ll, _ in lls], **metrics})
    return out


@pytest.mark.parametrize("name", sorted(CARDS) + ["mmlu"])
def test_acc_and_acc_norm_are_lmevals_on_the_tiny_model(name, engines, tmp_path):
    from arlecli.eval import EvalOptions
    from arlecli.loglik import run_loglikelihood

    arle, lm = engines
    if name == "mmlu":
        subject = "astronomy"
        test_rows = [r for r in rows("mmlu") if r["subject"] == subject]
        splits = {"test": test_rows, "dev": [r for r in mmlu_dev() if r["subject"] == subject]}
        card = local_card(tmp_path, name, splits)
        task, folder, split = f"mmlu_{subject}", "mmlu/default", "test"
        lm_splits, fewshot = splits, 5
    else:
        task, folder, split = CARDS[name]
        data = rows(name)
        card = local_card(tmp_path, name, {split: data})
        lm_splits, fewshot = {split: data, "train": data, "validation": data, "test": data}, 0
    lm_docs = lmeval_docs(task, lm_splits, folder=folder, num_fewshot=fewshot)
    want = lmeval_results(lmeval_task(task, lm_splits, folder=folder, num_fewshot=fewshot), lm, lm_docs)
    results = run_loglikelihood(card, arle, EvalOptions(), model="tiny", run_dir=tmp_path / "run")
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    by_id = {s["task_id"]: s for s in samples}
    docs = arle_docs(card)
    assert len(docs) == len(want) == len(samples)
    for doc, expected in zip(docs, want):
        got = by_id[doc.task.id]["details"]
        assert got["loglikelihoods"] == pytest.approx(expected["lls"], abs=1e-4)
        for metric in card.loglikelihood.metrics:
            assert got[metric] == expected[metric], (doc.task.id, metric)
    for metric in card.loglikelihood.metrics:
        mean = sum(w[metric] for w in want) / len(want)
        assert results["metrics"][metric]["value"] == pytest.approx(mean)
