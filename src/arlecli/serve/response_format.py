"""`response_format` (json_object, json_schema): parsed, and the replies checked against it.

On the vllm backend decoding is constrained (vLLM's structured outputs, xgrammar, offline):
the reply is JSON of the schema unless max_tokens cut it. The hf backend has no grammar, so a
reply may not be what was asked for. Either way the server checks each reply and says which:

    header   X-Arle-Response-Format: guided (vllm) | unconstrained (hf)
    field    choices[i].response_format_valid: true | false, and when false
             choices[i].response_format_error: why (not JSON, or the schema's first complaint)

json_object: the reply must parse as a JSON object. json_schema: it must also satisfy the
schema (checked with `jsonschema`). A streamed reply gets the header only (its validity is
known after the last chunk). Any other `type` (vLLM's "regex", "grammar", "structural_tag")
is a 400 naming it.

A schema is a client's input, checked on this machine, so it is held to what a reply check
needs (`check_schema`; serve/tools.py runs it on a tool's parameters too): every `$ref` points
inside the schema itself (nothing named is ever fetched: no URL, no file), no chain of
references loops back without descending into the reply, and the schema nests at most
MAX_SCHEMA_DEPTH deep; else a 400 before anything is generated. Replies are checked in a child
process with a budget (`check_replies`: CHECK_SECONDS and 1 GiB for all of a response's
replies), since a `pattern` runs on Python's backtracking `re`: one written to backtrack without
end marks the reply unchecked instead of holding the server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


HEADER = "X-Arle-Response-Format"
UNCONSTRAINED = "unconstrained"
GUIDED = "guided"


@dataclass(frozen=True)
class ResponseFormat:
    """What the reply must be: a JSON object, or one that satisfies `schema`."""

    kind: str  # "json_object" | "json_schema"
    schema: dict[str, Any] | None = None
    name: str | None = None


class ResponseFormatError(ValueError):
    """A malformed or unsupported `response_format` (serve.protocol answers it as a 400 naming the param)."""


def _bad(message: str) -> ResponseFormatError:
    return ResponseFormatError(message)


def parse(value: Any) -> ResponseFormat | None:
    """The request's `response_format`, None for none or `{type: text}`; ResponseFormatError for
    a malformed or unsupported one."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise _bad("`response_format` must be an object with a string `type` (text, json_object or json_schema)")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise _bad(
                "`response_format.json_schema` must be an object {name, schema, strict} with `schema` a "
                "JSON Schema object"
            )
        schema = spec.get("schema") or {}
        check_schema(schema)
        name = spec.get("name")
        return ResponseFormat("json_schema", schema, name if isinstance(name, str) else None)
    raise _bad(
        f"`response_format` type {kind!r} is not supported by arle serve (text, json_object and json_schema are)"
    )


def structured(fmt: ResponseFormat) -> dict[str, Any]:
    """The engine's constraint for `fmt` (SamplingParams.structured: vLLM's structured outputs)."""
    return {"json_object": True} if fmt.kind == "json_object" else {"json": fmt.schema or {}}


MAX_SCHEMA_DEPTH = 64  # JSON nesting of a schema; OpenAI's structured outputs allow 10 levels of objects
CHECK_SECONDS = 5.0  # the most one response's replies may take to check, all together

# Keywords whose schemas apply to the very instance their schema does (no step into the reply):
# a chain of these and `$ref`s that comes back to where it began would recurse without end.
_SAME_INSTANCE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_VALUES = (
    "additionalProperties", "additionalItems", "unevaluatedItems", "unevaluatedProperties", "contains",
    "propertyNames", "not", "if", "then", "else", "items", "contentSchema",
)  # fmt: skip
Pointer = tuple[str | int, ...]


def check_schema(schema: dict[str, Any], where: str = "`response_format.json_schema.schema`") -> None:
    """ResponseFormatError (its message naming `where`) for a schema this server will not take:
    invalid, nested past MAX_SCHEMA_DEPTH, an unknown $schema, or references that leave the
    schema or loop (`_check_refs`)."""
    import jsonschema

    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise _bad(f"{where} nests deeper than {MAX_SCHEMA_DEPTH} levels")
    cls = jsonschema.validators.validator_for(schema, default=None) if "$schema" in schema else None
    if cls is None and "$schema" in schema:
        raise _bad(
            f"{where} names an unknown $schema {schema.get('$schema')!r}: leave it "
            "out (draft 2020-12) or name a published draft"
        )
    try:
        (cls or jsonschema.validators.validator_for(schema)).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise _bad(f"{where} is not a valid JSON Schema: {exc.message}") from None
    _check_refs(schema, where)


