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
        _check_schema(schema)
        name = spec.get("name")
        return ResponseFormat("json_schema", schema, name if isinstance(name, str) else None)
    raise _bad(
        f"`response_format` type {kind!r} is not supported by arle serve (text, json_object and json_schema are)"
    )


def structured(fmt: ResponseFormat) -> dict[str, Any]:
    """The engine's constraint for `fmt` (SamplingParams.structured: vLLM's structured outputs)."""
    return {"json_object": True} if fmt.kind == "json_object" else {"json": fmt.schema or {}}


def _check_schema(schema: dict[str, Any]) -> None:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise _bad(f"`response_format.json_schema.schema` is not a valid JSON Schema: {exc.message}") from None


def check(fmt: ResponseFormat, text: str | None) -> str | None:
    """Why `text` is not what `fmt` asks for, or None when it is."""
    try:
        value = json.loads(text or "")
    except ValueError as exc:
        return f"not JSON: {exc}"
    if fmt.kind == "json_object":
        return None if isinstance(value, dict) else f"JSON, but a {type(value).__name__}, not an object"
    import jsonschema

    errors = sorted(
        jsonschema.validators.validator_for(fmt.schema or {})(fmt.schema or {}).iter_errors(value),
        key=lambda e: list(e.path),
    )
    if not errors:
        return None
    where = "/".join(str(p) for p in errors[0].path)
    return f"does not match the schema{' at ' + where if where else ''}: {errors[0].message}"


def mark(choice: dict[str, Any], fmt: ResponseFormat, text: str | None) -> None:
    """Put the check's verdict on a response `choice` (see the module docstring)."""
    error = check(fmt, text)
    choice["response_format_valid"] = error is None
    if error is not None:
        choice["response_format_error"] = error[:500]
