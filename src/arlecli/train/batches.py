"""Training batches: the trainers' side of the one producer of Episodes, and the rows it makes.

GRPO, RLOO and PPO never sample text themselves. Each step they hand the tasks of their
batch, by index, to `Rollouts.episodes`, which runs `envs.episodes.collect` (the function
`arle eval` runs) on an engine over the policy being trained (`PolicyBackend`: the hf engine
over the live weights, or an in-process vLLM engine synced to them). So stop strings, token
budgets, env turns, tool calls and @rollout agents behave exactly as in the eval, and:

    the rollouts of step s = `arle eval --seed SEED+s -n G --temperature T --top-p P
                              --max-tokens M` on the same tasks, for the same weights

where SEED is the trainer's seed and a task drawn twice in one step is samples 0 and 1.

Each episode becomes one training sequence (`flatten_episode`), one row of the trainer's batch:

    prompt_ids      the first turn's prompt ids
    completion_ids  turn 1's ids | the env's reply | turn 2's ids | ... (one unbroken
                    sequence: later prompts extend earlier ones, see engine.tokens.continue_ids)
    env_mask        1 on the model's tokens, 0 on the environment's and on tokens arle wrote
                    itself (`Turn.forced`: a budget-forced end of thought): no loss there
    logprobs        the engine's per-token sampling logprobs (0 on environment tokens)
    segment         which context each completion token was generated in (below)

The tokens are the model's as generated: a reasoning model's thinking is part of them, the
answer follows it (rewards read only the answer, training learns both).

Seams. A chat template that drops earlier turns' thinking (Qwen3's, R1's) renders the next
prompt without it, so turn k+1's prompt does not extend turn k's prompt + completion: the
episode's ids have a seam there. The policy (issue 24): each turn is trained on exactly what
the model saw when it generated it, its own thinking kept in its own turn. So at a seam the
row goes on with the next turn's whole prompt, as the template rendered it (env_mask 0), and
a new segment starts: segment 0 is generated after `prompt_ids`; segment k > 0 after its own
prompt, which opens it. The trainers score a segment k > 0 on its own context, never on what
precedes it in the row (`rescore_segments`: one more forward pass per segment), so every
model token's logprob, loss and KL are taken on the prompt it was generated from. One row per
episode keeps what GRPO needs: TRL's `rollout_func` returns one completion per prompt entry,
its groups of `num_generations` rows are one task's episodes, and the episode's reward (one
advantage) covers all its turns. The episode's `info["seams"]` (samples.jsonl, rewards.jsonl)
names the turns that started a segment.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator

from arlecli.cards import Card
from arlecli.envs.episodes import Sampling, collect
from arlecli.fewshot import Exemplars
from arlecli.train.weights import GenerationCopy, for_generation, is_generation_copy, policy_weights
from arlecli.train.dapo import DAPOOptions, Filled, fill_groups, is_cut, refill_picker
from arlecli.types import Episode, Task

if TYPE_CHECKING:
    import torch


@dataclass
class Flat:
    """One episode as a training row (see the module docstring); all empty for an episode
    without turns (a game's seat the other ended the game before)."""

    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segment: list[int] = field(default_factory=list)

    # Also the 4-tuple (prompt_ids, completion_ids, env_mask, logprobs) flatten_episode returned
    # before segments existed, so `prompt, completion, mask, logprobs = flatten_episode(e)` holds.
    def _row(self) -> tuple[list[int], list[int], list[int], list[float]]:
        return self.prompt_ids, self.completion_ids, self.env_mask, self.logprobs

    def __iter__(self) -> Iterator[Any]:
        return iter(self._row())

    def __getitem__(self, key: int | slice) -> Any:
        return self._row()[key]

    def __len__(self) -> int:
        return 4

    def pieces(self) -> list[tuple[list[int], list[int]]]:
        """(ids, loss mask) of each segment as a sequence of its own: segment 0 after
        `prompt_ids`, each later one from its own prompt on (what SFT trains on)."""
        out = [(list(self.prompt_ids), [0] * len(self.prompt_ids))]
        current = 0
        for token, mask, seg in zip(self.completion_ids, self.env_mask, self.segment, strict=True):
            if seg != current:
                out.append(([], []))
                current = seg
            out[-1][0].append(token)
            out[-1][1].append(mask)
        return out


def flatten_episode(episode: Episode) -> Flat:
    """The training row of an episode run by an in-process engine (module docstring)."""
    if not episode.turns:
        return Flat()
    first = episode.turns[0]
    flat = Flat(prompt_ids=list(first.prompt_token_ids or []))
    so_far, seg = list(flat.prompt_ids), 0
    for turn in episode.turns:
        ids = list(turn.prompt_token_ids or [])
        if ids[: len(so_far)] == so_far:
            context = ids[len(so_far) :]  # the env's reply (and the template's turn markers)
        else:  # a seam: the whole prompt this turn was generated from opens a new segment
            context, seg = ids, seg + 1
        own = list(turn.token_ids or [])
        forced = set(turn.forced)
        flat.completion_ids += context + own
        flat.env_mask += [0] * len(context) + [0 if j in forced else 1 for j in range(len(own))]
        sampled = list(turn.logprobs) if turn.logprobs and len(turn.logprobs) == len(own) else [0.0] * len(own)
        flat.logprobs += [0.0] * len(context) + sampled
        flat.segment += [seg] * (len(context) + len(own))
        so_far = ids + own
    return flat


@dataclass
class Sequences:
    """A batch of episodes as the token sequences a trainer consumes (one row per episode)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    env_mask: list[list[int]]
    logprobs: list[list[float]]
    episodes: list[Episode]
    segment: list[list[int]] = field(default_factory=list)
    indices: list[int] | None = None  # each row's task, when dynamic sampling chose other tasks
    scores: list[Any] | None = None  # each row's verdict, when the rollout scored them already

    @classmethod
    def of(cls, episodes: list[Episode], end_id: int) -> "Sequences":
        """Flatten each episode. One that has no completion token (a @rollout agent that failed
        before calling the model) gets one `end_id` token, masked out: trainers read each
        completion's last id, and its reward (0) then teaches nothing either way."""
        out = cls([], [], [], [], list(episodes))
        for episode in episodes:
            flat = flatten_episode(episode)
            if not flat.completion_ids:
                flat = Flat(flat.prompt_ids, [end_id], [0], [0.0], [0])
            out.prompt_ids.append(flat.prompt_ids)
            out.completion_ids.append(flat.completion_ids)
            out.env_mask.append(flat.env_mask)
            out.logprobs.append(flat.logprobs)
            out.segment.append(flat.segment)
        return out

    def without_loss(self, rows: list[bool] | None) -> "Sequences":
        """These sequences with the rows marked in `rows` (overlong filtering, a filler group of
        dynamic sampling) masked out of the loss: their tokens stay, attended to."""
        for r, off in enumerate(rows or []):
            if off:
                self.env_mask[r] = [0] * len(self.env_mask[r])
        return self

    @property
    def seamed(self) -> bool:
        """Whether some row has a segment after its first (a seam)."""
        return any(any(row) for row in self.segment)

    def for_trl(self) -> dict[str, list[Any]]:
        """TRL's `rollout_func` output: the sequences, `env_mask`, and each `episode` (an extra
        field, which TRL hands to the reward functions), with each row's `task_index` and
        verdict (`arle_score`) when dynamic sampling replaced tasks and scored them already."""
        out: dict[str, list[Any]] = {
            "prompt_ids": self.prompt_ids,
            "completion_ids": self.completion_ids,
            "env_mask": self.env_mask,
            "logprobs": self.logprobs,
            "episode": self.episodes,
        }
        if self.indices is not None:
            out["task_index"] = list(self.indices)
        if self.scores is not None:
            out["arle_score"] = list(self.scores)
        return out


def numbered(indices: list[int], drawn: Counter | None = None) -> list[tuple[int, int]]:
    """(task index, sample number) per entry: a task's k-th entry is its sample k, counted on
    from `drawn` (the samples already drawn per task, updated; None: none)."""
    drawn = Counter() if drawn is None else drawn
    out = []
    for i in indices:
        out.append((int(i), drawn[int(i)]))
        drawn[int(i)] += 1
    return out


def segment_spans(row: "torch.Tensor") -> list[tuple[int, int]]:
    """(start, end) completion positions of each segment after the first in one row's
    segment numbers (padding carries 0 and follows the last segment)."""
    values = row.tolist()
    spans: list[tuple[int, int]] = []
    for pos, seg in enumerate(values):
        if seg and (pos == 0 or values[pos - 1] != seg):
            spans.append((pos, pos + 1))
        elif seg:
            spans[-1] = (spans[-1][0], pos + 1)
    return spans


def rescore_segments(
    outputs: list["torch.Tensor | None"],
    completion_ids: "torch.Tensor",
    segment: "torch.Tensor",
    score: Callable[["torch.Tensor"], list["torch.Tensor | None"]],
) -> list["torch.Tensor | None"]:
    """Per-token outputs of a batch ([B, C] logprobs, entropies, values ...) with every token
    of a segment k > 0 scored on its own context: `score(ids)` runs the model over one
    segment's ids ([1, n]: its prompt, then what follows) and returns the same outputs for
    its tokens 1..n-1 ([1, n-1] each), which replace the batch's at those positions. A
    segment's first token (its prompt's first) has no context of its own and carries no loss."""
    if segment is None or not bool((segment > 0).any()):
        return outputs
    out = [None if t is None else t.clone() for t in outputs]
    for row in range(segment.shape[0]):
        for start, end in segment_spans(segment[row]):
            if end - start < 2:
                continue
            fresh = score(completion_ids[row : row + 1, start:end])
            for k, tensor in enumerate(fresh):
                target = out[k]
                if target is not None and tensor is not None:
                    target[row, start + 1 : end] = tensor[0].to(target.dtype)
    return out


def pad_rows(rows: list[list[int]], like: "torch.Tensor", fill: int = 0) -> "torch.Tensor":
    """`rows` (ragged ints) as a [B, C] long tensor shaped and placed like `like` ([B, C, ...]),
    cut or padded with `fill` on the right."""
    import torch

    out = torch.full(like.shape[:2], fill, dtype=torch.long, device=like.device)
    for r, row in enumerate(rows):
        row = row[: like.shape[1]]
        if row:
            out[r, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


def end_id(tokenizer: Any) -> int:
    """The token that ends a sequence (EOS, else pad)."""
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


def unwrap(model: Any) -> Any:
    """The module that generates: DDP/accelerate wrappers hide it behind `.module`."""
    while hasattr(model, "module") and not hasattr(model, "generate"):
        model = model.module
    return model


class PolicyBackend:
    """The run's --backend, which training rollouts and held-out evaluations run on: not an
    engine itself, it hands out an engine over the policy's current weights (`over`).

    `hf`: arle's hf engine (continuous batching, the code `arle eval` runs) over a copy of
    the policy refilled before each rollout, a peft adapter merged (train.weights), or over the
    live policy module where no copy is made (a plain policy on a GPU). `vllm`: one in-process
    vLLM engine for the whole run (`VLLMEngine`, colocated), into which the policy's weights (an
    adapter merged, train.weights) are loaded before a rollout whenever they changed.
    `version` names the weights (the optimizer step): equal versions skip the sync.
    `vllm-server`: TRL's vLLM server (`--vllm-server URL`) through `client` (the trainer's
    VLLMClient, set once the trainer exists), whose weights TRL's trainer syncs itself."""

    def __init__(
        self,
        backend: str,
        model_path: str,
        *,
        batch_size: int = 16,
        vllm_options: dict[str, Any] | None = None,
        think_tags: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.backend = backend
        self.model_path = model_path
        self.batch_size = batch_size
        self.vllm_options = dict(vllm_options or {})
        # The model's options, as `make_engine` gives them to an eval's engine (ModelSpec's).
        self.think_tags = think_tags
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._vllm: Any = None
        self._version: int | None = None
        self._turn = threading.RLock()
        self._copy = GenerationCopy()  # hf: what the live policy is generated from (train.weights)
        self.client: Any = None  # vllm-server: TRL's VLLMClient

    @contextlib.contextmanager
    def over(self, model: Any, tokenizer: Any, version: int) -> Iterator[Any]:
        """An engine generating with `model`'s current weights; the model's train/eval mode is
        restored afterwards (generation switches it to eval mode)."""
        model = unwrap(model)
        was_training = bool(getattr(model, "training", False))
        try:
            if self.backend == "vllm":
                # Rollouts sampled ahead (train.overlap) run on a worker thread: a held-out
                # evaluation waits for them, so nobody loads weights into a generating engine.
                with self._turn:
                    yield self._synced(model, version)
            elif self.backend == "vllm-server":
                from arlecli.engine.trl_server import TRLServerEngine

                yield self._configured(
                    TRLServerEngine(self.client, tokenizer, chat_template_kwargs=self.chat_template_kwargs)
                )
            else:
                from arlecli.engine.hf import HFEngine

                # A snapshot (--max-staleness) is a generation copy already; the live policy
                # gets this backend's copy (train.weights), one generation on it at a time.
                copied = not is_generation_copy(model)
                with self._turn if copied else contextlib.nullcontext():
                    generating = for_generation(model, self._copy, version) if copied else model
                    yield self._configured(
                        HFEngine(
                            "",
                            batch_size=self.batch_size,
                            model_obj=generating,
                            tokenizer=tokenizer,
                            device=str(next(model.parameters()).device),
                            chat_template_kwargs=self.chat_template_kwargs,
                        )
                    )
        finally:
            model.train(was_training)

    def _synced(self, model: Any, version: int) -> Any:
        if self._vllm is None:
            self._vllm = self._start_vllm()
        if self._version != version:
            self._vllm.load_weights(policy_weights(model))
            self._version = version
        return self._vllm

    def _start_vllm(self) -> Any:
        from arlecli.engine.vllm import VLLMEngine

        return self._configured(
            VLLMEngine(base_model(self.model_path), chat_template_kwargs=self.chat_template_kwargs, **self.vllm_options)
        )

    def _configured(self, engine: Any) -> Any:
        """`engine` with the model's think tags (thinking.configure), as make_engine does."""
        from arlecli import thinking

        return thinking.configure(engine, thinking.parse_option(self.think_tags, "--think-tags"))

    def close(self) -> None:
        """Shut the vLLM engine down and drop the hf engine's generation copy."""
        self._copy.close()
        if self._vllm is not None:
            self._vllm.close()
            self._vllm = None


def base_model(path: str) -> str:
    """The weights vLLM starts from: the model itself, or a LoRA adapter folder's base (the
    policy's merged weights are synced in before the first rollout anyway)."""
    from arlecli.engine.vllm import split_adapter

    return split_adapter(path)[0]


@dataclass
class Rollouts:
    """A run's rollouts: the card's tasks, the trainer's sampling, the engine over the policy,
    and the DAPO controls that shape which rows carry loss (train.dapo)."""

    card: Card
    tasks: list[Task]
    exemplars: Exemplars
    sampling: Sampling
    engine: PolicyBackend
    dapo: DAPOOptions = field(default_factory=DAPOOptions)
    last_stats: dict[str, float] = field(default_factory=dict)  # the latest step's DAPO counts (metrics.jsonl)
    ahead: Any = None  # train.overlap.Ahead: rollouts sampled ahead of their step (--max-staleness)
    _step: int | None = None
    _drawn: Counter = field(default_factory=Counter)

    def draws(self, indices: list[int], step: int) -> list[tuple[int, int]]:
        """(task index, sample number) per entry: a task's k-th entry this step is sample k."""
        if step != self._step:  # a resumed step starts afresh, as it was first drawn
            self._step, self._drawn = step, Counter()
        return numbered(indices, self._drawn)

    def episodes(self, indices: list[int], step: int, model: Any, tokenizer: Any) -> list[Episode]:
        """One episode per entry of `indices` (task indices) for optimizer step `step`, in the
        order given: sampled now with the weights of `model`, or with `--max-staleness`
        taken from the rollouts queued ahead (train.overlap)."""
        if self.ahead is not None:
            return self.ahead.episodes(indices, step, model, tokenizer)
        return self.sample(self.draws(indices, step), step, model, tokenizer, step)

    def sample(
        self, draws: list[tuple[int, int]], step: int, model: Any, tokenizer: Any, version: int
    ) -> list[Episode]:
        """One episode per (task index, sample number) of `draws`, seeded for `step`, sampled
        with `model`, whose weights are those of optimizer step `version`."""
        sampling = replace(self.sampling, seed=self.sampling.seed + step)
        out: list[Episode | None] = [None] * len(draws)
        with self.engine.over(model, tokenizer, version) as engine:
            for j, episode in collect(self.card, engine, self.tasks, self.exemplars, draws, sampling):
                out[j] = episode
        return out  # type: ignore[return-value]

    def sequences(
        self, indices: list[int], step: int, model: Any, tokenizer: Any, *, reward: Any = None, group: int = 1
    ) -> Sequences:
        """`episodes`, flattened into training sequences; a cut episode carries no loss under
        overlong filtering. With dynamic sampling, `reward` (the run's CardReward, which then
        records the verdicts) and `group` (the trainer's num_generations) refill the batch
        (`filled`)."""
        if self.dapo.dynamic_sampling and reward is not None:
            return self.filled(indices, step, model, tokenizer, reward, group)
        episodes = self.episodes(indices, step, model, tokenizer)
        seqs = Sequences.of(episodes, end_id(tokenizer))
        self.last_stats = self.filter_stats(seqs)
        return seqs.without_loss([self.no_loss(e) for e in episodes])

    def filter_stats(self, seqs: Sequences, rows: list[bool] | None = None) -> dict[str, float]:
        """Overlong filtering's counts for a step's rows (those marked in `rows`, default all):
        the share it keeps out of the loss and the tokens generated per row, filtered rows
        included (TRL's completions/mean_length counts the tokens trained on)."""
        if not self.dapo.overlong_filter:
            return {}
        picked = [r for r in range(len(seqs.episodes)) if rows is None or rows[r]]
        if not picked:
            return {}
        cut = sum(self.no_loss(seqs.episodes[r]) for r in picked)
        tokens = sum(sum(seqs.env_mask[r]) for r in picked)  # before without_loss: every model token
        return {"overlong/filtered_share": cut / len(picked), "completions/generated_mean_length": tokens / len(picked)}

    def no_loss(self, episode: Episode) -> bool:
        """Whether overlong filtering keeps `episode` out of the loss."""
        return self.dapo.overlong_filter and is_cut(episode)

    def filled(self, indices: list[int], step: int, model: Any, tokenizer: Any, reward: Any, group: int) -> Sequences:
        """Dynamic sampling (train.dapo.fill_groups): the batch with every all-equal group
        replaced by a group of another task where one was found; every episode sampled this
        step is scored once and recorded (rewards.jsonl marks the dropped ones), each row's
        task and verdict ride along (`Sequences.indices` / `.scores`), and the step's counts
        are in `last_stats`."""
        filled: Filled = fill_groups(
            list(indices),
            group,
            lambda todo: self.episodes(todo, step, model, tokenizer),
            reward.judge,
            refill_picker(len(self.tasks), self.sampling.seed, step),
            self.dapo.dynamic_sampling_rounds,
        )
        scored = filled.scored
        reward.record(
            [e for e, _, _, _ in scored],
            [i for _, i, _, _ in scored],
            [s for _, _, s, _ in scored],
            step=step + 1,
            dropped=[d for _, _, _, d in scored],
        )
        no_loss = [not trained or self.no_loss(e) for e, trained in zip(filled.episodes, filled.trained, strict=True)]
        seqs = Sequences.of(filled.episodes, end_id(tokenizer))
        self.last_stats = {**filled.stats, **self.filter_stats(seqs, filled.trained)}
        seqs = seqs.without_loss(no_loss)
        seqs.indices, seqs.scores = filled.indices, filled.scores
        return seqs
