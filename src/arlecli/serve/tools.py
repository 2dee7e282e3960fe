"""Function calling in `arle serve` and the recording gateway, as vLLM's server does it.

A chat request's `tools` (OpenAI's `{"type": "function", "function": {name, description,
parameters}}`) go to the model's chat template (its `tools=` argument: Qwen2.5's, Llama 3.1's
and Mistral's templates each render them their own way), and earlier turns come back as
assistant messages with `tool_calls` (their JSON `arguments` handed to the template as objects,
as vLLM does) and `tool` messages. What the model writes is taken apart by a tool-call parser,
chosen per model family:

    hermes        <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call
                  (Qwen2/2.5/3, SmolLM3, Hermes; the format arle's own tool env asks for, parsed
                  by the same function, envs.tools.parse_tool_calls)
    llama3_json   {"name": ..., "parameters": {...}} objects, `;`-separated, after an optional
                  <|python_tag|> (Llama 3.1/3.2)
    mistral       [TOOL_CALLS] then a JSON list of {"name", "arguments"} (Mistral 7B v0.3, Nemo)

`arle serve --tool-call-parser NAME` (vllm serve's flag) picks one; without it the chat template
decides (`[TOOL_CALLS]` in it: mistral; `<|python_tag|>`: llama3_json; else hermes).

A reply with calls answers `message.tool_calls` (ids `call_...`, arguments as a JSON string),
`content` the text outside the calls (null when there is none) and `finish_reason: "tool_calls"`.
`tool_choice`: "auto" (the default) parses; "none" leaves the text as content (the tools are
still rendered, as vLLM does by default); "required" and a named function start the reply inside
a call: arle writes the call's opening after the generation prompt (`<tool_call>\n{"name": "`, and
for a named function its name and `"arguments": `; `forced_start`), so the model goes on with a
name or the arguments. Decoding is not constrained beyond that (vLLM's guided decoding is not
used): arguments that are not valid JSON make no call, and the reply comes back as content. A
named choice keeps only that function's calls; `parallel_tool_calls: false` keeps the first.
A malformed call (bad JSON) is not a call: the whole text comes back as content, as vLLM's
parsers answer.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from arlecli.errors import UserError

PARSERS = ("hermes", "llama3_json", "mistral")
TOOL_CHOICES = ("none", "auto", "required")
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class ToolRequestError(ValueError):
    """A bad `tools` / `tool_choice` / tool message field; protocol.py answers it as a 400."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolRequest:
    """A chat request's function-calling fields, validated: `tools` as the template takes them,
    `choice` "none" | "auto" | "required" | a function's name, `parallel` False keeps one call."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    choice: str = "auto"
    named: bool = False
    parallel: bool = True

    @property
    def parses(self) -> bool:
        """Whether replies are searched for calls."""
        return bool(self.tools) and self.choice != "none"


# ------------------------------------------------------------------------------ requests


def parse_tool_request(body: dict[str, Any]) -> ToolRequest | None:
    """The function-calling fields of a chat body (None: it has none); ToolRequestError names
    the bad field."""
    for old in ("functions", "function_call"):
        if body.get(old) is not None:
            raise ToolRequestError(
                f"`{old}` (the deprecated function-calling API) is not supported by arle serve; "
                "send `tools` and `tool_choice`",
                old,
            )
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise ToolRequestError("`parallel_tool_calls` must be true or false", "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise ToolRequestError("`tool_choice` needs `tools`", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ToolRequestError('`tools` must be a list of {"type": "function", "function": {...}} objects', "tools")
    clean = [_tool(i, t) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in clean]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ToolRequestError(f"tools: the function name {dup!r} is given twice", "tools")
    named = False
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise ToolRequestError(
                '`tool_choice` must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
                "tool_choice",
            )
        if name not in names:
            raise ToolRequestError(
                f"tool_choice names the function {name!r}, which is not among `tools` ({', '.join(names)})",
                "tool_choice",
            )
        choice, named = name, True
    elif choice not in TOOL_CHOICES:
        raise ToolRequestError(
            '`tool_choice` must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    return ToolRequest(clean, choice, named, parallel is not False)


def _tool(i: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise ToolRequestError(f'{where} must be an object {{"type": "function", "function": {{...}}}}', "tools")
    if tool.get("type") != "function":
        raise ToolRequestError(
            f"{where}: only function tools (`type: function`) are supported by arle serve, not {tool.get('type')!r}",
            "tools",
        )
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise ToolRequestError(f"{where}.function must be an object with a `name`", "tools")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ToolRequestError(f"{where}.function.name must be 1-64 letters, digits, `_`, `.` or `-`", "tools")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise ToolRequestError(f"{where}.function.description must be a string", "tools")
    params = fn.get("parameters")
    if params is not None and not (isinstance(params, dict) and params.get("type", "object") == "object"):
        raise ToolRequestError(
            f'{where}.function.parameters must be a JSON Schema object ({{"type": "object", "properties": {{...}}}})',
            "tools",
        )
    if params is not None:
        from arlecli.serve.response_format import ResponseFormatError, check_schema

        try:  # the schema goes to the chat template and, on vllm, to guided decoding: held as a response format is
            check_schema(params, f"{where}.function.parameters")
        except ResponseFormatError as exc:
            raise ToolRequestError(str(exc), "tools") from None
    if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
        raise ToolRequestError(f"{where}.function.strict must be true or false", "tools")
    out = {k: v for k, v in fn.items() if k in ("name", "description", "parameters", "strict")}
    return {"type": "function", "function": out}


def message_tool_calls(i: int, calls: Any) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls`, validated, with each call's JSON `arguments` as the
    object it encodes: what chat templates render (`arguments | tojson`), as vLLM hands them."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise ToolRequestError(f"{where} must be a list", "messages")
    out = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise ToolRequestError(
                f'{where}[{k}] must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}', "messages"
            )
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            from arlecli import safeio

            try:  # safeio: a client's "[[[[..." 100k deep is a 400, not a RecursionError
                args = safeio.loads(args) if args.strip() else {}
            except ValueError:
                raise ToolRequestError(f"{where}[{k}].function.arguments is not valid JSON", "messages") from None
        entry: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if isinstance(call.get("id"), str):
            entry = {"id": call["id"], **entry}
        out.append(entry)
    return out


def same_calls(sent: list[dict[str, Any]], made: list[dict[str, Any]]) -> bool:
    """Whether the calls an agent sent back (message_tool_calls) are the ones a reply made
    (as answered: arguments a JSON string): same functions, same arguments, in order."""

    def key(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        out = []
        for c in calls:
            args = c["function"]["arguments"]
            out.append((c["function"]["name"], json.loads(args) if isinstance(args, str) else args))
        return out

    try:
        return key(sent) == key(made)
    except (KeyError, TypeError, ValueError):
        return False


# ------------------------------------------------------------------------------ parsers


@dataclass
class Parsed:
    """What a parser found: the text outside the calls and each call's (name, arguments)."""

    content: str
    calls: list[tuple[str, dict[str, Any]]]


