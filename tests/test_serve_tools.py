"""Function calling through `arle serve` (issue 25, item 1) with the official `openai` client over
loopback: the tiny model with Qwen2.5's tool template, its hf engine's output scripted where a
tool call is needed (random weights never write one). A tools round trip (the call parsed into
tool_calls, a `tool` message back, the next prompt rendering both), parallel calls, tool_choice
none / required / a named function, streaming, bad tools refused with a 400 naming the field,
and the parsers of the other families."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import openai
import pytest

from arlecli.serve import tools as serve_tools

from helpers.tool_model import TIME, WEATHER, build_tool_model, call_block, script_generate

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
BOTH = [{"role": "user", "content": "Weather and time in Paris, please."}]
CALL = call_block("get_weather", city="Paris")
TWO = call_block("get_weather", city="Paris") + "\n" + call_block("get_time", city="Paris")
SAID = "It is sunny in Paris."


def script(request) -> str | None:
    """What the scripted model writes: a call for the weather question, two for the other, a
    short answer once a tool result is in; the model's own gibberish for anything else."""
    messages = request.messages or []
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return SAID
    if last.get("content") == ASK[0]["content"]:
        return "Let me check.\n" + CALL
    if last.get("content") == BOTH[0]["content"]:
        return TWO
    return None


@pytest.fixture(scope="module")
def api(tiny_model, tmp_path_factory):
    from arlecli.engine.hf import HFEngine
    from arlecli.serve.app import create_app
    from arlecli.serve.server import BackgroundServer

    model = build_tool_model(tiny_model, tmp_path_factory.mktemp("tools") / "model")
    with pytest.MonkeyPatch.context() as mp:
        script_generate(mp, HFEngine, script)
        engine = HFEngine(str(model), batch_size=4)
        with BackgroundServer(create_app(engine, model_name="tiny")) as srv:
            yield openai.OpenAI(base_url=srv.base_url, api_key="local", max_retries=0), engine.tokenizer
        engine.close()


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=256, extra_body={"return_token_ids": True}, **kwargs
    )


def test_a_tools_round_trip(api):
    """The call comes back parsed (ids, JSON arguments, the text outside it as content,
    finish_reason tool_calls); the assistant message with its call and the `tool` message sent
    back are rendered by the template into the next prompt, whose reply is plain text."""
    client, tok = api
    first = ask(client, ASK, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    prompt = tok.decode(first.model_extra["prompt_token_ids"])
    assert "# Tools" in prompt and '"name": "get_weather"' in prompt  # the template rendered the tools

    history = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "22 C, sunny"},
    ]
    second = ask(client, history, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == SAID
    assert not second.choices[0].message.tool_calls
    prompt = tok.decode(second.model_extra["prompt_token_ids"])
    assert "<|im_start|>assistant\nLet me check.\n" + CALL + "<|im_end|>" in prompt
    assert "<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_parallel_calls_and_a_named_choice(api):
    client, tok = api
    reply = ask(client, BOTH, tools=[WEATHER, TIME]).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in reply.message.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"city": "Paris"}),
    ]
    assert len({c.id for c in reply.message.tool_calls}) == 2
    # parallel_tool_calls false keeps the first; a named function keeps that function's calls.
    one = ask(client, BOTH, tools=[WEATHER, TIME], parallel_tool_calls=False).choices[0].message.tool_calls
    assert [c.function.name for c in one] == ["get_weather"]
    named = ask(client, BOTH, tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [c.function.name for c in named.choices[0].message.tool_calls] == ["get_time"]
    # The server started the reply inside that function's call: the model wrote its arguments.
    assert tok.decode(named.model_extra["prompt_token_ids"]).endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_time", "arguments": '
    )
    assert named.usage.completion_tokens == len(tok('{"city": "Paris"}}\n</tool_call>')["input_ids"]) + 1


def test_tool_choice_none_and_required(api):
    client, tok = api
    plain = ask(client, ASK, tools=[WEATHER], tool_choice="none").choices[0]
    assert plain.finish_reason == "stop" and not plain.message.tool_calls
    assert plain.message.content == "Let me check.\n" + CALL  # not parsed: the text as written
    required = ask(client, ASK, tools=[WEATHER], tool_choice="required")
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
    assert choice.message.content is None  # the reply started inside the call: no text before it
    assert tok.decode(required.model_extra["prompt_token_ids"]).endswith('assistant\n<tool_call>\n{"name": "')
    # Without tools nothing is parsed, whatever the model writes.
    assert not ask(client, ASK).choices[0].message.tool_calls


