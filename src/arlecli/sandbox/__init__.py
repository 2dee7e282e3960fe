"""Running untrusted, model-written programs: the jail (`jail`) and the test harness whose
verdicts the program cannot forge (`harness`)."""

from __future__ import annotations

from typing import Any

from arlecli.sandbox.harness import HarnessVerdict, run_tests
from arlecli.sandbox.jail import (Isolation, SandboxResult, ensure_isolation, isolation, network_isolation,
                                  policy, run_program, run_programs, set_policy)

# Rewards that run programs in the jail: the model's code, or (reasoning_gym) checkers.
JAILED_REWARDS = frozenset({"code_tests", "code_unittest", "code_io", "reasoning_gym"})
# Rewards whose verdict is reached inside the model's own interpreter (unittest tests patch the
# solution's module), so code written to cheat can forge it (harness.FORGEABLE_MODES).
FORGEABLE_REWARDS = frozenset({"code_unittest"})

__all__ = ["FORGEABLE_REWARDS", "HarnessVerdict", "Isolation", "JAILED_REWARDS", "SandboxResult", "card_runs_code",
           "ensure_isolation", "isolation", "network_isolation", "policy", "run_program", "run_programs",
           "run_tests", "set_policy"]


def card_runs_code(card: Any) -> bool:
    """Whether a card's reward or tools run programs in the jail (so its isolation is
    checked, and under `--sandbox require` enforced, before any generation)."""
    tools = (getattr(card, "env_params", None) or {}).get("tools") or []
    return card.reward in JAILED_REWARDS or "python" in tools
