"""BFCL, the Berkeley Function Calling Leaderboard (bfcl-eval 2026.3.23): its categories, the
decoding of a model's function calls, and bfcl-eval's own AST checker's verdict on them.

The verdict is bfcl-eval's: `judge` walks the steps of its eval runner for one entry
(`_evaluate_single_ast_entry`, `_evaluate_single_relevance_entry` in
bfcl_eval/eval_checker/eval_runner.py) and calls bfcl-eval's own functions for each:
`is_function_calling_format_output` and `is_empty_output` (bfcl_eval.utils) and
`ast_checker` (bfcl_eval.eval_checker.ast_eval.ast_checker). Nothing of the checker is
re-implemented. The runner module itself is not imported: it pulls in every model handler
and so the API clients (openai, anthropic, mistralai, ...).

Decoding is the one part arle does itself, because BFCL's Python decoder runs model text:
`bfcl_eval.model_handler.utils.resolve_ast_by_type` calls `eval(ast.unparse(node))` on any
binary operation in an argument (`a=__import__('os').system('...') + 1` would run).
`decode_python` is a copy of its AST walk (same output on everything else, same failures)
with that one `eval` replaced by arithmetic on literals only (numbers and strings, sizes
bounded); an operation on anything else fails to decode, as a call BFCL could not read.
Java and JavaScript outputs go to bfcl-eval's own decoder (tree-sitter parsers; no eval).
Native tool calls are decoded as bfcl-eval's Qwen FC handler does (`<tool_call>` JSON blocks).

bfcl-eval is imported only when a BFCL card runs, and only these modules of it: its
`constants.model_config` (which imports every model handler) is stood in for while the
checker is imported; the checker reads it only for `underscore_to_dot` (False here: arle
sends function names with their dots). Its `constants.eval_config` makes folders under
`BFCL_PROJECT_ROOT` when imported: unless the user set it, that is arle's cache dir.
"""

from __future__ import annotations

import ast
import importlib
import json
import math
import operator
import os
import re
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any

from arlecli import safeio
from arlecli.errors import UserError
from arlecli.rewards import RewardFn, register
from arlecli.types import Episode, Score, Task

BFCL_VERSION = "2026.3.23"
# bfcl-eval pins numpy==1.26.4, networkx, filelock and every API client, which would replace
# torch's and vLLM's numpy: it installs without its dependencies, beside the extra's few.
INSTALL = f"pip install 'arle[bfcl]' && pip install --no-deps bfcl-eval=={BFCL_VERSION}"

# The single-turn categories arle scores (bfcl-eval's names): by AST, and by whether a call is made.
AST_CATEGORIES = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
RELEVANCE_CATEGORIES = ("irrelevance", "live_irrelevance", "live_relevance")
CATEGORIES = AST_CATEGORIES + RELEVANCE_CATEGORIES
# Not offered, and why (the error for a card that names one says so).
UNSUPPORTED = {
    "multi_turn": (
        "BFCL's multi-turn checker runs the model's calls with eval() on live Python objects "
        "(its file system, trading bot, ...) that keep their state across turns, in its own "
        "process; arle's sandbox runs one program per call and keeps no objects between them"
    ),
    "web_search": "it searches the web (SerpAPI), which arle's machines cannot reach",
    "memory": "its memory backends need sentence-transformers and faiss, which bfcl-eval pins",
    "format_sensitivity": "it re-runs other categories' entries under 26 prompt formats (not built)",
}

_MODEL_CONFIG = "bfcl_eval.constants.model_config"
_LOCK = threading.Lock()
_LOADED: "Bfcl | None" = None


class _AnyModel(dict[str, Any]):
    """Stands in for bfcl-eval's MODEL_CONFIG_MAPPING: every model sends names with dots."""

    def __missing__(self, key: str) -> Any:
        return types.SimpleNamespace(underscore_to_dot=False)


