"""What a training run is made of: arle's own settings plus the trainer's, from three layers.

A run's settings come, lowest first, from arle's defaults, a recipe file (`--recipe`), the
command-line flags (`--max-steps` ...) and `--set key=value`. Every key is one of:

- an arle field (`TrainOptions`: benchmark, algo, model, LoRA, held-out eval ...);
- a field of the algorithm's settings (`Algorithm.settings`, train.algorithm): any
  `trl.GRPOConfig` field for grpo, any `trl.RLOOConfig` field for rloo (loss_type, beta,
  epsilon, scale_rewards, num_iterations, per_device_train_batch_size, temperature ...), for
  ppo `arlecli.train.ppo_run.PPOConfig` (PPOParams plus what `train_ppo` takes as arguments);
  any `trl.SFTConfig` field for sft and any `trl.DPOConfig` field for dpo (max_length, beta,
  loss_type, packing ...); for rft the SFTConfig fields (each round's SFT) plus how rounds
  sample and keep (`arlecli.train.rft.RFTConfig`: rounds, num_generations, tasks_per_round,
  min_reward, keep_cut, temperature, top_p, max_completion_length).

- a DAPO control (`arlecli.train.dapo.DAPOOptions`: overlong_filter, overlong_buffer_len,
  overlong_penalty_factor, dynamic_sampling, dynamic_sampling_rounds).

One flat namespace, so a recipe reads like the trainer's own docs and `--set` reaches
everything. An unknown key is a one-line UserError that names the nearest known keys.

Stages (an algorithm declared `staged`: grpo, rloo): a recipe's `stages:` list trains in
stages, each resuming the last one's checkpoint, DeepScaleR's staged context lengthening
(8k -> 16k -> 24k tokens):

    stages:
      - {name: 8k, steps: 1040, max_completion_length: 8192}
      - {name: 16k, steps: 480, max_completion_length: 16384, num_generations: 16}

Each stage is `steps` optimizer steps (numbered on from the stage before) with its own
settings over the recipe's; flags and `--set` win over every stage, and a `--max-steps` cuts
the staged run short at that step. The learning rate's schedule spans the whole run, as one
run's would (every stage's trainer has the run's max_steps and stops at its own end). What a
stage may not change (`STAGE_FIXED`: the model, the data, LoRA, the optimizer's schedule ...)
is a one-line error.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from arlecli import safeio
from arlecli.errors import UserError, near_names
from arlecli.train.algorithm import Algorithm, algorithm, names
from arlecli.train.dapo import DAPO_FIELDS, DAPOOptions

TRAIN_BACKENDS = ("hf", "vllm")
REPORT_TO = ("none", "tensorboard", "trackio", "wandb")

# Trainer fields arle sets unless the user does. logging_steps=1: metrics.jsonl and the live
# view get every step. save_total_limit=2: a full fine-tune's checkpoint carries the optimizer
# state (3x the weights), and resume only needs the newest. seed=1234: the eval's default.
TRAINER_DEFAULTS: dict[str, Any] = {
    "max_steps": 100,
    "save_steps": 50,
    "logging_steps": 1,
    "save_total_limit": 2,
    "seed": 1234,
    "report_to": "none",
}

# Trainer fields the run directory owns; setting them would split the run apart.
RESERVED = {
    "output_dir": "use --output",
    "resume_from_checkpoint": "use --resume (it continues from the run's last checkpoint)",
    "logging_dir": "logs go under the run directory",
}


@dataclass
class TrainOptions:
    """arle's own training settings (everything that is not a trainer field)."""

    benchmark: str | None = None
    algo: str = "grpo"
    model: str | None = None  # profile, local folder or hub id (see resolve_model)
    backend: str = "hf"  # rollouts (and held-out evals): arle's hf or in-process vllm engine
    split: str | None = None  # train split; None: "train" if the card has one, else its default
    limit: int | None = None  # train on the first N rows only
    num_fewshot: int | None = None  # exemplars in train prompts; None: the card's (as the eval does)
    lora_rank: int = 0  # 0: full fine-tune; >0: LoRA on all linear layers
    lora_alpha: int | None = None  # None: 2 x lora_rank
    lora_dropout: float = 0.0
    lora_target_modules: Any = "all-linear"
    eval_split: str | None = None  # held-out split; None: the card's default split
    eval_limit: int = 50  # held-out tasks per evaluation; 0: no held-out evaluation
    eval_every: int = 0  # evaluate every N steps too (0: only before and after)
    eval_max_tokens: int | None = None  # None: the card's max_tokens, as `arle eval` uses
    eval_batch_size: int = 16  # hf engine batch (rollouts and held-out evals)
    # The colocated vLLM engine (--backend vllm): its share of GPU memory (the policy and its
    # optimizer state live there too), context length, and vLLM's quantization options.
    vllm_gpu_memory_utilization: float = 0.3
    vllm_max_model_len: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    # TRL's server mode (multi-node): rollouts on a `trl vllm-serve` at this URL, weights synced
    # by TRL over NCCL (grpo and rloo).
    vllm_server: str | None = None
    # sft/dpo: the JSONL file of recorded trajectories (SFT rows, or DPO pairs for dpo) that
    # `arle data from-eval` writes.
    data: str | None = None
    # The benchmark's own rows from a local file (jsonl, json, parquet, csv in the dataset's
    # schema) instead of the card's source, read exactly as `arle eval --rows` reads them:
    # what RL (grpo, rloo, ppo, rft) samples from. `eval_rows`: the held-out evaluations' rows
    # (None: the card's eval split, or with `rows` and no eval_split, the same rows).
    rows: str | None = None
    eval_rows: str | None = None
    # Two-player game cards: who plays the other seat in rollouts: self (default: self-play, both
    # seats trained, each with its own outcome), random or scripted. Held-out evals play the
    # card's own opponent.
    opponent: str | None = None
    # Reasoning models, as `arle eval` takes them: the think tags (START,END or none; None: the
    # profile's, else the tokenizer's), the chat template's switches (a mapping, e.g.
    # {enable_thinking: false}; over the profile's) and the thought's budget per turn in rollouts
    # and held-out evals (budget forcing; max_completion_length is then the answer's).
    think_tags: str | None = None
    chat_template_kwargs: Any = None
    max_thinking_tokens: int | None = None
    # Asynchronous RL (grpo, rloo, ppo; train.overlap): the rollouts of the next N steps are
    # sampled while a step updates (0: synchronous). The loss then weighs each token by the
    # truncated importance weight min(pi_old / pi_sampler, is_cap) unless is_correction is off.
    max_staleness: int = 0
    is_correction: bool = True
    is_cap: float = 2.0