def test_the_call_streams_as_a_tool_calls_delta(api):
    client, _ = api
    chunks = list(
        client.chat.completions.create(model="tiny", messages=BOTH, tools=[WEATHER, TIME], stream=True, max_tokens=256)
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:  # accumulated as clients of vLLM's deltas do
                entry = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += d.id or ""
                entry["name"] += (d.function.name or "") if d.function else ""
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"city": "Paris"}),
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())


@pytest.mark.parametrize(
    "field, value, param, words",
    [
        ("tools", [{"type": "function", "function": {"name": "bad name!"}}], "tools", "function.name"),
        ("tools", [{"type": "web_search"}], "tools", "only function tools"),
        (
            "tools",
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            "tools",
            "JSON Schema object",
        ),
        ("tools", [WEATHER, WEATHER], "tools", "given twice"),
        ("tool_choice", {"type": "function", "function": {"name": "get_time"}}, "tool_choice", "not among"),
        ("tool_choice", "sometimes", "tool_choice", "tool_choice"),
        ("functions", [{"name": "f"}], "functions", "deprecated"),
    ],
)
def test_bad_tools_are_a_400_naming_the_field(api, field, value, param, words):
    client, _ = api
    extra = {} if field == "tools" else {"tools": [WEATHER]}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, extra_body={field: value, **extra})
    assert err.value.status_code == 400 and err.value.body["param"] == param and words in err.value.body["message"]


def test_a_bad_call_in_history_is_a_400(api):
    client, _ = api
    bad = {
        "role": "assistant",
        "tool_calls": [{"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}],
    }
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, [*ASK, bad, {"role": "tool", "tool_call_id": "x", "content": "?"}], tools=[WEATHER])
    assert "arguments is not valid JSON" in err.value.body["message"]


def test_the_parsers_of_each_family_and_how_one_is_chosen():
    assert serve_tools.parse("hermes", "hi " + CALL) == serve_tools.Parsed("hi ", [("get_weather", {"city": "Paris"})])
    assert serve_tools.parse("hermes", "<tool_call>{oops</tool_call>").calls == []  # not a call: content
    llama = (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", '
        '"parameters": {"city": "Rome"}}'
    )
    assert serve_tools.parse("llama3_json", llama) == serve_tools.Parsed(
        "", [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Rome"})]
    )
    assert serve_tools.parse("llama3_json", "The answer is 4.").calls == []
    for parser, start in (("hermes", "<tool_call>"), ("llama3_json", '{"a": '), ("mistral", "[TOOL_CALLS]")):
        assert serve_tools.parse(parser, start + "[" * 100_000).calls == []  # model text nested deep: no call
    mistral = 'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    assert serve_tools.parse("mistral", mistral) == serve_tools.Parsed("Sure. ", [("get_weather", {"city": "Paris"})])

    class Tok:
        def __init__(self, template: str) -> None:
            self.chat_template = template

    assert serve_tools.parser_for(Tok("{{ '[TOOL_CALLS]' }}")) == "mistral"
    assert serve_tools.parser_for(Tok("{{ '<|python_tag|>' }}")) == "llama3_json"
    assert serve_tools.parser_for(Tok("<tool_call>")) == "hermes"
    assert serve_tools.parser_for(Tok("[TOOL_CALLS]"), "hermes") == "hermes"  # --tool-call-parser wins


def test_an_unknown_tool_call_parser_is_a_one_line_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "arlecli", "serve", "--tool-call-parser", "bogus", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
        cwd=tmp_path,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "--tool-call-parser bogus" in lines[0] and "hermes" in lines[0]


def test_tools_over_an_engine_without_a_template_are_a_400():
    """An endpoint engine sends text and gets text back: its calls would be lost, so tools are refused."""
    from arlecli.engine.base import Completion
    from arlecli.serve.app import create_app
    from arlecli.serve.server import BackgroundServer

    class Remote:
        name = "openai"

        def generate(self, requests):
            for i, _ in enumerate(requests):
                yield i, Completion("hi")

        def close(self) -> None:
            pass

    with BackgroundServer(create_app(Remote(), model_name="tiny")) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="local", max_retries=0)
        assert client.chat.completions.create(model="tiny", messages=ASK).choices[0].message.content == "hi"
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny", messages=ASK, tools=[WEATHER])
        assert err.value.body["param"] == "tools" and "openai engine" in err.value.body["message"]
