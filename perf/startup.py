"""Warm start to the first token (issue 29 item 4): `arle eval` on the embedded model, with
engine.native's load and with transformers' model classes, against a plain transformers script
that loads the same folder and generates one token, and where arle's seconds go.

What is measured, each in a fresh interpreter (the OS file cache warm: one untimed run first):
1. arle: `arle eval one_digit_sums --limit 1 --max-tokens 1` (the issue's measure), wall seconds
   from start to exit (the first token, its run files and the process's shutdown).
2. the same with ARLE_NATIVE_LOAD=0: the folder loaded through transformers' model classes (what
   arle did before engine.native), the same tokens.
3. transformers: import it, `from_pretrained` the model and tokenizer, render the same kind of
   chat prompt, `generate` one token; wall seconds from start to exit.
4. arle's timeline: the same eval in one interpreter with its stages imported and timed in
   order (arle's CLI, torch, transformers' utilities), then the model's load, the fused
   forward's build, the packed linears and the eval itself; and whether transformers' model
   classes were imported at all.

    python perf/startup.py              # 3 runs a side
    python perf/startup.py --repeats 5
    python perf/startup.py --quick      # 1 run a side, no warm-up run (the tests' smoke run)

Target (issue 29): < 5 s to the first token. Writes perf/results/startup.json (quick runs: startup_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from machine_info import cpu_model, package_versions, process_seconds, write_result

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_S = 5.0

PLAIN = """
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(1)
tok = AutoTokenizer.from_pretrained(sys.argv[1], padding_side="left")
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
ids = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True,
                              return_tensors="pt", return_dict=True)
with torch.inference_mode():
    model.generate(**ids, max_new_tokens=1, do_sample=False)
"""

# arle's eval with each stage imported, then timed, in the order the eval reaches it.
TIMELINE = """
import json, sys, time
start = time.perf_counter()
marks = {}
def mark(name, since):
    marks[name] = round(time.perf_counter() - since, 3)
    return time.perf_counter()
t = start
from arlecli.cli.main import main
t = mark("arle's CLI imports", t)
import torch
t = mark("import torch", t)
from arlecli.engine import hf, fused, native
hf._skip_sklearn()
t = mark("transformers' utilities", t)
def timed(module, name, label):
    real = getattr(module, name)
    def wrapper(*a, **k):
        s = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            marks[label] = round(marks.get(label, 0) + time.perf_counter() - s, 3)
    setattr(module, name, wrapper)
timed(native, "load", "model and tokenizer load")
timed(fused, "assemble", "fused forward (probes, stacking, packing)")
timed(hf, "pack_linears", "other linears packed")
sys.argv = ["arle", "eval", "one_digit_sums", "--limit", "1", "--max-tokens", "1", "--output", sys.argv[1]]
s = time.perf_counter()
try:
    main()
except SystemExit:
    pass
fused_s = marks.get("fused forward (probes, stacking, packing)", 0)
marks["model and tokenizer load"] = round(marks.get("model and tokenizer load", 0) - fused_s, 3)  # it runs inside
rest = time.perf_counter() - s - sum(v for k, v in marks.items() if k in (
    "model and tokenizer load", "fused forward (probes, stacking, packing)", "other linears packed"))
marks["card, rows, the eval, its files"] = round(rest, 3)
marks["total"] = round(time.perf_counter() - start, 3)
marks["model classes imported"] = "transformers.modeling_utils" in sys.modules
print("TIMELINE " + json.dumps(marks))
"""


def tagged(cmd: list[str], env: dict[str, str], tag: str) -> dict[str, Any]:
    """The JSON a script printed after `tag`."""
    out = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout
    line = next(x for x in out.splitlines() if x.startswith(tag + " "))
    return json.loads(line[len(tag) + 1 :])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure each side `--repeats` times, then the timeline; print and write."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="runs a side (default 3; quick 1)")
    p.add_argument("--quick", action="store_true", help="1 run a side and no warm-up run")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default perf/results/startup[_quick].json)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    repeats = args.repeats or (1 if args.quick else 3)
    from arlecli.models import embedded_default_model

    model = str(embedded_default_model())
    work = Path(tempfile.mkdtemp(prefix="arle-startup-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    arle = [sys.executable, "-m", "arlecli", "eval", "one_digit_sums", "--limit", "1", "--max-tokens", "1"]
    plain = [sys.executable, "-c", PLAIN, model]
    classes = {**env, "ARLE_NATIVE_LOAD": "0"}
    runs: dict[str, list[float]] = {"arle eval": [], "arle eval, transformers' classes": [], "transformers script": []}
    if not args.quick:
        process_seconds([*arle, "--output", str(work / "warm")], env)  # the file cache warm, the model converted
    for i in range(repeats):
        runs["arle eval"].append(process_seconds([*arle, "--output", str(work / f"run-{i}")], env))
        runs["arle eval, transformers' classes"].append(
            process_seconds([*arle, "--output", str(work / f"classes-{i}")], classes)
        )
        runs["transformers script"].append(process_seconds(plain, env))
        print(f"run {i + 1}: " + ", ".join(f"{side} {times[-1]:.2f} s" for side, times in runs.items()))
    median = {side: statistics.median(s) for side, s in runs.items()}
    timeline = tagged([sys.executable, "-c", TIMELINE, str(work / "timeline")], env, "TIMELINE")

    print(f"\nCPU: {cpu_model()}; one thread; median of {repeats}")
    print("| side | seconds, start to exit (1 row, 1 token) |\n|---|---|")
    for side, value in median.items():
        print(f"| {side} | {value:.2f} |")
    met = "met" if median["arle eval"] < TARGET_S else "missed"
    ratio = median["arle eval"] / median["transformers script"]
    before = median["arle eval"] / median["arle eval, transformers' classes"]
    print(f"\narle / transformers: {ratio:.2f}x the seconds; target < {TARGET_S:.0f} s: {met}")
    print(f"arle / arle on transformers' classes: {before:.2f}x the seconds")
    print("\nwhere arle's seconds go (one run):\n| stage | s |\n|---|---|")
    for stage, value in timeline.items():
        print(f"| {stage} | {value if isinstance(value, bool) else f'{value:.2f}'} |")
    result = {
        "cpu": cpu_model(),
        "packages": package_versions(("torch", "transformers", "tokenizers")),
        "runs": runs,
        "median": median,
        "target_s": TARGET_S,
        "timeline": timeline,
    }
    write_result(result, args.out or RESULTS / f"startup{'_quick' if args.quick else ''}.json", work, keep=False)
    return result


if __name__ == "__main__":
    main()
