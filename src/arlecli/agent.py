"""`@rollout`: any Python agent that speaks the OpenAI API, evaluated and trained as a benchmark's agent.

    from arlecli import rollout

    @rollout
    def solve(task, client):                     # client: a ClientConfig
        api = openai.OpenAI(base_url=client.base_url, api_key=client.api_key)
        reply = api.chat.completions.create(messages=client.prompt, **client.sampling())
        return reply.choices[0].message.content  # the answer (None: the last reply is)

A card runs it with `env: {name: rollout, params: {function: ...}}`, where `function` is

    "my_pkg.agents:solve"     an importable module's function
    "agent.py:solve"          a file, relative to the card's folder
    "solve"                   a name registered with @rollout (in a module already imported)
                              or by a package's entry point in group `arle.rollouts`
                              (`solve = "my_pkg.agents:solve"`)

and any other params are passed to the function as keyword arguments.

How an episode runs (`run_rollout_episodes`, for eval and training alike): arle serves its
engine in-process through the recording gateway (arlecli.serve, on a free localhost port),
gives each episode its own session (`client.base_url` ends in /s/<session>/v1; the server
mints the id, so no other client can write into the episode), and calls the function on a
thread pool, so many agents run at once and the server batches their requests. When a
function returns, its session is closed and its recorded requests become the Episode's
turns, with the engine's own prompt/completion token ids and logprobs. Because the server
continues a session's earlier reply with its exact ids (serve/continuation.py), an agent
that re-sends its conversation yields one unbroken id sequence that GRPO trains on as is
(train/batches.py). A function that raises ends its episode with end_reason "error" and
an empty answer (reward 0); the run goes on.

A model that thinks answers the agent with its thought apart (`reasoning_content`, see
serve/reasoning.py), and each turn is rebuilt from the record's split: `Turn.completion` is the
answer the agent got, `Turn.thinking`, `thinking_cut` and `thinking_tokens` the thought, with
the token ids covering both, exactly as the episode driver records an in-process turn.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import traceback
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, cast, overload

from arlecli.safeio import terminal_text
from arlecli.envs import Step, register_env
from arlecli.errors import ParamError, UserError
from arlecli.plugins import Registry
from arlecli.types import Episode, Task, Turn

if TYPE_CHECKING:
    from arlecli.engine.base import Engine
    from arlecli.envs.episodes import Job

ENV_NAME = "rollout"
SERVED_MODEL = "arle-policy"
MAX_AGENTS = 32  # agent threads at once: enough to fill a batch, few enough for any machine


@dataclass(frozen=True)
class ClientConfig:
    """How a rollout function reaches the model: an OpenAI-compatible endpoint and the run's
    sampling settings. Build the client yourself (`openai.OpenAI(base_url=..., api_key=...)`,
    or any framework's OpenAI settings) and pass `**client.sampling()` to each call.

    `prompt` is the card's prompt for the task (chat messages, or a string for completion
    cards), for agents that start from it; `session` names the recording session."""

    base_url: str
    api_key: str
    model: str
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    prompt: Any = None
    session: str = ""

    def sampling(self) -> dict[str, Any]:
        """Keyword arguments for `chat.completions.create` / `completions.create`: the model and
        the run's sampling settings (eval: the eval's options; training: the trainer's)."""
        out: dict[str, Any] = {
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
        }
        if self.stop:
            out["stop"] = list(self.stop)
        if self.seed is not None:
            out["seed"] = self.seed
        return out


RolloutFn = Callable[..., Any]
# No builtin rollouts: @rollout in imported modules, `arle.rollouts` entry points, or a spec.
ROLLOUTS: Registry[RolloutFn] = Registry("rollouts", "rollout function")


@overload
def rollout(fn: RolloutFn, *, name: str | None = None) -> RolloutFn: ...


@overload
def rollout(fn: None = None, *, name: str | None = None) -> Callable[[RolloutFn], RolloutFn]: ...


def rollout(fn: RolloutFn | None = None, *, name: str | None = None) -> Any:
    """Register `fn(task: Task, client: ClientConfig, **params) -> str | None` as a rollout
    function, under `name` (default: the function's name). Returns `fn` unchanged, so it can
    still be called directly. Use as `@rollout` or `@rollout(name="...")`."""

    def deco(f: RolloutFn) -> RolloutFn:
        key = name or f.__name__
        ROLLOUTS.add(key, f)
        f.__arle_rollout__ = key  # type: ignore[attr-defined]
        return f

    return deco(fn) if fn is not None else deco


