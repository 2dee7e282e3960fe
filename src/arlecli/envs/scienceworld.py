"""ScienceWorld (scienceworld 1.2.3, the arle[worlds] extra) as an arle world.

ScienceWorld is a text simulator of elementary-school science: 30 task types (boil water,
grow a plant, test conductivity, ...) in 10 topics, each with many variations (other
substances, objects, rooms). Its simulator is a Scala program inside the wheel's jar, run
by a Java runtime and driven through py4j.

Tasks. A task is (task type, variation): the row's `task_type` (ScienceWorld's task name,
e.g. "boil") and `variation` (an index < the task's variation count). The `scienceworld`
generator makes rows from the simulator's own train/dev/test variation lists
(`get_variations_train()`, `_dev()`, `_test()`), so a card's train and test splits never
share a variation. Rows come round-robin over the selected task types (each type's
variations in a seeded order), so `--limit 30` runs one variation of every task type and
`--limit 300` ten of each. Generator params: `split` (train, dev or test), `task_types`
(task names, ids like "1-1", the papers' names, or topic names like "Electricity"; default
all 30) and `per_task` (at most this many variations per task type).

Episode. The first user turn is the card's template around the world's introduction (the
task description and the "look around" observation, plus the action hints the
`action_hints` param asks for: `templates`, the simulator's action templates, as the
papers' prompts list them; `valid`, those and each turn the valid actions of the current
state; `none`). Each reply is one action: the text of its last `<answer></answer>` tag,
else its last non-empty line (a leading "> " or "Action:" is dropped). Every action goes to
the world, which answers with an observation. A reply with no action, or one the world's
parser does not know ("No known action matches that input."), is an invalid action: it is
counted, uses the turn, and `max_invalid` of them in a row end the episode. End reasons:
`won` (the world says the task is completed with full score), `lost` (the world ends the
task as failed: focusing on the wrong thing scores -100), `invalid_actions` and arle's
`turn_limit` (`max_turns`, default 100, ScienceWorld's own default step limit).

    env: {name: scienceworld, params: {simplification: easy, action_hints: templates,
                                       max_turns: 100, max_invalid: 10}}

Four task types' gold paths are longer than the default 100 turns in the easy setting
(inclined-plane-friction-named-surfaces 111, mendelian-genetics-* 130-134,
inclined-plane-friction-unnamed-surfaces 192 actions): raise `max_turns` to give a model
their room.

What the simulator does not hold fixed (scienceworld 1.2.3): a variation's world is the
same on every load, but a room lists its objects in an order that can change from one load
to the next, many task types draw their gold path at random (which cup, which animal, which
flower pot), and an electrical task may complete one `wait` earlier or later. So a rerun
with the same seed sends the model the same facts, not always the same bytes.

`simplification` is the simulator's simplification string: "easy" (teleport actions,
open doors and containers, self-watering pots, no electrical actions where the task does
not need them), "" (the full game) or a comma-separated list of teleportAction,
selfWateringFlowerPots, openContainers, openDoors, noElectricalAction.

Reward (`scienceworld`): the world's own verdict (envs.worlds.world_reward): reward = its
score / 100 clamped to 0-1, correct = won. `info()` holds world, won, score, steps,
invalid_actions (what envs.worlds reads) and raw_score, task_type, variation, the actions.

JVMs. Starting a JVM costs seconds, and ScienceWorld's Python wrapper starts one per
environment. Here one JVM serves a whole process: every live episode is its own
simulator object (`PythonInterface`, the class the wrapper drives) inside that one JVM, so
an eval's 16 or 500 concurrent episodes are one JVM, not 16 or 500. The JVM starts with the
first world, is replaced by a fresh one after RECYCLE_AFTER worlds (old worlds finish on the
old JVM, which then exits), exits IDLE_S seconds after its last world ends, at `shutdown()`
and at interpreter exit, and dies with this process in any case (py4j's
--die-on-broken-pipe). Episodes run in waves of at most `max_live` (default 256) live
worlds, so a 2,000-episode eval does not hold 2,000 worlds in memory at once.
"""

from __future__ import annotations

