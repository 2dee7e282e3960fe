"""Driving environments against an engine: many episodes at once, turn by turn.

Each round sends one request per unfinished episode in a single `engine.generate` call
(so the engine batches across episodes), hands every completion to its env as it
arrives, and either ends the episode (the env says done, or its turn limit is reached)
or queues the next turn. Finished episodes are yielded at once, so eval can score and
persist them while the others continue.

Token ids: with an in-process engine (one that has a `tokenizer`), turn k+1's prompt ids
are turn k's prompt ids + the completion ids exactly as the engine generated them + the
tokens the chat template adds for the env's reply (`engine.tokens.continue_ids`). So the
ids an episode records are one unbroken sequence that training can use as is: no
re-tokenisation drift across turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from arlecli.engine.base import Engine, GenerationRequest, SamplingParams
from arlecli.engine.tokens import continue_ids, template_renders_tools
from arlecli.envs import Env
from arlecli.types import Episode, Task, Turn


@dataclass
class Job:
    """One episode to run: its task, a fresh env and the sampling settings of every turn."""

    task: Task
    env: Env
    params: SamplingParams


@dataclass
class _State:
    prompt: Any
    episode: Episode
    prompt_ids: list[int] | None = None
    seams: list[int] = field(default_factory=list)


def native_tools(engine: Engine) -> bool:
    """Whether tool schemas can go to the engine's chat template (in-process engines whose
    model has a tool format); otherwise envs describe their tools in text."""
    tokenizer = getattr(engine, "tokenizer", None)
    return tokenizer is not None and template_renders_tools(tokenizer)


def _request(state: _State, job: Job, turn: int) -> GenerationRequest:
    prompt = state.prompt
    params = job.params if job.params.seed is None else replace(job.params, seed=job.params.seed + turn)
    return GenerationRequest(messages=prompt if isinstance(prompt, list) else None,
                             prompt=prompt if isinstance(prompt, str) else None,
                             params=params, tools=job.env.tools, prompt_token_ids=state.prompt_ids)


def run_episodes(engine: Engine, jobs: list[Job]) -> Iterator[tuple[int, Episode]]:
    """Run every job's episode to its end; yield (job index, Episode) as each finishes."""
    tokenizer = getattr(engine, "tokenizer", None)
    states = {i: _State(job.env.reset(), Episode(job.task.id)) for i, job in enumerate(jobs)}
    active = list(states)
    while active:
        requests = [_request(states[i], jobs[i], len(states[i].episode.turns)) for i in active]
        waiting: list[int] = []
        for r, comp in engine.generate(requests):
            i = active[r]
            state, env = states[i], jobs[i].env
            turn = Turn(prompt=state.prompt, completion=comp.text, prompt_token_ids=comp.prompt_token_ids,
                        token_ids=comp.token_ids, logprobs=comp.logprobs, finish_reason=comp.finish_reason)
            state.episode.turns.append(turn)
            step = env.step(comp.text)
            limit = getattr(env, "max_turns", 1)
            if step.done or len(state.episode.turns) >= limit or isinstance(state.prompt, str):
                state.episode.end_reason = step.reason if step.done else "turn_limit"
                state.episode.info = {**env.info(), **({"seams": state.seams} if state.seams else {})}
                yield i, state.episode
                continue
            turn.observation = step.messages
            state.prompt = [*state.prompt, {"role": "assistant", "content": comp.text}, *step.messages]
            if tokenizer is not None and comp.prompt_token_ids:
                state.prompt_ids, continued = continue_ids(
                    tokenizer, [*comp.prompt_token_ids, *comp.token_ids], state.prompt, env.tools)
                if not continued:
                    state.seams.append(len(state.episode.turns))
            waiting.append(i)
        active = waiting
