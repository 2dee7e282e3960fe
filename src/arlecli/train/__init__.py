"""Training: RL fine-tuning on a benchmark's reward (GRPO, RLOO, PPO)."""
