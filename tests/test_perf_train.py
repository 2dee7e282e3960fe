"""perf/train_vs_trl.py, perf/train_rollouts.py and perf/grpo_update.py in their quick modes on the tiny model:
the scripts run end to end and their result JSON has the shape perf/README.md's tables are
read from. No timing is asserted (these CPUs are shared; see perf/README.md for figures)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "perf" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # train_rollouts imports train_vs_trl by this name
    spec.loader.exec_module(module)
    return module


train_vs_trl = _load("train_vs_trl")
train_rollouts = _load("train_rollouts")
grpo_update = _load("grpo_update")


def test_train_vs_trl_quick_writes_both_tools_with_generation_split(tmp_path: Path) -> None:
    out = tmp_path / "train_vs_trl.json"
    train_vs_trl.main(["--quick", "--out", str(out)])
    result = json.loads(out.read_text())
    for key in (
        "seconds_per_step",
        "cpu_seconds_per_step",
        "generation_seconds_per_step",
        "rest_of_step_seconds",
        "generated_tokens_per_step",
        "generation_tokens_per_s",
        "step_tokens_per_s",
        "static_batch_token_slots_per_step",
        "kept_share_of_static_slots",
    ):
        row = result["table"][key]
        assert row["arle"] > 0 and row["trl"] > 0 and row["ratio"] is not None, key
    assert result["target_ratio"] == 0.8 and result["ceiling_ratio"] == 1.0
    assert isinstance(result["target_met"], bool) and isinstance(result["ceiling_met"], bool)
    assert result["same_tasks"] and not result["config_diff"]  # the comparison itself is fair
    assert result["card_stop"] == []  # the demo card: both tools stop at EOS or the budget only
    assert [r["tool"] for r in result["runs"]] == ["arle", "trl"]
    for run in result["runs"]:
        steps = result["steps"]
        assert len(run["seconds_per_step"]) == len(run["generate_seconds_per_step"]) == steps
        assert all(0 < g < s for g, s in zip(run["generate_seconds_per_step"], run["seconds_per_step"]))
        assert len(run["tokens_per_step"]) == steps and all(t > 0 for t in run["tokens_per_step"])
    arle = result["runs"][0]
    assert (
        sum(arle["finish_reasons"].values())
        == result["steps"] * result["trainer_config"]["per_device_train_batch_size"]
    )


def test_train_rollouts_quick_times_each_phase_on_both_backends(tmp_path: Path, monkeypatch) -> None:
    # vLLM's compiled sampler kernel is cached where test_engine_vllm/test_train_vllm keep it
    # between sessions (~10 s cold on these CPUs), not under this test's private ARLE_HOME.
    root = Path(os.environ.get("ARLE_TEST_CACHE") or Path(tempfile.gettempdir()) / f"arle-test-cache-{os.getuid()}")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(root / "vllm" / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "vllm" / "inductor"))
    out = tmp_path / "train_rollouts.json"
    train_rollouts.main(
        ["--quick", "--configs", "4-turn:grpo", "--episodes", "2", "--max-tokens", "4", "--out", str(out)]
    )
    result = json.loads(out.read_text())
    assert result["settings"]["episodes"] == 2 and result["settings"]["backends"] == ["hf", "vllm"]
    [summary] = result["summaries"]
    assert summary["workload"] == "4-turn" and summary["algo"] == "grpo"
    table = summary["table"]
    for key in ("step_s", "rollout_s", "engine_s", "update_s", "generated_tokens", "prompt_tokens", "rounds"):
        assert table[key]["hf"] and table[key]["vllm"] and table[key]["vllm_over_hf"], key
    assert table["rounds"]["hf"] == table["rounds"]["vllm"] == 4  # every episode held to its 4 turns
    assert summary["turns_per_episode"] == {"hf": {"4": 4}, "vllm": {"4": 4}}  # 2 steps x 2 episodes
    assert summary["vllm_speedup"]["step"] and summary["vllm_speedup"]["rollout"]
    assert set(summary["dominant"]) == {"hf", "vllm"}
    assert "4-turn GRPO step, vllm >= 2x hf" in result["targets"]
    runs = {r["backend"]: r for r in result["runs"]}
    assert runs["vllm"]["steps"][0]["vllm_start_s"] > 0  # vLLM starts inside the warm-up step
    assert runs["vllm"]["steps"][1]["weight_sync_s"] > 0 and runs["hf"]["steps"][1]["weight_sync_s"] == 0
    for run in runs.values():
        assert [s["step"] for s in run["steps"]] == [1, 2]
        for step in run["steps"]:
            assert step["engine_s"] <= step["rollout_s"] <= step["step_s"]


train_dynamic_sampling = _load("train_dynamic_sampling")


def test_train_dynamic_sampling_quick_reports_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "train_dynamic_sampling.json"
    train_dynamic_sampling.main(["--quick", "--steps", "2", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [(r["name"], r["dynamic_sampling"]) for r in result["runs"]] == [("off", False), ("on", True)]
    for run in result["runs"]:
        assert [s["step"] for s in run["steps"]] == [1, 2] and all(s["generated_tokens"] > 0 for s in run["steps"])
    table = result["table"]
    for key in ("seconds_per_step", "generated_tokens_per_step", "signal_groups_per_step", "dropped_token_share"):
        assert set(table[key]) == {"off", "on", "on_over_off"}, key
    # The tiny random model never answers a sum: every group is all-wrong, so with dynamic
    # sampling every group is dropped, and without it every token went to zero-advantage groups.
    assert table["dropped_token_share"]["on"] == 1.0 and table["zero_signal_token_share"]["off"] == 1.0
    assert table["dropped_groups_per_step"]["on"] > 0 and table["dropped_groups_per_step"]["off"] == 0


def test_grpo_update_quick_times_every_variant_and_agrees_with_trl(tmp_path: Path) -> None:
    """Each loss forward variant ran, and arle's give TRL's logprobs and gradients up to rounding."""
    import arlecli.train.grpo as grpo

    before = grpo.FORWARD
    out = tmp_path / "grpo_update.json"
    grpo_update.main(["--quick", "--out", str(out)])
    assert grpo.FORWARD is before  # the script leaves the module's setting as it found it
    result = json.loads(out.read_text())
    assert set(result["variants"]) == {"trl", "arle", "trl-nogc", "arle-nogc-unshared", "arle-nogc"}
    assert result["real_tokens"] < result["slots"]  # ragged completions: there is padding to drop
    for name, row in result["variants"].items():
        assert row["wall_s"] > 0 and row["cpu_s"] > 0, name
        assert row["max_d_logp"] < 1e-4 and row["grad_rel_diff"] < 1e-4, (name, row)
