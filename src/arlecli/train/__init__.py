"""Training: RL fine-tuning on a benchmark's reward (GRPO, RLOO, PPO, RFT), SFT/DPO on recorded trajectories.

Where things happen:

    algorithm.py the plugin point: what an algorithm declares (Algorithm), the one context its
                 run gets (TrainContext), the registry (`--algo NAME`, `file.py:attr`, entry
                 point group arle.algorithms)
    config.py    settings: arle fields + the algorithm's settings, from recipe < flags < --set, validated
    run.py       a run end to end: refusals, settings, data, rollouts, reward, evals, summary.json (the
                 run directory itself: arlecli.rundir)
    batches.py   every trainer's batches: the eval's episode producer (Rollouts) on the policy's
                 backend (PolicyBackend: hf over the live weights, or in-process vLLM synced to
                 them), and its episodes as token sequences (Sequences, flatten_episode)
    reward.py    the one reward adapter: TRL reward function over the card's score(task, episode)
    trl_glue.py  what every TRL trainer shares: the TRL import, LoRA config, the training loop with
                 its held-out evaluations and final/
    grpo.py      the algorithms grpo and rloo: TRL's trainers, fed arle's rollouts
    ppo.py       PPO with a value head, in plain PyTorch (TRL 1.16 has no PPO)
    ppo_run.py   the algorithm ppo: arle's rollouts, the reward and held-out evals around ppo.train_ppo
    offline.py   the algorithms sft and dpo: a --data file of trajectories (sft.py, dpo.py: the trainers)
    rft.py       the algorithm rft, rejection-sampling fine-tuning: rounds of rollouts, the reward's
                 accepted episodes as SFT rows (trajectories.py), SFT on them (sft.py)
    dapo.py      DAPO's controls (overlong filtering and punishment, dynamic sampling)
    ranks.py     this process among the ranks under accelerate (main process, barriers, gather)
    heldout.py   held-out evaluation of the weights being trained, through the eval runner
    metrics.py   metrics.jsonl: one line per logged step, with throughput
    model_card.py the run's README.md (in the run directory and final/)
    launch.py    re-launching a run under accelerate (DDP, DeepSpeed ZeRO, FSDP; multi-node)

`arlecli.cli.train` is the command; `run.run_train` the entry point for code.
"""