ARLE_KEYS = tuple(f.name for f in dataclasses.fields(TrainOptions))


# What a stage cannot change: it would make the stages one run no longer (another model or
# data), or the checkpoint being resumed would ignore it (the optimizer's and the scheduler's
# state, restored on resume, keep the learning rate and its schedule).
STAGE_FIXED = {
    "benchmark",
    "algo",
    "model",
    "backend",
    "split",
    "limit",
    "num_fewshot",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "data",
    "rows",
    "eval_rows",
    "opponent",
    "vllm_server",
    "seed",
    "max_steps",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "warmup_ratio",
    "optim",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "save_total_limit",
}


@dataclass
class Stage:
    """One stage of a staged run: `steps` optimizer steps ending at step `end`, trained with
    `config` (the run's settings with the stage's `settings` over them)."""

    name: str
    steps: int
    end: int
    settings: dict[str, Any]
    config: "TrainConfig"


@dataclass
class TrainConfig:
    """A resolved run: arle's options, the trainer field overrides for its algorithm, the DAPO
    controls and, for a staged run, its stages (each a resolved TrainConfig of its own)."""

    options: TrainOptions
    trainer: dict[str, Any] = field(default_factory=dict)
    recipe: str | None = None
    dapo: DAPOOptions = field(default_factory=DAPOOptions)
    stages: list[Stage] = field(default_factory=list)
    # The recipe's stages as written (name, steps, settings), before a --max-steps cut them
    # short: what meta.json records, so a resume may lengthen the run as for any run.
    stage_plan: list[dict[str, Any]] = field(default_factory=list)
    # A stage's last step. Its trainer's max_steps is the whole run's, so that the learning
    # rate schedule spans every stage (as one run's would); training stops here instead.
    stop_at: int | None = None

    @property
    def seed(self) -> int:
        """The run's seed (TRAINER_DEFAULTS' 1234 unless set): rollouts, held-out evals, vLLM."""
        return int(self.trainer["seed"])

    def sessions(self) -> list[Stage]:
        """The stages to train, in order; a run without stages is one stage of max_steps."""
        if self.stages:
            return self.stages
        steps = int(self.trainer["max_steps"])
        return [Stage("all", steps, steps, {}, self)]


def trainer_fields(algo: str) -> dict[str, Any]:
    """Field name -> declared type for the algorithm's trainer settings (its `settings`).

    Imports TRL (seconds): called only once a run is being set up."""
    return algorithm(algo).fields()


