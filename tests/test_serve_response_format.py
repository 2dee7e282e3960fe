"""`response_format.json_schema` is a client's input checked on the server's machine: hostile
schemas are a 400 before anything is generated, nothing a schema names is ever fetched (no URL,
no file), and a pattern written to backtrack without end cannot hold the server.

The server-level tests run a scripted engine whose reply is fixed text, so what is checked
against the schema is chosen here, not sampled.
"""

from __future__ import annotations

import http.server
import threading
import time
from typing import Iterator

import httpx
import pytest

from arlecli.engine.base import Completion, GenerationRequest
from arlecli.serve import response_format as rf
from arlecli.serve.app import create_app
from arlecli.serve.server import BackgroundServer

CHAT = [{"role": "user", "content": "Reply with JSON."}]


class _Scripted:
    """An engine whose every reply is `text` (no model in this process)."""

    name = "scripted"

    def __init__(self, text: str) -> None:
        self.text = text

    def generate(self, requests: list[GenerationRequest]) -> Iterator[tuple[int, Completion]]:
        for i, _ in enumerate(requests):
            yield i, Completion(self.text, [1], [2], [-0.5], "stop")

    def close(self) -> None:
        pass


class _Hits(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        _Hits.hits.append(self.path)
        body = b'{"type": "object", "properties": {"a": {"const": "TOPSECRET"}}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[str]:
    """A local HTTP server that counts what is fetched from it (what an attacker's would see)."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hits)
    _Hits.hits = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _chat(url: str, schema: object, timeout: float = 30) -> httpx.Response:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return httpx.post(
        url + "/chat/completions", json={"messages": CHAT, "max_tokens": 8, "response_format": fmt}, timeout=timeout
    )


def test_a_schema_naming_a_url_or_a_file_is_refused_and_nothing_is_fetched(listener, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"cfg": {"const": "LOCAL-FILE-SECRET"}}')
    with BackgroundServer(create_app(_Scripted('{"a": 1}'), model_name="tiny")) as srv:
        for ref in (f"{listener}/doc.json", f"file://{secret}#/cfg", "other.json", "#anchor"):
            for schema in ({"$ref": ref}, {"type": "object", "properties": {"a": {"$ref": ref}}}):
                resp = _chat(srv.base_url, schema)
                assert resp.status_code == 400, resp.text
                err = resp.json()["error"]
                assert err["param"] == "response_format" and "nothing is fetched" in err["message"]
                assert "SECRET" not in resp.text
        # Nested under $defs, reached through a local ref: still refused.
        resp = _chat(srv.base_url, {"$defs": {"d": {"$ref": f"{listener}/x"}}, "$ref": "#/$defs/d"})
        assert resp.status_code == 400
    assert _Hits.hits == []


def test_the_reply_check_itself_fetches_nothing(listener):
    """The second layer: even a schema that got past the parse (built here directly) is checked
    with a registry that resolves nothing outside the schema."""
    fmt = rf.ResponseFormat("json_schema", {"$ref": f"{listener}/doc.json"})
    (verdict,) = rf.check_replies(fmt, ['{"a": 1}'])
    assert verdict is not None and verdict.startswith("not checked") and "TOPSECRET" not in verdict
    assert _Hits.hits == []


@pytest.mark.parametrize(
    "schema, said",
    [
        ({"$ref": "#"}, "loop at #"),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}, "loop"),
        ({"properties": {"a": {"$ref": "#/properties/a"}}}, "loop at #/properties/a"),
        ({"anyOf": [{"not": {"$ref": "#"}}]}, "loop"),
        ({"$ref": "#/nope"}, "points at no schema"),
        ({"properties": {"a": {"enum": ["x"]}}, "$ref": "#/properties/a/enum/0"}, "points at no schema"),
        ({"$dynamicRef": "#meta"}, "$dynamicRef is not supported"),
        ({"properties": {"a": {"$id": "http://127.0.0.1:1/y", "type": "string"}}}, "$id is allowed at the top"),
        ({"$schema": "http://127.0.0.1:1/meta"}, "unknown $schema"),
        ({"type": 3}, "not a valid JSON Schema"),
    ],
)
def test_hostile_schemas_are_a_400_before_generation(schema, said):
    engine = _Scripted('{"a": 1}')
    calls = []
    engine.generate = lambda requests: calls.append(requests) or iter(())  # type: ignore[method-assign]
    with BackgroundServer(create_app(engine, model_name="tiny")) as srv:
        resp = _chat(srv.base_url, schema)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "response_format" and said in resp.json()["error"]["message"]
    assert calls == []  # refused before the engine was asked for anything


def test_deep_schemas_are_refused_and_deep_replies_do_not_crash():
    nested: dict = {}
    for _ in range(rf.MAX_SCHEMA_DEPTH):
        nested = {"type": "object", "properties": {"a": nested}}
    with pytest.raises(rf.ResponseFormatError, match="nests deeper"):
        rf.parse({"type": "json_schema", "json_schema": {"schema": nested}})
    fmt = rf.parse({"type": "json_schema", "json_schema": {"schema": {"type": "array"}}})
    verdicts = rf.check_replies(fmt, ["[" * 100_000 + "]" * 100_000, "[1]"])
    assert verdicts[0] is not None and verdicts[1] is None


def test_recursive_schemas_that_descend_still_work():
    tree = {
        "$defs": {
            "node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
        },
        "$ref": "#/$defs/node",
    }
    linked = {"type": "object", "properties": {"next": {"$ref": "#"}, "0": {"type": "integer"}}}
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"a": {"type": "string"}},
        "properties": {"x": {"$ref": "#/definitions/a"}},
    }
    fmts = [rf.parse({"type": "json_schema", "json_schema": {"schema": s}}) for s in (tree, linked, draft7)]
    assert rf.check_replies(fmts[0], ['{"kids": [{"kids": []}]}', '{"kids": [{"kids": 1}]}']) == [
        None,
        "does not match the schema at kids/0/kids: 1 is not of type 'array'",
    ]
    assert rf.check_replies(fmts[1], ['{"next": {"next": {"0": 2}}}', '{"next": {"0": "s"}}'])[0] is None
    assert "at next/0" in rf.check_replies(fmts[1], ['{"next": {"0": "s"}}'])[0]
    assert rf.check_replies(fmts[2], ['{"x": "s"}', '{"x": 1}'])[0] is None


def test_a_backtracking_pattern_cannot_hold_the_server():
    """`^(a+)+$` on 40 a's and a '!' backtracks for hours in Python's `re` (which holds the
    interpreter): the check gives up after its budget and the server answers others meanwhile."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a+)+$"}}}
    engine = _Scripted('{"name": "' + "a" * 40 + '!"}')
    with BackgroundServer(create_app(engine, model_name="tiny")) as srv:
        answered: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: answered.append(_chat(srv.base_url, schema, timeout=60)))
        start = time.monotonic()
        worker.start()
        time.sleep(0.5)
        health = [httpx.get(srv.base_url.removesuffix("/v1") + "/health", timeout=10) for _ in range(3)]
        health_done = time.monotonic() - start
        worker.join()
        took = time.monotonic() - start
    assert all(h.status_code == 200 for h in health)
    assert health_done < rf.CHECK_SECONDS  # answered while the check still ran
    assert took < rf.CHECK_SECONDS + 5
    choice = answered[0].json()["choices"][0]
    assert answered[0].status_code == 200 and choice["message"]["content"].startswith('{"name"')
    assert choice["response_format_valid"] is False
    assert choice["response_format_error"].startswith("not checked: checking it against the schema took over")