def rollout_names() -> list[str]:
    """Registered rollout functions: @rollout in imported modules and `arle.rollouts` entry points."""
    return ROLLOUTS.names()


def get_rollout(spec: str, base: Path | None = None) -> RolloutFn:
    """The rollout function `spec` names: a registered name, "module:function", or
    "file.py:function" (relative to `base`, the card's folder). Raises UserError."""
    return ROLLOUTS.get(spec, base)


# ------------------------------------------------------------------------------ the env


@dataclass
class RolloutEpisode(Episode):
    """An Episode whose answer the rollout function returned (None: its last reply).

    Rewards score `episode.completion`, so the answer is what they see."""

    answer: str | None = None

    @property
    def completion(self) -> str:
        """The answer the function returned, else the last model reply."""
        if self.answer is not None:
            return self.answer
        return self.turns[-1].completion if self.turns else ""

    @property
    def thinking_cut(self) -> bool:
        """Whether there is no answer to score: the function returned none and the last reply
        was a thought cut short (an answer the function returned is scored as it is)."""
        return self.answer is None and bool(self.turns) and self.turns[-1].thinking_cut


@dataclass
class RolloutEnv:
    """`env: rollout` for one task: the function and its params. The function drives its own
    turns, so this env only holds them for `run_rollout_episodes` (and shows the card's
    prompt, which `reset` returns, as single_turn does: cards.render_prompt)."""

    name: str
    fn: RolloutFn
    prompt: Any
    params: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    max_turns: int = 0  # the function decides
    tool_call_parser: str | None = None  # how the gateway parses tool calls (None: the template's)

    def reset(self) -> Any:
        return self.prompt

    def step(self, completion: str) -> Step:
        raise UserError(
            "a rollout function drives its own turns: run its episodes with arlecli.agent.run_rollout_episodes"
        )

    def info(self) -> dict[str, Any]:
        return {}


def check_params(params: dict[str, Any], base: Path | None = None) -> None:
    """The function a card's `rollout` env names must load (an unknown name suggests near ones);
    a `tool_call_parser` must be one arle has."""
    _check_parser(params.get("tool_call_parser"))
    function = params.get("function")
    if isinstance(function, str) and function:
        try:
            get_rollout(function, base)
        except UserError as exc:
            raise ParamError("function", str(exc)) from None


def rollout_env(
    card: Any,
    task: Task,
    exemplars: list[Task],
    native_tools: bool,
    function: str = "",
    tool_call_parser: str | None = None,
    **params: Any,
) -> RolloutEnv:
    """Env factory for `env: {name: rollout, params: {function: ..., tool_call_parser: ..., **params}}`
    (`tool_call_parser`, as `arle serve --tool-call-parser`, is the gateway's, not the function's)."""
    from arlecli.cards import render_prompt

    if not function:
        raise UserError(
            "env 'rollout' needs params.function: 'module:function', 'file.py:function' or a registered name"
        )
    base = Path(card.path).parent if getattr(card, "path", None) else None
    _check_parser(tool_call_parser)
    return RolloutEnv(
        function,
        get_rollout(function, base),
        render_prompt(card.prompt, task, exemplars),
        params,
        tool_call_parser=tool_call_parser,
    )


def _check_parser(name: Any) -> None:
    from arlecli.serve.tools import PARSERS

    if name is not None and name not in PARSERS:
        raise ParamError("tool_call_parser", f"must be one of {', '.join(PARSERS)}, not {name!r}")


# ------------------------------------------------------------------------------ running


