"""Options shared by several commands (declared once so their help and limits agree)."""

from __future__ import annotations

import typer

TENSOR_PARALLEL = typer.Option(
    1, "--tensor-parallel-size", min=1, help="vllm backend: GPUs (or CPU core groups) per model replica."
)
DATA_PARALLEL = typer.Option(
    1, "--data-parallel-size", min=1, help="vllm backend: model replicas, each in its own process."
)
GPU_MEMORY = typer.Option(
    0.9,
    "--gpu-memory-utilization",
    min=0.05,
    max=1.0,
    help="vllm backend: share of GPU memory for weights and KV cache.",
)
MAX_MODEL_LEN = typer.Option(
    None, "--max-model-len", min=1, help="vllm backend: context length (default: the model's)."
)
QUANTIZATION = typer.Option(
    None,
    "--quantization",
    help="vllm backend: vLLM's quantization method (fp8, awq, "
    "gptq, ...); a method this machine cannot run is refused in one line.",
)
DTYPE = typer.Option(
    None,
    "--dtype",
    help="Local weights on the hf or vllm backend: float32 (the CPU default: exact, batch-invariant), "
    "bfloat16 (the GPU default; opt-in on a CPU: faster where it has bf16 units, AMX or AVX512-BF16, "
    "and it changes the numbers, perf/README.md measures by how much) or float16.",
)
KV_CACHE_DTYPE = typer.Option(None, "--kv-cache-dtype", help="vllm backend: KV cache dtype (auto, fp8, ...).")
# Taken as text, without typer's min=: a bad value is arle's one-line error (config.check_*),
# not typer's usage screen.
REQUEST_TIMEOUT = typer.Option(
    None,
    "--request-timeout",
    metavar="SECONDS",
    help="Endpoints: deadline for one whole request attempt, however slowly the "
    "answer arrives (default: the profile's, else 600).",
)
MAX_RETRIES = typer.Option(
    None,
    "--max-retries",
    metavar="N",
    help="Endpoints: retries after a timeout, 429, 5xx or broken connection (default: the profile's, else 5).",
)
PRICE_INPUT = typer.Option(
    None,
    "--price-input",
    metavar="USD_PER_1M",
    help="USD per 1M prompt tokens: results.json then holds the run's cost and cost-of-pass (with --price-output).",
)
PRICE_OUTPUT = typer.Option(
    None, "--price-output", metavar="USD_PER_1M", help="USD per 1M completion tokens (with --price-input)."
)
# Reasoning models (arlecli/thinking.py, engine/phases.py).
THINK_TAGS = typer.Option(
    None,
    "--think-tags",
    metavar="TAGS",
    help="How the model delimits its thinking, e.g. '<think>,</think>' (default: the "
    "profile's, else the tokenizer's own tags, else <think>); none: never split.",
)
CHAT_TEMPLATE_KWARGS = typer.Option(
    None,
    "--chat-template-kwargs",
    metavar="KEY=VALUE",
    help="A switch of the model's chat template, e.g. enable_thinking=false "
    "(Qwen3); VALUE is a YAML scalar; repeatable; over the profile's.",
)
MAX_THINKING_TOKENS = typer.Option(
    None,
    "--max-thinking-tokens",
    min=1,
    metavar="N",
    help="A thinking model's thought per turn: at N tokens arle closes it and "
    "the model answers within --max-tokens (budget forcing; endpoints get "
    "vLLM's thinking_token_budget).",
)
