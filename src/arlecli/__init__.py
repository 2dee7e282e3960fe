"""arle: evaluate and RL-train LLMs and agents on benchmarks from one card."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["ClientConfig", "__version__", "rollout"]


def __getattr__(name: str) -> Any:
    # `arlecli.rollout`, the @rollout decorator (an OpenAI-API agent as a benchmark's agent), and
    # its ClientConfig, from arlecli.agent on first use: importing any arlecli module does not
    # load the gateway, the server and the engines behind it (`arle --help` stays fast).
    if name in ("rollout", "ClientConfig"):
        from arlecli import agent

        return getattr(agent, name)
    raise AttributeError(f"module 'arlecli' has no attribute {name!r}")
