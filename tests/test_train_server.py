"""`arle train --vllm-server URL`: TRL's server mode (multi-node rollouts on `trl vllm-serve`).

The server side needs CUDA and NCCL, so on a CPU these tests check what arle builds: the
trainer config TRL gets, the engine that turns arle's requests into VLLMClient calls (against
a fake client: prompt ids, stop strings, seeds, budgets, finish reasons), that episodes made
through it are the collector's, and the one-line refusals.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers.train import ARLE

ROOT = Path(__file__).resolve().parents[1]


class FakeVLLMClient:
    """TRL's VLLMClient.generate, answering every prompt with the ids of `reply`."""

    def __init__(self, tokenizer, reply: str) -> None:
        self.tokenizer, self.reply, self.calls = tokenizer, reply, []

    def generate(
        self, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=16, logprobs=0, generation_kwargs=None, **_
    ):
        self.calls.append(
            {
                "prompts": prompts,
                "temperature": temperature,
                "top_p": top_p,
                "max_tokens": max_tokens,
                "logprobs": logprobs,
                **(generation_kwargs or {}),
            }
        )
        ids = self.tokenizer(self.reply, add_special_tokens=False)["input_ids"][:max_tokens]
        return {
            "prompt_ids": prompts,
            "completion_ids": [ids],
            "logprobs": [[[-0.5]] * len(ids)],
            "logprob_token_ids": [[[i] for i in ids]],
        }


def test_trainer_config_is_trls_server_mode():
    from arlecli.train.config import resolve
    from arlecli.train.grpo import trainer_args

    for algo in ("grpo", "rloo"):
        cfg = resolve({}, {"benchmark": "gsm8k", "algo": algo, "vllm_server": "http://node7:8000/"}, {})
        args = trainer_args(cfg, Path("/tmp/unused-run"), 64)
        assert args.use_vllm and args.vllm_mode == "server" and args.vllm_server_base_url == "http://node7:8000"


def test_the_server_engine_produces_the_collectors_episodes(tiny_model):
    """Through the server engine, a gsm8k-format card's episodes carry the prompt ids arle
    encodes, the card's stop strings and budget, each sample's seed, and the text cut at the stop."""
    from transformers import AutoTokenizer

    from arlecli.catalog import resolve_references
    from arlecli.engine.trl_server import TRLServerEngine
    from arlecli.engine.tokens import encode_request
    from arlecli.envs.episodes import Sampling, collect
    from arlecli.catalog import load_card
    from arlecli.types import Task

    card = load_card("gsm8k")
    resolve_references(card)
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    client = FakeVLLMClient(tok, " 42 #### 42\n\nQuestion: and now?")
    engine = TRLServerEngine(client, tok)
    tasks = [Task("a", "What is 40 plus 2?", "#### 42"), Task("b", "What is 1 plus 1?", "#### 2")]
    sampling = Sampling(temperature=0.7, max_tokens=40, seed=5, logprobs=True)
    episodes = dict(collect(card, engine, tasks, [], [(0, 0), (1, 0), (1, 1)], sampling))
    assert len(episodes) == 3 and len(client.calls) == 3
    for j, (_i, _k) in enumerate([(0, 0), (1, 0), (1, 1)]):
        turn = episodes[j].turns[0]
        assert turn.completion == " 42 #### 42\n\n" and turn.finish_reason == "stop"
        from arlecli.engine.base import GenerationRequest

        assert turn.prompt_token_ids == encode_request(tok, GenerationRequest(prompt=episodes[j].turns[0].prompt))
        assert turn.logprobs == [-0.5] * len(turn.token_ids)
    seeds = sorted(c["seed"] for c in client.calls)
    assert seeds == sorted(sampling.params(card, tasks[i].id, k).seed for i, k in [(0, 0), (1, 0), (1, 1)])
    assert all(
        c["stop"] == card.prompt.stop and c["max_tokens"] == 40 and c["temperature"] == 0.7 for c in client.calls
    )
    # A reply that fills the budget without a stop is cut by length.
    client.reply = " 1 2 3 4 5 6 7 8 9"
    ((_, episode),) = collect(card, engine, tasks, [], [(0, 0)], Sampling(temperature=0.0, max_tokens=3))
    assert episode.turns[0].finish_reason == "length" and "seed" not in client.calls[-1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algo", "ppo", "--vllm-server", "http://node7:8000"], "--vllm-server is TRL's server mode"),
        (["--vllm-server", "node7:8000"], "give the server's URL"),
    ],
)
def test_bad_server_settings_are_one_line(args, message, tmp_path):
    out = subprocess.run(
        [*ARLE, "train", "gsm8k", *args, "--output", str(tmp_path / "run")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "run").exists()
