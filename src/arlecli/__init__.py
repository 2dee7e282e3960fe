"""arle: evaluate and RL-train LLMs and agents on benchmarks from one card."""

__version__ = "0.1.0"

# The @rollout decorator (an OpenAI-API agent as a benchmark's agent). Importing it also
# registers `env: rollout`. Note `arlecli.rollout` is the decorator, not the module: import
# the module's other names with `from arlecli.rollout import ...`.
from arlecli.rollout import ClientConfig, rollout  # noqa: E402

__all__ = ["ClientConfig", "__version__", "rollout"]