@dataclass(frozen=True)
class Bfcl:
    """The bfcl-eval modules arle uses."""

    utils: Any  # bfcl_eval.utils: data loading, category names, output-format checks
    handler_utils: Any  # bfcl_eval.model_handler.utils: prompts, decoders
    checker: Any  # bfcl_eval.eval_checker.ast_eval.ast_checker
    enums: Any  # bfcl_eval.constants.enums: Language, ReturnFormat
    model_name: str  # what the checker is told the model is (names keep their dots)


def bfcl() -> Bfcl:
    """bfcl-eval's modules, imported once; a one-line error says what to install when missing."""
    global _LOADED
    with _LOCK:
        if _LOADED is None:
            _LOADED = _import()
        return _LOADED


def _import() -> Bfcl:
    from arlecli.config import cache_dir

    set_root = "BFCL_PROJECT_ROOT" not in os.environ
    stub = None
    if _MODEL_CONFIG not in sys.modules:
        stub = types.ModuleType(_MODEL_CONFIG)
        stub.MODEL_CONFIG_MAPPING = _AnyModel()  # type: ignore[attr-defined]
        sys.modules[_MODEL_CONFIG] = stub
    if set_root:
        os.environ["BFCL_PROJECT_ROOT"] = str(cache_dir() / "bfcl")
    try:
        checker = importlib.import_module("bfcl_eval.eval_checker.ast_eval.ast_checker")
        utils = importlib.import_module("bfcl_eval.utils")
        handler_utils = importlib.import_module("bfcl_eval.model_handler.utils")
        enums = importlib.import_module("bfcl_eval.constants.enums")
    except ImportError as exc:
        missing = f" ({exc.name} is missing)" if exc.name else ""
        raise UserError(f"BFCL cards need bfcl-eval {BFCL_VERSION} and its parsers{missing}: {INSTALL}") from None
    finally:
        if set_root:
            del os.environ["BFCL_PROJECT_ROOT"]
        if stub is not None and sys.modules.get(_MODEL_CONFIG) is stub:
            del sys.modules[_MODEL_CONFIG]  # a later import of bfcl-eval's CLI gets its real one
    return Bfcl(utils, handler_utils, checker, enums, _model_name(checker.MODEL_CONFIG_MAPPING))


def _model_name(mapping: Any) -> str:
    # With bfcl-eval's real mapping (its CLI was imported first): a model that keeps dots.
    if isinstance(mapping, _AnyModel):
        return "arle"
    for key, config in mapping.items():
        if not getattr(config, "underscore_to_dot", True) and "_" not in key:
            return key.replace("/", "_")
    raise UserError("bfcl-eval's model config lists no model that keeps dots in function names")


def category_of(entry_id: str) -> str:
    """The BFCL category of an entry id ("live_simple_3-2-0" -> "live_simple"): bfcl-eval's reading."""
    return str(bfcl().utils.extract_test_category_from_id(str(entry_id)))


def language_of(category: str) -> str:
    """ "java", "javascript" or "python": the language of a category's function docs and calls."""
    if category.endswith("_java"):
        return "java"
    return "javascript" if category.endswith("_javascript") else "python"


# Decoding ---------------------------------------------------------------------------------

_TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)  # bfcl-eval's Qwen FC handler's
MAX_REPEAT = 100_000  # characters a string * n may make
MAX_POWER_BITS = 100_000  # bits an integer power may have


def decode_native(text: str) -> list[dict[str, Any]]:
    """The calls of a native tool-call answer, as bfcl-eval's Qwen FC handler decodes them: each
    `<tool_call>` JSON block (a block that is not JSON is skipped), as {name: arguments}. Raises
    (ValueError, KeyError, ...) where the handler does: a block that is no object, no name."""
    calls = []
    for body in _TOOL_CALL.findall(text):
        try:
            calls.append(safeio.loads(body))  # json.loads, without a RecursionError on deep nesting
        except ValueError:
            pass
    if any(type(call) is not dict for call in calls):
        raise ValueError(f"Model did not return a list of function calls: {text}")
    return [{call["name"]: dict(call["arguments"].items())} for call in calls]


