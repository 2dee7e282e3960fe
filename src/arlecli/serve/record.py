"""The recording gateway's store: one JSONL file per session, one line per request.

A session is named by the URL prefix `/s/{session}/v1/...` or the `X-Arle-Session` header,
and must have been opened by the server (sessions.py); a request naming none is recorded
in "default". Each line is written whole, under a lock, and flushed, so concurrent requests
never interleave and a crash loses at most the line being written. The token ids and
logprobs recorded are the engine's own (never re-tokenised text), which is what RL training
on recorded agent traffic needs. Each choice keeps the generated `text` whole and, taken apart
as the client got it (reasoning.py), its answer (`content`) and, when the model thought, its
`reasoning_content`, `thinking_cut` (no answer) and `thinking_tokens`, and when it called
tools (a request with `tools`, also recorded) its `tool_calls` and `tool_text` (the answer as
written, calls and all): agent.py rebuilds the
episode's turns from these, so training and eval see the split the agent saw.

Lines end in `\n` and nothing else does: `safeio.dumps` escapes every character below
U+0020 (lone surrogates too), and `read_records` splits on `\n` only. Model text is free to
hold U+2028, U+2029, U+0085 or \x1c-\x1e, which `str.splitlines()` would also split on.
"""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path
from typing import Any

from arlecli import safeio
from arlecli.serve.protocol import finite
from arlecli.serve.reasoning import Reply

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def session_file_name(session: str) -> str:
    """A file name for `session`: letters, digits, `_` and `-` kept; anything else (dots,
    slashes) replaced, plus a short hash of the original so distinct ids never share a file."""
    safe = _UNSAFE.sub("_", session)[:100]
    if safe != session or not safe:
        safe = f"{safe}-{hashlib.sha256(session.encode()).hexdigest()[:8]}"
    return safe + ".jsonl"


class Recorder:
    """Appends request records to `directory/{session}.jsonl`."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def path(self, session: str) -> Path:
        """Where `session`'s records go."""
        return self.directory / session_file_name(session)

    def write(self, session: str, record: dict[str, Any]) -> None:
        """Append one record as one line (written whole and flushed before returning)."""
        line = (safeio.dumps({"session": session, **record}) + "\n").encode("utf-8")
        with self._lock:
            # Open per write: no file handle per session to leak, and the cost is nothing
            # next to a generation. Binary: the bytes are the line, with no newline translation.
            with open(self.path(session), "ab") as f:
                f.write(line)
                f.flush()


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of one session file, in the order they were written ([] when there is no
    file). Split on `\n` only, the way `Recorder.write` ends them; a torn last line (a crash
    mid-write) is left out."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    records = []
    lines = data.split(b"\n")
    for k, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            records.append(safeio.loads(raw))
        except ValueError:
            if k == len(lines) - 1:  # no newline after it: the line being written when it stopped
                continue
            raise
    return records


def build_record(
    *,
    rid: str,
    endpoint: str,
    model: str,
    request: Any,
    finished: list[Any],
    received_at: float,
    usage: dict[str, Any],
    continues: dict[str, Any] | None = None,
    replies: list[Reply] | None = None,
) -> dict[str, Any]:
    """The record of one request: what was asked (messages or prompt, sampling params) and, per
    choice, the engine's prompt and completion token ids, logprobs, text, finish reason and times.

    `request` is an ApiRequest, `finished` its batcher results in choice order. `continues`
    ({"id", "choice", "seamless"}, or None) names the earlier reply of the session whose ids
    this request's prompt continues (see continuation.py). `replies` are the choices taken
    apart into thinking and answer (None: recorded as the text alone).
    """
    params = request.params
    asked: dict[str, Any] = (
        {"messages": request.prompts[0]}
        if request.chat
        else {"prompt": request.prompts[0] if len(request.prompts) == 1 else request.prompts}
    )
    tools = getattr(request, "tools", None)
    if tools is not None:  # function calling: what the template rendered, and how calls were asked for
        asked.update(tools=tools.tools, tool_choice=tools.choice)
    choices = []
    for i, fin in enumerate(finished):
        comp = fin.completion
        choices.append(
            {
                "index": i,
                "seed": request.seeds[i % request.n],
                "prompt_token_ids": list(comp.prompt_token_ids),
                "token_ids": list(comp.token_ids),
                "logprobs": finite(comp.logprobs),
                "text": comp.text,
                "finish_reason": comp.finish_reason,
                "started_at": fin.started_at,
                "finished_at": fin.finished_at,
                "batch_size": fin.batch_size,
                **(_thinking(replies[i]) if replies is not None else {}),
            }
        )
    return {
        "id": rid,
        "endpoint": endpoint,
        "model": model,
        **asked,
        "params": {
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
            "stop": list(params.stop),
            "seed": params.seed,
            "n": request.n,
            "logprobs": request.logprobs,
            "stream": request.stream,
            "reasoning_format": "none" if getattr(request, "raw_reasoning", False) else "parsed",
        },
        "received_at": received_at,
        "finished_at": max((fin.finished_at for fin in finished), default=received_at),
        "usage": usage,
        "continues": continues,
        "choices": choices,
    }


def _thinking(reply: Reply) -> dict[str, Any]:
    """A choice's answer and, when the model thought, its thinking (the record's split); when it
    called tools, the calls as answered and `tool_text`, the answer as written, calls and all."""
    out: dict[str, Any] = {"content": reply.answer}
    if reply.tool_calls:
        out.update(tool_calls=[dict(c) for c in reply.tool_calls], tool_text=reply.written)
    if reply.thought:
        out.update(reasoning_content=reply.thinking, thinking_cut=reply.cut, thinking_tokens=reply.thinking_tokens)
    return out
