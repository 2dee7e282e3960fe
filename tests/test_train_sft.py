"""`arle train BENCH --algo sft|dpo --data FILE.jsonl` on the tiny model, CPU: the loss covers the
assistant's tokens only (asserted on the trainers' own collated batches), 2 steps full and LoRA
change the weights into a run directory `arle eval` and `arle report` read, resume after kill -9,
and bad --data files are one line, exit 2."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.train import assert_trained, kill_after_first_checkpoint, steps_in, train_in_process

ARLE = [sys.executable, "-m", "arlecli"]
END = "<|im_end|>"  # the tiny model's end-of-turn token (ChatML)

SINGLE = {
    "messages": [
        {"role": "user", "content": "Using 3, 5, 7 make 22."},
        {"role": "assistant", "content": "<answer>3*5+7</answer>"},
    ],
    "benchmark": "countdown",
    "run": "runs/x",
    "task_id": "t0",
    "sample": 0,
    "reward": 1.0,
    "correct": True,
    "model": "teacher",
}
TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
MULTI = {
    "messages": [
        {"role": "system", "content": "You can use a calculator."},
        {"role": "user", "content": "What is 12 times 7?"},
        {"role": "assistant", "content": TOOL_CALL},
        {"role": "tool", "content": "84"},
        {"role": "assistant", "content": "<answer>84</answer>"},
    ],
    "benchmark": "countdown",
    "run": "runs/x",
    "task_id": "t1",
    "sample": 0,
    "reward": 1.0,
    "correct": True,
    "model": "teacher",
}
PAIR_SINGLE = {
    "prompt": SINGLE["messages"][:1],
    "chosen": SINGLE["messages"][1:],
    "rejected": [{"role": "assistant", "content": "<answer>3+5+7</answer>"}],
    "benchmark": "countdown",
    "run": "runs/x",
    "task_id": "t0",
    "model": "teacher",
    "chosen_reward": 1.0,
    "rejected_reward": 0.0,
}
PAIR_MULTI = {
    "prompt": MULTI["messages"][:2],
    "chosen": MULTI["messages"][2:],
    "rejected": [{"role": "assistant", "content": "<answer>74</answer>"}],
    "benchmark": "countdown",
    "run": "runs/x",
    "task_id": "t1",
    "model": "teacher",
    "chosen_reward": 1.0,
    "rejected_reward": 0.0,
}
TINY = ["--set", "per_device_train_batch_size=2", "--eval-limit", "1", "--set", "eval_max_tokens=4"]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def assistant_turns(messages: list[dict]) -> list[str]:
    """What must carry loss: each assistant message as the model writes it, through its end token."""
    return [m["content"] + END for m in messages if m["role"] == "assistant"]


def runs(tokenizer, ids: list[int], mask: list[int]) -> tuple[list[str], list[str]]:
    """(the trained stretches, the untrained ones) of a sequence, decoded."""
    trained: list[str] = []
    other: list[str] = []
    current: list[int] = []
    for i, (t, m) in enumerate(zip(ids, mask)):
        current.append(t)
        if i + 1 == len(ids) or mask[i + 1] != m:
            (trained if m else other).append(tokenizer.decode(current))
            current = []
    return trained, other


def offline_config(algo: str, tmp_path: Path, **trainer):
    from arlecli.train.config import resolve
    from arlecli.train.sft import trainer_args

    cfg = resolve({}, {"algo": algo, "data": "unused.jsonl"}, {"per_device_train_batch_size": 2, **trainer})
    return cfg, trainer_args(cfg, tmp_path / "run")


def test_tokenize_conversation_trains_assistant_turns_only(tiny_model):
    from transformers import AutoTokenizer

    from arlecli.train.sft import tokenize_conversation

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids, mask = tokenize_conversation(tok, MULTI["messages"])
    trained, other = runs(tok, ids, mask)
    assert trained == assistant_turns(MULTI["messages"])
    # The prompt, the assistant header, the tool's reply: all there, none trained.
    assert other == [
        "<|im_start|>system\nYou can use a calculator.<|im_end|>\n<|im_start|>user\n"
        "What is 12 times 7?<|im_end|>\n<|im_start|>assistant\n",
        "\n<|im_start|>tool\n84<|im_end|>\n<|im_start|>assistant\n",
    ]
    # The sequence is the chat template's rendering, up to the end of the last turn.
    assert tok.decode(ids) + "\n" == tok.apply_chat_template(MULTI["messages"], tokenize=False)
    # The prompt's ids are those the engines feed the model (engine.tokens.encode_request).
    prompt = tok(
        tok.apply_chat_template(MULTI["messages"][:2], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    assert ids[: len(prompt)] == prompt and mask[: len(prompt)] == [0] * len(prompt) and mask[len(prompt)] == 1


def test_a_template_that_rewrites_history_ends_the_sequence(tiny_model):
    """A template that drops earlier turns' reasoning (as Qwen3's does) renders a later prompt
    that does not extend the text trained on: the sequence stops there, as a rollout's does."""
    from transformers import AutoTokenizer

    from arlecli.train.sft import tokenize_conversation

    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and not loop.last %}"
        "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": "<think>hmm</think>A"},
        {"role": "user", "content": "More."},
        {"role": "assistant", "content": "B"},
    ]
    ids, mask = tokenize_conversation(tok, messages)
    trained, other = runs(tok, ids, mask)
    assert trained == ["<think>hmm</think>A" + END] and other == [
        "<|im_start|>user\nGo.<|im_end|>\n<|im_start|>assistant\n"
    ]


