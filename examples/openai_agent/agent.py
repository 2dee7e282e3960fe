"""A two-call agent on the plain `openai` client, as an arle rollout function.

It drafts an answer to the card's prompt, then is asked to check the draft and give its
final expression. arle serves the model being evaluated or trained at `client.base_url`,
records both calls (with the engine's token ids and logprobs) and scores what the function
returns. The same function runs in `arle eval` and `arle train` (see README.md).
"""

from __future__ import annotations

import openai

from arlecli import ClientConfig, rollout
from arlecli.types import Task

CHECK = (
    "Check your expression: it must use each given number exactly once and equal the "
    "target. Reply with only the final expression inside <answer></answer> tags."
)


@rollout
def draft_and_revise(task: Task, client: ClientConfig) -> str | None:
    """Draft, then revise; the revision is the answer."""
    api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key)
    messages = list(client.prompt) if isinstance(client.prompt, list) else [{"role": "user", "content": task.input}]
    draft = api.chat.completions.create(messages=messages, **client.sampling())
    messages += [
        {"role": "assistant", "content": draft.choices[0].message.content or ""},
        {"role": "user", "content": CHECK},
    ]
    final = api.chat.completions.create(messages=messages, **client.sampling())
    return final.choices[0].message.content