def _hermes(text: str) -> Parsed:
    from arlecli.envs.tools import split_tool_calls

    outside, calls = split_tool_calls(text)
    return Parsed(outside, [(c.name, c.arguments) for c in calls if c.error is None and c.name])


def _json_calls(body: str, arg_keys: tuple[str, ...]) -> list[tuple[str, dict[str, Any]]] | None:
    """Calls in a JSON object or list of objects (None: not that)."""
    from arlecli import safeio

    try:
        data = safeio.loads(body)
    except ValueError:
        return None
    items = data if isinstance(data, list) else [data]
    out = []
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)):
            return None
        args: Any = next((item[k] for k in arg_keys if k in item), {})
        if isinstance(args, str):
            try:
                args = safeio.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        out.append((item["name"], args))
    return out


def _llama3_json(text: str) -> Parsed:
    # vLLM's Llama3JsonToolParser: the reply is the calls (after <|python_tag|>), `;`-separated.
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return Parsed(text, [])
    calls: list[tuple[str, dict[str, Any]]] = []
    decoder = json.JSONDecoder()
    at = 0
    while at < len(body):
        try:
            obj, end = decoder.raw_decode(body, at)
        except (ValueError, RecursionError):  # model text: "[[[[..." 100k deep is no call, not a crash
            return Parsed(text, [])
        found = _json_calls(json.dumps(obj), ("parameters", "arguments"))
        if not found:
            return Parsed(text, [])
        calls += found
        at = end
        while at < len(body) and body[at] in " \n\t;":
            at += 1
    return Parsed("", calls)


