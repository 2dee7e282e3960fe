"""Training rollouts: the trainers' side of the one producer of Episodes.

GRPO, RLOO and PPO never sample text themselves. Each step they hand the tasks of their
batch, by index, to `Rollouts.episodes`, which runs `envs.episodes.collect` (the function
`arle eval` runs) on an engine over the policy being trained (`PolicyEngine`: the hf engine
over the live weights, or an in-process vLLM engine synced to them). So stop strings, token
budgets, env turns, tool calls and @rollout agents behave exactly as in the eval, and:

    the rollouts of step s = `arle eval --seed SEED+s -n G --temperature T --top-p P
                              --max-tokens M` on the same tasks, for the same weights

where SEED is the trainer's seed and a task drawn twice in one step is samples 0 and 1.

Each episode becomes one training sequence (`flatten_episode`):

    prompt_ids      the first turn's prompt ids
    completion_ids  turn 1's ids | the env's reply | turn 2's ids | ... (one unbroken
                    sequence: later prompts extend earlier ones, see engine.tokens.continue_ids)
    env_mask        1 on the model's tokens, 0 on the environment's (kept out of the loss)
    logprobs        the engine's per-token sampling logprobs (0 on environment tokens)

Where a chat template rewrote history (a seam), the sequence stops before it: training on
ids the model never conditioned on would teach the wrong thing.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from arlecli.cards import Card
from arlecli.envs.episodes import Sampling, collect
from arlecli.fewshot import Exemplars
from arlecli.types import Episode, Task


def flatten_episode(episode: Episode) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt_ids, completion_ids, env_mask, logprobs) of an episode run by an in-process engine
    (all empty for an episode without turns: a game's seat the other ended the game before)."""
    if not episode.turns:
        return [], [], [], []
    first = episode.turns[0]
    prompt_ids = list(first.prompt_token_ids or [])
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    so_far = list(prompt_ids)
    for turn in episode.turns:
        ids = list(turn.prompt_token_ids or [])
        if ids[:len(so_far)] != so_far:
            break  # a seam: this turn's prompt does not extend the sequence
        env_tokens = ids[len(so_far):]
        completion += env_tokens
        mask += [0] * len(env_tokens)
        logprobs += [0.0] * len(env_tokens)
        own = list(turn.token_ids or [])
        completion += own
        mask += [1] * len(own)
        logprobs += list(turn.logprobs) if turn.logprobs and len(turn.logprobs) == len(own) else [0.0] * len(own)
        so_far = ids + own
    return prompt_ids, completion, mask, logprobs


@dataclass
class Sequences:
    """A batch of episodes as the token sequences a trainer consumes (one row per episode)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    env_mask: list[list[int]]
    logprobs: list[list[float]]
    episodes: list[Episode]

    @classmethod
    def of(cls, episodes: list[Episode], end_id: int) -> "Sequences":
        """Flatten each episode. One that has no completion token (a @rollout agent that failed
        before calling the model) gets one `end_id` token, masked out: trainers read each
        completion's last id, and its reward (0) then teaches nothing either way."""
        out = cls([], [], [], [], list(episodes))
        for episode in episodes:
            prompt_ids, completion_ids, mask, logprobs = flatten_episode(episode)
            if not completion_ids:
                completion_ids, mask, logprobs = [end_id], [0], [0.0]
            out.prompt_ids.append(prompt_ids)
            out.completion_ids.append(completion_ids)
            out.env_mask.append(mask)
            out.logprobs.append(logprobs)
        return out

    def for_trl(self) -> dict[str, list[Any]]:
        """TRL's `rollout_func` output: the sequences, `env_mask`, and each `episode` (an extra
        field, which TRL hands to the reward functions)."""
        return {"prompt_ids": self.prompt_ids, "completion_ids": self.completion_ids, "env_mask": self.env_mask,
                "logprobs": self.logprobs, "episode": self.episodes}


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