def test_sft_batch_carries_loss_on_assistant_tokens_only(tiny_model, tmp_path):
    from arlecli.train.sft import build_sft_trainer, load_tokenizer

    cfg, args = offline_config("sft", tmp_path)
    tok = load_tokenizer(str(tiny_model))
    trainer = build_sft_trainer(cfg, args, str(tiny_model), tok, [SINGLE, MULTI])
    batch = next(iter(trainer.get_train_dataloader()))
    got = []
    for ids, labels, attention in zip(batch["input_ids"], batch["labels"], batch["attention_mask"]):
        n = int(attention.sum())
        trained, other = runs(tok, ids[:n].tolist(), (labels[:n] != -100).long().tolist())
        assert not any("<|im_start|>" in t or "84<|im_end|>" == t for t in trained), trained
        assert (labels[n:] == -100).all()  # padding carries no loss either
        got.append(trained)
    assert sorted(got) == sorted([assistant_turns(SINGLE["messages"]), assistant_turns(MULTI["messages"])])


def test_dpo_batch_carries_loss_on_assistant_tokens_only(tiny_model, tmp_path):
    from arlecli.train.dpo import build_dpo_trainer
    from arlecli.train.sft import load_tokenizer

    cfg, args = offline_config("dpo", tmp_path)
    tok = load_tokenizer(str(tiny_model))
    trainer = build_dpo_trainer(cfg, args, str(tiny_model), tok, [PAIR_SINGLE, PAIR_MULTI])
    batch = next(iter(trainer.get_train_dataloader()))
    got = []
    for ids, mask, attention in zip(batch["input_ids"], batch["completion_mask"], batch["attention_mask"]):
        n = int(attention.sum())
        trained, _ = runs(tok, ids[:n].tolist(), mask[:n].tolist())
        got.append(trained)
    half = len(got) // 2  # TRL stacks the chosen sides, then the rejected ones
    assert sorted(got[:half]) == sorted(assistant_turns(p["chosen"]) for p in (PAIR_SINGLE, PAIR_MULTI))
    assert sorted(got[half:]) == sorted(assistant_turns(p["rejected"]) for p in (PAIR_SINGLE, PAIR_MULTI))
    # The tool's reply inside the chosen side is attended to, but is no completion token.
    assert [TOOL_CALL + END, "<answer>84</answer>" + END] in got[:half]


