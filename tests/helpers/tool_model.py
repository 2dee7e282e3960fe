"""The tiny model with a tool-calling chat template (Qwen2.5's, verbatim in what it renders), and
a scripted `generate` for the hf and vLLM engines: the tiny model's random weights never write a
tool call, so tests script the turns that must call one (as scripted_engine.py does): any reply
(script_generate) or math_tool's first turn, a calculator CALL (first_turn_calls_a_tool). Also a
shorter tool template (tool_template_model)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

# Qwen2.5-Instruct's chat template: tools listed in the system turn, assistant tool calls as
# `<tool_call>` blocks (arguments rendered with tojson), tool results as a user turn of
# `<tool_response>` blocks.
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'
    'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}'
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

ROOT = Path(__file__).resolve().parents[2]
GSM8K_ROWS = str(ROOT / "benchmarks" / "fixtures" / "gsm8k.jsonl")  # math_tool's rows, offline
# The calculator call the scripted first turn of a math_tool episode makes (first_turn_calls_a_tool).
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "14 + 9 - 17"}}\n</tool_call>'

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def call_block(name: str, **arguments: Any) -> str:
    """One call as a Qwen model writes it (and as its template renders it back)."""
    import json

    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def build_tool_model(tiny_model: Path, out: Path) -> Path:
    """A copy of the tiny model folder whose tokenizer has QWEN_TOOLS_TEMPLATE."""
    from transformers import AutoTokenizer

    if out.exists():
        return out
    shutil.copytree(tiny_model, out)
    tok = AutoTokenizer.from_pretrained(str(out))
    tok.chat_template = QWEN_TOOLS_TEMPLATE
    tok.save_pretrained(str(out))
    return out


def tool_template_model(tiny_model: Path, folder: Path) -> Path:
    """The tiny model with a chat template that renders tool schemas and tool results (as
    Qwen2.5's does), so the tools env passes its tools natively."""
    from transformers import AutoTokenizer

    shutil.copytree(tiny_model, folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.chat_template = (
        "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
        "{% endif %}{% for m in messages %}{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n"
        "{{ m['content'] }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok.save_pretrained(str(folder))
    return folder


def first_turn_calls_a_tool(monkeypatch, engine_class: Any = None, latency_s: float | None = None) -> None:
    """Make the engine's (default: hf's) first turn of every episode the fixed tool call CALL
    (with the ids the model would have produced for it, and `latency_s` as its time where given);
    later turns are the model's own."""
    from arlecli.engine import hf
    from arlecli.engine.base import Completion

    engine_class = engine_class or hf.HFEngine
    original = engine_class.generate

    def generate(self, requests):
        first = [i for i, r in enumerate(requests) if not any(m["role"] == "assistant" for m in r.messages)]
        for i in first:
            ids = self.tokenizer(CALL, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            yield i, Completion(CALL, ids, self.encode(requests[i]), [0.0] * len(ids), latency_s=latency_s)
        rest = [i for i in range(len(requests)) if i not in first]
        for j, comp in original(self, [requests[i] for i in rest]):
            yield rest[j], comp

    monkeypatch.setattr(engine_class, "generate", generate)


def script_generate(monkeypatch: Any, engine_class: Any, reply: Callable[[Any], str | None]) -> None:
    """`engine_class.generate` answers a request with `reply(request)` when that gives a text (the
    ids a model that writes it then EOS would produce, logprob -1 each; after a reply the prompt
    already started, its rest), else with the model's own."""
    from arlecli.engine.base import Completion, cut_at_stop

    original = engine_class.generate

    def generate(self, requests, then=None, **hooks):
        # `then` and any other per-request hook (a streaming engine's on_tokens) name requests by
        # index: the model's own requests are renumbered for the original generate.
        def renumbered(fn):
            return (lambda j, *rest: fn(own[j], *rest)) if callable(fn) else fn

        own = []
        for i, request in enumerate(requests):
            text = reply(request)
            if text is None:
                own.append(i)
                continue
            # A reply the server started for the model (a forced call opening) goes on from there.
            prompt = self.tokenizer.decode(self.encode(request))
            started = prompt.rsplit("<|im_start|>assistant\n", 1)[-1] if "<|im_start|>assistant\n" in prompt else ""
            if started and started in text:
                text = text[text.index(started) + len(started) :]
            full = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
            ids = full[: request.params.max_tokens]
            why = "stop" if len(ids) == len(full) else "length"
            text = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), request.params.stop)
            if callable(hooks.get("on_tokens")):
                hooks["on_tokens"](i, list(ids))
            yield (
                i,
                Completion(
                    text, ids, self.encode(request), [-1.0] * len(ids) if request.params.logprobs else None, why
                ),
            )
        if own:
            extra = {k: renumbered(v) for k, v in hooks.items()}
            for j, comp in original(self, [requests[i] for i in own], then=renumbered(then), **extra):
                yield own[j], comp

    monkeypatch.setattr(engine_class, "generate", generate)
    if getattr(engine_class, "admits", False):
        # Requests joining a running call (generate(more=...)) come with the caller's own indices,
        # which the renumbering above cannot mix with; the scripted engine serves one call at a time.
        monkeypatch.setattr(engine_class, "admits", False)
