#!/usr/bin/env bash
# GRPO learning on a CPU, measured: SmolLM2-135M-Instruct on one-digit sums.
#
#   examples/cpu_grpo_demo/run.sh [RUN_DIR] [SEED] [arle train flags ...]
#
# (e.g. `runs/demo-async 1234 --max-staleness 1`: the flags after the seed go to `arle train`)
#
# 1. `arle train` (recipe.yaml): 40 GRPO + LoRA steps on training rows (seed 0), with
#    held-out evaluations of the `test` split (seed 1000, 200 tasks) before and after.
# 2. `arle eval` of the base model and of the trained adapter on a second held-out split
#    (`heldout`, seed 2000, 200 tasks), the same way any user would evaluate them.
# Offline: the model is the embedded default, the data is generated.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
run="${1:-runs/cpu-grpo-demo}"
seed="${2:-1234}"
start=$(date +%s)

arle train "$here/sums.yaml" --recipe "$here/recipe.yaml" --seed "$seed" --output "$run" "${@:3}"
arle eval "$here/sums.yaml" --split heldout --output "$run/heldout-base" --json > "$run/heldout-base.json"
arle eval "$here/sums.yaml" --split heldout --model "$run/final" --output "$run/heldout-trained" --json \
  > "$run/heldout-trained.json"

python3 - "$run" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
from pathlib import Path
run, seconds = Path(sys.argv[1]), int(sys.argv[2])
summary = json.loads((run / "summary.json").read_text())
acc = lambda p: json.loads(p.read_text())["metrics"]["accuracy"]["value"]
before, after = summary["before"]["accuracy"], summary["after"]["accuracy"]
base, trained = acc(run / "heldout-base.json"), acc(run / "heldout-trained.json")
print(f"test split (seed 1000, 200 tasks):    {before:.3f} -> {after:.3f}  ({after - before:+.3f})")
print(f"heldout split (seed 2000, 200 tasks): {base:.3f} -> {trained:.3f}  ({trained - base:+.3f})")
print(f"wall time: {seconds // 60} min {seconds % 60} s")
PY
