"""RFT: rejection-sampling fine-tuning (expert iteration), `arle train BENCH --algo rft`.

Each round R (1, 2, ... `rounds`):

    1. sample   `num_generations` episodes of each of `tasks_per_round` training tasks with the
                current weights, through `envs.episodes.collect` (the producer `arle eval` and
                every trainer use) on the run's rollout engine over the policy: round R's
                samples are `arle eval -n G --temperature T --top-p P --seed SEED+R` on its tasks
    2. score    with the card's reward (train.reward.CardReward: every verdict goes to
                rewards.jsonl with step R)
    3. keep     the episodes the reward accepts: `correct`, or reward >= `min_reward` when set,
                and none of whose turns was cut at its token limit (`keep_cut: true` keeps those)
    4. SFT      on the kept episodes' tokens as generated (thinking included; one sequence per
                segment where a chat template rewrote the history, see train.batches), through
                `train.sft`, continuing from the current weights (LoRA: the same adapter); the
                rows are also SFT rows as `arle data from-eval` writes them (`messages`), but
                an env: rollout card's (an agent's own requests, no conversation to replay)
                are their token record alone (`sequences`: the prompts' and tool results' ids
                without loss, the model's own ids with it)

A round's tasks are the next `tasks_per_round` rows of the training split (wrapping around), so
successive rounds see new tasks and a resumed round sees the same ones. A round that keeps
nothing takes no SFT step: it is logged and the next round samples again (new seed).

    <run>/checkpoint-R/rows.jsonl          round R's kept episodes as SFT rows
    <run>/checkpoint-R/model/              the weights after round R (an adapter under LoRA)
    <run>/checkpoint-R/trainer_state.json  written last: round R is finished
    <run>/metrics.jsonl                    one line per round (step = round)
    <run>/eval/step-R/                     held-out evaluations after round R (step-0: before)

In the run directory's terms a round is a step: `--resume` continues after the last finished
round (arlecli.rundir.latest_checkpoint) and drops the lines of later rounds from
metrics.jsonl and rewards.jsonl; a round cut short is sampled and trained again from its start
(same tasks, same seeds). This module registers the algorithm rft: its settings are the SFT
trainer's (`trl.SFTConfig`, each round's SFT) and `RFTConfig`; it counts rounds.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from arlecli import rundir, safeio
from arlecli.cards import Card
from arlecli.envs import env_kind
from arlecli.envs.episodes import collect
from arlecli.errors import UserError
from arlecli.train import sft
from arlecli.train.algorithm import TrainContext, names, register_algorithm
from arlecli.train.config import TrainConfig
from arlecli.train.metrics import open_reporter
from arlecli.train.batches import Rollouts, flatten_episode
from arlecli.train.trl_glue import import_trl, load_model, lora_config
from arlecli.results import write_json
from arlecli.records import RunDir, Sample
from arlecli.trajectories import Trajectory, sft_row, write_jsonl
from arlecli.trajectories import trajectory as sample_trajectory
from arlecli.types import Episode, Score, Task

ROWS_FILE = "rows.jsonl"
STATE_FILE = "trainer_state.json"  # the name rundir looks for: a checkpoint is complete once it is whole
MODEL_DIR = "model"


@dataclass
class RFTConfig:
    """RFT's own settings: trainer keys beside the SFT trainer's (train.config)."""

    rounds: int = 3  # sample -> filter -> SFT cycles
    num_generations: int = 4  # episodes per task per round
    tasks_per_round: int = 64  # training tasks sampled per round (the next ones each round)
    min_reward: float | None = None  # keep reward >= this; None: keep the reward's `correct` verdicts
    temperature: float = 1.0  # sampling, as `arle eval --temperature`
    top_p: float = 1.0
    max_completion_length: int | None = None  # tokens per model turn (None: the card's max_tokens)
    keep_cut: bool = False  # keep episodes with a turn cut at the token limit (default: drop)


RFT_FIELDS: dict[str, Any] = {f.name: f.type for f in dataclasses.fields(RFTConfig)}
# What meta.json records unless set: RFTConfig's defaults (max_completion_length stays unset:
# the card's). num_train_epochs is the SFT trainer's own: each round's SFT makes this many
# passes over the round's kept rows (at most max_steps optimizer steps), one rather than TRL's 3.
RFT_DEFAULTS: dict[str, Any] = {
    "rounds": 3,
    "num_generations": 4,
    "tasks_per_round": 64,
    "min_reward": None,
    "temperature": 1.0,
    "top_p": 1.0,
    "num_train_epochs": 1,
    "keep_cut": False,
}


@dataclass(frozen=True)
class RFTSettings:
    """How each round samples and filters (the SFT trainer's own settings stay in cfg.trainer)."""

    rounds: int
    num_generations: int
    tasks_per_round: int
    min_reward: float | None
    keep_cut: bool = False

    @classmethod
    def of(cls, trainer: dict[str, Any]) -> "RFTSettings":
        """The settings among a run's trainer fields, checked (a UserError names the bad one)."""
        t = {**RFT_DEFAULTS, **trainer}
        for key in ("rounds", "num_generations", "tasks_per_round"):
            if not isinstance(t[key], int) or isinstance(t[key], bool) or t[key] < 1:
                raise UserError(f"--algo rft: {key} must be a whole number >= 1, got {t[key]!r}")
        if t["min_reward"] is not None and not isinstance(t["min_reward"], (int, float)):
            raise UserError(
                f"--algo rft: min_reward must be a number (or null: keep `correct`), got {t['min_reward']!r}"
            )
        if not isinstance(t["keep_cut"], bool):
            raise UserError(f"--algo rft: keep_cut must be true or false, got {t['keep_cut']!r}")
        return cls(
            t["rounds"],
            t["num_generations"],
            t["tasks_per_round"],
            None if t["min_reward"] is None else float(t["min_reward"]),
            t["keep_cut"],
        )

    def accepts(self, score: Score, episode: Episode) -> bool:
        """Whether an episode with this verdict is kept for SFT. One with a turn cut at its
        token limit is not (unless keep_cut): its row would end that turn where the model
        did not, and SFT would teach it to stop mid-sentence."""
        if episode.cut and not self.keep_cut:
            return False
        return bool(score.correct) if self.min_reward is None else float(score.reward) >= self.min_reward


def validate_rft(cfg: TrainConfig) -> None:
    """RFT's settings, checked when they resolve; DAPO's overlong controls are not RFT's."""
    if cfg.dapo.overlong_filter or cfg.dapo.overlong_buffer_len:
        raise UserError(
            f"settings: overlong_filter and overlong_buffer_len are for --algo "
            f"{', '.join(names(lambda a: a.overlong_filter))}, not rft; rft drops cut episodes already "
            f"(keep_cut: false)"
        )
    RFTSettings.of(cfg.trainer)


def check_settings(cfg: TrainConfig, card: Card, run_dir: Path) -> None:
    """Refuse bad settings (RFT's, the SFT trainer's, a card SFT cannot learn from) before the
    run directory exists."""
    shots = card.prompt.fewshot.n if cfg.options.num_fewshot is None else cfg.options.num_fewshot
    if shots > 0 and card.prompt.format == "chat":  # plain-text exemplars are prompt text: no loss
        # Exemplars are assistant turns in the prompt: SFT would train on them as the model's own.
        raise UserError(
            f"--algo rft: {card.name} shows {shots} few-shot exemplars as assistant turns, which SFT "
            f"would train on as the model's own answers; pass --num-fewshot 0"
        )
    sft.trainer_args(replace(cfg, trainer=sft_settings(cfg)), run_dir / "sft")


def sft_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The trainer fields that go to the SFT trainer each round (RFT's own keys removed)."""
    return {k: v for k, v in cfg.trainer.items() if k not in RFT_FIELDS}


def round_tasks(round_no: int, per_round: int, num_tasks: int) -> list[int]:
    """Task indices of round `round_no` (1-based): the next `per_round` tasks, wrapping around;
    every task once when `per_round` covers them all."""
    if per_round >= num_tasks:
        return list(range(num_tasks))
    start = (round_no - 1) * per_round
    return [(start + j) % num_tasks for j in range(per_round)]


def trajectory(
    episode: Episode, task: Task, sample: int, score: Score, *, benchmark: str, run: str, model: str
) -> Trajectory:
    """An episode as the conversation the model had: its first prompt, then each of its turns
    (the answer as `content`, the thinking as `reasoning_content`, as the env driver's next
    prompt holds them) and the env's answer to it (what trajectories.py rebuilds from an eval
    run's sample: the same `trajectories.trajectory`, over the episode's Sample)."""
    text = isinstance(episode.turns[0].prompt, str)  # a completion-format card: prompt/completion text rows
    record = Sample.from_episode(
        task, sample, episode, score, multi_turn=not text, group_by=None, session_started_at=0.0
    )
    # A text row carries the answer alone (where a thought would go between the think tags is the model's).
    return sample_trajectory(record, run=run, benchmark=benchmark, model=model, drop_thinking=text)


def to_rows(
    episodes: list[Episode],
    draws: list[tuple[int, int]],
    scores: list[Score],
    keep: list[bool],
    tasks: list[Task],
    *,
    benchmark: str,
    run: str,
    model: str,
    replayable: bool = True,
) -> list[dict[str, Any]]:
    """The kept episodes as SFT rows, in draw order (the rows `arle data from-eval` writes),
    each with the token sequences SFT trains on (`sequences`, see `token_sequences`).

    Not `replayable` (an env: rollout card: an agent's own requests, whose tools and rewritten
    histories are not a conversation the env driver records turn by turn), a row is its token
    record alone (`sequences` and who made it, no messages), and an episode without token ids
    has nothing to train on and is left out."""
    rows = []
    for episode, (index, k), score, kept in zip(episodes, draws, scores, keep, strict=True):
        if not kept or not episode.turns:
            continue
        sequences = token_sequences(episode)
        if replayable:
            row = sft_row(trajectory(episode, tasks[index], k, score, benchmark=benchmark, run=run, model=model))
        elif sequences:
            row = {"benchmark": benchmark, "run": run, "task_id": tasks[index].id, "sample": k}
            row.update(reward=float(score.reward), correct=bool(score.correct), model=model)
        else:
            continue
        if sequences:
            row["sequences"] = sequences
        rows.append(row)
    return rows


def token_sequences(episode: Episode) -> list[dict[str, list[int]]]:
    """The episode's tokens as generated, for SFT: one {"input_ids", "completion_mask"} per
    segment (train.batches: a chat template that dropped a turn's thinking from the history
    starts a new one), 1 on the model's own tokens (its thinking included, a forced end of
    thought not), 0 on prompts and env replies. Empty when the engine gave no ids (then SFT
    renders the messages: train.sft)."""
    if not all(t.prompt_token_ids and t.token_ids for t in episode.turns):
        return []
    return [{"input_ids": ids, "completion_mask": mask} for ids, mask in flatten_episode(episode).pieces() if any(mask)]


@dataclass
class Learner:
    """What the rounds sample from and fine-tune: the policy, its tokenizer (left padding, for
    sampling) and the SFT trainer's (padding on the right)."""

    model: Any
    tokenizer: Any
    sft_tokenizer: Any


def _rft_settings() -> Sequence[type]:
    return (import_trl(False).SFTConfig, RFTConfig)


@register_algorithm(
    "rft",
    settings=_rft_settings,
    defaults=RFT_DEFAULTS,
    validate=validate_rft,
    check=check_settings,
    unit="rounds",
    length="rounds",
)
def run_rft(ctx: TrainContext) -> tuple[dict[str, dict[str, Any]], int]:
    """Rounds of sample -> keep -> SFT from the last finished round (ctx.checkpoint) on; held-out
    evals before the first round, every `eval_every` rounds and after the last. Returns (every
    evaluation's results by label, the last round)."""
    card, cfg, spec, run_dir, checkpoint, metrics, heldout = (
        ctx.card,
        ctx.cfg,
        ctx.spec,
        ctx.run_dir,
        ctx.checkpoint,
        ctx.metrics,
        ctx.heldout,
    )
    settings = RFTSettings.of(cfg.trainer)
    opts = cfg.options
    done: dict[str, Any] = _read_state(checkpoint) if checkpoint else {"round": 0, "model_dir": None, "sft_steps": 0}
    if done["round"] > settings.rounds:
        raise UserError(f"{run_dir} already ran {done['round']} rounds; pass --set rounds=N with N >= {done['round']}")
    shutil.rmtree(run_dir / "sft", ignore_errors=True)  # a round cut short: redone from its start
    model, tokenizer = load_policy(cfg, spec, run_dir / done["model_dir"] if done["model_dir"] else None)
    learner = Learner(model, tokenizer, sft.load_tokenizer(spec.path_or_id or ""))
    sft_steps = int(done["sft_steps"])
    evals: dict[str, dict[str, Any]] = {}

    def evaluate(label: str) -> None:
        assert heldout is not None  # called only when the card holds out tasks
        started = time.monotonic()
        evals[label] = heldout.evaluate(learner.model, tokenizer, label, sft_steps)
        metrics.exclude(time.monotonic() - started)

    if heldout is not None:
        evals.update(heldout.finished())
        if "step-0" not in evals:
            evaluate("step-0")
    reporter = open_reporter(
        cfg.trainer.get("report_to"), run_dir, {"benchmark": card.name, "algo": "rft", **cfg.trainer}
    )
    metrics.restart_clock()
    try:
        for round_no in range(done["round"] + 1, settings.rounds + 1):
            learner.model, done = one_round(ctx, settings, round_no, learner, done)
            sft_steps = done["sft_steps"]  # names the weights for the evaluation's engine
            if reporter is not None:
                reporter.log(round_no, done["metrics"])
            if (
                heldout is not None
                and opts.eval_every
                and round_no % opts.eval_every == 0
                and round_no < settings.rounds
            ):
                evaluate(f"step-{round_no}")
            # Last: the round counts as finished from here on (an evaluation cut short above is
            # resumed when the round is redone).
            write_json(RunDir(run_dir).checkpoint(round_no) / STATE_FILE, done)
            shutil.rmtree(run_dir / "sft", ignore_errors=True)
            _prune(run_dir, done["model_dir"], cfg.trainer.get("save_total_limit"))
    finally:
        if reporter is not None:
            reporter.close()

    learner.model.save_pretrained(str(ctx.final))
    tokenizer.save_pretrained(str(ctx.final))
    if heldout is not None and f"step-{settings.rounds}" not in evals:
        evaluate(f"step-{settings.rounds}")
    return evals, settings.rounds


def one_round(
    ctx: TrainContext, settings: RFTSettings, round_no: int, learner: Learner, previous: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """Round `round_no`: sample, score, keep, SFT; writes checkpoint-R (rows, weights) and the
    round's metrics line. Returns the model and the round's state (what trainer_state.json
    records once the caller has finished the round)."""
    assert ctx.rollouts is not None and ctx.reward is not None
    card, cfg, spec, run_dir, rollouts, reward = ctx.card, ctx.cfg, ctx.spec, ctx.run_dir, ctx.rollouts, ctx.reward
    model, tokenizer = learner.model, learner.tokenizer
    started = time.monotonic()
    indices = round_tasks(round_no, settings.tasks_per_round, len(rollouts.tasks))
    draws = [(i, k) for i in indices for k in range(settings.num_generations)]
    episodes = sample(rollouts, draws, round_no, model, tokenizer, int(previous["sft_steps"]))
    sampled_s = time.monotonic() - started
    scores = reward.score(episodes, [i for i, _ in draws], step=round_no)
    keep = [settings.accepts(s, e) for s, e in zip(scores, episodes, strict=True)]
    rows = to_rows(
        episodes,
        draws,
        scores,
        keep,
        rollouts.tasks,
        benchmark=card.name,
        run=str(run_dir),
        model=f"{spec.name}@step-{round_no - 1}",
        replayable=env_kind(card.env).replayable,
    )
    ckpt = RunDir(run_dir).checkpoint(round_no)
    if ckpt.exists():
        shutil.rmtree(ckpt)  # left by a round cut short (it had no state file)
    ckpt.mkdir(parents=True)
    write_jsonl(ckpt / ROWS_FILE, rows)

    stats: dict[str, Any] = {"loss": None, "steps": 0}
    sft_started = time.monotonic()
    if rows:
        model, stats = fine_tune(
            cfg, model, learner.sft_tokenizer, rows, run_dir / "sft" / f"round-{round_no}", round_no
        )
        model.save_pretrained(str(ckpt / MODEL_DIR))
        model_dir: str | None = f"{ckpt.name}/{MODEL_DIR}"
    else:
        ctx.view.message(
            f"round {round_no}: the reward accepted none of {len(draws)} samples; no SFT step, "
            f"the weights stay as they were"
        )
        model_dir = previous["model_dir"]  # rounds that keep nothing point back to the last weights
    sft_s = time.monotonic() - sft_started

    n = len(draws)
    row = ctx.metrics.record(
        round_no,
        {
            "round": round_no,
            "tasks": len(indices),
            "samples": n,
            "kept": len(rows),
            "keep_rate": len(rows) / n,
            "reward": sum(float(s.reward) for s in scores) / n,
            "accuracy": sum(bool(s.correct) for s in scores) / n,
            "cut": sum(e.cut for e in episodes),
            "loss": stats["loss"],
            "sft_steps": stats["steps"],
            "sampling_s": round(sampled_s, 2),
            "sft_s": round(sft_s, 2),
            "round_s": round(time.monotonic() - started, 2),
        },
    )
    ctx.view.message(round_line(row, settings.rounds))
    return model, {
        "round": round_no,
        "global_step": round_no,
        "model_dir": model_dir,
        "sft_steps": int(previous["sft_steps"]) + stats["steps"],
        "metrics": row,
    }


def sample(
    rollouts: Rollouts, draws: list[tuple[int, int]], round_no: int, model: Any, tokenizer: Any, version: int
) -> list[Episode]:
    """One episode per draw (task index, sample number) with `model`'s weights, in draw order.

    `version` names the weights for a synced engine (vLLM): the SFT steps taken so far."""
    sampling = replace(rollouts.sampling, seed=rollouts.sampling.seed + round_no, logprobs=False)
    out: list[Episode | None] = [None] * len(draws)
    with rollouts.engine.over(model, tokenizer, version) as engine:
        for j, episode in collect(rollouts.card, engine, rollouts.tasks, rollouts.exemplars, draws, sampling):
            out[j] = episode
    return out  # type: ignore[return-value]


def fine_tune(
    cfg: TrainConfig, model: Any, tokenizer: Any, rows: list[dict[str, Any]], output_dir: Path, round_no: int
) -> tuple[Any, dict[str, Any]]:
    """SFT `model` in place on `rows` with the run's SFT settings (train.sft: every assistant
    message carries loss, prompt and env tokens do not) for `num_train_epochs` passes over them,
    at most `max_steps` optimizer steps; returns the trained model and {"loss": mean training
    loss, "steps": optimizer steps}."""
    fields = sft_settings(cfg)
    batch = int(fields.get("per_device_train_batch_size", 8)) * int(fields.get("gradient_accumulation_steps", 1))
    epochs = float(fields.get("num_train_epochs", 1))
    examples = sum(len(row.get("sequences") or [row]) for row in rows)  # a row with seams is several
    steps = min(int(fields["max_steps"]), max(1, math.ceil(epochs * math.ceil(examples / batch))))
    # No checkpoints inside a round (a round cut short is redone whole), no reporting of each
    # round's SFT as a run of its own, and a seed of the round's own (its own shuffle).
    fields.update(max_steps=steps, save_strategy="no", report_to="none", seed=cfg.seed + round_no)
    args = sft.trainer_args(replace(cfg, trainer=fields), output_dir)
    trainer = sft.train_sft(cfg, args, model, tokenizer, rows)
    losses = [h["train_loss"] for h in trainer.state.log_history if "train_loss" in h]
    return trainer.model, {"loss": losses[-1] if losses else None, "steps": int(trainer.state.global_step)}


def load_policy(cfg: TrainConfig, spec: Any, saved: Path | None) -> tuple[Any, Any]:
    """The policy to sample from and train: the start model (a LoRA adapter on it under
    --lora-rank), or the weights a finished round saved (`saved`), and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # fp32 weights, as TRL loads a policy from a path (its model_init_kwargs default); on a GPU
    # the trainer's bf16 autocast does the mixed precision.
    dtype = torch.float32

    def start_model() -> Any:
        loaded = load_model(spec.path_or_id or "", spec.is_adapter)  # a path, or an adapter merged into its base
        return AutoModelForCausalLM.from_pretrained(loaded, dtype=dtype) if isinstance(loaded, str) else loaded

    if cfg.options.lora_rank > 0:
        from peft import PeftModel, get_peft_model

        base = start_model()
        model = (
            PeftModel.from_pretrained(base, str(saved), is_trainable=True)
            if saved
            else get_peft_model(base, lora_config(cfg))
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(str(saved), dtype=dtype) if saved else start_model()
    tokenizer = AutoTokenizer.from_pretrained(spec.path_or_id or "", padding_side="left")
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model, tokenizer


def round_line(row: dict[str, Any], rounds: int) -> str:
    """One finished round as a line (the full row is in metrics.jsonl)."""
    loss = "-" if row.get("loss") is None else f"{row['loss']:.4f}"
    cut = f" ({row['cut']} cut at the token limit)" if row.get("cut") else ""
    return (
        f"round {row['round']}/{rounds}  kept {row['kept']}/{row['samples']} ({row['keep_rate']:.0%}){cut}  "
        f"reward {row['reward']:.3f}  acc {row['accuracy']:.3f}  sft loss {loss} ({row['sft_steps']} steps)  "
        f"{row['round_s']:.1f} s"
    )


def _read_state(checkpoint: Path) -> dict[str, Any]:
    try:
        state = safeio.loads(safeio.read_text(checkpoint / STATE_FILE, "rft state"))
    except ValueError as exc:  # broken, or nested deeper than safeio.MAX_DEPTH
        raise UserError(
            f"cannot resume from {checkpoint}: its {STATE_FILE} is damaged ({exc}); delete that "
            f"checkpoint folder to resume from the one before, or choose a new --output"
        ) from None
    if not isinstance(state, dict) or "round" not in state:
        raise UserError(
            f"{checkpoint} is not an rft round (no 'round' in its {STATE_FILE}); it was written by "
            f"another --algo: resume with that algo, or choose a new --output"
        )
    return state


def _prune(run_dir: Path, model_dir: str | None, keep: int | None) -> None:
    """Keep the newest `keep` rounds' folders, and always the one holding the current weights
    (rounds that kept nothing point back to it)."""
    if not keep:
        return
    current = model_dir.split("/")[0] if model_dir else None
    for folder in rundir.checkpoints(run_dir)[:-keep]:
        if folder.name != current:
            shutil.rmtree(folder, ignore_errors=True)
