"""`arle eval --scoring loglikelihood`: the eval end to end, resume, the engines agreeing, and
endpoints that cannot score prompts refused in one line. (Parity with lm-eval itself:
test_lmeval_parity_mc.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import arle
from helpers.fake_openai import FakeOpenAIServer

FIXTURES = Path(__file__).resolve().parent.parent / "benchmarks" / "fixtures"


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def samples(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def test_eval_reports_acc_and_acc_norm_with_stderr_and_resumes(tiny_model, tmp_path):
    run = tmp_path / "run"
    args = [
        "eval",
        "hellaswag",
        "--model",
        str(tiny_model),
        "--data",
        str(FIXTURES / "hellaswag.jsonl"),
        "--scoring",
        "loglikelihood",
        "--output",
        str(run),
        "--json",
    ]
    first = arle(*args)
    assert first.returncode == 0, first.stderr
    results = json.loads(first.stdout)
    assert results["scoring"] == "loglikelihood" and results["lm_eval_task"] == "hellaswag"
    for metric in ("acc", "acc_norm"):
        assert set(results["metrics"][metric]) == {"value", "stderr", "n"} and results["metrics"][metric]["n"] == 3
    lines = samples(run)
    assert len(lines) == 3
    for s in lines:
        lls = s["details"]["loglikelihoods"]
        assert len(lls) == 4 and all(ll < 0 for ll in lls)
        assert s["extracted"] == max(range(4), key=lambda i: lls[i])  # the predicted index
        assert s["details"]["acc"] == float(s["extracted"] == s["target"])
        assert s["details"]["acc_norm"] in (0.0, 1.0)
    # Interrupted after the first document: the rerun scores only the other two, same results.
    (run / "samples.jsonl").write_text(json.dumps(lines[0]) + "\n")
    (run / "results.json").unlink()
    again = arle(*args, "--resume")
    assert again.returncode == 0, again.stderr
    assert "resuming: 1/3" in again.stderr
    redone = samples(run)
    assert redone[0] == lines[0] and len(redone) == 3
    by_id = {s["id"]: s["details"]["loglikelihoods"] for s in lines}
    for s in redone[1:]:
        assert s["details"]["loglikelihoods"] == pytest.approx(by_id[s["id"]], abs=1e-5)
    assert json.loads(again.stdout)["metrics"] == results["metrics"]
    # The run reads like any other in the run tools.
    for cmd in (["runs", "show", str(run)], ["report", str(run), "--output", str(tmp_path / "r.html")]):
        proc = arle(*cmd)
        assert proc.returncode == 0, proc.stderr
    # Generative scoring cannot resume it (its samples would be mixed in).
    gen = arle(
        "eval",
        "hellaswag",
        "--model",
        str(tiny_model),
        "--data",
        str(FIXTURES / "hellaswag.jsonl"),
        "--output",
        str(run),
        "--resume",
    )
    assert "scoring" in one_error_line(gen)


def test_a_card_without_a_loglikelihood_block_is_refused_in_one_line(tiny_model):
    proc = arle(
        "eval",
        "gsm8k",
        "--model",
        str(tiny_model),
        "--data",
        str(FIXTURES / "gsm8k.jsonl"),
        "--scoring",
        "loglikelihood",
    )
    line = one_error_line(proc)
    assert "gsm8k" in line and "--scoring generate" in line
    bad = arle("eval", "arc_easy", "--model", str(tiny_model), "--scoring", "logprobs")
    assert "loglikelihood" in one_error_line(bad)


def test_the_metrics_are_lmevals_definitions():
    """acc: the largest loglikelihood; acc_norm: per character of the choice (not per token or
    byte: lm-eval's acc_bytes is that); ties go to the first choice, as numpy's argmax."""
    from arlecli.loglik import mc_metrics

    # "é" is one character but two bytes: the three normalisations pick three different choices.
    m = mc_metrics([-2.0, -9.0, -4.5], [" a", " bcdefghij", " éé"], gold=1)
    assert (m["pred"], m["pred_norm"]) == (0, 1) and (m["acc"], m["acc_norm"]) == (0.0, 1.0)
    assert mc_metrics([-2.0, -9.0, -4.5], [" a", " bcdefghij", " éé"], gold=2)["acc_bytes"] == 0.0
    assert mc_metrics([-3.0, -3.0], ["x", "y"], gold=1)["acc"] == 0.0
    assert mc_metrics([-1.0, -3.0], ["x", "y"], gold=[0, 1])["acc"] == 1.0


# ---------------------------------------------------------------- the engines agree


def tiny_echo(model_dir: Path):
    """What vLLM's server echoes for a prompt, computed on the tiny model: each prompt token's
    text, offset and logprob (the first has none)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def score(prompt: str) -> list[tuple[str, int, float | None]]:
        enc = tok(prompt, return_offsets_mapping=True)
        ids = enc["input_ids"]
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        out: list[tuple[str, int, float | None]] = []
        for i, (start, end) in enumerate(enc["offset_mapping"]):
            out.append((prompt[start:end], start, None if i == 0 else float(logprobs[i - 1, ids[i]])))
        return out

    return score


def requests() -> list[Any]:
    from arlecli.engine.base import LoglikRequest

    return [
        LoglikRequest("Question: Which planet is known as the Red Planet?\nAnswer:", " Mars"),
        LoglikRequest("Question: Which planet is known as the Red Planet?\nAnswer:", " Jupiter and Saturn"),
        LoglikRequest("The trophy would not fit in the suitcase because the trophy", " was too big."),
        LoglikRequest("Answer: ", "B"),
    ]  # the context's trailing space belongs to the continuation


def test_hf_and_an_echoing_endpoint_give_the_same_loglikelihoods(tiny_model):
    from arlecli.engine.hf import HFEngine
    from arlecli.engine.openai import OpenAIEngine

    reqs = requests()
    hf = HFEngine(str(tiny_model), batch_size=2, device="cpu")
    try:
        local = dict(hf.loglikelihood(reqs))
    finally:
        hf.close()
    with FakeOpenAIServer(lambda body: "x", echo_logprobs=tiny_echo(tiny_model)) as srv:
        with OpenAIEngine(srv.base_url, srv.model) as engine:
            remote = dict(engine.loglikelihood(reqs))
        body = srv.bodies("/completions")[0]
    assert body["echo"] is True and body["logprobs"] == 1 and body["max_tokens"] == 1
    for i in range(len(reqs)):
        assert remote[i].logprob == pytest.approx(local[i].logprob, abs=1e-4)
        assert remote[i].num_tokens == local[i].num_tokens


def test_an_endpoint_without_prompt_logprobs_exits_2_in_one_line(tmp_path):
    data = FIXTURES / "arc_easy.jsonl"
    with FakeOpenAIServer(lambda body: " B") as srv:  # ignores `echo`, like servers that cannot score prompts
        proc = arle(
            "eval",
            "arc_easy",
            "--base-url",
            srv.base_url,
            "--model",
            srv.model,
            "--data",
            str(data),
            "--scoring",
            "loglikelihood",
            "--output",
            str(tmp_path / "run"),
        )
    line = one_error_line(proc)
    assert "prompt's logprobs" in line and "--scoring generate" in line
    with FakeOpenAIServer(lambda body: " B", fail_first=100, fail_status=400) as srv:  # refuses the request
        proc = arle(
            "eval",
            "arc_easy",
            "--base-url",
            srv.base_url,
            "--model",
            srv.model,
            "--data",
            str(data),
            "--scoring",
            "loglikelihood",
            "--output",
            str(tmp_path / "run2"),
        )
    line = one_error_line(proc)
    assert "HTTP 400" in line and "echoes prompt logprobs" in line


@pytest.mark.slow
def test_vllm_gives_close_loglikelihoods(tiny_model, vllm_environment):
    from arlecli.engine import vllm

    if not vllm.vllm_available():
        pytest.skip("vLLM is not installed")
    from arlecli.engine.hf import HFEngine
    from arlecli.engine.vllm import VLLMEngine

    reqs = requests()
    hf = HFEngine(str(tiny_model), batch_size=4, device="cpu")
    try:
        local = dict(hf.loglikelihood(reqs))
    finally:
        hf.close()
    engine = VLLMEngine(str(tiny_model), max_model_len=512)
    try:
        got = dict(engine.loglikelihood(reqs))
    finally:
        engine.close()
    for i in range(len(reqs)):
        assert got[i].logprob == pytest.approx(local[i].logprob, abs=1e-3)
        assert got[i].num_tokens == local[i].num_tokens


def test_a_card_defaulting_to_loglikelihood_evaluates_so_and_refuses_training(tiny_model, tmp_path):
    import yaml

    data = yaml.safe_load((FIXTURES.parent / "arc_easy.yaml").read_text())
    data["loglikelihood"]["default"] = True
    data["fixture"] = str(FIXTURES / "arc_easy.jsonl")
    card = tmp_path / "arc_ll.yaml"
    card.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = arle(
        "eval",
        str(card),
        "--model",
        str(tiny_model),
        "--data",
        str(FIXTURES / "arc_easy.jsonl"),
        "--output",
        str(tmp_path / "run"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert {"acc", "acc_norm"} <= set(json.loads(proc.stdout)["metrics"])
    line = one_error_line(arle("train", str(card), "--model", str(tiny_model), "--max-steps", "1"))
    assert "loglikelihood" in line and "arc_easy" in line