def decode_text(text: str, language: str = "python") -> list[dict[str, Any]]:
    """The calls of a text answer in BFCL's prompt format (`[func(a=1), other(b="x")]`), as
    bfcl-eval's `default_decode_ast_prompting` decodes them: Python by `decode_python` (its
    walk, without its eval), Java and JavaScript by bfcl-eval's own tree-sitter decoders.
    Raises on text that is not such a list."""
    if language == "python":
        result = text.strip("`\n ")
        if not result.startswith("["):
            result = "[" + result
        if not result.endswith("]"):
            result = result + "]"
        return decode_python(result)
    b = bfcl()
    fmt = b.enums.ReturnFormat.JAVA if language == "java" else b.enums.ReturnFormat.JAVASCRIPT
    return b.handler_utils.default_decode_ast_prompting(text, fmt, False)  # its Java/JS branch runs no model text


def decode_python(text: str) -> list[dict[str, Any]]:
    """bfcl-eval's `ast_parse` for Python (model_handler/utils.py), node for node, except that a
    binary operation is computed by `_arithmetic` instead of `eval`. The text is parsed, never run."""
    parsed = ast.parse(text.strip().strip("'"), mode="eval")
    if isinstance(parsed.body, ast.Call):
        return [_call(parsed.body)]
    elts = getattr(parsed.body, "elts", None)
    if elts is None:
        raise AttributeError(f"'{type(parsed.body).__name__}' object has no attribute 'elts'")
    calls = []
    for elem in elts:
        if not isinstance(elem, ast.Call):
            raise AssertionError("not a function call")
        calls.append(_call(elem))
    return calls


def _call(elem: ast.Call) -> dict[str, Any]:
    # bfcl-eval's resolve_ast_call: the dotted name; keyword arguments only (positional ones are dropped).
    parts = []
    func: ast.expr = elem.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return {".".join(reversed(parts)): {kw.arg: _value(kw.value) for kw in elem.keywords}}


def _value(node: Any) -> Any:
    # bfcl-eval's resolve_ast_by_type, branch for branch.
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.operand, ast.Constant):  # it reads operand.value, which only a literal has
            raise AttributeError(f"'{type(node.operand).__name__}' object has no attribute 'value'")
        value: Any = node.operand.value
        return -value  # any unary operator, as bfcl-eval does: +5 is -5 there too
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp):
        return _arithmetic(node)  # bfcl-eval: eval(ast.unparse(node))
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return ast.unparse(node) if not node.keywords else _call(node)
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Lambda):  # bfcl-eval reads node.body[0], which a lambda's body is not
        raise TypeError(f"'{type(node.body).__name__}' object is not subscriptable")
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise ValueError(f"Unsupported AST type: {type(node)}")


