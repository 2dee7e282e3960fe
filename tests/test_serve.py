"""`arle serve` on the tiny model (hf backend): the OpenAI API, batching, streaming, auth,
eval through the server, and the recording gateway."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import httpx
import pytest

from arlecli.engine.base import GenerationRequest, SamplingParams
from arlecli.engine.hf import HFEngine
from arlecli.serve.app import create_app
from arlecli.serve.record import read_records, session_file_name
from arlecli.serve.server import BackgroundServer

ARLE = [sys.executable, "-m", "arlecli"]
KEY_ENV = "ARLE_TEST_SERVE_KEY"
KEY = "sk-test-" + uuid.uuid4().hex
CHATS = [
    [{"role": "user", "content": "What is 12 plus 30?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "count to five"}],
    [{"role": "user", "content": "def add(a, b):"}],
]
PROMPTS = ["Question: What is 12 plus 30? Answer:", "def add(a, b):\n    return"]


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The engine run directly, one request at a time: what the server must reproduce."""
    return HFEngine(str(tiny_model), batch_size=1)


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """The app over its own hf engine, on uvicorn in a thread, recording to a temp folder."""
    engine = HFEngine(str(tiny_model), batch_size=16)
    record = tmp_path_factory.mktemp("record")
    app = create_app(engine, model_name="tiny", record_dir=record, max_concurrency=16)
    with BackgroundServer(app) as srv, httpx.Client(base_url=srv.base_url, timeout=60) as client:
        yield SimpleNamespace(
            url=srv.base_url, root=srv.base_url.removesuffix("/v1"), app=app, record=record, client=client
        )


def _open(served) -> str:
    """A new recording session, opened as a client does (POST /sessions)."""
    resp = served.client.post(served.root + "/sessions")
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["base_url"] == f"{served.root}/s/{body['id']}/v1"
    return body["id"]


def _direct(engine: HFEngine, request: GenerationRequest):
    return dict(engine.generate([request]))[0]


def _sse(text: str) -> list:
    """Parse an SSE body into its data payloads (the last one must be [DONE])."""
    events = [block for block in text.split("\n\n") if block.strip()]
    assert all(e.startswith("data: ") for e in events), events
    payloads = [e.removeprefix("data: ") for e in events]
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


# ------------------------------------------------------------------ API shape and errors


def test_models_and_openai_style_errors(served):
    c = served.client
    assert [m["id"] for m in c.get("/models").json()["data"]] == ["tiny"]
    assert c.get(served.root + "/health").status_code == 200

    def error(resp, status):
        assert resp.status_code == status, resp.text
        err = resp.json()["error"]
        assert err["message"] and err["type"]
        return err

    chat = {"messages": CHATS[0], "max_tokens": 4}
    assert error(c.post("/chat/completions", json={**chat, "model": "gpt-4"}), 404)["code"] == "model_not_found"
    error(c.get("/nothing/here"), 404)
    error(c.post("/chat/completions", content=b"{not json"), 400)
    error(c.post("/chat/completions", json={"max_tokens": 4}), 400)
    assert error(c.post("/chat/completions", json={**chat, "temperature": 7}), 400)["param"] == "temperature"
    assert error(c.post("/completions", json={"prompt": "x", "n": 0}), 400)["param"] == "n"
    # Token-id prompts are served (test_serve_clients.py); malformed ones are refused naming `prompt`.
    assert error(c.post("/completions", json={"prompt": [[1, 2], []]}), 400)["param"] == "prompt"
    assert error(c.post("/completions", json={"prompt": [1, 10**9]}), 400)["param"] == "prompt"
    ok = c.post("/chat/completions", json={**chat, "model": "tiny"})
    assert ok.status_code == 200 and ok.json()["model"] == "tiny"


# ------------------------------------------------------------------ batching


