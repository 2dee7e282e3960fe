"""OpenAI-compatible serving and the recording gateway (`arle serve`).

    protocol.py   the OpenAI wire format: parse request bodies, build responses and stream chunks
    batcher.py    groups concurrent requests into engine.generate calls, one at a time (newcomers
                  join a running call on hf)
    streaming.py  a streamed choice's text token by token: what may go out now
    scoring.py    per-token logprobs with top-N alternatives (top_logprobs, logprobs=N, echo)
    response_format.py  json_object / json_schema: guided on vllm, checked everywhere
    access_log.py one stderr line per request (--no-access-log)
    record.py     --record: one JSONL line per request, per session
    continuation.py  recorded sessions: a call that continues an earlier reply keeps its exact ids
    app.py        the starlette app tying them together
    server.py     uvicorn in the foreground (the CLI) or a background thread

Heavy imports (starlette, uvicorn) stay inside these modules; `arle --help` never loads them.
"""