def parse_set(items: list[str]) -> dict[str, Any]:
    """`["beta=0.04", "loss_type=dr_grpo"]` -> {"beta": 0.04, "loss_type": "dr_grpo"}.

    Values are YAML scalars (numbers, true/false, null, strings); `[a, b]` lists also work."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UserError(f"--set {item!r}: write --set key=value, e.g. --set beta=0.04")
        try:
            out[key] = safeio.load_yaml(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key] = raw  # not YAML (e.g. an unbalanced bracket): the plain string
    return out


def find_recipe(name_or_path: str) -> Path:
    """A recipe file: a path, else a packaged recipe by name (`countdown-grpo-cpu`)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    packaged = Path(str(resources.files("arlecli.recipes")))
    names = sorted(p.stem for p in packaged.glob("*.yaml"))
    if name_or_path.removesuffix(".yaml") in names:
        return packaged / f"{name_or_path.removesuffix('.yaml')}.yaml"
    near = near_names(name_or_path, names, n=2)
    hint = f"; did you mean {' or '.join(near)}?" if near else f" (packaged recipes: {', '.join(names)})"
    raise UserError(f"recipe {name_or_path} is neither a file nor a packaged recipe{hint}")


def load_recipe(name_or_path: str) -> tuple[Path, dict[str, Any]]:
    """Read a recipe: a flat YAML mapping of arle and trainer fields (and `stages:`)."""
    path = find_recipe(name_or_path)
    text = safeio.read_text(path, "recipe")
    try:
        data = safeio.load_yaml(text)  # no aliases, no deep nesting: one line, like any YAML mistake
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}:{where} is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise UserError(f"{path}: a recipe must be a YAML mapping of settings (model: ..., algo: grpo, beta: 0.04)")
    return path, data


def _coerce(key: str, value: Any, declared: Any, where: str) -> Any:
    # YAML reads "1e-5" as a string (it wants "1.0e-5"); flags and recipes mean a number.
    text = str(declared)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and ("float" in text or "int" in text) and "str" not in text:
        try:
            return int(value) if "float" not in text else float(value)
        except ValueError:
            raise UserError(f"{where}: {key} must be a number, got {value!r}") from None
    if isinstance(value, int) and "float" in text and "int" not in text:
        return float(value)
    # A recipe's value of another type reached the trainer (a dict * a tensor once training had
    # started) or arle (a number given as the benchmark): one line now, naming the key.
    numeric = ("float" in text or "int" in text) and not any(t in text for t in ("str", "list", "dict", "Any"))
    if numeric and (not _number(value) or (isinstance(value, float) and not math.isfinite(value))):
        raise UserError(f"{where}: {key} must be a finite number, got {value!r}")
    if "str" in text and not any(t in text for t in ("list", "dict", "Any", "int", "float", "bool")):
        if not isinstance(value, str):
            raise UserError(f"{where}: {key} must be text, got {value!r}")
    return value


def _check_key(key: str, known: list[str], algo: str, where: str) -> None:
    if key in RESERVED:
        raise UserError(f"{where}: {key} is set by arle: {RESERVED[key]}")
    if key in known:
        return
    near = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    if near:
        hint = f"; did you mean {', '.join(near)}?"
    else:
        others = names(lambda other: other.name != algo and key in _fields_or_empty(other))
        hint = (
            f"; it is a setting of --algo {' and '.join(others)}"
            if others
            else "; see `arle train --help` and the trainer's config docs"
        )
    raise UserError(f"{where}: unknown setting '{key}' for --algo {algo}{hint}")


def _fields_or_empty(other: Algorithm) -> dict[str, Any]:
    try:
        return other.fields()
    except ImportError:  # an algorithm's trainer may be absent from a build
        return {}


def resolve(
    recipe: dict[str, Any], flags: dict[str, Any], sets: dict[str, Any], *, recipe_name: str | None = None
) -> TrainConfig:
    """Merge recipe < flags < --set into a validated TrainConfig; a recipe's `stages:` becomes
    one TrainConfig per stage (recipe < stage < flags < --set).

    `flags` holds only the command-line options the user actually gave (None means unset)."""
    recipe = dict(recipe)
    stages = recipe.pop("stages", None)
    given = {k: v for k, v in flags.items() if v is not None}
    layers = [(recipe, f"recipe {recipe_name}"), (given, "command line"), (sets, "--set")]
    algo = "grpo"
    for layer, _ in layers:
        algo = layer.get("algo", algo)
    algorithm(algo)  # an unknown name is one line naming the near ones
    cfg = _merge(layers, algo, recipe_name)
    if stages is not None:
        cap = given.get("max_steps", sets.get("max_steps"))
        cfg.stages, cfg.stage_plan = _stages(stages, layers, algo, recipe_name, cap)
        cfg.trainer["max_steps"] = cfg.stages[-1].end  # what the run trains in all
    return cfg


