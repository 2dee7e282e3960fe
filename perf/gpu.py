"""arle's HF backend and one GRPO step on a model of a real shape, on a GPU (or, smaller, a CPU).

Run on the lent H200 machine, from the repository root (torch + transformers suffice for
the eval part; the GRPO part needs trl, and is skipped with a message without it):

    PYTHONPATH=src python perf/gpu.py --out $OUT/gpu.json

Asynchronous RL (`--max-staleness 1` vs 0 vs plain TRL, Qwen2.5-1.5B shape, colocated vLLM;
see `async_rl` at the end of this file; not run yet):

    PYTHONPATH=src python perf/gpu.py async-rl --out $OUT/gpu_async.json

CPU smoke test of the same code paths (smaller shape, seconds):

    PYTHONPATH=src python perf/gpu.py --device cpu --quick

What is measured, on a Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 KV
heads, intermediate 4864, vocab 151936, tied embeddings) with random weights, built here
offline (bf16 on CUDA, fp32 on CPU), with a byte-level tokenizer built here whose vocabulary
has exactly the config's 151936 ids:

1. eval: arle's hf engine (arlecli.engine.hf.HFEngine, what `arle eval --backend hf` runs)
   generating greedy, fixed-length completions (random weights almost never emit EOS, so
   every row decodes max_tokens) for chat prompts like the one-digit-sums card's, at several
   batch sizes: generated tokens/s, and the fraction of the memory-bandwidth limit reached;
2. raw decode: the same model driven by a minimal loop (prefill, then one forward + argmax
   per token, one device->host copy per step) at the same batch sizes: the model's own
   ceiling in this framework, so engine minus raw is the engine's per-token overhead;
3. grpo: one TRL GRPOTrainer step (what `arle train --algo grpo` runs; arle adds ~5 ms per
   step of its own, see perf/train_vs_trl.py) after one warm-up step, full fine-tune:
   seconds per step, generated tokens per step, peak GPU memory.

The bandwidth limit, stated: a decode step for a batch of B rows reads every weight once
(the tied embedding matrix is read in full as the LM head; the input lookup reads only B
rows) plus each row's KV cache, so

    tokens/s <= B * BW / (W + KV),   W  = n_params * dtype_bytes,
                                     KV = B * L * layers * 2 * kv_heads * head_dim * dtype_bytes

with L the mean context length during the decode and BW the memory bandwidth (H200:
4.8e12 B/s, `--bandwidth`). Fraction = measured tokens/s / that bound. Prefill is included
in the engine's time (it is part of an eval), not in the raw decode's.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_info import cpu_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # PYTHONPATH=src does the same; arle need not be installed

# Qwen2.5-0.5B's config.json values (the shape that matters for speed).
QWEN25_05B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}
QUICK_SHAPE = {
    **QWEN25_05B,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 8192,
}
H200_BANDWIDTH = 4.8e12  # bytes/s (HBM3e)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# --------------------------------------------------------------------------------------
# Model and tokenizer, built offline.
# --------------------------------------------------------------------------------------


def build_tokenizer(vocab_size: int) -> Any:
    """A byte-level tokenizer with exactly `vocab_size` ids and a ChatML template.

    No merges: text encodes one id per byte, so prompts are a few times longer in ids than
    with Qwen's real BPE. The ids above the 256 byte symbols are fillers (strings of 2-3 byte
    symbols) that encoding never produces but decoding can: a random model samples them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {}
    for token in itertools.chain(
        SPECIALS, alphabet, ("".join(p) for n in (2, 3) for p in itertools.product(alphabet, repeat=n))
    ):
        if len(vocab) >= vocab_size:
            break
        vocab[token] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(SPECIALS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    assert len(tok) == vocab_size, (len(tok), vocab_size)
    return tok


def build_model(shape: dict[str, Any], tok: Any, device: str, dtype: Any, seed: int = 0) -> Any:
    """A randomly initialised Qwen2ForCausalLM of `shape`, directly on `device` in `dtype`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(**shape, eos_token_id=eos, pad_token_id=tok.pad_token_id, bos_token_id=None)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval()


def prompts(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """Chat prompts shaped like the one-digit-sums card's rows ("What is 4 - 9?")."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, op = rng.randint(0, 9), rng.randint(0, 9), rng.choice("+-")
        out.append([{"role": "user", "content": f"{a} {op} {b} ="}])
    return out


# --------------------------------------------------------------------------------------
# Measurements.
# --------------------------------------------------------------------------------------


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bound_tokens_per_s(
    batch: int, weight_bytes: int, kv_bytes_per_token: int, mean_ctx: float, bandwidth: float | None
) -> float | None:
    """The bandwidth ceiling B * BW / (W + KV) (module docstring); None without a bandwidth."""
    if not bandwidth:
        return None
    return batch * bandwidth / (weight_bytes + batch * mean_ctx * kv_bytes_per_token)


def engine_eval(model: Any, tok: Any, device: str, batch: int, rows: int, max_tokens: int) -> dict[str, Any]:
    """arle's HFEngine over `rows` prompts at batch size `batch`: generated tokens/s (prefill included)."""
    from arlecli.engine.base import GenerationRequest, SamplingParams
    from arlecli.engine.hf import HFEngine

    # Prompt lookup off: the bandwidth ceiling is a bound on plain decode steps.
    engine = HFEngine("", batch_size=batch, device=device, model_obj=model, tokenizer=tok, draft_tokens=0)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    requests = [GenerationRequest(messages=m, params=params) for m in prompts(rows)]
    sync(device)
    started = time.perf_counter()
    done = list(engine.generate(requests))
    sync(device)
    seconds = time.perf_counter() - started
    generated = sum(len(c.token_ids) for _, c in done)
    prompt_len = statistics.mean(len(c.prompt_token_ids) for _, c in done)
    return {
        "batch": batch,
        "rows": rows,
        "completed": len(done),
        "generated_tokens": generated,
        "mean_prompt_tokens": round(prompt_len, 1),
        "mean_completion_tokens": generated / len(done),
        "seconds": round(seconds, 4),
        "tokens_per_s": round(generated / seconds, 1),
    }


def raw_decode(model: Any, tok: Any, device: str, batch: int, max_tokens: int) -> dict[str, Any]:
    """A minimal greedy loop: prefill once, then forward + argmax per token (decode steps timed alone)."""
    import torch
    from transformers import DynamicCache

    texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in prompts(batch)]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    # transformers 5.24 renamed `past_key_values` to `cache`, as arle's engine handles too.
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **{kw: cache}
        )
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        pos = positions[:, -1:] + 1
        sync(device)
        started = time.perf_counter()
        for _ in range(max_tokens - 1):
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
            out = model(input_ids=nxt, attention_mask=mask, position_ids=pos, use_cache=True, **{kw: cache})
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            nxt.view(-1).tolist()  # what any engine does each step: the tokens to the host (one copy)
            pos = pos + 1
        sync(device)
        seconds = time.perf_counter() - started
    steps = max_tokens - 1
    return {
        "batch": batch,
        "decode_steps": steps,
        "prompt_tokens": ids.shape[1],
        "ms_per_step": round(1000 * seconds / steps, 3),
        "tokens_per_s": round(batch * steps / seconds, 1),
    }