def test_64_concurrent_requests_succeed_and_are_batched(served):
    batcher = served.app.state.batcher
    calls_before = batcher.generate_calls
    sizes_before = len(batcher.recent_batch_sizes)

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=served.url, timeout=120, limits=limits) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/chat/completions",
                        json={
                            "messages": [{"role": "user", "content": f"request {i}: " + "word " * (i % 7)}],
                            "max_tokens": 8,
                            "temperature": 0,
                        },
                    )
                    for i in range(64)
                )
            )

    start = time.perf_counter()
    responses = asyncio.run(run())
    wall = time.perf_counter() - start
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200][:1]
    assert all(r.json()["choices"][0]["message"]["content"] for r in responses)
    calls = batcher.generate_calls - calls_before
    sizes = list(batcher.recent_batch_sizes)[sizes_before:]
    print(f"\n64 concurrent chat requests: {wall:.2f} s, {calls} generate calls, batch sizes {sizes}")
    assert sum(sizes) == 64
    assert calls < 64 and max(sizes) > 1


# ------------------------------------------------------------------ results equal the engine's


def test_greedy_results_equal_the_engine_run_directly(served, reference):
    for messages in CHATS:
        body = served.client.post(
            "/chat/completions",
            json={"messages": messages, "max_tokens": 12, "temperature": 0, "logprobs": True, "return_token_ids": True},
        ).json()
        want = _direct(
            reference, GenerationRequest(messages=messages, params=SamplingParams(max_tokens=12, logprobs=True))
        )
        choice = body["choices"][0]
        assert choice["message"]["content"] == want.text
        assert choice["token_ids"] == want.token_ids
        assert body["prompt_token_ids"] == want.prompt_token_ids
        assert choice["finish_reason"] == want.finish_reason
        assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx(want.logprobs, abs=1e-4)
        assert body["usage"] == {
            "prompt_tokens": len(want.prompt_token_ids),
            "completion_tokens": len(want.token_ids),
            "total_tokens": len(want.prompt_token_ids) + len(want.token_ids),
        }
    for prompt in PROMPTS:
        greedy = _direct(reference, GenerationRequest(prompt=prompt, params=SamplingParams(max_tokens=12)))
        stop = greedy.text[2:4]  # a stop string the greedy text is known to contain
        body = served.client.post(
            "/completions",
            json={
                "prompt": prompt,
                "max_tokens": 12,
                "temperature": 0,
                "stop": stop,
                "logprobs": 1,
                "return_token_ids": True,
            },
        ).json()
        want = _direct(reference, GenerationRequest(prompt=prompt, params=SamplingParams(max_tokens=12, stop=[stop])))
        choice = body["choices"][0]
        assert (choice["text"], choice["finish_reason"]) == (want.text, "stop")
        assert choice["token_ids"] == want.token_ids and choice["prompt_token_ids"] == want.prompt_token_ids
        assert len(choice["logprobs"]["tokens"]) == len(choice["logprobs"]["token_logprobs"]) == len(want.token_ids)