import atexit
import difflib
import importlib
import os
import random
import re
import shutil
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from arlecli.cards import render_prompt
from arlecli.data.generators import generator
from arlecli.envs import Step, register_env
from arlecli.envs.worlds import world_reward, world_stats
from arlecli.errors import ParamError, UserError
from arlecli.rewards import RewardFn, register
from arlecli.rewards.procedural import answer_tag
from arlecli.types import Episode, Score, Task

EXTRA = "pip install 'arle[worlds]' (scienceworld 1.2.3 and py4j)"
JAVA_HINT = (
    "ScienceWorld's simulator needs a Java runtime (java on PATH or in JAVA_HOME); "
    "install one, e.g. on Debian/Ubuntu: apt-get install default-jre-headless"
)
SPLITS = ("train", "dev", "test")
HINTS = ("templates", "valid", "none")
SIMPLIFICATIONS = ("teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors", "noElectricalAction")
DEFAULT_MAX_TURNS = 100  # ScienceWorld's own default step limit (envStepLimit)
DEFAULT_MAX_INVALID = 10  # invalid actions in a row that end an episode
DEFAULT_MAX_LIVE = 256  # live worlds (episodes) per wave
MAX_ACTION_CHARS = 300  # model output is untrusted: no action is longer than this
UNKNOWN_ACTION = "No known action matches that input."
RECYCLE_AFTER = 2000  # worlds one JVM loads before a fresh JVM takes over (bounds its heap)
IDLE_S = 60.0  # a JVM without worlds exits after this long
_ENV_PARAMS = ("simplification", "action_hints", "max_turns", "max_invalid", "max_live")
_GEN_PARAMS = ("split", "task_types", "per_task")


def scienceworld() -> Any:
    """The scienceworld module, or a one-line error naming the extra that installs it."""
    try:
        module = importlib.import_module("scienceworld")
        importlib.import_module("py4j.java_gateway")
    except ImportError:
        raise UserError(f"ScienceWorld cards need the scienceworld package: {EXTRA}") from None
    return module


def java_path() -> str:
    """The java executable py4j will run ($JAVA_HOME/bin/java, else java on PATH), or a
    one-line error saying to install a Java runtime."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise UserError(JAVA_HINT)
    return found


# Task types ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskType:
    """One of ScienceWorld's 30 task types, as its tasks.json lists it."""

    id: str  # "1-1"
    name: str  # the simulator's name, "boil"
    topic: str  # "Matter"
    title: str  # "Changes of State (Boiling)"


def all_task_types() -> list[TaskType]:
    """The 30 task types in ScienceWorld's own order (no JVM needed: the wheel's tasks.json)."""
    constants = importlib.import_module(scienceworld().__name__ + ".constants")
    return [TaskType(t["task_id"], t["task_name"], t["topic"], t["task"]) for t in constants.TASKS]


def task_types(spec: Any = None) -> list[TaskType]:
    """The task types `spec` selects: None or "all" for all 30, else a name or a list of
    names; a name is a task name ("boil"), an id ("1-1"), the papers' name ("Matter Changes
    of State (Boiling)") or a topic ("Electricity": all its task types). An unknown name is
    a one-line error suggesting near ones."""
    types = all_task_types()
    if spec is None or spec == "all":
        return types
    names = [spec] if isinstance(spec, str) else spec
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise UserError(f"scienceworld: task_types must be 'all', a task type or a list of them, got {spec!r}")
    lookup: dict[str, list[TaskType]] = {}
    for t in types:
        for key in (t.name, t.id, f"{t.topic} {t.title}", f"task-{t.id}-{t.name}"):
            lookup.setdefault(key.lower(), []).append(t)
        lookup.setdefault(t.topic.lower(), []).append(t)
    chosen: list[TaskType] = []
    for name in names:
        found = lookup.get(name.strip().lower())
        if found is None:
            near = difflib.get_close_matches(
                name.lower(), [t.name for t in types] + sorted({t.topic.lower() for t in types}), n=3
            )
            hint = f"; did you mean {', '.join(near)}" if near else f"; known: {', '.join(t.name for t in types)}"
            raise UserError(f"unknown ScienceWorld task type '{name}'{hint}")
        chosen.extend(t for t in found if t not in chosen)
    return chosen


