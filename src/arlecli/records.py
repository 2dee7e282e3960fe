"""What a run directory holds: its paths (RunDir) and the records in its files, typed.

    meta.json        Meta: written when the run starts (`schema` says which layout; none: before 1)
    samples.jsonl    one Sample a line (with its turns, TurnRecord, for a multi-turn card)
    results.json     Results: aggregated from samples.jsonl (results.py)
    metrics.jsonl    a training run's logged steps (train.metrics)
    rewards.jsonl    one RewardRow per training verdict
    summary.json     TrainSummary: a training run's closing file
    final/, eval/step-N/ (held-out evals, ordinary eval runs), checkpoint-N/

Each record is a dataclass with `to_json` (the object written, keys in the order arle has
always written them) and `from_json` (lenient: what an older arle wrote reads, a missing field
takes its default), made from an Episode by `from_episode` where one is, as rllm's
Step/Trajectory/Episode. Keys a record does not name ride in `extra`, so a record read and
written back loses nothing. Checking that a line is a record at all is the reader's
(results.read_samples names the file and line).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping

from arlecli import safeio
from arlecli.types import Episode, Score, Task, Turn

SCHEMA = 1  # meta.json's `schema`: the layout of the run's files (a run without one was written before 1)


@dataclass(frozen=True)
class RunDir:
    """Every path of a run directory, each file named once here."""

    path: Path

    META: ClassVar[str] = "meta.json"
    SAMPLES: ClassVar[str] = "samples.jsonl"
    RESULTS: ClassVar[str] = "results.json"
    METRICS: ClassVar[str] = "metrics.jsonl"
    REWARDS: ClassVar[str] = "rewards.jsonl"
    SUMMARY: ClassVar[str] = "summary.json"
    FINAL: ClassVar[str] = "final"
    HELD_OUT: ClassVar[str] = "eval"  # <train run>/eval/step-N/: the held-out evaluations
    CHECKPOINT: ClassVar[str] = "checkpoint-{step}"
    LOCK: ClassVar[str] = ".lock"  # held by the process writing the run (rundir.hold)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def meta(self) -> Path:
        """meta.json."""
        return self.path / self.META

    @property
    def samples(self) -> Path:
        """samples.jsonl."""
        return self.path / self.SAMPLES

    @property
    def results(self) -> Path:
        """results.json."""
        return self.path / self.RESULTS

    @property
    def metrics(self) -> Path:
        """metrics.jsonl (a training run's logged steps)."""
        return self.path / self.METRICS

    @property
    def rewards(self) -> Path:
        """rewards.jsonl (a training run's verdicts)."""
        return self.path / self.REWARDS

    @property
    def summary(self) -> Path:
        """summary.json (a training run's closing file)."""
        return self.path / self.SUMMARY

    @property
    def final(self) -> Path:
        """final/: the trained model."""
        return self.path / self.FINAL

    @property
    def held_out(self) -> Path:
        """eval/: a training run's held-out evaluations."""
        return self.path / self.HELD_OUT

    def eval_dir(self, label: str) -> Path:
        """eval/LABEL (LABEL: step-N), one held-out evaluation's run directory."""
        return self.held_out / label

    def checkpoint(self, step: int) -> Path:
        """checkpoint-N/."""
        return self.path / self.CHECKPOINT.format(step=step)

    def owns(self, path: Path) -> bool:
        """Whether writing `path` would overwrite part of this run: one of its records, or
        anything under final/, eval/ or a checkpoint (symlinks and `..` resolved)."""
        target, root = Path(path).resolve(), self.path.resolve()
        if target.parent == root:
            names = (self.META, self.SAMPLES, self.RESULTS, self.METRICS, self.REWARDS, self.SUMMARY, self.LOCK)
            return target.name in names
        inside = target.relative_to(root).parts[0] if target.is_relative_to(root) else None
        return inside is not None and (inside in (self.FINAL, self.HELD_OUT) or inside.startswith("checkpoint-"))

    def read_metrics(self) -> list[dict[str, Any]]:
        """The complete lines of metrics.jsonl (a torn last line is skipped; nothing after a
        damaged line is trusted)."""
        if not self.metrics.exists():
            return []
        rows = []
        for raw in self.metrics.read_bytes().splitlines(keepends=True):
            if not raw.endswith(b"\n"):
                break
            try:
                row = safeio.loads(raw)
            except ValueError:  # damaged (or nested too deep)
                break
            if not isinstance(row, dict):
                break
            rows.append(row)
        return rows


def sample_id(task_id: str, k: int) -> str:
    """The unique id of sample k of a task (the resume key)."""
    return f"{task_id}#{k}"


def _split(data: Mapping[str, Any], cls: type) -> tuple[dict[str, Any], dict[str, Any]]:
    # A JSON object as (the record's own fields, the rest in their order).
    names = {f.name for f in dataclasses.fields(cls)} - {"extra", "order", "has_tools"}
    return {k: v for k, v in data.items() if k in names}, {k: v for k, v in data.items() if k not in names}


def _ordered(record: Any) -> dict[str, Any]:
    # A whole-file record (meta, results, summary) as JSON: read from a file, the keys it had in
    # their order (a reader printing it shows the file); made here, its fields that are set.
    named = {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name not in ("extra", "order")}
    out = {**named, **record.extra}
    if record.order:
        return {k: out[k] for k in record.order if k in out}
    return {k: v for k, v in out.items() if v is not None}


def _thinking(record: Any) -> dict[str, Any]:
    # The thinking block (Sample, RewardRow): present when a turn thought (thinking_cut is then a bool).
    if record.thinking_cut is None:
        return {}
    return {
        "thinking": record.thinking,
        "thinking_cut": record.thinking_cut,
        "thinking_tokens": record.thinking_tokens,
        "answer_tokens": record.answer_tokens,
    }


def _sum_or_none(values: list[Any]) -> Any:
    return None if any(v is None for v in values) else sum(values)


def sample_counts(turns: list[Turn]) -> dict[str, Any]:
    """A sample's `prompt_tokens`, `completion_tokens` and `latency_s` from its Turns (summed;
    None when any turn lacks it)."""
    return {
        "prompt_tokens": _sum_or_none([t.prompt_count() for t in turns]),
        "completion_tokens": _sum_or_none([t.completion_count() for t in turns]),
        "latency_s": _sum_or_none([t.latency_s for t in turns]),
    }


def thinking_counts(turns: list[Turn]) -> dict[str, Any]:
    """What a record keeps of its episode's thinking (nothing when no turn thought): the last
    turn's `thinking` text and whether it was cut (`thinking_cut`: no answer), and over all
    turns `thinking_tokens` and `answer_tokens` (None where the engine gave no counts)."""
    if not any(t.thinking is not None for t in turns):
        return {}
    thought = _sum_or_none([t.thinking_tokens if t.thinking is not None else 0 for t in turns])
    generated = _sum_or_none([t.completion_count() for t in turns])
    answer = generated - thought if thought is not None and generated is not None else None
    return {
        "thinking": turns[-1].thinking,
        "thinking_cut": turns[-1].thinking_cut,
        "thinking_tokens": thought,
        "answer_tokens": answer,
    }


@dataclass
class TurnRecord:
    """One model turn of a multi-turn sample, with what the environment answered."""

    completion: Any = None
    observation: Any = None
    finish_reason: str | None = None
    num_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    thinking: str | None = None  # None: the turn did not think (the three keys are then left out)
    thinking_cut: bool = False
    thinking_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_turn(cls, t: Turn) -> "TurnRecord":
        """The record of an episode's turn."""
        return cls(
            t.completion,
            t.observation,
            t.finish_reason,
            len(t.token_ids or []),
            t.prompt_count(),
            t.completion_count(),
            t.latency_s,
            t.thinking,
            t.thinking_cut,
            t.thinking_tokens,
        )

    def to_json(self) -> dict[str, Any]:
        """The turn as samples.jsonl holds it."""
        out = {
            "completion": self.completion,
            "observation": self.observation,
            "finish_reason": self.finish_reason,
            "num_tokens": self.num_tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_s": self.latency_s,
        }
        if self.thinking is not None:
            out.update(thinking=self.thinking, thinking_cut=self.thinking_cut, thinking_tokens=self.thinking_tokens)
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Any) -> "TurnRecord":
        """A turn read back (a value that is no object reads as an empty turn: the reader refuses it)."""
        own, extra = _split(data if isinstance(data, dict) else {}, cls)
        return cls(**own, extra=extra)


