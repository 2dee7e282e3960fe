"""Training algorithms are plugins: a user's algorithm from a file registers and trains a step
on the tiny model through the run arle's own algorithms get (run directory, rollouts, reward,
metrics, final/); a misspelt --algo is one line naming the near ones; and `run_train` from
Python refuses what `arle train` refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

TOY = '''
from dataclasses import dataclass

from arlecli.errors import UserError
from arlecli.train.algorithm import register_algorithm


@dataclass
class ToyConfig:
    """The toy's settings."""

    max_steps: int = 1                # optimizer steps
    learning_rate: float = 1e-2       # plain SGD's step
    max_completion_length: int = 8    # tokens per model turn
    num_generations: int = 2          # episodes per task


def check(cfg, card, run_dir):
    if cfg.trainer["learning_rate"] <= 0:
        raise UserError("toy: learning_rate must be > 0")
    return {"checked": True}


@register_algorithm("toy", settings=lambda: (ToyConfig,), check=check)
def toy(ctx):
    """REINFORCE in a few lines: sample each task's episodes, score them, one SGD step on
    -reward * logprob of the model's own tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arlecli.train.batches import flatten_episode

    assert ctx.prepared == {"checked": True} and ctx.rollouts is not None and ctx.reward is not None
    settings = ToyConfig(**{k: v for k, v in ctx.cfg.trainer.items() if k in ToyConfig.__dataclass_fields__})
    model = AutoModelForCausalLM.from_pretrained(ctx.spec.path_or_id)
    tokenizer = AutoTokenizer.from_pretrained(ctx.spec.path_or_id, padding_side="left")
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.learning_rate)
    indices = [i for i in range(len(ctx.rollouts.tasks)) for _ in range(settings.num_generations)]
    for step in range(1, settings.max_steps + 1):
        episodes = ctx.rollouts.episodes(indices, step - 1, model, tokenizer)
        scores = ctx.reward.score(episodes, indices, step=step)
        loss = torch.zeros(())
        for episode, score in zip(episodes, scores):
            flat = flatten_episode(episode)
            ids = torch.tensor([flat.prompt_ids + flat.completion_ids])
            logps = model(ids).logits[0, :-1].log_softmax(-1).gather(1, ids[0, 1:, None])[:, 0]
            mine = logps[len(flat.prompt_ids) - 1:] * torch.tensor(flat.env_mask, dtype=logps.dtype)
            loss = loss - (float(score.reward) + 1.0) * mine.sum() / len(episodes)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ctx.metrics.record(step, {"loss": float(loss.detach()), "reward": sum(s.reward for s in scores) / len(scores)})
    model.save_pretrained(str(ctx.final))
    tokenizer.save_pretrained(str(ctx.final))
    return {}, settings.max_steps
'''


def _arle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "arlecli", *args], capture_output=True, text=True, timeout=120, env=os.environ.copy()
    )


def test_an_algorithm_from_a_plugin_file_trains_a_step(tmp_path, tiny_model, monkeypatch):
    from safetensors.torch import load_file

    import arlecli.sandbox.jail as jail
    from arlecli.errors import UserError
    from arlecli.models import resolve_model
    from arlecli.catalog import load_card
    from arlecli.train.algorithm import algorithm
    from arlecli.train.config import resolve
    from arlecli.train.run import run_train

    monkeypatch.setattr(jail, "_policy", jail._policy)  # run_train sets the sandbox's policy: undone after
    monkeypatch.setenv("ARLE_SANDBOX", os.environ.get("ARLE_SANDBOX", "auto"))
    plugin = tmp_path / "toy_algo.py"
    plugin.write_text(TOY)
    spec = f"{plugin}:toy"
    declared = algorithm(spec)
    assert declared.name == "toy" and set(declared.fields()) >= {"max_steps", "learning_rate"}
    cfg = resolve(
        {},
        {"benchmark": "countdown", "algo": spec, "limit": 2, "eval_limit": 0},
        {"learning_rate": 0.05, "max_steps": 1, "max_completion_length": 8},
    )
    with pytest.raises(UserError, match="unknown setting 'beta' for --algo"):
        resolve({}, {"algo": spec}, {"beta": 0.1})  # the toy's settings are its dataclass's fields
    run = tmp_path / "run"
    summary = run_train(load_card("countdown"), cfg, resolve_model(str(tiny_model)), run)
    assert summary["algo"] == spec and summary["global_step"] == 1
    meta = json.loads((run / "meta.json").read_text())
    assert meta["algo"] == spec and meta["trainer"]["learning_rate"] == 0.05 and meta["trainer"]["seed"] == 1234
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    assert len((run / "rewards.jsonl").read_text().splitlines()) == 4  # 2 tasks x 2 episodes, scored
    trained = load_file(str(run / "final" / "model.safetensors"))
    base = load_file(str(tiny_model / "model.safetensors"))
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not trained[key].equal(base[key])
    assert (run / "summary.json").exists()


def test_a_misspelt_algorithm_is_one_line_naming_the_near_ones():
    proc = _arle("train", "countdown", "--algo", "grpoo", "--max-steps", "1")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: unknown algorithm 'grpoo'") and "did you mean grpo" in lines[0], lines[0]


def test_run_train_from_python_refuses_a_loglikelihood_card_as_arle_train_does(tmp_path, tiny_model):
    from arlecli.errors import UserError
    from arlecli.models import resolve_model
    from arlecli.catalog import load_card
    from arlecli.train.config import resolve
    from arlecli.train.run import run_train

    fixtures = ROOT / "benchmarks" / "fixtures"
    data = yaml.safe_load((ROOT / "benchmarks" / "arc_easy.yaml").read_text())
    data["loglikelihood"]["default"] = True
    data["fixture"] = str(fixtures / "arc_easy.jsonl")
    card_file = tmp_path / "arc_ll.yaml"
    card_file.write_text(yaml.safe_dump(data, sort_keys=False))
    card = load_card(str(card_file))
    cfg = resolve({}, {"benchmark": str(card_file), "max_steps": 1}, {})
    with pytest.raises(UserError) as raised:
        run_train(card, cfg, resolve_model(str(tiny_model)), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    proc = _arle(
        "train", str(card_file), "--model", str(tiny_model), "--max-steps", "1", "--output", str(tmp_path / "cli-run")
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == f"error: {raised.value}", proc.stderr
    assert "loglikelihood" in str(raised.value) and "arc_easy" in str(raised.value)


def test_an_installed_packages_algorithm_is_found_by_its_entry_point_and_may_not_take_a_builtin_name(
    tmp_path, monkeypatch
):
    from arlecli.errors import UserError
    from arlecli.train.algorithm import ALGORITHMS, algorithm

    dist = tmp_path / "toys-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toys\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[arle.algorithms]\ntoy_ep = toy_ep_algo:run\n")
    (tmp_path / "toy_ep_algo.py").write_text("def run(ctx):\n    return {}, 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        ALGORITHMS.refresh()
        found = algorithm("toy_ep")  # a plain run function: an algorithm with no settings of its own
        assert found.name == "toy_ep" and found.fields() == {} and not found.data
        assert str(ALGORITHMS.origin("toy_ep")).startswith("entry point arle.algorithms 'toy_ep = toy_ep_algo:run'")
        (dist / "entry_points.txt").write_text("[arle.algorithms]\ngrpo = toy_ep_algo:run\n")
        ALGORITHMS.refresh()
        with pytest.raises(
            UserError,
            match="algorithm 'grpo' is registered twice: by builtin arlecli.train.grpo "
            "and by entry point arle.algorithms 'grpo = toy_ep_algo:run'",
        ):
            algorithm("grpo")
    finally:
        monkeypatch.undo()
        ALGORITHMS.refresh()