def _mistral(text: str) -> Parsed:
    # vLLM's MistralToolParser (pre-v11 tokenizers): content, then [TOOL_CALLS] and a JSON list.
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return Parsed(text, [])
    found = _json_calls(text[start + len("[TOOL_CALLS]") :].strip(), ("arguments", "parameters"))
    return Parsed(text[:start], found) if found else Parsed(text, [])


_PARSE: dict[str, Callable[[str], Parsed]] = {"hermes": _hermes, "llama3_json": _llama3_json, "mistral": _mistral}


def check_parser(name: str | None) -> str | None:
    """`name` if it is a known parser (None: chosen by the template); a UserError otherwise."""
    if name is not None and name not in PARSERS:
        raise UserError(
            f"--tool-call-parser {name}: not a tool-call parser arle knows; use one of {', '.join(PARSERS)}"
        )
    return name


def parser_for(tokenizer: Any, name: str | None = None) -> str:
    """The tool-call parser for a model: `name` when given, else the one its chat template's
    tool format calls for (see the module docstring)."""
    if name is not None:
        return check_parser(name) or "hermes"
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = "\n".join(t for t in template.values() if isinstance(t, str))
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template:
        return "llama3_json"
    return "hermes"


def parse(parser: str, text: str) -> Parsed:
    """`text` (a reply's answer) taken apart by `parser`."""
    return _PARSE[parser](text)


def forced_start(request: ToolRequest | None, parser: str) -> str:
    """The start of a call that arle writes after the generation prompt when the request needs one
    (`tool_choice` "required": the call's opening up to the function's name; a named function: up
    to its arguments), so the model goes on from inside a call; "" when nothing is forced. The
    forced text is part of the prompt (its ids carry no loss in training) and of the reply parsed."""
    if request is None or not request.parses or request.choice == "auto":
        return ""
    head = {"hermes": '<tool_call>\n{"name": "', "llama3_json": '{"name": "', "mistral": '[TOOL_CALLS] [{"name": "'}[
        parser
    ]
    if not request.named:
        return head
    return f'{head}{request.choice}", "{"parameters" if parser == "llama3_json" else "arguments"}": '


def new_call_id() -> str:
    """A tool call id in OpenAI's style."""
    return f"call_{uuid.uuid4().hex[:24]}"


def with_calls(reply: Any, request: ToolRequest | None, parser: str) -> Any:
    """`reply` (a reasoning.Reply) with the calls its answer holds taken out: `answer` the text
    outside them, `tool_calls` in the response's shape, `written` the answer as written. Unchanged
    when the request parses no calls or the answer holds none."""
    if request is None or not request.parses:
        return reply
    found = parse(parser, reply.answer)
    calls = found.calls
    if request.named:
        calls = [c for c in calls if c[0] == request.choice]
    if not request.parallel:
        calls = calls[:1]
    if not calls:
        return reply
    shaped = tuple(
        {
            "id": new_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }
        for name, args in calls
    )
    return replace(reply, answer=found.content.strip(), tool_calls=shaped, written=reply.answer)


def stream_calls(calls: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """A reply's calls as one streamed `delta.tool_calls` (each with its index, id, name and the
    whole arguments), which clients accumulate as they do vLLM's deltas."""
    return [{"index": k, **call} for k, call in enumerate(calls)]