def grpo_step(model: Any, tok: Any, device: str, quick: bool, work: Path) -> dict[str, Any]:
    """One timed TRL GRPO step (after one warm-up step), full fine-tune; skipped without trl."""
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        msg = f"skipped: {exc.name or exc} is not installed (pip install trl); the eval part ran without it"
        print(f"grpo: {msg}", file=sys.stderr)
        return {"skipped": msg}
    import torch
    from transformers import PrinterCallback, TrainerCallback

    gens, batch, max_len = (4, 8, 16) if quick else (8, 64, 128)
    rows = [{"prompt": m, "answer": "0"} for m in prompts(256)]

    def number(completions: list[Any], **_: Any) -> list[float]:
        return [float(str(c[-1]["content"] if isinstance(c, list) else c).strip().endswith("0")) for c in completions]

    steps: list[dict[str, Any]] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            sync(device)
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync(device)
            steps.append({"step": state.global_step, "seconds": time.perf_counter() - self.t})

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and steps and "completions/mean_length" in logs:
                steps[-1]["generated_tokens"] = logs["completions/mean_length"] * batch

    cuda = device.startswith("cuda")
    args = GRPOConfig(
        output_dir=str(work / "grpo"),
        max_steps=2,
        num_generations=gens,
        per_device_train_batch_size=batch,
        max_completion_length=max_len,
        temperature=1.0,
        beta=0.0,
        learning_rate=1e-6,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=1234,
        use_cpu=not cuda,
        bf16=cuda,
        gradient_checkpointing=True,
    )
    model.train()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=number,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[Timer()],
    )
    trainer.remove_callback(PrinterCallback)  # it prints every log dict; the Timer keeps what we need
    trainer.train()
    timed = steps[-1]
    out = {
        "num_generations": gens,
        "batch": batch,
        "max_completion_length": max_len,
        "full_finetune": True,
        "warmup_step_s": round(steps[0]["seconds"], 3),
        "seconds_per_step": round(timed["seconds"], 3),
        "generated_tokens_per_step": round(timed.get("generated_tokens", 0)),
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }
    if out["generated_tokens_per_step"]:
        out["generated_tokens_per_s"] = round(out["generated_tokens_per_step"] / timed["seconds"], 1)
    return out


# --------------------------------------------------------------------------------------
# Driver.
# --------------------------------------------------------------------------------------


