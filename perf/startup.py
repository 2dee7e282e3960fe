"""Warm start to the first token (issue 29 item 4): `arle eval` on the embedded model against a
plain transformers script that loads the same folder and generates one token, and where arle's
seconds go.

What is measured, each in a fresh interpreter (the OS file cache warm: one untimed run first):
1. arle: `arle eval one_digit_sums --limit 1 --max-tokens 1` (the issue's measure), wall seconds
   from start to exit (the first token, its run files and the process's shutdown).
2. transformers: import it, `from_pretrained` the model and tokenizer, render the same kind of
   chat prompt, `generate` one token; wall seconds from start to exit.
3. arle's timeline: the same eval in one interpreter with its stages imported and timed in
   order (arle's CLI, torch, transformers' utilities, transformers' model classes), then the
   model's load, the fused forward's build, the packed linears and the eval itself.
4. The imports a load without transformers' model classes would need (torch, the tokenizer
   class alone, safetensors, transformers' cache): the floor of that lever, not a path arle has.

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
from arlecli.engine import hf, fused
hf._skip_sklearn()
t = mark("transformers' utilities", t)
from transformers import AutoModelForCausalLM, AutoTokenizer
t = mark("transformers' model classes", t)
def timed(module, name, label):
    real = getattr(module, name)
    def wrapper(*a, **k):
        s = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            marks[label] = round(marks.get(label, 0) + time.perf_counter() - s, 3)
    setattr(module, name, wrapper)
timed(hf, "_load", "model and tokenizer load")
timed(fused, "build", "fused forward (probes, stacking, packing)")
timed(hf, "pack_linears", "other linears packed")
sys.argv = ["arle", "eval", "one_digit_sums", "--limit", "1", "--max-tokens", "1", "--output", sys.argv[1]]
s = time.perf_counter()
try:
    main()
except SystemExit:
    pass
rest = time.perf_counter() - s - sum(v for k, v in marks.items() if k in (
    "model and tokenizer load", "fused forward (probes, stacking, packing)", "other linears packed"))
marks["card, rows, the eval, its files"] = round(rest, 3)
marks["total"] = round(time.perf_counter() - start, 3)
print("TIMELINE " + json.dumps(marks))
"""

FLOOR = """
import json, sys, time
start = time.perf_counter()
import torch
a = time.perf_counter()
from transformers.tokenization_utils_tokenizers import TokenizersBackend
b = time.perf_counter()
tok = TokenizersBackend.from_pretrained(sys.argv[1], padding_side="left")
c = time.perf_counter()
from safetensors.torch import load_file
from transformers.cache_utils import DynamicCache
weights = load_file(sys.argv[1] + "/model.safetensors")
d = time.perf_counter()
print("FLOOR " + json.dumps({"import torch": round(a - start, 3), "the tokenizer class": round(b - a, 3),
    "the tokenizer's load": round(c - b, 3), "safetensors, the cache, the weights mapped": round(d - c, 3),
    "total": round(d - start, 3), "model classes imported": "transformers.modeling_utils" in sys.modules}))
"""


def tagged(cmd: list[str], env: dict[str, str], tag: str) -> dict[str, Any]:
    """The JSON a script printed after `tag`."""
    out = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout
    line = next(x for x in out.splitlines() if x.startswith(tag + " "))
    return json.loads(line[len(tag) + 1 :])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure both sides `--repeats` times, then the timeline and the floor; print and write."""
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
    runs: dict[str, list[float]] = {"arle eval": [], "transformers script": []}
    if not args.quick:
        process_seconds([*arle, "--output", str(work / "warm")], env)  # the file cache warm, the model converted
    for i in range(repeats):
        runs["arle eval"].append(process_seconds([*arle, "--output", str(work / f"run-{i}")], env))
        runs["transformers script"].append(process_seconds(plain, env))
        print(f"run {i + 1}: arle {runs['arle eval'][-1]:.2f} s, transformers {runs['transformers script'][-1]:.2f} s")
    median = {side: statistics.median(s) for side, s in runs.items()}
    timeline = tagged([sys.executable, "-c", TIMELINE, str(work / "timeline")], env, "TIMELINE")
    floor = tagged([sys.executable, "-c", FLOOR, model], env, "FLOOR")

    print(f"\nCPU: {cpu_model()}; one thread; median of {repeats}")
    print("| side | seconds, start to exit (1 row, 1 token) |\n|---|---|")
    for side, value in median.items():
        print(f"| {side} | {value:.2f} |")
    met = "met" if median["arle eval"] < TARGET_S else "missed"
    ratio = median["arle eval"] / median["transformers script"]
    print(f"\narle / transformers: {ratio:.2f}x the seconds; target < {TARGET_S:.0f} s: {met}")
    print("\nwhere arle's seconds go (one run):\n| stage | s |\n|---|---|")
    for stage, value in timeline.items():
        print(f"| {stage} | {value:.2f} |")
    print("\nwhat a load without transformers' model classes would start from:\n| part | s |\n|---|---|")
    for part, value in floor.items():
        print(f"| {part} | {value} |")
    result = {
        "cpu": cpu_model(),
        "packages": package_versions(("torch", "transformers", "tokenizers")),
        "runs": runs,
        "median": median,
        "target_s": TARGET_S,
        "timeline": timeline,
        "floor_without_model_classes": floor,
    }
    write_result(result, args.out or RESULTS / f"startup{'_quick' if args.quick else ''}.json", work, keep=False)
    return result


if __name__ == "__main__":
    main()
