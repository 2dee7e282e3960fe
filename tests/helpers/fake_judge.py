"""A stand-in judge for tests: the fake OpenAI server answering the judge reward's prompts.

It grades by string matching, not by understanding: a response passes when it contains the
reference answer (case and punctuation aside). That is enough to check what arle does around
a judge (the prompt carries the question, reference and response; verdicts are parsed, cached
and retried), and says nothing about how good a rubric is.

    with judge_profile("judge") as srv:      # a profile named "judge" pointing at the fake server
        ...
        assert len(srv.bodies("/chat/completions")) == 3
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

from helpers.fake_openai import FakeOpenAIServer

# A response holding this word gets a reply with no verdict line (the unparseable case).
MUMBLE = "MUMBLE"


def _section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    return m[1].strip() if m else ""


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def grade_by_reference(body: dict[str, Any]) -> str:
    """The judge's reply to one chat request: reasoning, then the verdict line the prompt asks for."""
    prompt = body["messages"][-1]["content"]
    reference, response = _section(prompt, "Reference answer"), _section(prompt, "Response to grade")
    if MUMBLE in response:
        return "Hmm, hard to say. It might be fine."
    match = bool(reference) and _norm(reference) in _norm(response)
    reasoning = (
        "The response states the reference answer." if match else "The response does not state the reference answer."
    )
    scale = re.search(r"whole number from (\d+) \(worst\) to (\d+)", prompt)
    if scale:
        return f"{reasoning}\nScore: {scale[2] if match else scale[1]}"
    return f"{reasoning}\nVerdict: {'PASS' if match else 'FAIL'}"


@contextlib.contextmanager
def judge_profile(name: str = "judge", **server: Any) -> Iterator[FakeOpenAIServer]:
    """Run the stand-in judge and save profile `name` pointing at it (in the test's ARLE_HOME).

    `server` goes to FakeOpenAIServer (fail_first, api_key, ...); with `api_key` the profile
    reads it from the env var JUDGE_TEST_KEY, which the caller sets."""
    from arlecli import config

    with FakeOpenAIServer(grade_by_reference, **server) as srv:
        config.save_profile(
            config.ModelProfile(
                name=name,
                base_url=srv.base_url,
                model=srv.model,
                api_key_env="JUDGE_TEST_KEY" if server.get("api_key") else None,
            )
        )
        yield srv