def _depth(value: Any) -> int:
    """How deep `value` nests (a scalar 0), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def _subschemas(node: dict[str, Any]) -> list[tuple[Pointer, Any]]:
    """The schemas `node` holds under its keywords, each with its path below `node`."""
    out: list[tuple[Pointer, Any]] = []
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out += [((key, name), sub) for name, sub in node[key].items() if isinstance(sub, (dict, bool))]
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out += [((key, i), sub) for i, sub in enumerate(node[key]) if isinstance(sub, (dict, bool))]
    for key in _SCHEMA_VALUES:
        if isinstance(node.get(key), (dict, bool)):
            out.append(((key,), node[key]))
    return out


def _check_refs(schema: dict[str, Any], where: str) -> None:
    """Every `$ref` names a schema inside this one (`#` or `#/json/pointer`), and no chain of
    references and same-instance keywords loops; else ResponseFormatError. Why: jsonschema
    would fetch any other URI (a URL, a file) from this machine, and a loop recurses until
    Python's stack gives out, after the reply was generated."""
    from urllib.parse import unquote

    nodes: dict[Pointer, Any] = {}
    stack: list[tuple[Pointer, Any]] = [((), schema)]
    while stack:
        path, node = stack.pop()
        nodes[path] = node
        if isinstance(node, dict):
            for key in ("$dynamicRef", "$recursiveRef"):
                if key in node:
                    raise _bad(f"{where}: {key} is not supported; use $ref to a schema under #/$defs")
            if path and isinstance(node.get("$id", node.get("id")), str):
                raise _bad(f"{where}: $id is allowed at the top of the schema only")
            stack += [(path + sub_path, sub) for sub_path, sub in _subschemas(node)]
    edges: dict[Pointer, list[Pointer]] = {}
    for path, node in nodes.items():
        if not isinstance(node, dict):
            continue
        targets = [path + sub_path for sub_path, _ in _subschemas(node) if sub_path[0] in _SAME_INSTANCE]
        if "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
                raise _bad(
                    f"{where}: $ref {ref!r} does not point inside the schema: only references of the form "
                    "#/$defs/NAME are followed (nothing is fetched)"
                )
            target = _pointer(schema, [unquote(t).replace("~1", "/").replace("~0", "~") for t in ref[2:].split("/")])
            if ref == "#":
                target = ()
            if target not in nodes:
                raise _bad(f"{where}: $ref {ref!r} points at no schema in it")
            targets.append(target)
        edges[path] = targets
    _check_no_loop(edges, where)


def _pointer(schema: Any, tokens: list[str]) -> Pointer | None:
    """The path `tokens` (a JSON pointer's, unescaped) names in `schema`: list indices as ints,
    as `_subschemas` writes them; None where it leads nowhere."""
    path: list[str | int] = []
    node = schema
    for token in tokens:
        if isinstance(node, dict) and token in node:
            path.append(token)
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            path.append(int(token))
            node = node[int(token)]
        else:
            return None
    return tuple(path)


def _check_no_loop(edges: dict[Pointer, list[Pointer]], where: str) -> None:
    """ResponseFormatError when following `edges` can come back to where it started."""
    done: set[Pointer] = set()
    for start in edges:
        if start in done:
            continue
        on_path, stack = {start}, [(start, iter(edges.get(start, ())))]
        while stack:
            node, rest = stack[-1]
            nxt = next(rest, None)
            if nxt is None:
                stack.pop()
                on_path.discard(node)
                done.add(node)
            elif nxt in on_path:
                shown = "/".join(["#", *(str(p) for p in nxt)])
                raise _bad(
                    f"{where}: its references loop at {shown} without descending "
                    "into the value (a schema may refer to itself only under properties or items)"
                )
            elif nxt not in done:
                on_path.add(nxt)
                stack.append((nxt, iter(edges.get(nxt, ()))))


def check(fmt: ResponseFormat, text: str | None) -> str | None:
    """Why `text` is not what `fmt` asks for, or None when it is. Runs in this process: a
    json_schema check of a client's schema belongs in `check_replies` (a child process)."""
    try:
        value = json.loads(text or "")
    except (ValueError, RecursionError) as exc:
        return f"not JSON: {exc}"
    if fmt.kind == "json_object":
        return None if isinstance(value, dict) else f"JSON, but a {type(value).__name__}, not an object"
    import jsonschema
    import referencing

    schema = fmt.schema or {}
    validator = jsonschema.validators.validator_for(schema)(schema, registry=referencing.Registry())  # fetches nothing
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    except RecursionError:
        return "nests too deeply to check against the schema"
    if not errors:
        return None
    where = "/".join(str(p) for p in errors[0].path)
    return f"does not match the schema{' at ' + where if where else ''}: {errors[0].message}"


def check_replies(fmt: ResponseFormat, texts: list[str | None], seconds: float = CHECK_SECONDS) -> list[str | None]:
    """`check` for each of a response's replies. A json_schema is checked in a child process
    given at most `seconds` (and 1 GiB) for all of them: a client's `pattern` runs on Python's
    backtracking `re`, which holds the interpreter while it runs, so a pattern written to
    backtrack without end would otherwise hold every request this server answers. A reply
    that could not be checked in time is marked invalid and says why."""
    if fmt.kind != "json_schema":
        return [check(fmt, t) for t in texts]
    import subprocess
    import sys

    job = json.dumps({"schema": fmt.schema or {}, "texts": texts})
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-m", "arlecli.serve.response_format"],
            input=job, capture_output=True, text=True, timeout=seconds, check=False,
        )  # fmt: skip
        verdicts = json.loads(done.stdout) if done.returncode == 0 else None
    except subprocess.TimeoutExpired:
        return [f"not checked: checking it against the schema took over {seconds:g} s"] * len(texts)
    if not isinstance(verdicts, list) or len(verdicts) != len(texts):
        return ["not checked: the schema check failed (out of memory?)"] * len(texts)
    return verdicts


def mark(choice: dict[str, Any], error: str | None) -> None:
    """Put a reply's verdict (`check`'s answer) on its response `choice` (see the module docstring)."""
    choice["response_format_valid"] = error is None
    if error is not None:
        choice["response_format_error"] = error[:500]


def _main() -> None:
    """The child process of `check_replies`: a job on stdin, the verdicts on stdout."""
    import resource
    import sys

    try:
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))
    except (ValueError, OSError):  # a platform without an address-space limit: the time budget still holds
        pass
    job = json.loads(sys.stdin.read())
    fmt = ResponseFormat("json_schema", job["schema"])
    json.dump([check(fmt, t) for t in job["texts"]], sys.stdout)


if __name__ == "__main__":
    _main()