class PolicyEngine:
    """The engine that training rollouts and held-out evaluations run on, over the policy.

    `hf`: arle's hf engine (continuous batching, the code `arle eval` runs) over the live
    policy module: no copy, always current. `vllm`: one in-process vLLM engine for the whole
    run (`VLLMEngine`, colocated), into which the policy's weights are loaded before a
    rollout whenever they changed (a LoRA adapter is merged for the copy, then unmerged).
    `version` names the weights (the optimizer step): equal versions skip the sync.
    `vllm-server`: TRL's vLLM server (`--vllm-server URL`) through `client` (the trainer's
    VLLMClient, set once the trainer exists), whose weights TRL's trainer syncs itself."""

    def __init__(self, backend: str, model_path: str, *, batch_size: int = 16,
                 vllm_options: dict[str, Any] | None = None, think_tags: str | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.backend = backend
        self.model_path = model_path
        self.batch_size = batch_size
        self.vllm_options = dict(vllm_options or {})
        # The model's options, as `make_engine` gives them to an eval's engine (ModelSpec's).
        self.think_tags = think_tags
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self._vllm: Any = None
        self._version: int | None = None
        self.client: Any = None  # vllm-server: TRL's VLLMClient

    @contextlib.contextmanager
    def over(self, model: Any, tokenizer: Any, version: int) -> Iterator[Any]:
        """An engine generating with `model`'s current weights; the model's train/eval mode is
        restored afterwards (generation switches it to eval mode)."""
        model = unwrap(model)
        was_training = bool(getattr(model, "training", False))
        try:
            if self.backend == "vllm":
                yield self._synced(model, version)
            elif self.backend == "vllm-server":
                from arlecli.engine.trl_server import TRLServerEngine

                yield self._configured(TRLServerEngine(self.client, tokenizer,
                                                       chat_template_kwargs=self.chat_template_kwargs))
            else:
                from arlecli.engine.hf import HFEngine

                yield self._configured(HFEngine("", batch_size=self.batch_size, model_obj=model, tokenizer=tokenizer,
                                                device=str(next(model.parameters()).device),
                                                chat_template_kwargs=self.chat_template_kwargs))
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

        return self._configured(VLLMEngine(base_model(self.model_path), chat_template_kwargs=self.chat_template_kwargs,
                                           **self.vllm_options))

    def _configured(self, engine: Any) -> Any:
        """`engine` with the model's think tags (thinking.configure), as make_engine does."""
        from arlecli import thinking

        return thinking.configure(engine, thinking.parse_option(self.think_tags, "--think-tags"))

    def close(self) -> None:
        """Shut the vLLM engine down (the hf engine holds nothing of its own)."""
        if self._vllm is not None:
            self._vllm.close()
            self._vllm = None


def base_model(path: str) -> str:
    """The weights vLLM starts from: the model itself, or a LoRA adapter folder's base (the
    policy's merged weights are synced in before the first rollout anyway)."""
    from arlecli.engine.vllm import split_adapter

    return split_adapter(path)[0]


def policy_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of every weight under the names a plain HF checkpoint (and vLLM's
    `load_weights`) uses. A peft model's adapter is merged while its weights are read."""
    if not hasattr(model, "merge_adapter"):
        for name, param in model.named_parameters():
            yield name, param.data
        return
    model.merge_adapter()
    try:
        for name, param in model.named_parameters():
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            if model.prefix in name or "original_module" in name:
                continue  # adapter weights (merged already) and modules_to_save originals
            yield name.replace("modules_to_save.default.", ""), param.data
    finally:
        model.unmerge_adapter()


@dataclass
class Rollouts:
    """A run's rollouts: the card's tasks, the trainer's sampling, the engine over the policy."""

    card: Card
    tasks: list[Task]
    exemplars: Exemplars
    sampling: Sampling
    engine: PolicyEngine
    _step: int | None = None
    _drawn: Counter = field(default_factory=Counter)

    def draws(self, indices: list[int], step: int) -> list[tuple[int, int]]:
        """(task index, sample number) per entry: a task's k-th entry this step is sample k."""
        if step != self._step:  # a resumed step starts afresh, as it was first drawn
            self._step, self._drawn = step, Counter()
        out = []
        for i in indices:
            out.append((int(i), self._drawn[int(i)]))
            self._drawn[int(i)] += 1
        return out

    def episodes(self, indices: list[int], step: int, model: Any, tokenizer: Any) -> list[Episode]:
        """One episode per entry of `indices` (task indices), sampled with the weights of `model`
        at optimizer step `step`, in the order given."""
        draws = self.draws(indices, step)
        sampling = replace(self.sampling, seed=self.sampling.seed + step)
        out: list[Episode | None] = [None] * len(draws)
        with self.engine.over(model, tokenizer, step) as engine:
            for j, episode in collect(self.card, engine, self.tasks, self.exemplars, draws, sampling):
                out[j] = episode
        return out  # type: ignore[return-value]

    def sequences(self, indices: list[int], step: int, model: Any, tokenizer: Any) -> Sequences:
        """`episodes`, flattened into training sequences."""
        return Sequences.of(self.episodes(indices, step, model, tokenizer), end_id(tokenizer))
