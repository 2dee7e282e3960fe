"""lm-evaluation-harness and arle's own loglikelihood scoring through `arle serve` (issue 25).

lm-eval 0.4.13's `local-completions` model with its defaults (token-id prompts; loglikelihood
as `echo` + `logprobs: 1` + `max_tokens: 1`; its tokenizer from the tiny model's folder) runs a
generate task (gsm8k) and a loglikelihood task (arc_easy) end to end through `simple_evaluate`
against the server, on fixture rows (lm-eval's own task YAML with its dataset swapped through
its `custom_dataset` hook, as tests/helpers/lmeval_local.py does, minus the code_eval stub whose
`evaluate` import costs seconds; nothing touches the hub). Its answers equal the engine run in
this process: the same greedy texts, the same loglikelihoods (1e-4) and is_greedy. And arle's
`--scoring loglikelihood` through the server (the openai engine, text prompts) scores as the hf
engine in process does.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from arlecli.engine.base import GenerationRequest, LoglikRequest, SamplingParams, cut_at_stop
from arlecli.serve.app import create_app
from arlecli.serve.server import BackgroundServer

pytest.importorskip("tenacity", reason="lm-eval's API models need lm-eval[api] (the dev extra has it)")

FIXTURES = Path(__file__).resolve().parent.parent / "benchmarks" / "fixtures"
MAX_GEN_TOKS = 32


def rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def lmeval_task(yaml_path: str, splits: dict[str, list[dict[str, Any]]]) -> Any:
    """lm-eval's task from its installed YAML (lm_eval/tasks/<yaml_path>), reading `splits`, 0-shot."""
    import datasets
    import lm_eval.tasks
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    cfg = load_yaml(str(Path(lm_eval.tasks.__file__).parent / yaml_path), resolve_func=True)
    for key in ("tag", "group"):
        cfg.pop(key, None)
    data = datasets.DatasetDict({name: datasets.Dataset.from_list(r) for name, r in splits.items()})
    cfg["custom_dataset"] = lambda **_: data
    task = ConfigurableTask(config=cfg)
    task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=1234)
    return task


@pytest.fixture(scope="module")
def served(tiny_model):
    from arlecli.engine.hf import HFEngine

    engine = HFEngine(str(tiny_model), batch_size=8)
    with BackgroundServer(create_app(engine, model_name="tiny")) as srv:
        yield SimpleNamespace(engine=engine, url=srv.base_url, model=tiny_model)
    engine.close()


def test_lmeval_local_completions_with_its_defaults_generates_and_scores(served):
    import lm_eval
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    lm = LocalCompletionsAPI(
        base_url=served.url + "/completions",
        model="tiny",
        tokenizer_backend="huggingface",
        tokenizer=str(served.model),
        max_gen_toks=MAX_GEN_TOKS,
    )
    gsm8k = lmeval_task("gsm8k/gsm8k.yaml", {"train": rows("gsm8k"), "test": rows("gsm8k")})
    arc = rows("arc_easy")
    arc_easy = lmeval_task("arc/arc_easy.yaml", {"train": arc, "validation": arc, "test": arc})
    # An empty task index: the tasks are given as objects (the default indexes all ~14k YAMLs, 80 s here).
    out = lm_eval.simple_evaluate(
        model=lm, tasks=[gsm8k, arc_easy], limit=3, log_samples=True, task_manager=TaskManager(include_defaults=False)
    )
    assert out["results"]["gsm8k"]["sample_len"] == out["results"]["arc_easy"]["sample_len"] == 3

    engine = served.engine
    for sample in out["samples"]["gsm8k"]:
        [(context, kwargs)] = sample["arguments"]
        ids = lm.tok_encode(context)
        params = SamplingParams(max_tokens=MAX_GEN_TOKS, stop=list(kwargs["until"]))
        [(_, own)] = list(engine.generate([GenerationRequest(prompt=context, prompt_token_ids=ids, params=params)]))
        assert sample["resps"] == [[cut_at_stop(own.text, kwargs["until"])]]
    pairs = [tuple(args) for sample in out["samples"]["arc_easy"] for args in sample["arguments"]]
    got = [resp[0] for sample in out["samples"]["arc_easy"] for resp in sample["resps"]]
    want = [ll for _, ll in sorted(engine.loglikelihood([LoglikRequest(c, x) for c, x in pairs]))]
    assert [g[0] for g in got] == pytest.approx([w.logprob for w in want], abs=1e-4)
    assert [g[1] for g in got] == [w.greedy for w in want]


def test_arle_loglikelihood_scoring_through_serve_equals_hf_in_process(served, tmp_path):
    from arlecli.engine.openai import OpenAIEngine
    from arlecli.eval import EvalOptions
    from arlecli.loglik import run_loglikelihood
    from arlecli.catalog import load_card

    card = load_card("arc_easy")
    opts = EvalOptions(limit=4, num_fewshot=0, data=str(FIXTURES / "arc_easy.jsonl"))

    def scores(engine: Any, name: str) -> list[dict[str, Any]]:
        run_loglikelihood(card, engine, opts, model="tiny", run_dir=tmp_path / name)
        lines = (tmp_path / name / "samples.jsonl").read_text().splitlines()
        return sorted((json.loads(line) for line in lines), key=lambda s: s["task_id"])

    with OpenAIEngine(served.url, model="tiny") as remote:
        through_serve = scores(remote, "served")
    in_process = scores(served.engine, "hf")
    assert [s["task_id"] for s in through_serve] == [s["task_id"] for s in in_process] and len(in_process) == 4
    for a, b in zip(through_serve, in_process):
        assert a["details"]["loglikelihoods"] == pytest.approx(b["details"]["loglikelihoods"], abs=1e-4)
        assert a["details"]["greedy"] == b["details"]["greedy"]
        assert (a["details"]["acc"], a["details"]["acc_norm"]) == (b["details"]["acc"], b["details"]["acc_norm"])
