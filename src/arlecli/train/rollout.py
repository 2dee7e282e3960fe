"""Multi-turn training rollouts: TRL's `rollout_func` over arle's envs.

For a card whose env is not single-turn, GRPO does not sample completions itself: it hands
each step's prompts to `make_rollout_func`'s function, which runs whole episodes with the
same env and episode driver `arle eval` uses (envs.episodes), on an hf engine over the
model being trained. Each episode becomes one training sequence:

    prompt_ids      the first turn's prompt ids
    completion_ids  turn 1's ids | the env's reply | turn 2's ids | ... (one unbroken
                    sequence: later prompts extend earlier ones, see engine.tokens.continue_ids)
    env_mask        1 on the model's tokens, 0 on the environment's (kept out of the loss)
    logprobs        the engine's per-token logprobs (0 on environment tokens)

The Episode itself rides along as an extra field, so the reward adapter scores exactly
what the eval would. Where a chat template rewrote history (a seam), the sequence stops
before it: training on ids the model never conditioned on would teach the wrong thing.

A card with `env: rollout` runs its @rollout agent instead of an env (arlecli.rollout): the
agent's calls go through the recording gateway over the same hf engine, and its recorded
calls are the episode's turns, flattened the same way.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from arlecli.cards import Card
from arlecli.engine.base import SamplingParams
from arlecli.envs import make_env
from arlecli.envs.episodes import Job, native_tools
from arlecli.rollout import episode_driver
from arlecli.types import Episode, Task


def flatten_episode(episode: Episode) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt_ids, completion_ids, env_mask, logprobs) of an episode run by an in-process engine."""
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


def _key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def make_rollout_func(card: Card, tasks: list[Task], exemplars: list[Task], prompts: list[Any],
                      args: Any, batch_size: int = 16) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """TRL's `rollout_func(prompts, trainer)` running the card's env for each prompt.

    `prompts[i]` is task i's dataset prompt; TRL passes those objects back, so they map to
    their tasks by content. Sampling follows the trainer's args (temperature, top_p, and
    max_completion_length per model turn)."""
    index = {_key(p): i for i, p in enumerate(prompts)}

    def rollout(batch: list[Any], trainer: Any) -> dict[str, list[Any]]:
        from arlecli.engine.hf import HFEngine
        from arlecli.train.grpo import _unwrap

        model = _unwrap(trainer.model)
        was_training = model.training
        engine = HFEngine("", batch_size=batch_size, model_obj=model, tokenizer=trainer.processing_class,
                          device=str(next(model.parameters()).device))
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                max_tokens=args.max_completion_length or card.prompt.max_tokens,
                                stop=list(card.prompt.stop), logprobs=True)
        native = native_tools(engine)
        jobs = []
        for prompt in batch:
            task = tasks[index[_key(prompt)]]
            jobs.append(Job(task, make_env(card, task, exemplars, native), params))
        episodes: list[Episode | None] = [None] * len(jobs)
        try:
            for i, episode in episode_driver(card)(engine, jobs):
                episodes[i] = episode
        finally:
            model.train(was_training)  # the engine switched it to eval mode
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "env_mask": [], "logprobs": [],
                                     "episode": []}
        for episode in episodes:
            prompt_ids, completion_ids, mask, logprobs = flatten_episode(episode)
            if not completion_ids:  # a @rollout agent that failed before calling the model
                # TRL reads each completion's last id: give it one end-of-sequence token, masked
                # out of the loss (the episode's reward, 0, then teaches nothing either way).
                completion_ids, mask, logprobs = [_end_id(trainer.processing_class)], [0], [0.0]
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion_ids)
            out["env_mask"].append(mask)
            out["logprobs"].append(logprobs)
            out["episode"].append(episode)
        return out

    return rollout


def _end_id(tokenizer: Any) -> int:
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0
