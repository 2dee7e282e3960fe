"""GRPO's update, TRL's own loss forward vs arle's (train/logprobs.py), side by side in one process.

What is timed: one GRPO loss forward and backward as TRL's GRPOTrainer runs it on a step's
batch (`_get_per_token_logps_and_entropies` with entropies, then the backward of the
completion tokens' logprobs), on a real GRPOTrainer of arle's class (`train.grpo.with_rollouts`)
over the same batch, for each variant:

  trl            TRL's forward (`grpo.FORWARD = None`): the padded [B, P + T] batch, its fused LM
                 head over every position (on a CPU it scores the prompt's positions too), with
                 TRL's default gradient checkpointing
  arle           arle's forward (train.logprobs): no padding, the LM head on completion positions
                 only; under gradient checkpointing the shared prompts are not used (the
                 recompute runs without a KV cache)
  trl-nogc       TRL's forward, gradient checkpointing off
  arle-nogc-unshared  arle's forward, gradient checkpointing off, each row with its own prompt
  arle-nogc      arle's forward with gradient checkpointing off: each group's prompt runs once,
                 its KV cache handed to the group's completions (what arle runs when it is off)

The batch is the CPU demo's (examples/cpu_grpo_demo: the embedded SmolLM2-135M-Instruct, LoRA
r16 on every linear, 2 prompts x 8 completions): the prompts are the demo card's first two
rendered with its chat template, the completions random token ids of 4-24 tokens (timing does
not depend on the text). Variants run interleaved over `--repeats`, medians reported, with the
largest logprob difference from `trl` (exactness) and the gradients' relative difference.

    python perf/grpo_update.py                # SmolLM2-135M-Instruct, 5 repeats (~3 min)
    python perf/grpo_update.py --quick        # the tiny test model, 2 repeats (~20 s)
    python perf/grpo_update.py --completion 64 --group 8 --prompts 4

Writes perf/results/grpo_update.json (quick runs: grpo_update_quick.json).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from machine_info import cpu_model, package_versions, perf_model, write_result

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
RESULTS = ROOT / "perf" / "results"
# variant: (arle's forward or TRL's, gradient checkpointing, shared prompts)
VARIANTS = {
    "trl": (False, True, False),
    "arle": (True, True, False),
    "trl-nogc": (False, False, False),
    "arle-nogc-unshared": (True, False, False),
    "arle-nogc": (True, False, True),
}


def demo_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """The CPU demo card's first `count` training prompts, rendered and tokenized as arle does."""
    from arlecli.cards import render_prompt
    from arlecli.catalog import load_card
    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.train.run import train_split

    card = load_card(str(ROOT / "examples" / "cpu_grpo_demo" / "sums.yaml"))
    tasks, exemplars = load_tasks(card, EvalOptions(split=train_split(card, None), limit=count, num_fewshot=None))
    out = []
    for task in tasks:
        ids = tokenizer.apply_chat_template(render_prompt(card.prompt, task, exemplars), add_generation_prompt=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def batch(tokenizer: Any, args: argparse.Namespace) -> tuple[Any, Any, int]:
    """(input_ids, attention_mask, completion width) as TRL hands them to its loss: prompts
    left-padded, completions right-padded, each prompt repeated for its group."""
    import torch

    rng = random.Random(0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = demo_prompts(tokenizer, args.prompts)
    rows = [
        (p, [rng.randrange(10, len(tokenizer)) for _ in range(rng.randint(4, args.completion))])
        for p in prompts
        for _ in range(args.group)
    ]
    width_p = max(len(p) for p, _ in rows)
    width_c = max(len(c) for _, c in rows)
    ids = torch.full((len(rows), width_p + width_c), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, (p, c) in enumerate(rows):
        ids[r, width_p - len(p) : width_p] = torch.tensor(p)
        mask[r, width_p - len(p) : width_p] = 1
        ids[r, width_p : width_p + len(c)] = torch.tensor(c)
        mask[r, width_p : width_p + len(c)] = 1
    return ids, mask, width_c


def trainer(model_path: str, work: Path, rows: int, group: int) -> Any:
    """A GRPOTrainer of arle's class with the demo recipe's LoRA and batch, on the CPU."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    import trl
    from arlecli.train.grpo import with_rollouts

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype="float32")
    config = trl.GRPOConfig(
        output_dir=str(work / "trainer"),
        use_cpu=True,
        bf16=False,  # as arle sets on a CPU (train.trl_glue.common_fields)
        report_to="none",
        num_generations=group,
        per_device_train_batch_size=rows,
        max_completion_length=24,
        temperature=1.0,
        beta=0.0,
    )
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    dataset = Dataset.from_list([{"prompt": "x", "task_index": i} for i in range(rows)])
    out = with_rollouts(trl.GRPOTrainer)(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=config,
        train_dataset=dataset,
        peft_config=lora,
    )
    with torch.no_grad():  # an adapter that already moved (lora_B starts at 0)
        for name, param in out.model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    return out


def step(trl_trainer: Any, ids: Any, mask: Any, width: int) -> tuple[float, float, Any, Any]:
    """(wall s, CPU s, logprobs, gradients) of one loss forward and backward."""
    import torch

    model = trl_trainer.model
    model.zero_grad(set_to_none=True)
    started, cpu = time.perf_counter(), time.process_time()
    logps, _, _ = trl_trainer._get_per_token_logps_and_entropies(model, ids, mask, width, compute_entropy=True)
    loss = -(logps * mask[:, -width:]).sum() / mask[:, -width:].sum()
    loss.backward()
    wall, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return wall, cpu_s, logps.detach() * mask[:, -width:], grads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny test model, 2 repeats")
    parser.add_argument("--model", help="a model folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--completion", type=int, default=24, help="the longest completion (tokens)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else args.repeats
    import torch

    import arlecli.train.grpo as grpo

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="arle-grpo-update-"))
    model_path, model_name = perf_model(args.quick, work, args.model)
    rows = args.prompts * args.group
    t = trainer(model_path, work, rows, args.group)
    ids, mask, width = batch(t.processing_class, args)
    fast = grpo.FORWARD
    t.model.train()  # as in training_step: gradient checkpointing only acts in training mode
    base = t.model.get_base_model()
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    outputs: dict[str, tuple[Any, Any]] = {}
    try:
        for _ in range(repeats + 1):  # the first round warms up and is left out
            for variant in VARIANTS:
                arle, checkpointing, share = VARIANTS[variant]
                grpo.FORWARD = replace(fast, share_prompts=share) if arle and fast else None
                if checkpointing:
                    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                else:
                    base.gradient_checkpointing_disable()
                wall, cpu_s, logps, grads = step(t, ids, mask, width)
                if variant in outputs:
                    times[variant].append((wall, cpu_s))
                outputs[variant] = (logps, grads)
    finally:
        grpo.FORWARD = fast
    ref_logps, ref_grads = outputs["trl"]
    table = {}
    trl_wall = statistics.median(w for w, _ in times["trl"])
    print(
        f"{model_name}; CPU: {cpu_model()}; {args.threads} thread(s); {rows} rows, prompts {ids.shape[1] - width} "
        f"wide, completions <= {width}; {int(mask.sum())} real tokens in {mask.numel()} slots; median of {repeats}"
    )
    print("| variant | forward + backward s | CPU s | trl / it | max abs d logp vs trl | grad rel diff |")
    print("|---|---|---|---|---|---|")
    for variant in VARIANTS:
        wall = statistics.median(w for w, _ in times[variant])
        cpu_s = statistics.median(c for _, c in times[variant])
        logps, grads = outputs[variant]
        d_logp = float((logps - ref_logps).abs().max())
        d_grad = float((grads - ref_grads).norm() / ref_grads.norm())
        table[variant] = {
            "wall_s": wall,
            "cpu_s": cpu_s,
            "speedup": trl_wall / wall,
            "max_d_logp": d_logp,
            "grad_rel_diff": d_grad,
        }
        print(f"| {variant} | {wall:.3f} | {cpu_s:.3f} | {trl_wall / wall:.2f}x | {d_logp:.1e} | {d_grad:.1e} |")
    result = {
        "script": "perf/grpo_update.py",
        "model": model_name,
        "cpu": cpu_model(),
        "threads": args.threads,
        "rows": rows,
        "prompt_width": int(ids.shape[1] - width),
        "completion_width": width,
        "real_tokens": int(mask.sum()),
        "slots": int(mask.numel()),
        "repeats": repeats,
        "variants": table,
        "versions": package_versions(("torch", "transformers", "trl", "peft")),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": os.getloadavg(),
    }
    out = args.out or RESULTS / ("grpo_update_quick.json" if args.quick else "grpo_update.json")
    write_result(result, out, work, keep=False)


if __name__ == "__main__":
    main()