def _merge(layers: list[tuple[dict[str, Any], str]], algo: str, recipe_name: str | None) -> TrainConfig:
    """One TrainConfig from settings layers, lowest first (every key checked and coerced)."""
    declared = {f.name: f.type for f in dataclasses.fields(TrainOptions)}
    algo_ = algorithm(algo)
    trainer_types = algo_.fields()
    known = sorted(set(ARLE_KEYS) | set(trainer_types) | set(DAPO_FIELDS))

    arle: dict[str, Any] = {}
    dapo: dict[str, Any] = {}
    trainer: dict[str, Any] = {**TRAINER_DEFAULTS, **algo_.defaults}  # all of them in meta.json
    for layer, where in layers:
        for key, value in layer.items():
            _check_key(key, known, algo, where)
            if key in declared:  # an arle field, even if the trainer has one of that name (ppo's lora_alpha)
                arle[key] = _coerce(key, value, declared[key], where)
            elif key in DAPO_FIELDS:
                dapo[key] = _coerce(key, value, DAPO_FIELDS[key], where)
            else:
                trainer[key] = _coerce(key, value, trainer_types[key], where)
    cfg = TrainConfig(options=TrainOptions(**arle), trainer=trainer, recipe=recipe_name, dapo=_dapo(dapo))
    algo_.validate(cfg)  # the algorithm's own refusals first (rft's settings, sft's missing --data)
    _validate(cfg.options, trainer, algo_)
    cfg.dapo.check(algo_)
    return cfg


def _dapo(values: dict[str, Any]) -> DAPOOptions:
    """The DAPO controls among a run's settings, checked (one line naming the bad one)."""
    wanted: dict[str, tuple[type | tuple[type, ...], str]] = {
        "bool": (bool, "true or false"),
        "int": (int, "a whole number"),
        "float": ((int, float), "a number"),
    }
    for key, value in values.items():
        types, words = wanted[str(DAPO_FIELDS[key])]
        if not isinstance(value, types) or (isinstance(value, bool) and types is not bool):
            raise UserError(f"{key} must be {words}, got {value!r}")
    return DAPOOptions(**values)


def _stages(
    raw: Any, layers: list[tuple[dict[str, Any], str]], algo: str, recipe_name: str | None, cap: Any
) -> tuple[list[Stage], list[dict[str, Any]]]:
    """The recipe's `stages:` as resolved stages, cut at step `cap` when the command line gave
    --max-steps (a short run of a long recipe), and the plan as written."""
    where = f"recipe {recipe_name}"
    if not algorithm(algo).staged:
        raise UserError(
            f"{where}: stages resume the trainer's own checkpoints, which --algo "
            f"{' and '.join(names(lambda a: a.staged))} write; not {algo}"
        )
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise UserError(
            f"{where}: stages must be a list of mappings, e.g. "
            "[{name: 8k, steps: 100, max_completion_length: 8192}, ...]"
        )
    out: list[Stage] = []
    plan: list[dict[str, Any]] = []
    end = 0
    for n, stage in enumerate(raw, 1):
        settings = dict(stage)
        name = str(settings.pop("name", f"stage-{n}"))
        steps = settings.pop("steps", None)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise UserError(f"{where}: stage {name} needs steps: N (a whole number >= 1), got {steps!r}")
        for key in settings:
            if key in STAGE_FIXED or key == "stages":
                raise UserError(
                    f"{where}: stage {name} sets {key}, which every stage shares (a stage resumes the "
                    f"last one's checkpoint); set it at the top of the recipe"
                )
        plan.append({"name": name, "steps": steps, "settings": settings})
        if isinstance(cap, int) and end >= cap:
            continue
        steps = min(steps, cap - end) if isinstance(cap, int) else steps
        end += steps
        stage_layers = [layers[0], (settings, f"{where} stage {name}"), *layers[1:]]
        out.append(Stage(name, steps, end, settings, _merge(stage_layers, algo, recipe_name)))
    for stage in out:  # every stage's schedule is the whole run's; each stops at its own end
        stage.config.trainer["max_steps"] = end
        stage.config.stop_at = stage.end
    return out, plan