@dataclass
class Sample:
    """One line of samples.jsonl: a task's sample k, what the model said and the reward's verdict.

    Optional blocks are written only where they apply: `choices` (loglikelihood scoring), the
    thinking block (`thinking_cut` not None: a turn thought), the multi-turn block (`turns` not
    None: num_turns, tool counts where the env keeps them, end_reason, env_info, tools) and
    `group` (cards with group_by)."""

    id: str
    task_id: str
    sample: int = 0
    prompt: Any = None
    completion: Any = None
    extracted: Any = None
    target: Any = None
    reward: float | None = None
    correct: bool = False
    details: Any = field(default_factory=dict)
    choices: list[Any] | None = None
    finish_reason: str | None = None
    num_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    thinking: str | None = None
    thinking_cut: bool | None = None
    thinking_tokens: int | None = None
    answer_tokens: int | None = None
    turns: list[TurnRecord] | None = None
    num_turns: int | None = None
    tool_calls: int | None = None
    tool_errors: int | None = None
    end_reason: str | None = None
    env_info: Any = None
    tools: list[dict[str, Any]] | None = None
    has_tools: bool = False  # `tools` was recorded (null included): runs before it was are told apart
    group: Any = None
    session_started_at: float | None = None
    finished_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_episode(
        cls,
        task: Task,
        k: int,
        episode: Episode,
        score: Score,
        *,
        multi_turn: bool,
        group_by: str | None,
        session_started_at: float,
    ) -> "Sample":
        """The sample an eval writes for `episode` (sample k of `task`) and its verdict; every
        turn is recorded for a multi-turn env."""
        # No turns: a game's seat that never got to move (the other seat ended the game first).
        first, last = (episode.turns[0], episode.turns[-1]) if episode.turns else (None, None)
        s = cls(
            sample_id(task.id, k),
            task.id,
            k,
            first.prompt if first else None,
            episode.completion,
            score.extracted,
            task.target,
            float(score.reward),
            bool(score.correct),
            score.details,
            finish_reason=last.finish_reason if last else None,
            num_tokens=sum(len(t.token_ids or []) for t in episode.turns),
            **sample_counts(episode.turns),
            **thinking_counts(episode.turns),
        )
        if multi_turn:  # every turn, with what the environment answered
            s.turns = [TurnRecord.from_turn(t) for t in episode.turns]
            s.num_turns = len(episode.turns)
            s.tool_calls, s.tool_errors = (
                episode.info.get(key) if isinstance(episode.info.get(key), int) else None
                for key in ("tool_calls", "tool_errors")
            )  # where the env counts them
            s.end_reason, s.env_info, s.tools, s.has_tools = episode.end_reason, episode.info, episode.tools, True
        if group_by:
            s.group = task.fields.get(group_by, "")
        s.session_started_at, s.finished_at = session_started_at, time.time()
        return s

    def to_json(self) -> dict[str, Any]:
        """The line as samples.jsonl holds it (keys in the order arle writes them)."""
        out: dict[str, Any] = {
            "id": self.id,
            "task_id": self.task_id,
            "sample": self.sample,
            "prompt": self.prompt,
            "completion": self.completion,
            "extracted": self.extracted,
            "target": self.target,
            "reward": self.reward,
            "correct": self.correct,
            "details": self.details,
        }
        if self.choices is not None:
            out["choices"] = self.choices
        out.update(
            finish_reason=self.finish_reason,
            num_tokens=self.num_tokens,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            latency_s=self.latency_s,
            **_thinking(self),
        )
        if self.turns is not None:
            out.update(turns=[t.to_json() for t in self.turns], num_turns=self.num_turns)
            out.update(
                {
                    key: value
                    for key, value in (("tool_calls", self.tool_calls), ("tool_errors", self.tool_errors))
                    if value is not None
                }
            )
            out.update(end_reason=self.end_reason, env_info=self.env_info)
        if self.has_tools:
            out["tools"] = self.tools
        if self.group is not None:
            out["group"] = self.group
        out.update(session_started_at=self.session_started_at, finished_at=self.finished_at)
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Sample":
        """A line read back: any arle's, or a hand-written one with at least id, task_id and correct."""
        own, extra = _split(data, cls)
        turns = own.pop("turns", None)
        s = cls(**own, has_tools="tools" in data, extra=extra)
        if isinstance(turns, list):
            s.turns = [TurnRecord.from_json(t) for t in turns]
        elif turns is not None:  # not what arle writes: kept as it was, for the reader to refuse
            s.extra["turns"] = turns
        return s

    @property
    def detail_map(self) -> dict[str, Any]:
        """`details` when it is an object, else empty (a damaged line's)."""
        return self.details if isinstance(self.details, dict) else {}


