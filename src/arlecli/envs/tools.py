"""The tool-use env: the model calls typed Python tools over several turns, then answers.

Tools are plain typed Python functions with a Google-style docstring (their JSON schema
comes from transformers' `get_json_schema`, the format chat templates take). A tool is
registered with `@register_tool("name")` as a factory `(task) -> function`, so a tool can close
over the row it serves (a search over the row's own paragraphs); stateless tools ignore the
task. A card names tools by registered name, or as "module:attr" / "file.py:attr" (relative
to the card), where attr is a plain typed function (the tool itself) or a decorated factory;
a package adds tools through `arle.tools` entry points (arlecli/plugins.py).

Tool-call format: where the model's chat template has a tool format of its own (Qwen2.5,
Llama 3.1, ...), the schemas go to the template and results come back as `tool` messages.
Otherwise (the text fallback) the system prompt lists the schemas and asks for

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12 * 7"}}
    </tool_call>

(the Hermes format, which is also what Qwen2.5 writes natively), and results come back as
a user message of `<tool_response>...</tool_response>` blocks. Either way a turn with tool
calls gets their results and the episode goes on; a turn without one is the final answer.
A malformed call, an unknown tool or a tool that raises becomes an error result the model
can read (counted in the episode's info), never a crash; running out of turns ends the
episode with reason "turn_limit".

    env: {name: tools, params: {tools: [calculator, python], max_turns: 5}}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from arlecli import safeio
from arlecli.envs import Step, register_env
from arlecli.cards import render_prompt
from arlecli.errors import ParamError, UserError
from arlecli.plugins import Registry
from arlecli.types import Task

ToolFactory = Callable[[Task], Callable[..., Any]]


def _as_factory(obj: Any, name: str) -> ToolFactory:
    # A decorated factory stays one; a plain typed function named by "module:attr", a file or
    # an entry point is the tool itself, the same for every task.
    if getattr(obj, "__arle_tool__", False):
        return obj
    return lambda task: obj


TOOLS: Registry[ToolFactory] = Registry("tools", "tool", builtin=["arlecli.envs.*"], wrap=_as_factory)
MAX_RESULT_CHARS = 2000  # a tool result longer than this is clipped: it all goes back into the context

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

TEXT_FALLBACK = (
    "You can call these tools:\n<tools>\n{schemas}\n</tools>\n\n"
    "To call a tool, write a block like this (one block per call):\n"
    '<tool_call>\n{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}\n</tool_call>\n'
    "The results come back in <tool_response></tool_response> blocks. "
    "When you know the answer, reply without a tool call."
)


def register_tool(name: str | None = None, *, runs_code: bool = False) -> Callable[[ToolFactory], ToolFactory]:
    """Register a tool factory `(task) -> typed function` under `name` (default: its own).
    `runs_code` says the tool runs programs in the sandbox (a card that offers it has the
    sandbox's isolation checked before generation)."""

    def deco(factory: ToolFactory) -> ToolFactory:
        factory.__arle_tool__ = True  # type: ignore[attr-defined]
        factory.__arle_runs_code__ = runs_code  # type: ignore[attr-defined]
        TOOLS.add(name or factory.__name__, factory)
        return factory

    return deco


def tool_names() -> list[str]:
    """The registered tools (arle's, decorated in imported modules, entry points)."""
    return TOOLS.names()


def get_tool(name: str, task: Task, base: Path | None = None) -> Callable[..., Any]:
    """The tool `name` (a registered name, "module:attr" or "file.py:attr" relative to `base`),
    bound to `task`."""
    return TOOLS.get(name, base)(task)


def tool_runs_code(name: str, base: Path | None = None) -> bool:
    """Whether tool `name` runs programs in the sandbox (`@register_tool(runs_code=True)`)."""
    return bool(getattr(TOOLS.get(name, base), "__arle_runs_code__", False))


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The chat-template JSON schema of a typed, documented function."""
    from transformers.utils import get_json_schema

    return get_json_schema(fn)


@dataclass
class ToolCall:
    """One parsed call, or the reason it could not be parsed."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>{json}</tool_call>` block of `text` (an unclosed last block too)."""
    calls = []
    for body in _CALL.findall(text):
        try:
            data = safeio.loads(body.strip())  # model text: "[[[[..." 100k deep is a bad call, not a RecursionError
        except ValueError as exc:
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            calls.append(ToolCall(None, error=f"the tool call is not valid JSON ({why})"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall(None, error='a tool call needs {"name": ..., "arguments": {...}}'))
            continue
        args = data.get("arguments", data.get("parameters", {}))
        if isinstance(args, str):  # some models double-encode the arguments
            try:
                args = safeio.loads(args)
            except ValueError:
                pass
        if not isinstance(args, dict):
            calls.append(ToolCall(data["name"], error="the tool call's arguments must be a JSON object"))
            continue
        calls.append(ToolCall(data["name"], args))
    return calls


def split_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """`text` without its `<tool_call>` blocks, and the calls they hold (parse_tool_calls):
    what `arle serve` answers as `content` and `tool_calls` (serve/tools.py, the hermes parser)."""
    return _CALL.sub("", text), parse_tool_calls(text)


def call_tool(tools: dict[str, Callable[..., Any]], call: ToolCall) -> tuple[str, bool]:
    """Run one call; returns (result text, ok). Every failure is a readable result."""
    if call.error is not None:
        return f"error: {call.error}", False
    fn = tools.get(call.name or "")
    if fn is None:
        return f"error: unknown tool '{call.name}'; available: {', '.join(tools)}", False
    try:
        result = fn(**call.arguments)
    except TypeError as exc:
        return f"error: bad arguments for {call.name}: {exc}", False
    except Exception as exc:  # the tool's own failure is the model's information, not our crash
        return f"error: {type(exc).__name__}: {exc}", False
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"... [{len(text) - MAX_RESULT_CHARS} more characters]"
    return text, True


class ToolEnv:
    """The card's prompt, then tool calls and results until the model answers."""

    def __init__(
        self,
        card: Any,
        task: Task,
        exemplars: list[Task],
        native_tools: bool,
        tools: list[str],
        max_turns: int = 5,
        system: str | None = None,
    ) -> None:
        if not tools:
            raise UserError(f"{card.name}: env 'tools' needs params.tools, e.g. [calculator]")
        base = Path(card.path).parent if getattr(card, "path", None) else None
        functions = [get_tool(name, task, base) for name in tools]
        # The model calls a tool by its function's name ("search"), not by how the card named it.
        self.functions = {fn.__name__: fn for fn in functions}
        self.schemas = [tool_schema(fn) for fn in self.functions.values()]
        self.native = native_tools
        self.tools = self.schemas if native_tools else None
        self.max_turns = max_turns
        self.card, self.task, self.exemplars, self.system = card, task, exemplars, system
        self.calls = self.errors = 0

    def reset(self) -> list[dict[str, Any]]:
        rendered = render_prompt(self.card.prompt, self.task, self.exemplars)
        if isinstance(rendered, str):
            raise UserError(f"{self.card.name}: env 'tools' needs a chat card (prompt.format: chat)")
        messages = list(rendered)
        guide = [] if self.native else [TEXT_FALLBACK.format(schemas="\n".join(json.dumps(s) for s in self.schemas))]
        system = "\n\n".join(p for p in [self.system or "", *guide] if p)
        if system:
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": messages[0]["content"] + "\n\n" + system}
            else:
                messages.insert(0, {"role": "system", "content": system})
        return messages

    def step(self, completion: str) -> Step:
        calls = parse_tool_calls(completion)
        if not calls:
            return Step(done=True, reason="answered")
        results = []
        for call in calls:
            text, ok = call_tool(self.functions, call)
            self.calls += 1
            self.errors += not ok
            results.append((call.name or "invalid", text))
        if self.native:
            return Step([{"role": "tool", "name": name, "content": text} for name, text in results])
        body = "\n".join(f"<tool_response>\n{text}\n</tool_response>" for _, text in results)
        return Step([{"role": "user", "content": body}])

    def info(self) -> dict[str, Any]:
        return {"tool_calls": self.calls, "tool_errors": self.errors}


def check_params(params: dict[str, Any], base: Path | None = None) -> None:
    """Each tool a card's `tools` env names must load (an unknown name suggests near ones)."""
    tools = params.get("tools")
    for i, spec in enumerate(tools if isinstance(tools, list) else []):
        try:
            TOOLS.get(str(spec), base)
        except UserError as exc:
            raise ParamError(f"tools[{i}]", str(exc)) from None


@register_env("tools", check=check_params)
def tools_env(card: Any, task: Task, exemplars: list[Task], native_tools: bool, **params: Any) -> ToolEnv:
    """Env factory for `env: {name: tools, params: {tools: [...], max_turns: N, system: ...}}`."""
    return ToolEnv(card, task, exemplars, native_tools, **params)


# Built-in tools ---------------------------------------------------------------------------


@register_tool("calculator")
def _calculator(task: Task) -> Callable[..., Any]:
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers with + - * / and brackets, e.g. "(12 + 30) * 1.5".
        """
        from arlecli.rewards.procedural import safe_arithmetic

        value, _ = safe_arithmetic(_decimal_literals(expression))
        return str(int(value)) if value.denominator == 1 else f"{float(value):.10g}"

    return calculator


def _decimal_literals(expression: str) -> str:
    # safe_arithmetic takes integer literals only: 1.5 becomes (15/10), exactly.
    def exact(m: re.Match[str]) -> str:
        whole, frac = m.group(1), m.group(2)
        return f"({whole}{frac}/{10 ** len(frac)})"

    return re.sub(r"(\d+)\.(\d+)", exact, expression.replace(",", ""))


@register_tool("python", runs_code=True)
def _python(task: Task) -> Callable[..., Any]:
    def python(code: str) -> str:
        """Run Python code in a sandbox (no network, 10 s, 512 MB) and return what it prints.

        Args:
            code: A complete Python program; print() the values you need.
        """
        from arlecli.sandbox import run_program

        # numpy and sympy when installed: what a model reaches for to compute; nothing else
        # of site-packages (no data a card reads its answers from) is visible.
        result = run_program(code, timeout_s=10.0, memory_mb=512, packages=("numpy", "sympy"))
        out = result.stdout.strip()
        if result.status != "passed":
            err = result.stderr.strip().splitlines()[-1:] or [result.status]
            return (out + "\n" if out else "") + f"error ({result.status}): {err[0]}"
        return out or "(no output; print() what you need)"

    return python
