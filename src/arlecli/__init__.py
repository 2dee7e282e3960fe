"""arle: evaluate and RL-train LLMs and agents on benchmarks from one card."""

__version__ = "0.1.0"
