"""GRPO and RLOO through TRL 1.16's GRPOTrainer / RLOOTrainer.

Both are critic-free and take the same inputs: a dataset with a `prompt` column (a string
for completion-format cards, chat messages for chat cards) plus `task_index`, and our one
reward adapter. Any GRPOConfig/RLOOConfig field comes through the run's TrainConfig; arle
adds only what the run directory and the machine decide (output_dir, CPU settings, the
LoRA config). Checkpoints are the Trainer's own (`<run>/checkpoint-N`: weights or adapter,
optimizer, scheduler, RNG states, data position), so resume is Trainer's resume.

Rollouts are arle's, not TRL's: TRL never generates. GRPO gets them through its
`rollout_func` hook, RLOO (no hook in TRL 1.16) through a two-method subclass, both from
`train.batches.Rollouts` (the producer `arle eval` uses), so training samples exactly what
the eval would: the card's stop strings and budgets, env turns and tool calls, on the hf
engine over the live policy or on arle's in-process vLLM engine (`--backend vllm`), synced to
the policy before each rollout. The trainers see the batch's task indices through
`_generate_and_score_completions`, so tasks travel by index, never by prompt text.

The loss is TRL's, its forward arle's where that gives TRL's numbers (`FORWARD`, train.logprobs:
no padding, the LM head on completion positions only, a group's prompt run once); with
--max-staleness the importance weights are taken from that same forward (`_arle_weigh_loss`).

What every TRL trainer shares (the TRL import, LoRA, the training loop with its held-out
evaluations) is train.trl_glue's; this module registers the algorithms grpo and rloo.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from arlecli.cards import Card
from arlecli.envs.textarena import SELF, is_multiplayer
from arlecli.errors import UserError
from arlecli.train.algorithm import ALGORITHMS, Algorithm, TrainContext
from arlecli.train.config import TrainConfig
from arlecli.train.overlap import Ahead
from arlecli.train.reward import CardReward
from arlecli.train.batches import Rollouts, Sequences, pad_rows, rescore_segments
from arlecli.train.logprobs import ForwardOptions, completion_outputs, supports_chunking
from arlecli.train.trl_glue import check_report_to, common_fields, import_trl, load_model, lora_config, train_loop


def trainer_args(cfg: TrainConfig, run_dir: Path, default_max_tokens: int) -> Any:
    """The GRPOConfig / RLOOConfig for this run."""
    opts = cfg.options
    # TRL never generates here (see the module docstring); it needs vLLM only to reach a server.
    trl = import_trl(bool(opts.vllm_server))
    # LoRA adapters start at zero and need a larger step than TRL's full fine-tune default (1e-6).
    fields = common_fields(cfg, run_dir, 1e-5 if opts.lora_rank > 0 else 1e-6)
    fields.setdefault("max_completion_length", default_max_tokens)  # the card's budget, as the eval uses
    if opts.vllm_server:
        # TRL's server mode: TRL connects to the server and syncs the weights before each
        # rollout; arle's rollouts then generate there (engine.trl_server).
        fields.update(use_vllm=True, vllm_mode="server", vllm_server_base_url=opts.vllm_server.rstrip("/"))
    check_report_to(fields.get("report_to"))
    cls = trl.GRPOConfig if opts.algo == "grpo" else trl.RLOOConfig
    try:
        return cls(**fields)
    except (ValueError, TypeError) as exc:  # TRL's own checks (batch sizes vs num_generations ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"invalid {opts.algo} settings: {first}") from None


def build_trainer(
    cfg: TrainConfig,
    args: Any,
    model: Any,
    prompts: list[Any],
    reward: CardReward,
    rollouts: Rollouts,
    callbacks: list[Any],
    checkpoint: Path | None = None,
) -> Any:
    """A ready GRPOTrainer/RLOOTrainer with `args` (from trainer_args) over `prompts` (row i is
    task i's prompt, which TRL only logs), whose rollouts come from `rollouts`; with
    --max-staleness they are sampled ahead (train.overlap), the queue restored from
    `checkpoint` (the one the run resumes from)."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-tensor "Loading weights"/"Writing model shards" bars are noise here

    trl = import_trl(bool(cfg.options.vllm_server))
    dataset = Dataset.from_list(
        [{"prompt": p, "task_index": i, "task_id": reward.tasks[i].id} for i, p in enumerate(prompts)]
    )
    extra: dict[str, Any] = {}
    if cfg.options.algo == "grpo":
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16
        cls = with_rollouts(trl.GRPOTrainer)
        extra["rollout_func"] = lambda prompts, trainer: trainer.arle_rollout().for_trl()
    else:
        cls = rloo_with_rollouts(trl.RLOOTrainer)
    trainer = cls(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        peft_config=lora_config(cfg),
        callbacks=callbacks,
        **extra,
    )
    trainer.arle_rollouts = rollouts
    trainer.arle_by_seat = cfg.options.algo == "grpo"
    opts = cfg.options
    if opts.max_staleness:
        rollouts.ahead = Ahead(rollouts, opts.max_staleness, trl_plan(trainer), max_step=args.max_steps)
        rollouts.ahead.restore(checkpoint)
        trainer.arle_is_cap = opts.is_cap if opts.is_correction else None
    if cfg.options.vllm_server:
        rollouts.engine.client = trainer.vllm_generation.vllm_client
    trainer.remove_callback(PrinterCallback)  # it prints every log dict; the live view shows them
    return trainer


# How the loss's forward (and the old and reference logprobs') runs: train.logprobs' padding-free
# path with the group's shared prompt run once, giving TRL's numbers up to float rounding
# (tests/test_train_grpo_forward.py; perf/grpo_update.py measures it against TRL's own forward);
# None: TRL's own forward (a padded batch, its fused LM head over every position).
FORWARD: ForwardOptions | None = ForwardOptions(share_prompts=True)


def with_rollouts(base: type) -> type:
    """`base` (a TRL trainer) that remembers its batch's task indices, draws arle rollouts for
    them (dynamic sampling included, train.dapo) and scores every token of a segment after a
    seam on its own context (train.batches: one row per episode, each turn trained on the
    prompt it was generated from)."""
    import torch

    class Indexed(base):
        arle_rollouts: Rollouts
        arle_inputs: list[dict[str, Any]] = []

        arle_seats: list[Any] = []
        arle_by_seat = False  # GRPO: advantages per (task, seat) when a batch holds a game's seats
        arle_seqs: Sequences | None = None  # the rows of the batch being generated and scored
        arle_generating = False  # True while TRL generates and scores a batch (not in the loss's forward)
        arle_is_cap: float | None = None  # rollouts sampled ahead: their importance weights' cap (None: off)
        _arle_segment: Any = None  # the segment numbers of the rows in the loss (a batch key)
        _arle_loss_batch: dict[str, Any] | None = None  # the batch whose loss is being computed

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> Any:
            self.arle_inputs = inputs  # the dataset rows of the prompts `_generate` gets, in order
            self.arle_generating = True
            try:
                out = super()._generate_and_score_completions(inputs)
            finally:
                self.arle_generating = False
            if self.arle_by_seat and len(set(self.arle_seats)) > 1:  # a game's seats: each against its own
                rewards = self.reward_funcs[0].last
                advantages = seat_advantages(rewards, self.arle_seats, self.num_generations, self.scale_rewards)
                out["advantages"] = advantages.to(out["advantages"].device, out["advantages"].dtype)
            if self.arle_seqs is not None and self.arle_seqs.seamed:
                # Shuffled and split with the other tensors, so the loss knows each row's segments.
                out["arle_segment"] = pad_rows(self.arle_seqs.segment, out["completion_ids"])
            if self.arle_is_cap is not None:
                self._arle_importance_weights(out)
            return out

        def _arle_importance_weights(self, out: dict[str, Any]) -> None:
            """Rollouts sampled ahead (--max-staleness) came from an older policy: each row's
            advantage is weighed by its truncated importance weight min(pi_old / pi_sampler,
            is_cap), per token for GRPO (advantages become [B, T]), per sequence for RLOO,
            whose loss is a sequence's (TRL's own correction only runs with its vLLM)."""
            if "old_logps" not in out:  # GRPO: per token, here or in the loss (_arle_weigh_loss)
                if out.get("old_per_token_logps") is not None and out.get("sampling_per_token_logps") is not None:
                    self._arle_weigh(out, out["old_per_token_logps"])
                return
            from arlecli.train.overlap import is_weights

            seqs = self.arle_seqs  # RLOO: sequence logprobs (environment tokens are zeroed in both)
            assert seqs is not None
            old = out["old_logps"].detach().unsqueeze(1)
            pairs = zip(seqs.logprobs, seqs.env_mask, strict=True)
            rows = [sum(lp * m for lp, m in zip(lps, ms, strict=True)) for lps, ms in pairs]
            sampled = torch.tensor([[r] for r in rows], dtype=old.dtype, device=old.device)
            weights, stats = is_weights(old, sampled, torch.ones_like(old), float(self.arle_is_cap or 0.0))
            out["advantages"] = out["advantages"] * weights[:, 0]
            self._arle_record(stats)

        def _arle_record(self, stats: dict[str, float]) -> None:
            """The importance weights' statistics, into the step's metrics."""
            mode = "train" if self.model.training else "eval"
            for key, value in stats.items():
                self._metrics[mode][key].append(value)

        def _arle_weigh(self, batch: dict[str, Any], old: Any) -> None:
            """`batch`'s advantages ([B] or [B, T]) times each token's truncated importance
            weight min(pi_old / pi_sampler, is_cap), `old` the logprobs of the policy the step
            starts from; the weights' mean and clip fraction go to the step's metrics."""
            from arlecli.train.overlap import is_weights

            mask = batch["completion_mask"].to(old.dtype)
            if batch.get("tool_mask") is not None:
                mask = mask * batch["tool_mask"].to(old.dtype)
            behaviour = batch["sampling_per_token_logps"].to(old.dtype)
            weights, stats = is_weights(old.detach(), behaviour, mask, float(self.arle_is_cap or 0.0))
            advantages = batch["advantages"]
            batch["advantages"] = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages) * weights
            self._arle_record(stats)

        def _arle_weigh_loss(self, logps: Any) -> None:
            """The importance weights of rollouts sampled ahead, where TRL skipped the old
            logprobs (one policy iteration, steps aligned): pi_old is the loss forward's own
            logprobs, which TRL then uses as its old ones too, so no second forward computes
            them. The loss's batch is weighed before TRL reads its advantages."""
            batch = self._arle_loss_batch
            if (
                batch is None
                or self.arle_is_cap is None
                or batch.get("old_per_token_logps") is not None
                or batch.get("sampling_per_token_logps") is None  # RLOO's: weighed when generated
            ):
                return
            self._arle_loss_batch = None  # once per loss
            self._arle_weigh(batch, logps)

        def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            ahead = self.arle_rollouts.ahead
            if ahead is not None and "loss" in logs:  # a training step's log: its staleness and idle shares
                logs.update(ahead.metrics())
            super().log(logs, *args, **kwargs)

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            ahead = self.arle_rollouts.ahead
            if ahead is not None:  # the queued rollouts first: a checkpoint is complete once its state is
                ahead.save(Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}")
            super()._save_checkpoint(model, trial)

        def arle_rollout(self) -> Sequences:
            indices = [int(x["task_index"]) for x in self.arle_inputs]
            rollouts = self.arle_rollouts
            reward = self.reward_funcs[0] if rollouts.dapo.dynamic_sampling else None
            seqs = rollouts.sequences(
                indices,
                self.state.global_step,
                self.model,
                self.processing_class,
                reward=reward,
                group=self.num_generations,
            )
            mode = "train" if self.model.training else "eval"
            for key, value in rollouts.last_stats.items():  # dynamic sampling's and overlong filtering's counts
                self._metrics[mode][key].append(value)
            self.arle_seqs = seqs
            # A seat that never moved (the other seat ended the game first) produced no token to
            # train: kept out of its seat's baseline, in a group of its own.
            self.arle_seats = [episode.info.get("seat") if episode.turns else None for episode in seqs.episodes]
            return seqs

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            self._arle_segment = inputs.get("arle_segment")
            self._arle_loss_batch = inputs
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._arle_segment = None
                self._arle_loss_batch = None

        def _get_per_token_logps_and_entropies(
            self, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *args: Any, **kwargs: Any
        ) -> Any:
            score_rows = self._arle_score_rows
            logps, entropies, *rest = score_rows(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            segment = self._arle_segments_like(logps)
            if segment is not None:

                def score(ids: Any) -> list[Any]:  # one segment alone: its prompt, then its tokens
                    lp, ent, *_ = score_rows(
                        model, ids, torch.ones_like(ids), ids.shape[1] - 1, compute_entropy=entropies is not None
                    )
                    return [lp, ent]

                logps, entropies = rescore_segments([logps, entropies], input_ids[:, -logits_to_keep:], segment, score)
            self._arle_weigh_loss(logps)  # inside the loss only: the batch is set by _compute_loss
            return (logps, entropies, *rest)

        def _arle_score_rows(
            self, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *args: Any, **kwargs: Any
        ) -> Any:
            """TRL's per-token logprobs and entropies of the last `logits_to_keep` columns, on
            train.logprobs' forward (no padding, the LM head on completion positions only, a
            group's shared prompt run once) where it computes the same numbers, else TRL's."""
            trl_rows = super()._get_per_token_logps_and_entropies
            call = inspect.signature(trl_rows).bind(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            options = self._arle_forward_options(model, call.arguments)
            if options is None:
                return trl_rows(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            with_entropy = bool(call.arguments.get("compute_entropy"))
            rows = call.arguments.get("batch_size") or input_ids.shape[0]  # TRL's bound on a forward's rows
            prompt_len = input_ids.shape[1] - logits_to_keep
            logps: list[Any] = []
            entropies: list[Any] = []
            for start in range(0, input_ids.shape[0], rows):
                lp, _, ent = completion_outputs(
                    model,
                    None,
                    input_ids[start : start + rows],
                    attention_mask[start : start + rows],
                    prompt_len,
                    self.temperature,
                    self.accelerator.mixed_precision == "bf16",
                    with_entropy,
                    options,
                )
                logps.append(lp)
                if ent is not None:
                    entropies.append(ent)
            return torch.cat(logps), torch.cat(entropies) if with_entropy else None, None

        def _arle_forward_options(self, model: Any, call: dict[str, Any]) -> ForwardOptions | None:
            """FORWARD where it gives TRL's numbers: a text model of plain logits, run unwrapped
            (a DDP/FSDP/DeepSpeed wrapper expects one forward per backward; the shared prompt
            is a second), no MoE aux loss, no entropy bonus (arle's entropies carry no
            gradient), the LM head in the forward's own dtype, no fp16 autocast."""
            if FORWARD is None or call.get("compute_aux_loss") or getattr(self, "_entropy_bonus_enabled", False):
                return None
            vision = ("pixel_values", "image_grid_thw", "token_type_ids", "mm_token_type_ids", "image_sizes")
            if any(call.get(name) is not None for name in vision):
                return None
            head_fp32 = getattr(self.args, "cast_lm_head_to_fp32", False)
            if head_fp32 or self.accelerator.mixed_precision not in ("no", "bf16"):
                return None
            if self.accelerator.unwrap_model(model) is not model or not supports_chunking(model):
                return None
            return FORWARD

        def _arle_segments_like(self, like: Any) -> Any:
            # The rows being generated (old/reference logprobs), else those of the loss's batch.
            if self.arle_generating:
                seqs = self.arle_seqs
                if seqs is None or not seqs.seamed or len(seqs.segment) != like.shape[0]:
                    return None
                return pad_rows(seqs.segment, like)
            segment = self._arle_segment
            return segment if segment is not None and tuple(segment.shape) == tuple(like.shape[:2]) else None

    Indexed.__name__ = base.__name__
    return Indexed


def trl_plan(trainer: Any) -> Callable[[int], list[int] | None]:
    """The task indices TRL's trainer will hand this process's rollouts at each optimizer step
    (None: a step that does not generate), read off a twin of its sampler: TRL's RepeatSampler
    is seeded, so a second one walks the same prompts epoch after epoch, and this process's
    dataloader batches are every world-th batch of it (accelerate's sharding). A step the twin
    gets wrong only costs its overlap: Ahead samples it then (and says so in `unforeseen`)."""
    args = trainer.args
    per_batch = args.per_device_train_batch_size * args.steps_per_generation
    world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
    generate_every = args.steps_per_generation * trainer.num_iterations
    twin = trainer._get_train_sampler(trainer.train_dataset)
    batches: list[list[int]] = []

    def batch(j: int) -> list[int] | None:
        while len(batches) <= j:
            flat = [int(i) for i in iter(twin)]  # one epoch
            if not flat:
                return None
            chunks = [flat[k : k + per_batch] for k in range(0, len(flat), per_batch)]
            batches.extend(chunks[rank::world])
        return batches[j]

    def plan(step: int) -> list[int] | None:
        micro = step * args.gradient_accumulation_steps
        return batch(micro) if micro % generate_every == 0 else None

    return plan


def seat_advantages(rewards: list[float], seats: list[Any], group: int, scale: str = "group") -> Any:
    """Role-conditioned GRPO advantages (SPIRAL's idea, with GRPO's group baseline): in each
    group of `group` completions of one task, each completion's reward minus the mean of the
    completions of the same seat, divided by their std unless `scale` is "none" (as TRL's
    "group" scaling; "batch" scales by the whole batch's std of these differences). Two seats
    of one game have different stakes (the first mover wins more often), so one baseline for
    both would credit a seat for where it sat, not how it played."""
    import torch

    r = torch.tensor(rewards, dtype=torch.float32)
    out = torch.zeros_like(r)
    std = torch.zeros_like(r)
    for start in range(0, len(rewards), group):
        for seat in {seats[i] for i in range(start, min(start + group, len(rewards)))}:
            idx = [i for i in range(start, min(start + group, len(rewards))) if seats[i] == seat]
            values = r[idx]
            out[idx] = values - values.mean()
            std[idx] = values.std() if len(idx) > 1 else 0.0
    if scale == "batch":
        std = torch.full_like(r, float(out.std()) if len(rewards) > 1 else 0.0)
    return out if scale == "none" else out / (std + 1e-4)


def rloo_with_rollouts(base: type) -> type:
    """RLOOTrainer drawing arle rollouts: `_generate` returns them (TRL 1.16's RLOO has no
    rollout hook) and each row's episode joins its input for the reward. RLOO has no env_mask
    either: environment tokens stay attended to, but their logprobs are zeroed wherever RLOO
    sums a sequence's logprobs (the rollout's old logprobs, the reference's for the KL, the
    loss's), so they carry no loss. The mask rides in the batch as `arle_loss_mask`, which
    TRL shuffles and splits with the other tensors."""
    import torch

    class RLOO(with_rollouts(base)):  # type: ignore[misc]  # a class made at run time: mypy cannot see its base
        _last_loaded_step: int  # RLOOTrainer's: the step whose weights vLLM holds
        arle_env_mask: list[list[int]] = []
        _arle_mask: Any = None  # the loss mask of the rows being scored, when known

        def _generate(self, prompts: list[Any]) -> tuple[list[list[int]], list[list[int]], list[Any]]:
            if self.use_vllm and self.state.global_step != self._last_loaded_step:  # --vllm-server
                self.vllm_generation.sync_weights()  # what RLOO's own generation would do first
                self._last_loaded_step = self.state.global_step
            seqs = self.arle_rollout()
            self.arle_env_mask = seqs.env_mask
            for i, (row, episode) in enumerate(zip(self.arle_inputs, seqs.episodes, strict=True)):
                row["episode"] = episode  # reward functions get every input column
                if seqs.indices is not None:  # dynamic sampling: another task's row, scored already
                    row["task_index"], row["arle_score"] = seqs.indices[i], seqs.scores[i]
            mode = "train" if self.model.training else "eval"
            if mode == "train":
                self.state.num_input_tokens_seen += sum(map(len, seqs.prompt_ids)) + sum(map(len, seqs.completion_ids))
            self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]
            lengths = [sum(m) for m in seqs.env_mask]
            self._metrics[mode]["completions/mean_length"].append(sum(lengths) / max(1, len(lengths)))
            texts = [episode.completion for episode in seqs.episodes]
            completions = (
                [[{"role": "assistant", "content": t}] for t in texts] if isinstance(prompts[0], list) else texts
            )
            return seqs.prompt_ids, seqs.completion_ids, completions

        def _mask_like(self, like: Any) -> Any:
            mask = torch.zeros(like.shape[:2], dtype=torch.float32, device=like.device)
            for r, row in enumerate(self.arle_env_mask):
                row = row[: like.shape[1]]
                mask[r, : len(row)] = torch.tensor(row, dtype=torch.float32)
            return mask

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> Any:
            out = super()._generate_and_score_completions(inputs)
            out["arle_loss_mask"] = self._mask_like(out["completion_ids"])
            return out

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            self._arle_mask = inputs.get("arle_loss_mask")
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._arle_mask = None

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            logps, *rest = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            mask = self._mask_like(logps) if self.arle_generating else self._arle_mask
            if mask is not None and mask.shape == logps.shape:
                logps = logps * mask.to(logps.dtype)
            return (logps, *rest)

    RLOO.__name__ = base.__name__
    return RLOO


def run_trl(ctx: TrainContext) -> tuple[dict[str, dict[str, Any]], int]:
    """Train with GRPO/RLOO (ctx.prepared: the config from trainer_args), held-out evals before
    and after; returns (every evaluation's results by label, the last step). Every rank calls
    it (see train.ranks)."""
    assert ctx.rollouts is not None and ctx.reward is not None
    rollouts, reward = ctx.rollouts, ctx.reward
    model = load_model(ctx.spec.path_or_id or "", ctx.spec.is_adapter)
    return train_loop(
        ctx,
        lambda callbacks: build_trainer(
            ctx.cfg, ctx.prepared, model, ctx.prompts, reward, rollouts, callbacks, checkpoint=ctx.checkpoint
        ),
    )


def check_grpo(cfg: TrainConfig, card: Card, run_dir: Path) -> Any:
    """The run's GRPOConfig (TRL's own checks refuse bad settings before the run directory exists)."""
    return trainer_args(cfg, run_dir, card.prompt.max_tokens)


def check_rloo(cfg: TrainConfig, card: Card, run_dir: Path) -> Any:
    """The run's RLOOConfig; a self-play game is refused (one baseline would mix the seats)."""
    args = trainer_args(cfg, run_dir, card.prompt.max_tokens)
    if is_multiplayer(card) and (cfg.options.opponent or SELF) == SELF:
        raise UserError(
            "self-play trains with --algo grpo (each seat's advantage against its own seat's "
            "baseline); rloo's leave-one-out baseline would mix the seats: use grpo, or "
            "--opponent random"
        )
    return args


def _config(name: str) -> Sequence[type]:
    return (getattr(import_trl(False), name),)


# Both train on rollouts in one process or many, in stages, with every DAPO control.
_TRL_RL: dict[str, Any] = dict(
    distributed=True, staged=True, overlong_filter=True, dynamic_sampling=True, asynchronous=True
)
ALGORITHMS.add(
    "grpo", Algorithm("grpo", run_trl, lambda: _config("GRPOConfig"), check=check_grpo, **_TRL_RL), source=run_trl
)
ALGORITHMS.add(
    "rloo", Algorithm("rloo", run_trl, lambda: _config("RLOOConfig"), check=check_rloo, **_TRL_RL), source=run_trl
)