@pytest.mark.parametrize("start", ["path", "object"])
def test_dpo_reference_is_the_starting_policy(tiny_model, tmp_path, start):
    """Full fine-tune: a frozen copy of the starting weights (also when the policy is a model
    object, e.g. an adapter merged into its base, which TRL would rebuild from the base's path);
    LoRA: no second model, the policy with its adapter disabled."""
    import torch
    from transformers import AutoModelForCausalLM

    from arlecli.train.dpo import build_dpo_trainer
    from arlecli.train.sft import load_tokenizer

    tok = load_tokenizer(str(tiny_model))
    key = "model.layers.0.self_attn.q_proj.weight"
    model = str(tiny_model) if start == "path" else AutoModelForCausalLM.from_pretrained(tiny_model)
    if start == "object":
        with torch.no_grad():
            model.get_parameter(key).add_(0.5)  # not the weights on disk: the reference must be these
    start_weights = (
        (AutoModelForCausalLM.from_pretrained(tiny_model) if start == "path" else model)
        .get_parameter(key)
        .detach()
        .clone()
    )
    cfg, args = offline_config("dpo", tmp_path, max_steps=1, learning_rate=1e-3)
    trainer = build_dpo_trainer(cfg, args, model, tok, [PAIR_SINGLE, PAIR_MULTI])
    trainer.train()
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
    assert trainer.ref_model.get_parameter(key).equal(start_weights)
    assert not trainer.model.get_parameter(key).equal(start_weights)

    cfg, args = offline_config("dpo", tmp_path, max_steps=1, learning_rate=1e-3, lora_rank=4)
    trainer = build_dpo_trainer(cfg, args, str(tiny_model), tok, [PAIR_SINGLE, PAIR_MULTI])
    assert trainer.ref_model is None and hasattr(trainer.model, "disable_adapter")


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
@pytest.mark.parametrize("algo", ["sft", "dpo"])
def test_two_steps_change_weights_in_a_run_directory(tmp_path, tiny_model, algo, lora):
    data = write_jsonl(tmp_path / "data.jsonl", [SINGLE, MULTI] if algo == "sft" else [PAIR_SINGLE, PAIR_MULTI])
    run = tmp_path / "run"
    t0 = time.monotonic()
    train_in_process(
        "countdown",
        "--algo",
        algo,
        "--data",
        str(data),
        "--model",
        str(tiny_model),
        *TINY,
        "--max-steps",
        "2",
        "--lora-rank",
        str(lora),
        "--learning-rate",
        "1e-3",
        "--output",
        str(run),
    )
    train_s = time.monotonic() - t0

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows), rows
    if algo == "dpo":
        assert all("rewards/margins" in r for r in rows)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["algo"] == algo and meta["options"]["data"] == str(data) and meta["data_rows"] == 2
    assert meta["data_hash"] and meta["options"]["lora_rank"] == lora
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 2 and summary["algo"] == algo
    assert summary["before"]["label"] == "step-0" and summary["after"]["label"] == "step-2"
    assert (run / "eval" / "step-0" / "results.json").exists() and (run / "eval" / "step-2" / "results.json").exists()
    assert (run / "checkpoint-2" / "trainer_state.json").exists() and not (run / "rewards.jsonl").exists()

    assert_trained(run / "final", tiny_model, lora)
    print(f"{algo} lora={lora}: train {train_s:.1f} s")