def environment(device: str) -> dict[str, Any]:
    import torch
    import transformers

    env: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg": os.getloadavg(),
    }
    try:
        import trl

        env["trl"] = trl.__version__
    except ImportError:
        env["trl"] = None
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
    env["cpu"] = cpu_model()
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    p.add_argument("--quick", action="store_true", help="small shape and sizes (a CPU smoke test)")
    p.add_argument("--batches", type=int, nargs="+", help="batch sizes (default 1 16 64 256; quick 1 8)")
    p.add_argument("--max-tokens", type=int, help="tokens per completion (default 128; quick 12)")
    p.add_argument(
        "--bandwidth",
        type=float,
        help="memory bandwidth in bytes/s (default 4.8e12 on CUDA, none on CPU: no fraction then)",
    )
    p.add_argument("--no-grpo", action="store_true", help="skip the GRPO step")
    p.add_argument("--out", type=Path, help="result JSON (default perf/results/gpu.json; CPU: gpu_cpu_quick.json)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32  # CPUs here have no bf16 units
    shape = QUICK_SHAPE if args.quick else QWEN25_05B
    batches = args.batches or ([1, 8] if args.quick else [1, 16, 64, 256])
    max_tokens = args.max_tokens or (12 if args.quick else 128)
    bandwidth = args.bandwidth or (H200_BANDWIDTH if cuda else None)

    tok = build_tokenizer(shape["vocab_size"])
    model = build_model(shape, tok, device, dtype)
    dtype_bytes = torch.finfo(dtype).bits // 8
    n_params = sum(p.numel() for p in model.parameters())  # tied: the embedding counted once
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    weight_bytes = n_params * dtype_bytes
    kv_per_token = shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * head_dim * dtype_bytes
    env = environment(device)
    print(
        f"{env['date']}  {env.get('gpu') or env.get('cpu')}  torch {env['torch']}  transformers "
        f"{env['transformers']}  trl {env['trl']}",
        file=sys.stderr,
    )
    print(
        f"model: {n_params / 1e6:.1f}M params ({'Qwen2.5-0.5B' if not args.quick else 'quick'} shape), "
        f"{dtype}, {weight_bytes / 1e9:.3f} GB of weights; KV {kv_per_token} B/token",
        file=sys.stderr,
    )

    engine_eval(model, tok, device, batches[0], batches[0], 4)  # warm-up: CUDA context, kernels
    evals, raws = [], []
    for b in batches:
        rows = max(2 * b, 4)
        e = engine_eval(model, tok, device, b, rows, max_tokens)
        r = raw_decode(model, tok, device, b, max_tokens)
        for m, ctx in (
            (e, e["mean_prompt_tokens"] + e["mean_completion_tokens"] / 2),
            (r, r["prompt_tokens"] + max_tokens / 2),
        ):
            bound = bound_tokens_per_s(b, weight_bytes, kv_per_token, ctx, bandwidth)
            m["bound_tokens_per_s"] = round(bound, 1) if bound else None
            m["fraction_of_bandwidth_bound"] = round(m["tokens_per_s"] / bound, 4) if bound else None
        e["engine_vs_raw"] = round(e["tokens_per_s"] / r["tokens_per_s"], 3)
        evals.append(e)
        raws.append(r)
        print(
            f"batch {b:4d}: engine {e['tokens_per_s']:10.1f} tok/s   raw decode {r['tokens_per_s']:10.1f} tok/s "
            f"({r['ms_per_step']:.2f} ms/step)   bound {e['bound_tokens_per_s']}",
            file=sys.stderr,
            flush=True,
        )

    with tempfile.TemporaryDirectory(prefix="arle-perf-gpu-") as work:
        grpo = {"skipped": "--no-grpo"} if args.no_grpo else grpo_step(model, tok, device, args.quick, Path(work))

    result = {
        "title": "arle hf engine eval + one TRL GRPO step, Qwen2.5-0.5B shape, random weights",
        "command": " ".join(["PYTHONPATH=src python perf/gpu.py", *(sys.argv[1:] if argv is None else argv)]),
        "environment": env,
        "shape": shape,
        "dtype": str(dtype),
        "n_params": n_params,
        "weight_bytes": weight_bytes,
        "kv_bytes_per_token": kv_per_token,
        "bandwidth_bytes_per_s": bandwidth,
        "formula": "bound tokens/s = B * BW / (n_params * dtype_bytes + B * L * layers * 2 * kv_heads * "
        "head_dim * dtype_bytes), L = mean context length during decode",
        "max_tokens": max_tokens,
        "eval_engine": evals,
        "raw_decode": raws,
        "grpo": grpo,
    }
    print_table(result)
    out = args.out or ROOT / "perf" / "results" / ("gpu.json" if cuda else "gpu_cpu_quick.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")
    return result


def print_table(result: dict[str, Any]) -> None:
    env = result["environment"]
    print(
        f"\n{result['title']}\n{env['date']}  {env.get('gpu') or env.get('cpu')} ({env['cpu_cores']} CPU cores)  "
        f"torch {env['torch']}  transformers {env['transformers']}  trl {env['trl']}"
    )
    print(
        f"{result['n_params'] / 1e6:.1f}M params, {result['dtype']}, {result['max_tokens']} tokens per completion; "
        f"bandwidth {result['bandwidth_bytes_per_s']}"
    )
    print(
        f"\n{'batch':>5s} {'engine tok/s':>13s} {'raw tok/s':>11s} {'engine/raw':>10s} {'bound tok/s':>12s} "
        f"{'engine frac':>11s} {'raw frac':>9s}"
    )
    for e, r in zip(result["eval_engine"], result["raw_decode"]):
        print(
            f"{e['batch']:5d} {e['tokens_per_s']:13.1f} {r['tokens_per_s']:11.1f} {e['engine_vs_raw']:10.3f} "
            f"{e['bound_tokens_per_s'] or '-':>12} {e['fraction_of_bandwidth_bound'] or '-':>11} "
            f"{r['fraction_of_bandwidth_bound'] or '-':>9}"
        )
    print(f"\ngrpo: {json.dumps(result['grpo'])}")


# --------------------------------------------------------------------------------------
# Asynchronous RL on a GPU (`python perf/gpu.py async-rl`): not run yet (no GPU lent so far).
# --------------------------------------------------------------------------------------

# Qwen2.5-1.5B-Instruct's config.json values; the weights are random (the device machine has no
# model hub), which does not change what a step costs: random weights almost never emit EOS, so
# every completion runs to max_completion_length and every step generates the same tokens.
QWEN25_15B = {
    **QWEN25_05B,
    "hidden_size": 1536,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "intermediate_size": 8960,
}


def async_rl(argv: list[str] | None = None) -> int:
    """GRPO step time of `arle train --backend vllm --max-staleness 1` vs `--max-staleness 0` vs
    plain TRL's GRPOTrainer (its colocated vLLM), on a Qwen2.5-1.5B-shaped model, one GPU.

    Runs perf/train_async.py (the CPU comparison, same card, recipe, timers and table) with the
    model built here (bf16, random weights, saved to a folder) and GPU-sized settings: 8 prompts
    x 8 generations (batch 64), 256 tokens, LoRA r16 as the demo recipe sets, arle's vLLM colocated
    (its default share of the GPU), TRL with `use_vllm=True, vllm_mode="colocate"`.

    What it predicts: perf/README.md measured the update at 65-80% of a synchronous step (CPU);
    on a GPU, generation with vLLM is cheaper relative to the update still, so with one step of
    staleness the step should approach max(generation, update) ~= the update alone: async / sync
    ~ 0.65-0.8 (the idle trainer share near 0, the idle engine share = 1 - generation / update),
    and async / TRL below that, as TRL's colocated vLLM generates synchronously.
    Returns the child's exit status."""
    p = argparse.ArgumentParser(prog="perf/gpu.py async-rl", description=async_rl.__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8, help="steps per side (the first 2 and the last are not timed)")
    p.add_argument("--max-tokens", type=int, default=256, help="max_completion_length")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (x 8 generations)")
    p.add_argument("--out", type=Path, help="result JSON (default perf/results/gpu_async.json)")
    p.add_argument("--dry-run", action="store_true", help="print the command, build nothing")
    args = p.parse_args(argv)
    import subprocess

    out = args.out or ROOT / "perf" / "results" / "gpu_async.json"
    with tempfile.TemporaryDirectory(prefix="arle-perf-gpu-async-") as work:
        folder = Path(work) / "qwen2.5-1.5b-shape"
        cmd = [
            sys.executable,
            str(ROOT / "perf" / "train_async.py"),
            "--model",
            str(folder),
            "--steps",
            str(args.steps),
            "--trl-vllm",
            "--set",
            f"max_completion_length={args.max_tokens}",
            "--set",
            f"per_device_train_batch_size={8 * args.prompts}",
            "--set",
            "num_generations=8",
            "--set",
            "gradient_accumulation_steps=1",
            "--out",
            str(out),
        ]
        print(" ".join(cmd), file=sys.stderr)
        if args.dry_run:
            return 0
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("async-rl needs a CUDA GPU (and vllm: pip install arle[vllm])")
        tok = build_tokenizer(QWEN25_15B["vocab_size"])
        model = build_model(QWEN25_15B, tok, "cuda", torch.bfloat16)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        del model
        torch.cuda.empty_cache()
        path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    if sys.argv[1:2] == ["async-rl"]:
        raise SystemExit(async_rl(sys.argv[2:]))
    main()
