"""The one producer of Episodes: (card, tasks, engine, sampling) -> Episodes.

`collect` is what `arle eval`, GRPO, RLOO and PPO all call (eval.py, train/batches.py), for
single-turn, multi-turn and @rollout cards alike: it builds each episode's env, gives each
sample its settings (`Sampling.params`: the card's stop strings, the per-turn token budget, a
per-sample seed that depends only on (seed, task id, sample number)), and runs the env
kind's registered driver. So a training rollout and an eval sample of the same weights,
seed and task are the same tokens, by construction.

The turn-by-turn driver (`run_episodes`), for every env kind but @rollout agents:

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

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

from arlecli.engine.base import Engine, GenerationRequest, SamplingParams
from arlecli.engine.phases import phased
from arlecli.engine.tokens import continue_ids, template_renders_tools
from arlecli.envs import Env, env_kind, make_env
from arlecli.fewshot import Exemplars, exemplars_for
from arlecli.thinking import ThinkTags, prompt_opens, split, tags_for, thinking_token_count
from arlecli.types import Episode, Task, Turn


def sample_seed(seed: int, task_id: str, k: int) -> int:
    """A per-sample seed, independent of batching and of which samples ran before."""
    digest = hashlib.sha256(f"{seed}:{task_id}:{k}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


@dataclass(frozen=True)
class Sampling:
    """How a job samples every episode: eval's options, or a trainer's (same fields, same meaning)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int | None = None  # per model turn; None: the card's budget
    seed: int = 1234
    logprobs: bool = False  # the engine's per-token sampling logprobs (training wants them)
    # A thinking model's thought per turn, apart from `max_tokens` (then the answer's budget):
    # budget forcing (engine.phases). None: one budget for thought and answer.
    max_thinking_tokens: int | None = None

    def params(self, card: Any, task_id: str, k: int) -> SamplingParams:
        """The engine settings of sample `k` of task `task_id` (every turn of it: see `Transcript.request`)."""
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens or card.prompt.max_tokens,
            stop=list(card.prompt.stop),
            seed=sample_seed(self.seed, task_id, k),
            logprobs=self.logprobs,
            max_thinking_tokens=self.max_thinking_tokens,
        )


def collect(
    card: Any,
    engine: Engine,
    tasks: Sequence[Task],
    exemplars: Exemplars,
    draws: Sequence[tuple[int, int]],
    sampling: Sampling,
) -> Iterator[tuple[int, Episode]]:
    """Run one episode per draw `(task index, sample number)`; yield (draw index, Episode) as
    each ends, in any order. Tasks travel by index: two draws of one task are two samples."""
    native = native_tools(engine)
    jobs = [
        Job(
            tasks[i],
            make_env(card, tasks[i], exemplars_for(exemplars, tasks[i]), native),
            sampling.params(card, tasks[i].id, k),
            k,
        )
        for i, k in draws
    ]
    if not jobs:
        return iter(())
    return env_kind(card.env).run(engine, jobs)


@dataclass
class Job:
    """One episode to run: its task, a fresh env, the sampling settings of every turn and
    which sample of the task it is (drivers that pair samples, as self-play does, read it)."""

    task: Task
    env: Env
    params: SamplingParams
    sample: int = 0