def test_final_model_evaluates_and_reports(tmp_path, tiny_model):
    data = write_jsonl(tmp_path / "rows.jsonl", [SINGLE, MULTI])
    run = tmp_path / "run"
    train_in_process(
        "countdown",
        "--algo",
        "sft",
        "--data",
        str(data),
        "--model",
        str(tiny_model),
        *TINY,
        "--max-steps",
        "1",
        "--lora-rank",
        "4",
        "--output",
        str(run),
    )
    env = os.environ.copy()
    out = subprocess.run(
        [
            *ARLE,
            "eval",
            "countdown",
            "--model",
            str(run / "final"),
            "--limit",
            "2",
            "--max-tokens",
            "4",
            "--output",
            str(tmp_path / "eval"),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["n_tasks"] == 2
    out = subprocess.run(
        [*ARLE, "report", str(run), "-o", str(tmp_path / "report.html")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "sft" in (tmp_path / "report.html").read_text()


def test_kill_after_first_checkpoint_then_resume(tmp_path, tiny_model, capsys):
    rows = [SINGLE, MULTI, {**SINGLE, "task_id": "t2"}, {**MULTI, "task_id": "t3"}]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    common = [
        "countdown",
        "--algo",
        "sft",
        "--data",
        str(data),
        "--model",
        str(tiny_model),
        *TINY,
        "--max-steps",
        "6",
        "--save-steps",
        "1",
        "--learning-rate",
        "1e-3",
    ]
    run = tmp_path / "run"
    kill_after_first_checkpoint(["train", *common, "--output", str(run)], run, steps=6)

    capsys.readouterr()
    train_in_process(*common, "--output", str(run), "--resume")
    assert "resuming from checkpoint-" in capsys.readouterr().err
    assert json.loads((run / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6
    assert steps_in(run / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "summary.json").read_text())["global_step"] == 6
    assert len((run / "eval" / "step-0" / "samples.jsonl").read_text().splitlines()) == 1  # not redone

    # Weights, optimizer, RNG and data order came back: every step's loss is the uninterrupted run's.
    train_in_process(*common, "--output", str(tmp_path / "straight"))
    losses = lambda r: [json.loads(line)["loss"] for line in (r / "metrics.jsonl").read_text().splitlines()]
    assert losses(run) == pytest.approx(losses(tmp_path / "straight"), rel=1e-4)

    # The data file is part of the run: a resume over changed rows is refused.
    write_jsonl(data, rows[:2])
    from arlecli.errors import UserError

    with pytest.raises(UserError, match="data_hash"):
        train_in_process(*common, "--max-steps", "7", "--output", str(run), "--resume")


def _main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """The real `arle` entry point, in this process: (exit code, stderr)."""
    from arlecli.cli.main import main

    monkeypatch.setattr(sys, "argv", ["arle", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "case",
    [
        "no data",
        "data for grpo",
        "missing file",
        "pairs for sft",
        "rows for dpo",
        "last not assistant",
        "no chosen",
        "not json",
        "no messages",
        "an opponent for sft",
    ],
)
def test_bad_data_is_one_line(tmp_path, tiny_model, monkeypatch, capsys, case):
    good_sft = [SINGLE]
    files = {
        "pairs for sft": ("sft", [SINGLE, PAIR_SINGLE], ":2:", "--algo dpo"),
        "rows for dpo": ("dpo", [SINGLE], ":1:", "--algo sft"),
        "last not assistant": ("sft", [SINGLE, {"messages": MULTI["messages"][:4]}], ":2:", "last message is a tool"),
        "no chosen": (
            "dpo",
            [PAIR_SINGLE, {k: v for k, v in PAIR_MULTI.items() if k != "chosen"}],
            ":2:",
            "no `chosen`",
        ),
        "not json": ("sft", [SINGLE, '{"messages": [', SINGLE], ":2:", "not valid JSON"),
        "no messages": ("sft", [{"text": "hello"}], ":1:", "no `messages`"),
    }
    run = tmp_path / "run"
    base = ["train", "countdown", "--model", str(tiny_model), "--output", str(run)]
    if case == "no data":
        args, needles = [*base, "--algo", "sft"], ["--data"]
    elif case == "data for grpo":
        args, needles = [*base, "--data", str(write_jsonl(tmp_path / "d.jsonl", good_sft))], ["--data", "grpo"]
    elif case == "missing file":
        args, needles = [*base, "--algo", "sft", "--data", str(tmp_path / "nope.jsonl")], ["nope.jsonl", "from-eval"]
    elif case == "an opponent for sft":  # sft plays no games: the option would silently do nothing
        data = write_jsonl(tmp_path / "d.jsonl", good_sft)
        args = [*base, "--algo", "sft", "--data", str(data), "--opponent", "random"]
        needles = ["--opponent", "--algo sft", "drop --opponent"]
    else:
        algo, rows, line, why = files[case]
        path = write_jsonl(tmp_path / "d.jsonl", rows)
        args, needles = [*base, "--algo", algo, "--data", str(path)], [f"{path}{line}", why]
    code, err = _main(monkeypatch, capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(n in lines[0] for n in needles), (needles, lines[0])
    assert not run.exists(), "bad input is refused before the run directory exists"


def test_bad_data_is_refused_before_the_default_model_is_prepared(tmp_path):
    """No --model means the embedded default model, unpacked on first use (a fresh ARLE_HOME: not
    yet): a bad --data file is refused before that, in one line."""
    child = "import sys; from arlecli.cli.main import main; sys.argv = ['arle', *sys.argv[1:]]; main()"
    env = {**os.environ, "ARLE_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-c", child, "train", "gsm8k", "--algo", "sft", "--data", "missing.jsonl"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "missing.jsonl" in lines[0] and "preparing the embedded default model" not in done.stderr


def test_rows_of_another_benchmark_warn_and_limit_takes_the_first_rows(tmp_path, tiny_model, capsys):
    data = write_jsonl(tmp_path / "rows.jsonl", [{**SINGLE, "benchmark": "gsm8k"}, MULTI, {**MULTI, "benchmark": "x"}])
    capsys.readouterr()
    train_in_process(
        "countdown",
        "--algo",
        "sft",
        "--data",
        str(data),
        "--model",
        str(tiny_model),
        *TINY,
        "--max-steps",
        "1",
        "--eval-limit",
        "0",
        "--limit",
        "2",
        "--output",
        str(tmp_path / "run"),
    )
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert "holds trajectories of gsm8k (1 rows), not countdown" in err and "x (1 rows)" not in err
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["data_rows"] == 2


def test_rows_from_a_real_agent_run_train_on_what_the_model_saw(tmp_path, tiny_model, monkeypatch, capsys):
    """eval (math_tool, native tools, first turn a tool call) -> `arle data from-eval` -> sft: each
    row's sequence holds, before each of the first two assistant turns, exactly the prompt ids
    the engine generated that turn from; the turns carry the loss; training runs on the file."""
    from helpers.runs import SEED, capture_prompt_ids, from_eval, read_rows
    from helpers.tool_model import GSM8K_ROWS, first_turn_calls_a_tool, tool_template_model

    from arlecli.engine.hf import HFEngine
    from arlecli.envs.episodes import sample_seed
    from arlecli.eval import EvalOptions, run_eval
    from arlecli.catalog import load_card
    from arlecli.train.sft import load_tokenizer, tokenize_conversation

    model = tool_template_model(tiny_model, tmp_path / "model")
    first_turn_calls_a_tool(monkeypatch)
    seen = capture_prompt_ids(monkeypatch)
    run_eval(
        load_card("math_tool"),
        HFEngine(str(model), batch_size=4),
        EvalOptions(data=GSM8K_ROWS, limit=2, max_tokens=8, seed=SEED),
        model="tiny",
        run_dir=tmp_path / "ev",
    )
    code, _, err = from_eval(
        monkeypatch, capsys, str(tmp_path / "ev"), "--all", "--keep-cut", "-o", str(tmp_path / "rows.jsonl")
    )
    assert code == 0, err
    rows = read_rows(tmp_path / "rows.jsonl")
    assert len(rows) == 2 and all(r["tools"] for r in rows)
    tok = load_tokenizer(str(model))
    for row in rows:
        ids, mask = tokenize_conversation(tok, row["messages"], row["tools"])
        trained, _ = runs(tok, ids, mask)
        assert trained == assistant_turns(row["messages"]) and len(trained) >= 2
        starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
        base = sample_seed(SEED, row["task_id"], row["sample"])
        for t in (0, 1):  # turn 1 is the scripted call, whose ids round-trip through its text
            assert ids[: starts[t]] == seen[base + t][0]
    train_in_process(
        "math_tool",
        "--algo",
        "sft",
        "--data",
        str(tmp_path / "rows.jsonl"),
        "--model",
        str(model),
        "--set",
        "per_device_train_batch_size=2",
        "--eval-limit",
        "0",
        "--max-steps",
        "1",
        "--output",
        str(tmp_path / "run"),
    )
    assert steps_in(tmp_path / "run" / "metrics.jsonl") == [1] and (tmp_path / "run" / "final").is_dir()