def _validate_thinking(opts: TrainOptions) -> None:
    """The reasoning-model options, normalised: think tags checked, template switches a dict."""
    from arlecli.config import parse_template_kwargs
    from arlecli.thinking import parse_option

    parse_option(opts.think_tags, "think_tags")
    opts.chat_template_kwargs = parse_template_kwargs(opts.chat_template_kwargs, "chat_template_kwargs") or None
    budget = opts.max_thinking_tokens
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise UserError(f"max_thinking_tokens must be a whole number >= 1, got {budget!r}")


def _validate(opts: TrainOptions, trainer: dict[str, Any], algo: Algorithm) -> None:
    """The settings every algorithm shares, checked (its own: `Algorithm.validate`)."""
    if opts.backend not in TRAIN_BACKENDS:
        raise UserError(f"unknown rollout backend {opts.backend!r}: choose one of {', '.join(TRAIN_BACKENDS)}")
    if opts.vllm_server and not opts.vllm_server.startswith(("http://", "https://")):
        raise UserError(f"--vllm-server {opts.vllm_server!r}: give the server's URL, e.g. http://node1:8000")
    if opts.data and not algo.data:
        raise UserError(
            f"--data is recorded trajectories for --algo {' and '.join(names(lambda a: a.data))}; --algo "
            f"{opts.algo} samples from the benchmark's rows: drop --data (for the benchmark's rows "
            f"from a local file, as `arle eval --rows` reads them, pass --rows FILE)"
        )
    if opts.rows and algo.data:
        raise UserError(
            f"--rows is the benchmark rows RL samples from; --algo {opts.algo} trains on --data "
            f"(recorded trajectories): drop --rows, or pass --eval-rows FILE to evaluate on local rows"
        )
    if opts.rows and opts.split:
        raise UserError("--rows replaces the card's source, so there is no split to pick: drop --split or --rows")
    for key in ("rows", "eval_rows"):
        value = getattr(opts, key)
        if value is not None and not Path(str(value)).expanduser().is_file():
            raise UserError(
                f"--{key.replace('_', '-')} {value}: no such file; give a jsonl, json, parquet or csv "
                f"file of rows in the dataset's own schema"
            )
    if opts.vllm_server and algo.data:
        raise UserError(
            f"--vllm-server serves rollouts; --algo {opts.algo} has none (its held-out evals can use "
            f"--backend vllm): drop --vllm-server"
        )
    if opts.lora_rank < 0:
        raise UserError("lora_rank must be >= 0 (0 is a full fine-tune)")
    _validate_thinking(opts)
    if opts.eval_limit < 0 or opts.eval_every < 0:
        raise UserError("eval_limit and eval_every must be >= 0")
    if opts.limit is not None and opts.limit < 1:
        raise UserError("limit must be at least 1")
    report = trainer.get("report_to")
    for name in [report] if isinstance(report, str) else (report or []):
        if name not in REPORT_TO and name != "all":
            raise UserError(f"unknown report_to {name!r}: choose one of {', '.join(REPORT_TO)}")
    steps = trainer.get("max_steps")
    if not isinstance(steps, int) or steps < 1:
        raise UserError(f"max_steps must be a whole number >= 1, got {steps!r}")
    for key in ("num_generations", "gradient_accumulation_steps", "per_device_train_batch_size"):
        count = trainer.get(key)  # 0 was a ZeroDivisionError in TRL's config or torch's data loader
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise UserError(f"{key} must be a whole number >= 1, got {count!r}")
    _validate_optimizer(trainer)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _validate_optimizer(trainer: dict[str, Any]) -> None:
    """The optimizer's settings, whichever algorithm takes them. torch checks them only when
    the trainer creates its optimizer, after the run directory exists and the model loaded
    (the run left behind then blocks a plain rerun); and it accepts a learning rate of 0,
    which trains for hours and changes nothing."""
    lr = trainer.get("learning_rate")
    if lr is not None and (not _number(lr) or not lr > 0):
        raise UserError(
            f"learning_rate (--lr) must be a number > 0, got {lr!r}; e.g. 1e-6 for a full fine-tune, 1e-5 for LoRA"
        )
    wd = trainer.get("weight_decay")
    if wd is not None and (not _number(wd) or wd < 0):
        raise UserError(f"weight_decay must be a number >= 0 (0: none), got {wd!r}")
    eps = trainer.get("adam_epsilon")
    if eps is not None and (not _number(eps) or eps < 0):
        raise UserError(f"adam_epsilon must be a number >= 0, got {eps!r}")
    for key in ("adam_beta1", "adam_beta2"):
        beta = trainer.get(key)
        if beta is not None and (not _number(beta) or not 0 <= beta < 1):
            raise UserError(f"{key} must be a number in [0, 1), got {beta!r}")