def task_type(name: Any) -> TaskType:
    """The one task type a row's `task_type` names (see task_types)."""
    if not isinstance(name, str) or not name:
        raise UserError(f"scienceworld: a task needs a 'task_type' (e.g. 'boil'), got {name!r}")
    [found, *rest] = task_types([name])
    if rest:
        raise UserError(f"scienceworld: a task's task_type names one task type, not the topic '{name}'")
    return found


# The JVM and its worlds -------------------------------------------------------------------


class Jvm:
    """One Java process running ScienceWorld's server, reached through a py4j gateway.
    Worlds are simulator objects inside it; `live` counts the open ones."""

    def __init__(self) -> None:
        sw = scienceworld()
        # py4j ships no types; imported by name so its classes are Any to mypy
        py4j = importlib.import_module("py4j.java_gateway")
        GatewayParameters, JavaGateway, launch_gateway = py4j.GatewayParameters, py4j.JavaGateway, py4j.launch_gateway
        constants = importlib.import_module(sw.__name__ + ".constants")
        java = java_path()
        try:
            # No output redirect: py4j drains the simulator's chatter to /dev/null.
            port, proc = launch_gateway(
                classpath=constants.JAR_PATH, die_on_exit=True, cwd=constants.BASEPATH, return_proc=True, java_path=java
            )
        except (OSError, ValueError) as exc:  # java that does not run, or exits before printing its port
            raise UserError(f"could not start ScienceWorld's simulator with {java}: {exc}; {JAVA_HINT}") from None
        self.proc = proc
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(auto_field=True, port=port), java_process=proc)
        self.live = 0
        self.loads = 0
        self.closed = False

    def interface(self) -> Any:
        """A fresh simulator object (ScienceWorld's PythonInterface) in this JVM."""
        return self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()

    def close(self) -> None:
        """Shut the gateway and make sure the Java process has exited."""
        if self.closed:
            return
        self.closed = True
        try:
            self.gateway.shutdown()
        except Exception:  # the JVM may be gone already; the process check below still runs
            pass
        proc = self.proc
        if proc.poll() is None:
            try:  # py4j's server exits on a newline (py4j issue 320), as the wrapper's close() does
                proc.stdin.write(b"\n")
                proc.stdin.flush()
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except Exception:
                proc.kill()
                proc.wait(timeout=5)


class _Pool:
    """The process's JVMs: the current one, the retired ones still running worlds, and the
    timer that closes an idle JVM."""

    def __init__(self) -> None:
        # Re-entrant: a World dropped by the garbage collector releases from inside any call.
        self.lock = threading.RLock()
        self.current: Jvm | None = None
        self.retired: list[Jvm] = []
        self.timer: threading.Timer | None = None
        self.started = 0  # JVMs started by this process (tests and perf read it)

    def acquire(self) -> Jvm:
        with self.lock:
            self._cancel_timer()
            if self.current is not None and self.current.loads >= RECYCLE_AFTER:
                self._retire(self.current)
                self.current = None
            if self.current is None or self.current.closed:
                self.current = Jvm()
                self.started += 1
            jvm = self.current
            jvm.live += 1
            jvm.loads += 1
            return jvm

    def release(self, jvm: Jvm) -> None:
        with self.lock:
            jvm.live -= 1
            if jvm.live > 0:
                return
            if jvm in self.retired:
                self.retired.remove(jvm)
                jvm.close()
            elif jvm is self.current:
                self._cancel_timer()
                self.timer = threading.Timer(IDLE_S, self._close_if_idle, args=(jvm,))
                self.timer.daemon = True
                self.timer.start()

    def running(self) -> list[Jvm]:
        """The JVMs of this process that have not exited."""
        with self.lock:
            return [j for j in [self.current, *self.retired] if j is not None and not j.closed]

    def shutdown(self) -> None:
        with self.lock:
            self._cancel_timer()
            for jvm in [self.current, *self.retired]:
                if jvm is not None:
                    jvm.close()
            self.current, self.retired = None, []

    def _retire(self, jvm: Jvm) -> None:
        if jvm.live > 0:
            self.retired.append(jvm)
        else:
            jvm.close()

    def _close_if_idle(self, jvm: Jvm) -> None:
        with self.lock:
            if jvm is self.current and jvm.live == 0:
                jvm.close()
                self.current = None

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


