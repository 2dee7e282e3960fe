"""The recording gateway and the server under hostile clients and hostile model text (issue 23,
item 6): sessions only the server opens, records that survive any character, session memory
bounded in bytes, and requests the engine would raise on refused before they are batched.

Everything runs over loopback HTTP to a server in a thread (tests/test_serve.py's way), with the
real `openai` client where a client is needed; engines are the tiny model or instant fakes.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from arlecli.engine.base import Completion, GenerationRequest, SamplingParams
from arlecli.engine.tokens import encode_request
from arlecli.serve.app import create_app
from arlecli.serve.continuation import Continuations
from arlecli.serve.limits import ServeLimits
from arlecli.serve.record import Recorder, read_records, session_file_name
from arlecli.serve.server import BackgroundServer

CHAT = [{"role": "user", "content": "What is 12 plus 30?"}]
# Every character str.splitlines() splits on besides \n, and the ones a JSON writer or reader
# may trip on: NUL, lone surrogates.
BREAKERS = [
    "\u2028",
    "\u2029",
    "\u0085",
    "\x00",
    "\r",
    "\r\n",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1d",
    "\x1e",
    "\ud800",
    "\udfff",
    "\ud83d",
]


class Scripted:
    """An engine that answers every request at once with `text`, spelled as `ids`, and counts
    its generate calls (a batch each) and the prompts it was given."""

    name = "scripted"

    def __init__(
        self,
        tokenizer: Any,
        text: str,
        ids: list[int] | None = None,
        fail_with: str | None = None,
        logprobs: bool = True,
    ) -> None:
        self.tokenizer, self.text, self.fail_with, self.logprobs = tokenizer, text, fail_with, logprobs
        self.ids = ids if ids is not None else tokenizer(text, add_special_tokens=False)["input_ids"]
        self.batches: list[int] = []

    def generate(self, requests: list[GenerationRequest]):
        self.batches.append(len(requests))
        if self.fail_with is not None:
            raise RuntimeError(self.fail_with)
        for i, request in enumerate(requests):
            yield (
                i,
                Completion(
                    self.text,
                    list(self.ids),
                    encode_request(self.tokenizer, request),
                    [-0.5] * len(self.ids) if self.logprobs else None,
                    "stop",
                ),
            )

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def serve(engine: Any, record: Path | None, **kwargs: Any) -> tuple[BackgroundServer, SimpleNamespace]:
    app = create_app(engine, model_name="tiny", record_dir=record, **kwargs)
    srv = BackgroundServer(app).__enter__()
    root = srv.base_url.removesuffix("/v1")
    return srv, SimpleNamespace(
        app=app, url=srv.base_url, root=root, record=record, client=httpx.Client(base_url=srv.base_url, timeout=60)
    )


@pytest.fixture(scope="module")
def gateway(tiny_model, tmp_path_factory):
    """The tiny model behind a recording server."""
    from arlecli.engine.hf import HFEngine

    engine = HFEngine(str(tiny_model), batch_size=16)
    srv, info = serve(engine, tmp_path_factory.mktemp("record"), max_concurrency=16, batch_wait_s=0.05)
    yield info
    info.client.close()
    srv.__exit__(None, None, None)
    engine.close()


def open_session(info: SimpleNamespace, **kwargs: Any) -> dict[str, Any]:
    resp = httpx.post(info.root + "/sessions", **kwargs)
    assert resp.status_code == 201, resp.text
    return resp.json()


def assert_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text[:500]
    err = resp.json()["error"]
    assert (
        err["message"] and err["type"] == "invalid_request_error" and set(err) == {"message", "type", "param", "code"}
    )
    if code is not None:
        assert err["code"] == code
    return err


# ------------------------------------------------------------------ sessions


def test_a_second_client_cannot_append_to_a_session_it_did_not_open(gateway):
    opened = open_session(gateway)
    sid, base_url = opened["id"], opened["base_url"]
    assert base_url == f"{gateway.root}/s/{sid}/v1"
    assert re.fullmatch(r"[A-Za-z0-9_-]{32,}", sid) and open_session(gateway)["id"] != sid  # 192 random bits
    owner = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    mine = owner.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, temperature=0)

    batcher = gateway.app.state.batcher
    calls = batcher.generate_calls
    # A second client, knowing everything but the id: guessed, default, or named by the header.
    default_file = gateway.record / session_file_name("default")
    default_lines = len(read_records(default_file))
    for guess in ("victim", "default", sid[:-1] + ("A" if sid[-1] != "A" else "B"), sid.upper()):
        other = openai.OpenAI(base_url=f"{gateway.root}/s/{guess}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.NotFoundError) as caught:
            other.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4)
        assert caught.value.code == "session_not_found"
        plain = openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0)
        with pytest.raises(openai.NotFoundError):
            plain.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_headers={"X-Arle-Session": guess})
        assert guess == "default" or not (gateway.record / session_file_name(guess)).exists()
    assert batcher.generate_calls == calls  # refused before anything was generated
    assert len(read_records(default_file)) == default_lines

    # The owner's session holds exactly the owner's request; the header form reaches it too.
    header = openai.OpenAI(
        base_url=gateway.url, api_key="unused", max_retries=0, default_headers={"X-Arle-Session": sid}
    )
    again = header.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, temperature=0)
    assert [r["id"] for r in read_records(gateway.record / f"{sid}.jsonl")] == [mine.id, again.id]

    # Closed: nobody, the owner included, appends to it any more; closing twice is a 404.
    assert httpx.delete(f"{gateway.root}/sessions/{sid}").json() == {"id": sid, "object": "session", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        owner.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4)
    assert_openai_error(httpx.delete(f"{gateway.root}/sessions/{sid}"), 404, "session_not_found")
    assert len(read_records(gateway.record / f"{sid}.jsonl")) == 2


def test_only_a_client_with_the_key_opens_sessions(tiny_model, tokenizer):
    engine = Scripted(tokenizer, "ok")
    srv, info = serve(engine, None, api_key="sk-gateway-test")
    try:
        resp = httpx.post(info.root + "/sessions")
        assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
        assert httpx.post(info.root + "/sessions", headers={"Authorization": "Bearer nope"}).status_code == 401
        sid = open_session(info, headers={"Authorization": "Bearer sk-gateway-test"})["id"]
        assert httpx.delete(f"{info.root}/sessions/{sid}").status_code == 401  # closing needs it too
        assert sid in info.app.state.sessions
    finally:
        info.client.close()
        srv.__exit__(None, None, None)


def test_at_the_open_session_cap_new_sessions_are_refused_with_429(tokenizer):
    srv, info = serve(Scripted(tokenizer, "ok"), None)
    try:
        info.app.state.sessions.max_open = 3
        ids = [open_session(info)["id"] for _ in range(3)]
        err = httpx.post(info.root + "/sessions")
        assert err.status_code == 429 and "DELETE /sessions/ID" in err.json()["error"]["message"]
        assert httpx.delete(f"{info.root}/sessions/{ids[0]}").status_code == 200
        open_session(info)  # closing one makes room
    finally:
        info.client.close()
        srv.__exit__(None, None, None)


# ------------------------------------------------------------------ records


def test_records_with_every_line_breaking_character_round_trip(tmp_path):
    recorder = Recorder(tmp_path)
    rng = random.Random(23)
    alphabet = [*BREAKERS, "a", " ", "\n", "\t", '"', "\\", "é", "😀"]
    texts = [*BREAKERS, "".join(BREAKERS)] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(300)
    ]
    written = [
        {
            "id": f"r{k}",
            "messages": [{"role": "user", "content": t}],
            "choices": [{"text": t[::-1]}],
            "received_at": float(k),
        }
        for k, t in enumerate(texts)
    ]
    for record in written:
        recorder.write("s1", record)
    raw = recorder.path("s1").read_bytes()
    raw.decode("utf-8")  # valid UTF-8 whatever the text held
    assert raw.count(b"\n") == len(written)  # one line per record: no raw \n inside any
    # As JSON itself round-trips them (a high surrogate then a low one read back as the pair's
    # character: JSON's \u escapes are UTF-16); everything else exactly.
    assert read_records(recorder.path("s1")) == [json.loads(json.dumps({"session": "s1", **r})) for r in written]
    # A crash mid-write leaves a torn last line: the records before it are kept.
    with open(recorder.path("s1"), "ab") as f:
        f.write(b'{"id": "torn", "choi')
    assert len(read_records(recorder.path("s1"))) == len(written)
    assert read_records(tmp_path / "never-written.jsonl") == []


ODD_REPLY = "step one\u2028step two\u2029step three\u0085end\x1c\x1d\x1e\x00 \r done"


def test_an_episode_whose_replies_hold_line_separators_is_kept_whole(tokenizer):
    """The example agent's two calls, each answered with U+2028, U+2029, U+0085, \\x1c-\\x1e, NUL
    and \\r: both turns come back whole (before, splitlines() broke each record apart)."""
    from arlecli.envs import make_env
    from arlecli.envs.episodes import Job
    from arlecli.eval import EvalOptions, load_tasks
    from arlecli.catalog import load_card
    from arlecli.agent import run_rollout_episodes

    card = load_card(str(Path(__file__).resolve().parents[1] / "examples" / "openai_agent" / "card.yaml"))
    tasks, _ = load_tasks(card, EvalOptions(limit=2))
    engine = Scripted(tokenizer, ODD_REPLY)
    jobs = [Job(t, make_env(card, t), SamplingParams(max_tokens=64)) for t in tasks]
    episodes = dict(run_rollout_episodes(engine, jobs))
    assert sorted(episodes) == [0, 1]
    for episode in episodes.values():
        assert episode.end_reason == "done" and episode.info["calls"] == 2
        assert [t.completion for t in episode.turns] == [ODD_REPLY, ODD_REPLY]
        assert episode.turns[0].token_ids == engine.ids and episode.completion == ODD_REPLY
        assert episode.turns[1].prompt[-2] == {"role": "assistant", "content": ODD_REPLY}  # re-sent as it came


def test_a_reply_with_a_lone_surrogate_reaches_the_client_and_the_record(tokenizer, tmp_path):
    srv, info = serve(Scripted(tokenizer, "half \ud83d of a pair", ids=[5, 6, 7]), tmp_path)
    try:
        sid = open_session(info)["id"]
        resp = info.client.post(f"{info.root}/s/{sid}/v1/chat/completions", json={"messages": CHAT})
        assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "half \ud83d of a pair"
        stream = info.client.post(f"{info.root}/s/{sid}/v1/chat/completions", json={"messages": CHAT, "stream": True})
        assert stream.status_code == 200 and "\\ud83d" in stream.text
        [first, second] = read_records(tmp_path / f"{sid}.jsonl")
        assert first["choices"][0]["text"] == second["choices"][0]["text"] == "half \ud83d of a pair"
    finally:
        info.client.close()
        srv.__exit__(None, None, None)


# ------------------------------------------------------------------ session memory


def big_completion(tokenizer: Any, request_ids: list[int], size: int) -> Completion:
    x = tokenizer.convert_tokens_to_ids("x")
    return Completion("x" * size, [x] * size, request_ids, None)


def test_session_memory_is_counted_in_bytes_as_python_holds_it(tokenizer):
    """The server's count is what the kept replies take: measured with tracemalloc, 16-choice
    requests of 20k-token replies take what was counted (within 2%), not far less."""
    conts = Continuations(tokenizer, max_bytes=2**40)
    prompt = list(range(100, 1100))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(4):
            messages = [{"role": "user", "content": f"question {k} " * 200}]
            conts.remember(f"s{k}", f"r{k}", messages, [big_completion(tokenizer, prompt, 20_000) for _ in range(16)])
            del messages
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    print(f"\nkept replies: counted {conts.bytes:,} bytes, traced {grown:,}")
    assert grown <= 1.02 * conts.bytes and conts.bytes < 1.5 * grown
    assert conts.bytes < 4 * 16 * 20_000 * 6  # ids as 4-byte arrays (a list of ints took ~36 bytes an id)


def test_session_memory_stays_within_its_byte_budget(tokenizer, tmp_path):
    """30 sessions, each a 16-choice request of 8k-token replies (~0.7 MB kept each), under a
    2 MB budget: the count never passes it, the least recently used sessions are dropped, the
    newest still continue with exact ids, and a dropped one's next call is encoded afresh
    (answered and recorded as usual)."""
    size = 8000
    budget = 2 * 2**20
    engine = Scripted(tokenizer, "x" * size, ids=[tokenizer.convert_tokens_to_ids("x")] * size, logprobs=False)
    srv, info = serve(engine, tmp_path, limits=ServeLimits(record_memory_bytes=budget))
    conts = info.app.state.continuations
    try:
        sessions = [open_session(info)["id"] for _ in range(30)]
        for sid in sessions:
            resp = info.client.post(
                f"{info.root}/s/{sid}/v1/chat/completions", json={"messages": CHAT, "n": 16, "max_tokens": size}
            )
            assert resp.status_code == 200
            assert 0 < conts.bytes <= budget
        assert conts.evicted >= 26 and 1 <= len(conts) <= 3

        def follow_up(sid: str) -> dict[str, Any]:
            convo = [*CHAT, {"role": "assistant", "content": "x" * size}, {"role": "user", "content": "more?"}]
            resp = info.client.post(
                f"{info.root}/s/{sid}/v1/chat/completions", json={"messages": convo, "max_tokens": 4}
            )
            assert resp.status_code == 200
            return read_records(tmp_path / f"{sid}.jsonl")[-1]

        newest, oldest = follow_up(sessions[-1]), follow_up(sessions[0])
        assert newest["continues"] is not None and newest["continues"]["seamless"]
        assert oldest["continues"] is None  # dropped: encoded afresh, still recorded
        assert conts.bytes <= budget

        # One reply bigger than the whole budget is not kept at all, and still answered and recorded.
        conts.max_bytes = 10_000
        sid = open_session(info)["id"]
        resp = info.client.post(f"{info.root}/s/{sid}/v1/chat/completions", json={"messages": CHAT})
        assert resp.status_code == 200 and conts.bytes == 0 and len(read_records(tmp_path / f"{sid}.jsonl")) == 1
        # Closing a session frees what it held.
        conts.max_bytes = budget
        sid = open_session(info)["id"]
        info.client.post(f"{info.root}/s/{sid}/v1/chat/completions", json={"messages": CHAT})
        held = conts.bytes
        assert held > 0 and httpx.delete(f"{info.root}/sessions/{sid}").status_code == 200 and conts.bytes == 0
    finally:
        info.client.close()
        srv.__exit__(None, None, None)


# ------------------------------------------------------------------ requests the engine would raise on


def test_an_empty_prompt_is_a_400_and_its_batch_mates_are_not_slowed(gateway, capfd):
    """12 requests at once, one of them `{"prompt": ""}` (the tiny model's tokenizer adds no BOS,
    so it encodes to no ids): a 400 in OpenAI's shape, and the other 11 are answered in batches
    with no request run again alone (before: a 500, and the whole batch retried one by one)."""
    batcher = gateway.app.state.batcher
    calls, sizes, retried = batcher.generate_calls, len(batcher.recent_batch_sizes), batcher.retried

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:
            bodies = [
                {"prompt": f"Question {k}: what is {k} plus 3? Answer:", "max_tokens": 6, "temperature": 0}
                for k in range(11)
            ]
            bodies.insert(5, {"prompt": "", "max_tokens": 6})
            return await asyncio.gather(*(client.post("/completions", json=b) for b in bodies))

    responses = asyncio.run(burst())
    err = assert_openai_error(responses.pop(5), 400)
    assert err["param"] == "prompt" and "empty" in err["message"]
    assert [r.status_code for r in responses] == [200] * 11 and all(r.json()["choices"][0]["text"] for r in responses)
    new_sizes = list(batcher.recent_batch_sizes)[sizes:]
    print(f"\nbatch sizes for 11 good requests beside an empty one: {new_sizes}")
    assert batcher.retried == retried and sum(new_sizes) == 11 and batcher.generate_calls - calls == len(new_sizes)
    assert max(new_sizes) > 1
    assert "Traceback" not in capfd.readouterr().err


def test_an_empty_prompt_among_several_is_refused_up_front(gateway):
    calls = gateway.app.state.batcher.generate_calls
    err = assert_openai_error(gateway.client.post("/completions", json={"prompt": ["fine", ""], "max_tokens": 2}), 400)
    assert err["param"] == "prompt" and gateway.app.state.batcher.generate_calls == calls


def test_odd_but_valid_requests_are_answered_together_without_an_engine_error(gateway, capfd):
    """Prompts of only whitespace or NUL, an empty chat message and a temperature so close to 0
    that dividing the logits by it overflows (raised to 0.01, as vLLM does), all at once: each
    answered, none making its batch fail."""
    retried = gateway.app.state.batcher.retried
    bodies = [
        ("/completions", {"prompt": "   "}),
        ("/completions", {"prompt": "\n"}),
        ("/completions", {"prompt": "\x00"}),
        ("/completions", {"prompt": "hi", "temperature": 1e-40}),
        ("/chat/completions", {"messages": [{"role": "user", "content": ""}], "temperature": 5e-324}),
    ]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=120) as client:
            return await asyncio.gather(*(client.post(path, json={**b, "max_tokens": 3}) for path, b in bodies))

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * len(bodies), [r.text for r in responses]
    assert gateway.app.state.batcher.retried == retried and "Traceback" not in capfd.readouterr().err


def test_a_prompt_with_no_encoder_to_check_it_is_refused_when_empty(tokenizer):
    """An engine without `encode` (no context to check against) still never gets an empty prompt."""
    engine = Scripted(tokenizer, "ok")
    srv, info = serve(engine, None)
    try:
        assert_openai_error(info.client.post("/completions", json={"prompt": ""}), 400)
        assert engine.batches == []
    finally:
        info.client.close()
        srv.__exit__(None, None, None)


def test_the_server_log_shows_an_engine_error_with_its_control_characters_escaped(tokenizer, capfd):
    engine = Scripted(tokenizer, "ok", fail_with="bad prompt \x1b]0;pwned\x07\x1b[2J\x9b31m")
    srv, info = serve(engine, None)
    try:
        resp = info.client.post("/completions", json={"prompt": "hi", "max_tokens": 2})
        assert resp.status_code == 500 and resp.json()["error"]["type"] == "server_error"
    finally:
        info.client.close()
        srv.__exit__(None, None, None)
    err = capfd.readouterr().err
    assert "bad prompt \\x1b]0;pwned\\x07\\x1b[2J\\x9b31m" in err
    assert not re.search("[\x1b\x07\x9b]", err)