def test_n_choices_get_seeds_derived_from_the_request_seed(served, reference):
    ask = {"messages": CHATS[1], "max_tokens": 12, "temperature": 1.5, "seed": 11, "n": 3, "return_token_ids": True}
    first = served.client.post("/chat/completions", json=ask).json()
    again = served.client.post("/chat/completions", json=ask).json()
    ids = [c["token_ids"] for c in first["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert ids == [c["token_ids"] for c in again["choices"]]  # seeded: reproducible
    assert len({tuple(x) for x in ids}) > 1  # but the choices differ from each other
    # Choice 0 samples with the request's own seed, as the engine would in-process.
    want = _direct(
        reference, GenerationRequest(messages=CHATS[1], params=SamplingParams(max_tokens=12, temperature=1.5, seed=11))
    )
    assert ids[0] == want.token_ids


# ------------------------------------------------------------------ streaming


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_streaming_deltas_add_up_to_the_non_streaming_answer(served, chat):
    path = "/chat/completions" if chat else "/completions"
    ask = {"messages": CHATS[0]} if chat else {"prompt": PROMPTS[1]}
    ask |= {"max_tokens": 10, "temperature": 0}
    whole = served.client.post(path, json=ask).json()
    resp = served.client.post(path, json={**ask, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    chunks = _sse(resp.text)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    if chat:
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
        want = whole["choices"][0]["message"]["content"]
    else:
        text = "".join(ch["text"] for c in chunks for ch in c["choices"])
        want = whole["choices"][0]["text"]
    assert text == want and text
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == [whole["choices"][0]["finish_reason"]]


# ------------------------------------------------------------------ recording gateway


def test_recording_keeps_each_session_apart_with_the_engine_token_ids(served, reference):
    path_session, header_session = _open(served), _open(served)
    c = served.client
    by_path = [
        c.post(
            f"{served.root}/s/{path_session}/v1/chat/completions",
            json={"messages": CHATS[0], "max_tokens": 8, "temperature": 0, "return_token_ids": True},
        ).json(),
        c.post(
            f"{served.root}/s/{path_session}/v1/completions",
            json={"prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "return_token_ids": True},
        ).json(),
    ]
    by_header = [
        c.post(
            "/chat/completions",
            headers={"X-Arle-Session": header_session},
            json={"messages": CHATS[2], "max_tokens": 8, "temperature": 0, "n": 2, "return_token_ids": True},
        ).json()
    ]

    def lines(session: str) -> list[dict]:
        file = served.record / session_file_name(session)
        assert file.parent == served.record and file.name == session + ".jsonl"  # minted ids are file-safe
        return read_records(file)

    for session, responses, asked in (
        (path_session, by_path, [("messages", CHATS[0]), ("prompt", PROMPTS[0])]),
        (header_session, by_header, [("messages", CHATS[2])]),
    ):
        records = lines(session)
        assert [r["id"] for r in records] == [r["id"] for r in responses]  # exactly its own requests
        for record, response, (field, value) in zip(records, responses, asked):
            assert record["session"] == session and record[field] == value
            assert record["params"]["max_tokens"] == 8 and record["params"]["temperature"] == 0
            assert record["received_at"] <= record["finished_at"]
            request = GenerationRequest(**{field: value}, params=SamplingParams(max_tokens=8))
            want = _direct(reference, request)
            assert len(record["choices"]) == len(response["choices"])
            for rec, got in zip(record["choices"], response["choices"]):
                assert rec["token_ids"] == got["token_ids"] == want.token_ids
                assert rec["prompt_token_ids"] == want.prompt_token_ids
                assert rec["text"] == want.text and rec["finish_reason"] == want.finish_reason
                # Recorded even though the client did not ask for them.
                assert len(rec["logprobs"]) == len(rec["token_ids"]) and got["logprobs"] is None


def test_a_recorded_session_continues_its_earlier_reply_with_the_exact_ids(served):
    """An agent re-sends its conversation as text; the server starts the new prompt with the
    earlier prompt's ids + the reply's ids as generated, and says so in the record."""
    session, other_session = _open(served), _open(served)
    url = f"{served.root}/s/{session}/v1/chat/completions"
    ask = {"max_tokens": 6, "temperature": 1.0, "seed": 3, "return_token_ids": True}
    first = served.client.post(url, json={**ask, "messages": CHATS[0]}).json()
    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    convo = [*CHATS[0], reply, {"role": "user", "content": "Are you sure?"}]
    second = served.client.post(url, json={**ask, "messages": convo}).json()
    elsewhere = served.client.post(
        f"{served.root}/s/{other_session}/v1/chat/completions", json={**ask, "messages": convo}
    ).json()  # another session: encoded afresh
    sent = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(sent)] == sent
    records = read_records(served.record / session_file_name(session))
    assert records[0]["continues"] is None
    assert records[1]["continues"] == {"id": first["id"], "choice": 0, "seamless": True}
    [other] = read_records(served.record / session_file_name(other_session))
    assert other["continues"] is None and other["choices"][0]["prompt_token_ids"] == elsewhere["prompt_token_ids"]


# ------------------------------------------------------------------ `arle serve` itself


@pytest.fixture(scope="module")
def cli_server(tiny_model, tmp_path_factory):
    """`arle serve` as a user runs it, with an API key, on a free port."""
    env = {**os.environ, KEY_ENV: KEY, "ARLE_HOME": str(tmp_path_factory.mktemp("serve_home"))}
    proc = subprocess.Popen(
        [
            *ARLE,
            "serve",
            "--model",
            str(tiny_model),
            "--port",
            "0",
            "--api-key-env",
            KEY_ENV,
            "--served-model-name",
            "tiny",
            "--max-concurrency",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any(line.startswith("serving ") for line in output):
        assert proc.poll() is None, "".join(output)
        assert time.monotonic() < deadline, "arle serve did not come up: " + "".join(output)
        time.sleep(0.05)
    ready = next(line for line in output if line.startswith("serving "))
    url = ready.split(" on ")[1].strip()
    yield SimpleNamespace(proc=proc, url=url, output=output, reader=reader, env=env)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_api_key_is_required(cli_server):
    url = cli_server.url
    assert cli_server.output[0].startswith("serving tiny on http://127.0.0.1:")
    chat = {"messages": CHATS[0], "max_tokens": 4}
    assert httpx.post(url + "/chat/completions", json=chat).status_code == 401
    wrong = httpx.post(url + "/chat/completions", json=chat, headers={"Authorization": "Bearer sk-wrong-guess"})
    assert wrong.status_code == 401 and "sk-wrong-guess" not in wrong.text
    assert httpx.get(url + "/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    good = httpx.post(url + "/chat/completions", json=chat, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert good.status_code == 200 and good.json()["choices"]


def test_eval_through_serve_equals_eval_in_process(cli_server, tiny_model, tmp_path):
    common = ["eval", "countdown", "--limit", "4", "--max-tokens", "16", "--json"]
    # Both at once: the in-process eval's model load overlaps the other's HTTP round trips.
    local = subprocess.Popen(
        [*ARLE, *common, "--model", str(tiny_model), "--output", str(tmp_path / "local")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_server.env,
    )
    remote = subprocess.Popen(
        [*ARLE, *common, "--base-url", cli_server.url, "--api-key-env", KEY_ENV, "--output", str(tmp_path / "remote")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_server.env,
    )
    results = {}
    for name, proc in (("local", local), ("remote", remote)):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results[name] = json.loads(out)

    def samples(run: str) -> list[dict]:
        rows = [json.loads(line) for line in (tmp_path / run / "samples.jsonl").read_text().splitlines()]
        keep = ("id", "completion", "extracted", "reward", "correct", "finish_reason", "num_tokens")
        return sorted(({k: row[k] for k in keep} for row in rows), key=lambda r: r["id"])

    assert len(samples("local")) == 4
    assert samples("remote") == samples("local")
    assert results["remote"]["metrics"] == results["local"]["metrics"]


def test_ctrl_c_stops_the_server_cleanly_and_the_key_is_never_printed(cli_server):
    proc, answers = cli_server.proc, []

    def long_request() -> None:  # still generating when Ctrl-C comes: answered 503, not left hanging
        answers.append(
            httpx.post(
                cli_server.url + "/completions",
                timeout=60,
                headers={"Authorization": f"Bearer {KEY}"},
                json={"prompt": "x", "max_tokens": 2000, "temperature": 0},
            )
        )

    client = threading.Thread(target=long_request)
    client.start()
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    client.join(30)
    assert answers and answers[0].status_code == 503 and answers[0].json()["error"]["message"]
    cli_server.reader.join(5)
    output = "".join(cli_server.output)
    assert "server stopped" in output and "Traceback" not in output and "ERROR" not in output
    assert KEY not in output
