"""Running untrusted, model-written programs: the jail (`jail`) and the test harness whose
verdicts the program cannot forge (`harness`).

Which rewards and tools run programs here is theirs to declare at registration
(`@register(runs_code=True, forgeable=...)`, `@register_tool(runs_code=True)`); catalog.card_runs_code
reads those declarations, so a plugin's code-running reward is isolation-checked like arle's own."""

from __future__ import annotations

from arlecli.sandbox.harness import HarnessVerdict, run_tests
from arlecli.sandbox.jail import (
    Isolation,
    SandboxResult,
    ensure_isolation,
    isolation,
    network_isolation,
    policy,
    run_program,
    run_programs,
    set_policy,
)

__all__ = [
    "HarnessVerdict",
    "Isolation",
    "SandboxResult",
    "ensure_isolation",
    "isolation",
    "network_isolation",
    "policy",
    "run_program",
    "run_programs",
    "run_tests",
    "set_policy",
]