POOL = _Pool()
atexit.register(POOL.shutdown)


def shutdown() -> None:
    """Close every ScienceWorld JVM of this process now (worlds still open stop working)."""
    POOL.shutdown()


@dataclass
class Outcome:
    """What the world says after one action."""

    observation: str
    raw_score: int  # ScienceWorld's 0-100 (-100: the task failed)
    completed: bool


class World:
    """One ScienceWorld game: a task type's variation, loaded in the process's JVM."""

    def __init__(self, kind: TaskType, variation: int, simplification: str = "", gold: bool = False) -> None:
        self.kind, self.variation, self.simplification = kind, variation, simplification
        self._jvm: Jvm | None = POOL.acquire()
        try:
            self.server = self._jvm.interface()
            self.server.load(kind.name, variation, simplification, gold)
        except BaseException:
            self.close()
            raise

    def variations(self, split: str) -> list[int]:
        """The loaded task type's variations of the simulator's `split` (train, dev, test)."""
        get = {"train": self.server.getVariationsTrain, "dev": self.server.getVariationsDev}
        return [int(v) for v in get.get(split, self.server.getVariationsTest)()]

    def description(self) -> str:
        """The task description the simulator gives."""
        return str(self.server.getTaskDescription())

    def templates(self) -> list[str]:
        """The simulator's action templates ("open OBJ", "move OBJ to OBJ", ...)."""
        return [str(a) for a in self.server.getPossibleActions()]

    def valid_actions(self) -> list[str]:
        """The concrete actions valid in the current state."""
        return sorted(str(a) for a in self.server.getValidActionObjectCombinations())

    def gold(self) -> list[str]:
        """The simulator's gold action sequence (the world must be loaded with gold=True)."""
        return [str(a) for a in self.server.getGoldActionSequence()]

    def step(self, action: str) -> Outcome:
        """Send one action; the observation, score and whether the task has ended."""
        Py4JJavaError = importlib.import_module("py4j.protocol").Py4JJavaError
        try:
            observation = str(self.server.step(action))
        except Py4JJavaError:  # the simulator's own error on a strange input: the action is unknown to it
            observation = UNKNOWN_ACTION
        score = int(round(100 * float(self.server.getScore())))  # as the wrapper reports it
        return Outcome(observation, score, bool(self.server.getCompleted()))

    def close(self) -> None:
        """Give the world's place in the JVM back (idempotent)."""
        jvm, self._jvm = self._jvm, None
        self.server = None
        if jvm is not None:
            POOL.release(jvm)

    def __del__(self) -> None:  # an episode dropped mid-way (an interrupted eval) still releases
        try:
            self.close()
        except Exception:
            pass


# Replies ---------------------------------------------------------------------------------

