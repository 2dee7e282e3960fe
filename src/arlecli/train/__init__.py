"""Training: RL fine-tuning on a benchmark's reward (GRPO, RLOO, PPO).

Where things happen:

    config.py    settings: arle fields + trainer fields, from recipe < flags < --set, validated
    run.py       a run end to end: settings, data, rollouts, reward, evals, summary.json (the run
                 directory itself: arlecli.rundir)
    rollout.py   every trainer's rollouts: the eval's episode producer on an engine over the policy
                 (hf over the live weights, or in-process vLLM synced to them), as token sequences
    reward.py    the one reward adapter: TRL reward function over the card's score(task, episode)
    grpo.py      GRPO and RLOO through TRL's trainers, fed arle's rollouts (LoRA config, CPU settings)
    ppo.py       PPO with a value head, in plain PyTorch (TRL 1.16 has no PPO)
    ppo_run.py   PPO on a card: arle's rollouts, the reward and held-out evals around ppo.train_ppo
    rft.py       rejection-sampling fine-tuning: rounds of rollouts, the reward's accepted episodes
                 as SFT rows (trajectories.py), SFT on them (sft.py)
    ranks.py     this process among the ranks under accelerate (main process, barriers, gather)
    heldout.py   held-out evaluation of the weights being trained, through the eval runner
    metrics.py   metrics.jsonl: one line per logged step, with throughput
    launch.py    re-launching a run under accelerate (DDP, DeepSpeed ZeRO, FSDP; multi-node)

`arlecli.cli.train` is the command; `run.run_train` the entry point for code.
"""