@dataclass
class Transcript:
    """One player's side of an episode so far: the next prompt (and its token ids, when an
    in-process engine gave them) and the Episode its turns go into."""

    prompt: Any
    episode: Episode
    prompt_ids: list[int] | None = None
    seams: list[int] = field(default_factory=list)

    def record(self, comp: Any, tags: ThinkTags | None = None, tokenizer: Any = None) -> Turn:
        """Append (and return) the turn `comp` (an engine Completion) answered the current prompt
        with: its thinking (delimited by `tags`) apart from its answer (thinking.split)."""
        opened = prompt_opens(tokenizer, comp.prompt_token_ids, tags)
        thought = split(comp.text, tags, reasoning=comp.reasoning, opened=opened)
        counted = (
            comp.reasoning_tokens
            if comp.reasoning is not None
            else thinking_token_count(tokenizer, comp.token_ids, tags, thought.thinking, thought.cut)
        )
        turn = Turn(
            prompt=self.prompt,
            completion=thought.answer,
            prompt_token_ids=comp.prompt_token_ids,
            token_ids=comp.token_ids,
            logprobs=comp.logprobs,
            finish_reason=comp.finish_reason,
            prompt_tokens=comp.prompt_tokens,
            completion_tokens=comp.completion_tokens,
            latency_s=comp.latency_s,
            thinking=thought.thinking,
            thinking_cut=thought.cut,
            thinking_tokens=counted,
            forced=list(comp.forced),
        )
        self.episode.turns.append(turn)
        return turn

    def extend(
        self,
        messages: list[dict[str, Any]],
        tokenizer: Any,
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """The next prompt: the conversation so far, the last turn as an assistant message and
        the environment's reply `messages`. The message holds the answer as `content` and the
        thinking, if any, as `reasoning_content` (what vLLM's reasoning parsers return), so a
        chat template that renders reasoning_content continues the history exactly, and one
        that drops it (Qwen3's, for turns before the last user message; R1's always) renders
        the next prompt without it. With a tokenizer, the next prompt's ids extend the last
        turn's ids exactly as generated; where the template rewrote history they cannot, the
        next prompt is encoded as rendered (what the model really sees next) and the turn is
        recorded as a seam (`seams`; training then scores that turn on its own prompt)."""
        turn = self.episode.turns[-1]
        turn.observation = messages
        said: dict[str, Any] = {"role": "assistant", "content": turn.completion}
        if turn.thinking is not None:
            said["reasoning_content"] = turn.thinking
        self.prompt = [*self.prompt, said, *messages]
        if tokenizer is not None and turn.prompt_token_ids:
            switches = {"template_kwargs": template_kwargs} if template_kwargs else {}  # the template's own switches
            self.prompt_ids, continued = continue_ids(
                tokenizer, [*turn.prompt_token_ids, *(turn.token_ids or [])], self.prompt, tools, **switches
            )
            if not continued:
                self.seams.append(len(self.episode.turns))

    def request(self, params: SamplingParams, tools: list[dict[str, Any]] | None) -> GenerationRequest:
        """The request for the next turn; turn k samples with seed + k."""
        turn = len(self.episode.turns)
        params = params if params.seed is None else replace(params, seed=params.seed + turn)
        prompt = self.prompt
        return GenerationRequest(
            messages=prompt if isinstance(prompt, list) else None,
            prompt=prompt if isinstance(prompt, str) else None,
            params=params,
            tools=tools,
            prompt_token_ids=self.prompt_ids,
        )


def native_tools(engine: Engine) -> bool:
    """Whether tool schemas can go to the engine's chat template (in-process engines whose
    model has a tool format); otherwise envs describe their tools in text."""
    tokenizer = getattr(engine, "tokenizer", None)
    return tokenizer is not None and template_renders_tools(tokenizer)


def run_episodes(engine: Engine, jobs: list[Job]) -> Iterator[tuple[int, Episode]]:
    """Run every job's episode to its end; yield (job index, Episode) as each finishes. A
    thinking model's turns run in phases (engine.phases: its thought bounded by
    `max_thinking_tokens`, the card's stops on its answer only)."""
    engine = phased(engine)
    tokenizer = getattr(engine, "tokenizer", None)
    tags = tags_for(engine)
    states = {i: Transcript(job.env.reset(), Episode(job.task.id, tools=job.env.tools)) for i, job in enumerate(jobs)}
    active = list(states)
    while active:
        requests = [states[i].request(jobs[i].params, jobs[i].env.tools) for i in active]
        waiting: list[int] = []
        for r, comp in engine.generate(requests):
            i = active[r]
            state, env = states[i], jobs[i].env
            turn = state.record(comp, tags, tokenizer)
            step = env.step(turn.completion)  # the answer: a tool call written in a thought is none
            limit = getattr(env, "max_turns", 1)
            if step.done or len(state.episode.turns) >= limit or isinstance(state.prompt, str):
                state.episode.end_reason = step.reason if step.done else "turn_limit"
                state.episode.info = {**env.info(), **({"seams": state.seams} if state.seams else {})}
                yield i, state.episode
                continue
            state.extend(step.messages, tokenizer, env.tools, getattr(engine, "chat_template_kwargs", None))
            waiting.append(i)
        active = waiting