_PREFIX = re.compile(r"^(?:>\s*|action\s*:\s*)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def parse_action(text: str) -> tuple[str | None, str | None]:
    """The action a reply gives: its last `<answer>` tag's text, else its last non-empty
    line, without a leading "> " or "Action:" and with whitespace collapsed. Returns
    (action, None), or (None, why) when there is none or it is too long to be one."""
    tagged = answer_tag(text)
    body = tagged if tagged is not None else text
    lines = [ln.strip() for ln in (body or "").splitlines() if ln.strip()]
    if not lines:
        return None, "no action given"
    line = lines[0] if tagged is not None else lines[-1]
    action = " ".join(_CONTROL.sub(" ", _PREFIX.sub("", line.strip().strip("`'\""))).split())
    if not action:
        return None, "no action given"
    if len(action) > MAX_ACTION_CHARS:
        return None, f"an action is at most {MAX_ACTION_CHARS} characters"
    return action, None


# The env ---------------------------------------------------------------------------------


@dataclass
class Settings:
    """The env params of a scienceworld card (see the module doc)."""

    simplification: str = "easy"
    action_hints: str = "templates"
    max_turns: int = DEFAULT_MAX_TURNS
    max_invalid: int = DEFAULT_MAX_INVALID
    max_live: int = DEFAULT_MAX_LIVE


def check_params(params: dict[str, Any], base: Path | None = None) -> None:
    """Refuse a scienceworld card's bad env params when it loads (ParamError names the
    param); a missing package or Java runtime is its own one-line error."""
    unknown = sorted(set(params) - set(_ENV_PARAMS))
    if unknown:
        raise ParamError(unknown[0], f"is not a param of env 'scienceworld' (known: {', '.join(_ENV_PARAMS)})")
    simplification = params.get("simplification", "easy")
    if not isinstance(simplification, str):
        raise ParamError("simplification", f"must be a string, got {simplification!r}")
    bad = [s for s in simplification.split(",") if s and s not in ("easy", *SIMPLIFICATIONS)]
    if bad:
        raise ParamError("simplification", f"'{bad[0]}' is not one of easy, {', '.join(SIMPLIFICATIONS)}")
    hints = params.get("action_hints", "templates")
    if hints not in HINTS:
        raise ParamError("action_hints", f"must be one of {', '.join(HINTS)}, got {hints!r}")
    for key in ("max_turns", "max_invalid", "max_live"):
        value = params.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ParamError(key, f"must be a whole number >= 1, got {value!r}")
    scienceworld()  # the extra, then Java: each its own line
    java_path()


class ScienceWorldTextEnv:
    """One ScienceWorld episode: the world's introduction, then one observation per action."""

    tools: list[dict[str, Any]] | None = None

    def __init__(self, card: Any, task: Task, exemplars: list[Task], settings: Settings) -> None:
        self.kind, self.variation = check_task(card, task)
        self.card, self.task, self.exemplars, self.settings = card, task, exemplars, settings
        self.max_turns = settings.max_turns
        self.world: World | None = None
        self.actions: list[str] = []
        self.invalid = self.streak = 0
        self.last = Outcome("", 0, False)
        self.ended: str | None = None

    def reset(self) -> list[dict[str, Any]]:
        world = self.world = World(self.kind, self.variation, self.settings.simplification)
        start = world.step("look around")  # ScienceWorld's first observation, as its wrapper's reset() gives it
        parts = [f"Task: {world.description().strip()}", start.observation.strip()]
        if self.settings.action_hints != "none":
            parts.append("Actions you can take (OBJ is an object you see):\n" + "\n".join(world.templates()))
        if self.settings.action_hints == "valid":
            parts.append(self._valid())
        text = "\n\n".join(p for p in parts if p)
        rendered = render_prompt(self.card.prompt, replace(self.task, input=text), self.exemplars)
        if isinstance(rendered, str):
            self.close()
            raise UserError(f"{self.card.name}: env 'scienceworld' needs a chat card (prompt.format: chat)")
        return rendered

    def step(self, completion: str) -> Step:
        assert self.world is not None, "reset() first"
        action, error = parse_action(completion)
        if action is None:
            return self._invalid(
                f"Invalid reply: {error}. Reply with one action inside <answer></answer>, "
                "e.g. <answer>look around</answer>."
            )
        out = self.world.step(action)
        self.actions.append(action)
        self.last = out
        if out.observation.strip().startswith(UNKNOWN_ACTION):
            return self._invalid(out.observation.strip())
        self.streak = 0
        if out.completed or out.raw_score < 0:
            self.ended = "won" if out.completed and out.raw_score >= 100 else "lost"
            self.close()
            return Step([self._say(out.observation)], done=True, reason=self.ended)
        text = out.observation.strip()
        if self.settings.action_hints == "valid":
            text += "\n\n" + self._valid()
        return Step([self._say(text)])

    def info(self) -> dict[str, Any]:
        self.close()  # the driver reads info() once, at the episode's end
        return {
            "world": "scienceworld",
            "won": self.ended == "won",
            "score": max(0, min(100, self.last.raw_score)) / 100,
            "raw_score": self.last.raw_score,
            "steps": len(self.actions),
            "invalid_actions": self.invalid,
            "task_type": self.kind.name,
            "variation": self.variation,
            "simplification": self.settings.simplification,
            "actions": list(self.actions),
        }

    def close(self) -> None:
        """End the episode's world (its JVM slot goes back to the pool)."""
        if self.world is not None:
            self.world.close()
            self.world = None

    def _invalid(self, text: str) -> Step:
        self.invalid += 1
        self.streak += 1
        if self.streak >= self.settings.max_invalid:
            self.ended = "invalid_actions"
            self.close()
            return Step(
                [self._say(f"{text}\n\n{self.streak} invalid actions in a row: the episode ends.")],
                done=True,
                reason="invalid_actions",
            )
        return Step([self._say(text)])

    def _valid(self) -> str:
        assert self.world is not None
        return "Valid actions now:\n" + "\n".join(self.world.valid_actions())

    @staticmethod
    def _say(text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}


def run_world_episodes(engine: Any, jobs: list[Any]) -> Iterator[tuple[int, Episode]]:
    """The turn-by-turn driver (envs.episodes.run_episodes) in waves of at most `max_live`
    episodes, so no more worlds are alive at once (all run in the one JVM)."""
    from arlecli.envs.episodes import run_episodes

    size = max(1, min((getattr(j.env, "settings", Settings()).max_live for j in jobs), default=DEFAULT_MAX_LIVE))
    for start in range(0, len(jobs), size):
        wave = jobs[start : start + size]
        try:
            for i, episode in run_episodes(engine, wave):
                yield start + i, episode
        finally:  # an interrupted wave gives its worlds back at once
            for job in wave:
                close = getattr(job.env, "close", None)
                if close is not None:
                    close()


def check_task(card: Any, task: Task) -> tuple[TaskType, int]:
    """A task's task type and variation as the simulator has them, else one line."""
    kind = task_type(task.fields.get("task_type"))
    variation = task.fields.get("variation")
    if not isinstance(variation, int) or isinstance(variation, bool) or variation < 0:
        raise UserError(f"{card.name}: task {task.id}: 'variation' must be a whole number >= 0, got {variation!r}")
    count = variation_count(kind)
    if variation >= count:
        raise UserError(
            f"{card.name}: task {task.id}: ScienceWorld task type '{kind.name}' has variations "
            f"0-{count - 1}, got {variation}"
        )
    return kind, variation


@register_env("scienceworld", driver=run_world_episodes, check=check_params, stats=world_stats, check_task=check_task)
def scienceworld_env(
    card: Any,
    task: Task,
    exemplars: list[Task],
    native_tools: bool,
    simplification: str = "easy",
    action_hints: str = "templates",
    max_turns: int = DEFAULT_MAX_TURNS,
    max_invalid: int = DEFAULT_MAX_INVALID,
    max_live: int = DEFAULT_MAX_LIVE,
) -> ScienceWorldTextEnv:
    """Env factory for `env: {name: scienceworld, params: {simplification, action_hints,
    max_turns, max_invalid, max_live}}` (see the module doc)."""
    settings = Settings(simplification, action_hints, max_turns, max_invalid, max_live)
    try:  # a card built in code, not loaded (its check ran at load otherwise)
        check_params(vars(settings))
    except ParamError as exc:
        raise UserError(f"{card.name}: env 'scienceworld' {exc}") from None
    return ScienceWorldTextEnv(card, task, exemplars, settings)


# The reward ------------------------------------------------------------------------------


@register("scienceworld", metrics=["score", "steps", "invalid_actions"], needs_target=False)
def scienceworld_reward() -> RewardFn:
    """ScienceWorld: the world's own verdict, reward = its score / 100 (0-1; a failed task's
    -100 is 0), correct = the task completed (won).

    The verdict is the env's (`episode.info`, see envs.worlds.world_reward); an episode that
    did not run in the world (a single completion scored outside the env) has none and
    scores 0. Takes no params. Details: won, score (0-1), steps (actions sent to the
    world), invalid_actions. `extracted` is the last action."""

    def score(task: Task, episode: Episode) -> Score:
        verdict = world_reward(episode)
        actions = episode.info.get("actions") if isinstance(episode.info, dict) else None
        details = {"won": False, "score": 0.0, "steps": 0, "invalid_actions": 0, **verdict.details}
        return Score(verdict.reward, verdict.correct, actions[-1] if actions else None, details)

    return score


# Rows ------------------------------------------------------------------------------------

_VARIATIONS: dict[str, dict[str, list[int]]] = {}
_VARIATIONS_LOCK = threading.Lock()


_COUNTS: dict[str, int] = {}


def variation_count(kind: TaskType) -> int:
    """How many variations the simulator has for a task type (cached per process)."""
    with _VARIATIONS_LOCK:
        if kind.name not in _COUNTS:
            jvm = POOL.acquire()
            try:
                _COUNTS[kind.name] = int(jvm.interface().getTaskMaxVariations(kind.name))
            finally:
                POOL.release(jvm)
        return _COUNTS[kind.name]


def variation_sets(kind: TaskType) -> dict[str, list[int]]:
    """The simulator's train/dev/test variation lists of a task type (cached per process)."""
    with _VARIATIONS_LOCK:
        if kind.name not in _VARIATIONS:
            world = World(kind, 0)
            try:
                _VARIATIONS[kind.name] = {split: world.variations(split) for split in SPLITS}
            finally:
                world.close()
        return _VARIATIONS[kind.name]


def question(kind: TaskType, variation: int, split: str) -> str:
    """A row's text: which task this is (the env shows the world's own introduction in its place)."""
    return (
        f"ScienceWorld task {kind.id} ({kind.topic}: {kind.title}), task type '{kind.name}', "
        f"variation {variation} ({split} set)"
    )


def task_row(kind: TaskType, variation: int, split: str) -> dict[str, Any]:
    """The row the generator makes for (task type, variation) of `split`."""
    return {
        "id": f"scienceworld-{kind.name}-{variation}",
        "task_type": kind.name,
        "task_id": kind.id,
        "topic": kind.topic,
        "variation": variation,
        "split": split,
        "question": question(kind, variation, split),
        "answer": "",
    }


@generator("scienceworld")
def scienceworld_rows(*, seed: int, size: int, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`size` ScienceWorld tasks (see the module doc): row i is {id, task_type, task_id,
    topic, variation, split, question, answer}, round-robin over the task types, each
    type's variations of `split` in an order seeded by `seed`; fewer rows when the split
    has fewer. `answer` is empty: the world decides."""
    cfg = {"split": "test", "task_types": None, "per_task": None, **(params or {})}
    unknown = sorted(set(cfg) - set(_GEN_PARAMS))
    if unknown:
        raise UserError(f"unknown params for scienceworld: {', '.join(unknown)}; known: {', '.join(_GEN_PARAMS)}")
    split = cfg["split"]
    if split not in SPLITS:
        raise UserError(f"scienceworld: split must be one of {', '.join(SPLITS)}, got {split!r}")
    per_task = cfg["per_task"]
    if per_task is not None and (not isinstance(per_task, int) or isinstance(per_task, bool) or per_task < 1):
        raise UserError(f"scienceworld: per_task must be a whole number >= 1, got {per_task!r}")
    kinds = task_types(cfg["task_types"])
    orders: dict[str, list[int]] = {}  # filled as rows need them: a first row needs one task type's lists

    def order(kind: TaskType) -> list[int]:
        if kind.name not in orders:
            vs = list(variation_sets(kind)[split])
            random.Random(f"arle-scienceworld:{seed}:{kind.name}").shuffle(vs)
            orders[kind.name] = vs[:per_task] if per_task else vs
        return orders[kind.name]

    rows: list[dict[str, Any]] = []
    rank, live = 0, list(kinds)
    while len(rows) < size and live:
        still = []
        for kind in live:
            vs = order(kind)
            if rank >= len(vs):
                continue
            still.append(kind)
            rows.append(task_row(kind, vs[rank], split))
            if len(rows) >= size:
                break
        live, rank = still, rank + 1
    return rows
