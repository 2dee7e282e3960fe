"""Training algorithms as plugins: what one declares, and the one context its run gets.

An algorithm is a run function `run(ctx: TrainContext) -> (evals, last_step)` registered with
`@register_algorithm("name", settings=..., ...)`, the same way a reward registers: arle's own
(grpo and rloo in train.grpo, ppo in train.ppo_run, sft and dpo in train.offline, rft in
train.rft) on the first lookup, one a decorator registered in an imported module, an installed
package's entry point in group `arle.algorithms`, or `--algo my_algo.py:run` / `mypkg.algos:run`
(arlecli.plugins). An unknown name is a one-line error naming the near ones.

What it declares (`Algorithm`): its settings (the dataclasses whose fields are its trainer
settings, as TRL has one documented config per trainer), the trainer defaults arle records
for it, whether it trains on `--data` rows instead of rollouts, whether it runs in several
processes, which DAPO controls it takes, a `validate` when the settings resolve, a `check`
before the run directory exists, and what a step of it is called. Nothing outside an
algorithm's own module compares algorithm names: train.run, train.config, train.launch and
rundir ask the declaration.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from arlecli.cards import Card
from arlecli.errors import UserError
from arlecli.models import ModelSpec
from arlecli.plugins import Registry
from arlecli.records import RunDir

if TYPE_CHECKING:  # the context's parts: train modules that import this one (config) or sit above it
    from arlecli.train.config import TrainConfig
    from arlecli.train.heldout import HeldOut
    from arlecli.train.metrics import MetricsLog
    from arlecli.train.ranks import Ranks
    from arlecli.train.reward import CardReward
    from arlecli.train.batches import PolicyBackend, Rollouts


@dataclass
class TrainView:
    """Where progress goes (the CLI's live view); every hook is optional."""

    log: Callable[[dict[str, Any]], None] | None = None  # one logged step
    eval_start: Callable[[str, int, int], None] | None = None  # (label, total, done)
    eval_sample: Callable[[dict[str, Any]], None] | None = None
    eval_done: Callable[[str, dict[str, Any]], None] | None = None
    message: Callable[[str], None] = field(default=lambda text: print(text, file=sys.stderr, flush=True))


@dataclass
class TrainContext:
    """Everything one stage of a training run hands its algorithm's `run`.

    The run directory exists (meta.json written, metrics.jsonl opened) and `checkpoint` is the
    newest checkpoint to resume from (None: a fresh start). An RL algorithm samples through
    `rollouts` and scores through `reward` (whose verdicts go to rewards.jsonl); a `--data`
    algorithm gets neither and trains on `prepared`'s rows. `run` returns (every held-out
    evaluation's results by label, the last step) and leaves the trained model in `final`."""

    card: Card  # the benchmark (held-out evaluations play it)
    cfg: "TrainConfig"  # this stage's settings: options, trainer fields, DAPO controls
    spec: ModelSpec  # the model being trained
    run_dir: Path
    checkpoint: Path | None  # resume from here
    metrics: "MetricsLog"  # metrics.jsonl
    view: TrainView
    ranks: "Ranks"  # this process among the training processes
    engine: "PolicyBackend"  # the engine over the policy (--backend): rollouts and held-out evals
    heldout: "HeldOut | None"  # held-out evaluations (None: --eval-limit 0)
    prepared: Any = None  # what the algorithm's `check` returned for this stage
    rollouts: "Rollouts | None" = None  # RL: the card's tasks, sampled on the engine as `arle eval` does
    reward: "CardReward | None" = None  # RL: the card's reward
    prompts: list[Any] = field(default_factory=list)  # RL: row i is task i's prompt (TRL logs them)

    @property
    def final(self) -> Path:
        """Where the trained model goes (`<run>/final`)."""
        return RunDir(self.run_dir).final


Evals = tuple[dict[str, dict[str, Any]], int]
RunFn = Callable[[TrainContext], Evals]


def _no_check(cfg: "TrainConfig", card: Card, run_dir: Path) -> Any:
    return None


def _no_validate(cfg: "TrainConfig") -> None:
    return None


def _no_settings() -> Sequence[type]:
    return ()


@dataclass(frozen=True)
class Algorithm:
    """A registered training algorithm (see the module docstring).

    settings: the dataclasses whose fields are its trainer settings (a recipe key, a flag or
        `--set key=value` sets one), later ones winning; called when a run is set up (TRL's
        config classes import in seconds).
    defaults: trainer fields arle sets unless the user does, beyond train.config's
        TRAINER_DEFAULTS (so meta.json records them).
    data: trains on the rows of a `--data` file (recorded trajectories), not on rollouts:
        its `check` returns a `Prepared` with those rows.
    distributed: runs in several processes under accelerate (--num-processes, DeepSpeed, FSDP).
    staged: trains a recipe's `stages:` (each stage resumes the trainer's own checkpoint).
    overlong_filter, dynamic_sampling: which DAPO controls it takes (train.dapo).
    asynchronous: takes --max-staleness (its rollouts may be sampled ahead: train.overlap).
    validate(cfg): refuses its settings when they resolve (one line naming the bad one).
    check(cfg, card, run_dir): refuses what it cannot train before the run directory exists;
        returns what `run` gets as ctx.prepared (the trainer's resolved config, recorded in
        meta.json as trainer_resolved when it has `to_dict`).
    read_data(cfg): a data algorithm's --data rows, read and checked with no model and no run
        directory: train.run.refuse runs it before the model resolves (its check reads them
        for the run).
    unit, length: what its step is called and the trainer field that counts them (rft: rounds).
    """

    name: str
    run: RunFn
    settings: Callable[[], Sequence[type]] = _no_settings
    defaults: Mapping[str, Any] = field(default_factory=dict)
    data: bool = False
    distributed: bool = False
    staged: bool = False
    overlong_filter: bool = False
    dynamic_sampling: bool = False
    asynchronous: bool = False
    validate: Callable[["TrainConfig"], None] = _no_validate
    check: Callable[["TrainConfig", Card, Path], Any] = _no_check
    read_data: Callable[["TrainConfig"], Any] | None = None
    unit: str = "steps"
    length: str = "max_steps"

    def __call__(self, ctx: TrainContext) -> Evals:
        # Callable, as every registry's plugins are: `file.py:attr` may name an Algorithm itself.
        return self.run(ctx)

    def fields(self) -> dict[str, Any]:
        """Setting name -> declared type, over every dataclass of `settings`."""
        out: dict[str, Any] = {}
        for cls in self.settings():
            out.update({f.name: f.type for f in dataclasses.fields(cls) if f.init})
        return out


@dataclass
class Prepared:
    """What a `--data` algorithm's check hands its run: the trainer's resolved config and the
    rows of the data file, checked."""

    trainer_args: Any
    rows: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """The trainer's settings, every default included (meta.json's trainer_resolved)."""
        return self.trainer_args.to_dict()


def _as_algorithm(obj: Any, name: str) -> Algorithm:
    # A run function named by "module:attr", a file or an entry point: the algorithm its
    # decorator declared, else a plain run function with no settings of its own.
    declared = getattr(obj, "__arle_algorithm__", obj)
    return declared if isinstance(declared, Algorithm) else Algorithm(name, obj)


# arle's algorithms register on import (on the first lookup).
ALGORITHMS: Registry[Algorithm] = Registry(
    "algorithms",
    "algorithm",
    wrap=_as_algorithm,
    builtin=["arlecli.train.grpo", "arlecli.train.ppo_run", "arlecli.train.offline", "arlecli.train.rft"],
)


def register_algorithm(name: str | None = None, **declared: Any) -> Callable[[RunFn], RunFn]:
    """Register a run function `run(ctx: TrainContext) -> (evals, last_step)` as the algorithm
    `name` (default: the function's name), with `declared`: Algorithm's fields (settings,
    defaults, data, distributed, check ...)."""

    def deco(run: RunFn) -> RunFn:
        algo = Algorithm(name or run.__name__, run, **declared)
        run.__arle_algorithm__ = algo  # type: ignore[attr-defined]
        ALGORITHMS.add(algo.name, algo, source=run)
        return run

    return deco


def algorithm(spec: str) -> Algorithm:
    """The algorithm `spec` names (a registered name, "module:attr" or "file.py:attr"); an
    unknown name is a UserError suggesting near ones."""
    if not isinstance(spec, str):
        raise UserError(f"unknown algorithm {spec!r}: give its name (e.g. algo: grpo)")
    return ALGORITHMS.get(spec)


def names(where: Callable[[Algorithm], bool]) -> list[str]:
    """The registered algorithms that `where` holds for (for messages that name them)."""
    return [name for name in ALGORITHMS.names() if where(ALGORITHMS.get(name))]


def recorded(spec: Any) -> Algorithm | None:
    """The algorithm a run directory's meta.json names, when it is a registered one (a file
    or module spec is not imported for reading a run back); None otherwise."""
    if not isinstance(spec, str) or ":" in spec:
        return None
    try:
        return ALGORITHMS.get(spec) if ALGORITHMS.has(spec) else None
    except UserError:  # an entry point that no longer loads
        return None
