"""Running untrusted, model-written programs: the jail (`jail`) and the test harness whose
verdicts the program cannot forge (`harness`)."""

from arlecli.sandbox.harness import HarnessVerdict, run_tests
from arlecli.sandbox.jail import SandboxResult, network_isolation, run_program, run_programs

__all__ = ["HarnessVerdict", "SandboxResult", "network_isolation", "run_program", "run_programs", "run_tests"]