def samples_of(lines: Iterable[Sample | Mapping[str, Any]]) -> list[Sample]:
    """Samples from records or samples.jsonl objects (callers may hold either)."""
    return [s if isinstance(s, Sample) else Sample.from_json(s) for s in lines]


@dataclass
class RewardRow:
    """One line of a training run's rewards.jsonl: a rollout's verdict at a step.

    `num_turns` is written as `turns` (an int here, as rewards.jsonl has always held it;
    samples.jsonl's `turns` is the list of turns and its count `num_turns`): both records read
    as `.num_turns`."""

    step: int | None
    task_id: str
    task_index: int
    completion: Any = None
    extracted: Any = None
    target: Any = None
    reward: float | None = None
    correct: bool = False
    details: Any = field(default_factory=dict)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    thinking: str | None = None
    thinking_cut: bool | None = None
    thinking_tokens: int | None = None
    answer_tokens: int | None = None
    overlong_penalty: float | None = None  # DAPO's soft overlong punishment; `reward` is the card's
    trained_reward: float | None = None
    dropped: bool | None = None  # dynamic sampling left this group out of the batch
    num_turns: int | None = None  # multi-turn cards (with end_reason and env_info)
    end_reason: str | None = None
    env_info: Any = None
    policy_version: int | None = None  # --max-staleness: the optimizer steps of the weights that sampled it
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_episode(
        cls,
        step: int | None,
        task: Task,
        index: int,
        episode: Episode,
        score: Score,
        *,
        multi_turn: bool,
        dropped: bool | None = None,
    ) -> "RewardRow":
        """The row for `episode`'s verdict `score` (an overlong penalty in its details rides beside
        the card's reward)."""
        penalty = score.details.get("overlong_penalty") if isinstance(score.details, dict) else None
        details = (
            {k: v for k, v in score.details.items() if k != "overlong_penalty"}
            if penalty is not None
            else score.details
        )
        row = cls(
            step,
            task.id,
            int(index),
            episode.completion,
            score.extracted,
            task.target,
            float(score.reward) - (penalty or 0.0),
            bool(score.correct),
            details,
            episode.turns[-1].finish_reason if episode.turns else None,
            sum(t.completion_count() or 0 for t in episode.turns),
            **thinking_counts(episode.turns),
        )
        if penalty is not None:
            row.overlong_penalty, row.trained_reward = penalty, float(score.reward)
        row.dropped = dropped
        row.policy_version = episode.policy_version
        if multi_turn:
            row.num_turns, row.end_reason, row.env_info = len(episode.turns), episode.end_reason, episode.info
        return row

    def to_json(self) -> dict[str, Any]:
        """The line as rewards.jsonl holds it."""
        out: dict[str, Any] = {
            "step": self.step,
            "task_id": self.task_id,
            "task_index": self.task_index,
            "completion": self.completion,
            "extracted": self.extracted,
            "target": self.target,
            "reward": self.reward,
            "correct": self.correct,
            "details": self.details,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
            **_thinking(self),
        }
        if self.overlong_penalty is not None:
            out.update(overlong_penalty=self.overlong_penalty, trained_reward=self.trained_reward)
        if self.dropped is not None:
            out["dropped"] = self.dropped
        if self.policy_version is not None:
            out["policy_version"] = self.policy_version
        if self.num_turns is not None:
            out.update(turns=self.num_turns, end_reason=self.end_reason, env_info=self.env_info)
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RewardRow":
        """A line read back (lenient: a missing field takes its default)."""
        data = dict(data)
        turns = data.pop("turns", None)
        own, extra = _split(data, cls)
        own.pop("num_turns", None)
        return cls(
            **{"step": None, "task_id": "", "task_index": 0, **own},
            num_turns=turns if isinstance(turns, int) else None,
            extra=extra,
        )


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass
class Meta:
    """meta.json: how a run was started (eval: card, model, options; train: kind "train", algo,
    trainer settings). Only what readers use is named; everything else rides in `extra`."""

    kind: str | None = None  # "train" for a training run (an eval run records none)
    schema: int | None = None  # None: written before meta.json carried a schema
    command: list[Any] = field(default_factory=list)
    benchmark: str | None = None
    model: str | None = None
    created: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    data_hash: str | None = None
    expected_samples: int | None = None
    algo: str | None = None
    eval_split: str | None = None
    trainer: dict[str, Any] = field(default_factory=dict)
    unit: str | None = None  # a training run: what a step of its algorithm is called (rounds) ...
    length: str | None = None  # ... and the trainer field that counts them (rounds)
    extra: dict[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = field(default=(), repr=False, compare=False)  # the file's keys, read back

    @property
    def is_training(self) -> bool:
        """Whether this is a training run (`arle train` records kind: train)."""
        return self.kind == "train"

    @property
    def steps(self) -> tuple[str, str]:
        """(unit, trainer field) of a training run's steps. A run written before meta.json named
        them: rft's, the one trainer with a `rounds` field, counted rounds."""
        if self.unit and self.length:
            return self.unit, self.length
        return ("rounds", "rounds") if "rounds" in self.trainer else ("steps", "max_steps")

    def to_json(self) -> dict[str, Any]:
        """The object as meta.json holds it."""
        return _ordered(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Meta":
        """meta.json read back; a field of the wrong type reads as absent (a hand-edited file)."""
        own, extra = _split(data, cls)
        for key in ("command",):
            if not isinstance(own.get(key, []), list):
                extra[key] = own.pop(key)
        for key in ("options", "trainer"):
            if key in own and not isinstance(own[key], dict):
                extra[key] = own.pop(key)
        meta = cls(**own, extra=extra, order=tuple(data))
        meta.options, meta.trainer = _obj(meta.options), _obj(meta.trainer)
        return meta


@dataclass
class Results:
    """results.json: each metric's {value, stderr, n} over tasks, the counts, and the
    efficiency blocks (tokens, time, agents, games, consistency, cost, reasoning) in `extra`."""

    metrics: dict[str, dict[str, Any]]
    benchmark: str | None = None
    card_version: Any = None
    model: str | None = None
    split: str | None = None
    num_samples: int | None = None
    n_tasks: int | None = None
    n_samples: int | None = None
    groups: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = field(default=(), repr=False, compare=False)  # the file's keys, read back

    def stat(self, name: str) -> tuple[float | None, float | None]:
        """(value, stderr) of metric `name`; (None, None) when the run has no such metric."""
        stat = _obj(self.metrics.get(name))
        return stat.get("value"), stat.get("stderr")

    def to_json(self) -> dict[str, Any]:
        """The object as results.json holds it."""
        return _ordered(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Results":
        """results.json read back (the reader checks `metrics` is there)."""
        own, extra = _split(data, cls)
        own["metrics"], own["groups"] = _obj(own.get("metrics")), _obj(own.get("groups"))
        return cls(**own, extra=extra, order=tuple(data))


@dataclass
class TrainSummary:
    """summary.json, a training run's closing file: before/after held-out accuracy, steps and
    where the final model is."""

    benchmark: str | None = None
    model: str | None = None
    algo: str | None = None
    global_step: int | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    evals: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = field(default=(), repr=False, compare=False)  # the file's keys, read back

    def to_json(self) -> dict[str, Any]:
        """The object as summary.json holds it."""
        return _ordered(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TrainSummary":
        """summary.json read back; a global_step that is not an int reads as unknown."""
        own, extra = _split(data, cls)
        summary = cls(**own, extra=extra, order=tuple(data))
        if not isinstance(summary.global_step, int) or isinstance(summary.global_step, bool):
            summary.global_step = None
        return summary