def run_rollout_episodes(
    engine: Engine, jobs: list[Job], max_agents: int = MAX_AGENTS
) -> Iterator[tuple[int, Episode]]:
    """Run each job's rollout function against `engine` through the recording gateway; yield
    (job index, Episode) as each function returns. Jobs' envs are RolloutEnvs (make_env of a
    card with `env: rollout`); their params give each call's sampling settings."""
    if not jobs:
        return
    from arlecli.serve.app import create_app
    from arlecli.serve.record import read_records
    from arlecli.serve.server import BackgroundServer

    with tempfile.TemporaryDirectory(prefix="arle-rollout-") as record_dir:
        # Concurrent agents' calls arrive a little apart: wait a bit longer than `arle serve`
        # does for batch mates, as one generate call per batch is what makes this fast.
        app = create_app(
            engine,
            model_name=SERVED_MODEL,
            record_dir=Path(record_dir),
            max_concurrency=max(16, min(len(jobs), 256)),
            batch_wait_s=0.02,
            tool_call_parser=getattr(jobs[0].env, "tool_call_parser", None),
        )
        recorder, sessions = app.state.recorder, app.state.sessions
        warned = threading.Event()
        with BackgroundServer(app) as server:
            root = server.base_url.removesuffix("/v1")
            pool = ThreadPoolExecutor(max_workers=min(len(jobs), max_agents), thread_name_prefix="arle-agent")
            futures: dict[Future[Any], int] = {}
            try:
                for i, job in enumerate(jobs):
                    futures[pool.submit(_episode, job, i, root, sessions)] = i
                for fut in as_completed(futures):
                    i = futures[fut]
                    session, answer, error = fut.result()
                    if error is not None and not warned.is_set():
                        warned.set()
                        function = cast(RolloutEnv, jobs[i].env).name
                        print(
                            terminal_text(
                                f"arle: rollout function '{function}' raised {error} (task "
                                f"{jobs[i].task.id}; the episode ends with end_reason 'error'; later "
                                "errors are in each sample's env_info)"
                            ),
                            file=sys.stderr,
                        )
                    # Closed first: a thread the agent left behind can no longer add to the episode.
                    sessions.close(session)
                    records = read_records(recorder.path(session))
                    records.sort(key=lambda r: r["received_at"])  # the order the agent asked in
                    yield i, build_episode(jobs[i], records, answer, error, engine)
            finally:
                # On an early exit (an interrupt, a scoring error) don't start the agents still
                # queued; running ones get a 503 once the server stops, and end.
                pool.shutdown(wait=False, cancel_futures=True)


# `env: rollout` runs its episodes with this driver instead of the turn-by-turn env driver.
register_env(ENV_NAME, driver=run_rollout_episodes, replayable=False, check=check_params)(rollout_env)


def _client(job: Job, root: str, session: str) -> ClientConfig:
    p = job.params
    return ClientConfig(
        base_url=f"{root}/s/{session}/v1",
        api_key="arle-local",
        model=SERVED_MODEL,
        temperature=p.temperature,
        top_p=p.top_p,
        max_tokens=p.max_tokens,
        stop=tuple(p.stop),
        seed=p.seed,
        prompt=job.env.reset(),
        session=session,
    )


def _episode(job: Job, i: int, root: str, sessions: Any) -> tuple[str, str | None, str | None]:
    """(session, answer, error) of job `i`'s episode, in a session opened when it starts (so only
    the agents running, and the episodes not read yet, hold one)."""
    session = sessions.open(label=f"ep{i}")
    return (session, *_call(job, _client(job, root, session)))


def _call(job: Job, client: ClientConfig) -> tuple[str | None, str | None]:
    """(answer, error): what the function returned, or why it failed (never raises, so one bad
    episode does not end the run)."""
    env = cast(RolloutEnv, job.env)  # run_rollout_episodes runs the envs rollout_env makes
    try:
        out = env.fn(job.task, client, **env.params)
        if out is not None and not isinstance(out, str):
            raise TypeError(f"a rollout function returns the answer as str or None, not {type(out).__name__}")
        return out, None
    except Exception as exc:
        tail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return None, tail