def test_a_reply_is_still_marked_valid_or_not():
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0}}, "required": ["answer"]}
    for text, valid in (('{"answer": 42}', True), ('{"answer": -1}', False), ("42", False)):
        with BackgroundServer(create_app(_Scripted(text), model_name="tiny")) as srv:
            choice = _chat(srv.base_url, schema).json()["choices"][0]
        assert choice["response_format_valid"] is valid, (text, choice)
        assert ("response_format_error" in choice) is not valid


def test_completions_refuse_response_format_of_any_shape():
    with BackgroundServer(create_app(_Scripted("x"), model_name="tiny")) as srv:
        for value in ("json", [1], 3, {"type": "json_object"}):
            resp = httpx.post(
                srv.base_url + "/completions", json={"prompt": "hi", "max_tokens": 2, "response_format": value}
            )
            assert resp.status_code == 400, (value, resp.text)
            assert resp.json()["error"]["param"] == "response_format"


@pytest.mark.parametrize(
    "parameters, said",
    [
        ({"type": "object", "properties": "zzz"}, "is not a valid JSON Schema"),
        ({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:1/x"}}}, "nothing is fetched"),
        ({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}}, "references loop"),
    ],
)
def test_a_tools_parameters_are_held_to_the_same_rules(parameters, said):
    from arlecli.serve import protocol

    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(protocol.ApiError) as bad:
        protocol.parse_chat({"messages": CHAT, "tools": [tool]})
    assert bad.value.param == "tools" and said in bad.value.message
    assert bad.value.message.startswith("tools[0].function.parameters")
    fine = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    assert protocol.parse_chat({"messages": CHAT, "tools": [fine]}).tools is not None