_BINARY: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Any] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _arithmetic(node: ast.expr) -> Any:
    """The value of an arithmetic expression over literals (`10**3`, `2*3.5`, `"a" + "b"`), as
    eval gives it; anything else (a name, a call, an attribute) raises ValueError, as do
    results too large to hold (a string of millions of characters, a power of millions of bits)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_arithmetic(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _arithmetic(node.left), _arithmetic(node.right)
        _check_size(node.op, left, right)
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"arle computes arithmetic on literals only, not {ast.unparse(node)[:80]!r}")


def _check_size(op: ast.operator, left: Any, right: Any) -> None:
    if isinstance(op, ast.Mult):
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes)) and isinstance(n, int) and len(seq) * n > MAX_REPEAT:
                raise ValueError("a repeated string too long to hold")
    if isinstance(op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        if right > 0 and right * math.log2(abs(left)) > MAX_POWER_BITS:
            raise ValueError("a power too large to hold")


# The verdict ------------------------------------------------------------------------------


@dataclass
class Verdict:
    """bfcl-eval's verdict on one answer: `valid`, and where it failed (`error_type` and `error`
    as bfcl-eval's score files write them). `decoded` is the calls as decoded (None: it could
    not be decoded); `called` whether it holds a call (what the relevance categories judge)."""

    valid: bool
    decoded: list[Any] | None = None
    called: bool = False
    error_type: str | None = None
    error: str | None = None


def judge(entry: dict[str, Any], output: str, native: bool) -> Verdict:
    """bfcl-eval's verdict on `output` (the model's answer) for the BFCL entry `entry` (its
    `id`, `function` docs as in the data file and, for AST categories, `ground_truth`), with
    `native` saying whether the model answered in native tool calls or in BFCL's text format."""
    b = bfcl()
    category = category_of(entry["id"])
    if category not in CATEGORIES:
        raise UserError(f"BFCL entry {entry['id']!r}: category {category!r} is not one arle scores")
    relevance = category in RELEVANCE_CATEGORIES
    language = "python" if relevance else language_of(category)
    try:
        decoded = decode_native(output) if native else decode_text(output, language)
    except Exception as exc:  # bfcl-eval's runner: any failure to decode is "not a call"
        if relevance:
            ok = "irrelevance" in category
            return Verdict(ok, None, False, None if ok else "relevance_error:decoder_failed", None if ok else str(exc))
        return Verdict(False, None, False, "ast_decoder:decoder_failed", f"Invalid syntax. Failed to decode AST. {exc}")
    called = not b.utils.is_empty_output(decoded)
    if relevance:
        calls = decoded if b.utils.is_function_calling_format_output(decoded) else None
        if "irrelevance" in category:
            return (
                Verdict(True, calls, called)
                if not called
                else Verdict(False, calls, called, "irrelevance_error:decoder_success", "Valid syntax.")
            )
        return Verdict(called, calls, called, None if called else "relevance_error:decoder_failed")
    if not b.utils.is_function_calling_format_output(decoded):
        return Verdict(False, None, called, "ast_decoder:decoder_wrong_output_format", f"Decoded as {decoded!r}"[:500])
    languages = {"java": b.enums.Language.JAVA, "javascript": b.enums.Language.JAVASCRIPT}
    lang = languages.get(language, b.enums.Language.PYTHON)
    try:
        result = b.checker.ast_checker(
            entry["function"], decoded, entry.get("ground_truth") or [], lang, category, b.model_name
        )
    except Exception as exc:  # bfcl-eval's own run would stop here; arle scores the answer wrong
        return Verdict(False, decoded, called, "checker_error", f"{type(exc).__name__}: {exc}")
    error = "; ".join(map(str, result.get("error") or [])) or None
    if result["valid"]:  # bfcl-eval's result keeps an error_type even when valid; its score file has none
        return Verdict(True, decoded, called)
    return Verdict(False, decoded, called, result.get("error_type"), error)


def _shown(decoded: list[Any] | None) -> str | None:
    # The decoded calls as JSON for samples.jsonl (tuples as lists; what JSON cannot hold, as repr).
    if decoded is None:
        return None
    try:
        text = json.dumps(decoded, default=repr, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(decoded)
    return text if len(text) <= 2000 else text[:2000] + "..."


@register("bfcl", metrics=["decoded", "called"], needs_target=False, fields=["id", "function"])
def bfcl_reward() -> RewardFn:
    """A BFCL answer scored by bfcl-eval's own AST checker (`judge`): reward 1 and correct when
    bfcl-eval counts it valid. AST categories: the calls must decode and match a possible
    answer (function, parameters, types, values); irrelevance: correct when no call decodes;
    live_relevance: correct when one does. An episode with native tools (`episode.tools`) is
    decoded as tool calls, else as BFCL's text format.

    Takes no params. Details: decoded (0/1: the answer decoded as a list of calls),
    called (0/1: it holds a call), error_type and error (bfcl-eval's, when not valid),
    category, mode ("native" or "text"). `extracted` is the decoded calls as JSON.
    """

    def score(task: Task, episode: Episode) -> Score:
        native = episode.tools is not None
        verdict = judge(task.fields, episode.completion, native)
        details: dict[str, Any] = {
            "decoded": int(verdict.decoded is not None),
            "called": int(verdict.called),
            "category": category_of(task.fields["id"]),
            "mode": "native" if native else "text",
        }
        if verdict.error_type:
            details["error_type"] = verdict.error_type
        if verdict.error:
            details["error"] = verdict.error[:500]
        return Score(float(verdict.valid), verdict.valid, _shown(verdict.decoded), details)

    return score