def build_episode(
    job: Job, records: list[dict[str, Any]], answer: str | None, error: str | None, engine: Any = None
) -> RolloutEpisode:
    """The Episode of one rollout: each recorded request is a turn (the choice a later call
    continued, else choice 0), with the engine's ids and logprobs. `seams` in info lists the
    turns whose prompt ids do not extend the previous turn's ids (a fresh conversation, or a
    template that rewrote history): each starts a new segment, trained on its own prompt
    (train/batches.flatten_episode)."""
    continued = {r["continues"]["id"]: r["continues"]["choice"] for r in records if r.get("continues")}
    turns: list[Turn] = []
    seams: list[int] = []
    chosen: list[dict[str, Any]] = []
    for k, record in enumerate(records):
        choice = record["choices"][continued.get(record["id"], 0)]
        chosen.append(choice)
        # The gateway stamps each request's arrival and each choice's end: the turn's latency.
        start, end = record.get("received_at"), choice.get("finished_at")
        latency = end - start if isinstance(start, (int, float)) and isinstance(end, (int, float)) else None
        prompt: Any = record.get("messages", record.get("prompt"))  # a chat request's messages, else the prompt
        turns.append(
            Turn(
                prompt=prompt,
                completion=_answer(choice),
                prompt_token_ids=choice["prompt_token_ids"],
                token_ids=choice["token_ids"],
                logprobs=choice["logprobs"],
                finish_reason=choice["finish_reason"],
                latency_s=latency,
                thinking=choice.get("reasoning_content"),
                thinking_cut=bool(choice.get("thinking_cut")),
                thinking_tokens=choice.get("thinking_tokens"),
            )
        )
        link = record.get("continues")
        if k and not (link and link["seamless"] and link["id"] == records[k - 1]["id"]):
            seams.append(k)
    for turn, choice, after in zip(turns, chosen, turns[1:]):  # what came between two calls: tool results, a nudge
        if not (isinstance(turn.prompt, list) and isinstance(after.prompt, list)):
            continue
        n = len(turn.prompt)
        if (
            len(after.prompt) > n
            and _without_thinking(after.prompt[:n]) == _without_thinking(turn.prompt)
            and _sent_back(after.prompt[n], choice)
        ):
            turn.observation = after.prompt[n + 1 :]
    if not turns:  # the function failed (or answered) without calling the model
        turns.append(_empty_turn(job, engine, "error" if error else "stop"))
    info: dict[str, Any] = {"rollout": cast(RolloutEnv, job.env).name, "calls": len(records)}
    if seams:
        info["seams"] = seams
    if error is not None:
        info["error"] = error
    if answer is not None:
        info["answer"] = answer
    # The tools the template rendered (a function-calling agent's): part of what the model saw.
    tools = next((r["tools"] for r in reversed(records) if r.get("tools")), None)
    return RolloutEpisode(
        job.task.id,
        turns,
        end_reason="error" if error else "done",
        info=info,
        tools=tools,
        answer="" if error else answer,
    )


def _sent_back(message: Any, choice: dict[str, Any]) -> bool:
    """Whether `message` (in a later call's conversation) is the reply `choice` recorded: its
    answer, or for a reply that called tools the same calls (serve/tools.py; ids aside)."""
    from arlecli.serve.tools import same_calls

    if not isinstance(message, dict) or message.get("role") != "assistant":
        return False
    if choice.get("tool_calls"):
        return same_calls(message.get("tool_calls") or [], choice["tool_calls"])
    return message.get("content") == _answer(choice)


def _answer(choice: dict[str, Any]) -> str:
    """A recorded choice's answer: for a reply that called tools the answer as written, calls and
    all (what an env reads, as envs.tools does); else its `content` (the split the client got),
    else its text (a record written before replies were split)."""
    if isinstance(choice.get("tool_text"), str):
        return choice["tool_text"]
    content = choice.get("content")
    return content if isinstance(content, str) else choice["text"]


def _without_thinking(messages: list[Any]) -> list[Any]:
    # An agent may send its earlier replies back with their reasoning_content or without it:
    # the conversation is the same either way.
    return [{k: v for k, v in m.items() if k != "reasoning_content"} if isinstance(m, dict) else m for m in messages]


def _empty_turn(job: Job, engine: Any, finish_reason: str) -> Turn:
    """A turn with no completion, so eval's samples and training's sequences (which start from
    the first turn's prompt) have one; its prompt is the card's prompt."""
    from arlecli.engine.base import GenerationRequest
    from arlecli.engine.tokens import encode_request

    prompt = job.env.reset()
    ids: list[int] | None = None
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is not None:
        request = GenerationRequest(
            messages=prompt if isinstance(prompt, list) else None, prompt=prompt if isinstance(prompt, str) else None
        )
        ids = encode_request(tokenizer, request)
    return Turn(
        prompt=prompt, completion="", prompt_token_ids=ids, token_ids=[], logprobs=[], finish_reason=finish_reason
    )
