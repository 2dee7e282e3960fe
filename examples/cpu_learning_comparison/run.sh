#!/usr/bin/env bash
# GRPO vs RFT vs SFT on a teacher's trajectories, measured on a CPU: SmolLM2-135M-Instruct (the
# embedded default model) on one-digit sums (the CPU GRPO demo's card, ../cpu_grpo_demo).
#
#   examples/cpu_learning_comparison/run.sh [OUT_DIR] [SEED]
#
# Each method learns from the same 80 training questions at the same budget: 640 sampled
# answers of at most 24 tokens (temperature 1.0) and at most 40 LoRA steps (r 16, lr 2e-4) of
# 16 sequences each; rft.yaml and sft.yaml say how each reaches it.
#   grpo  ../cpu_grpo_demo/recipe.yaml: 40 steps x 2 questions x 8 samples
#   rft   rft.yaml: 4 rounds x 20 questions x 8 samples with the current policy, SFT on the
#         correct ones (at most 10 steps a round)
#   sft   the base model samples 8 answers to each question (`arle eval -n 8`), the correct ones
#         are kept (`arle data from-eval`, self-distillation), then 40 SFT steps on them
# Held-out accuracy before and after: each run's own evaluations on the `test` split (seed 1000,
# 200 tasks, greedy). Wall time per method includes its sampling and both evaluations.
# About an hour on 2 cores. Offline: the model is embedded, the data generated.
#
# Rerunning with the same OUT_DIR skips finished methods and resumes an interrupted one.
# SMOKE=1 shrinks everything (2 questions, 1 step or round, 2 held-out tasks) to check the script.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
demo="$here/../cpu_grpo_demo"
card="$demo/sums.yaml"
out="${1:-runs/cpu-learning-comparison}"
seed="${2:-1234}"
tasks=80 eval_limit=200
grpo_small=() rft_small=() sft_small=()
if [[ "${SMOKE:-0}" == 1 ]]; then
  tasks=2 eval_limit=2
  grpo_small=(--max-steps 1)
  rft_small=(--set rounds=1 --set tasks_per_round=2 --max-steps 1)
  sft_small=(--max-steps 1)
fi
mkdir -p "$out"

# arle train ... --output DIR (--limit: the training questions; for sft, rows of --data), skipped when DIR finished, resumed when it was interrupted.
train() {
  local dir="$1"; shift
  if [[ -f "$dir/summary.json" ]]; then echo "$dir: done already"; return; fi
  local resume=(); [[ -f "$dir/meta.json" ]] && resume=(--resume)
  local start; start=$(date +%s)
  arle train "$card" "$@" --eval-limit "$eval_limit" --seed "$seed" --output "$dir" "${resume[@]}"
  echo $(( $(date +%s) - start )) > "$dir.seconds"
}

train "$out/grpo" --recipe "$demo/recipe.yaml" --limit "$tasks" "${grpo_small[@]}"
train "$out/rft" --recipe "$here/rft.yaml" --limit "$tasks" "${rft_small[@]}"

# The teacher's trajectories: the base model, 8 samples a question, as GRPO and RFT sample.
if [[ ! -f "$out/sft/summary.json" ]]; then
  start=$(date +%s)
  if [[ ! -f "$out/teacher/results.json" ]]; then
    resume=(); [[ -f "$out/teacher/meta.json" ]] && resume=(--resume)
    arle eval "$card" --split train --limit "$tasks" -n 8 --temperature 1.0 --max-tokens 24 --seed "$seed" \
      --output "$out/teacher" "${resume[@]}" > /dev/null
  fi
  arle data from-eval "$out/teacher" -o "$out/teacher-rows.jsonl"
  echo $(( $(date +%s) - start )) > "$out/teacher.seconds"
  train "$out/sft" --recipe "$here/sft.yaml" --data "$out/teacher-rows.jsonl" "${sft_small[@]}"
fi

python3 - "$out" "$seed" <<'PY'
import json, sys
from pathlib import Path
out, seed = Path(sys.argv[1]), sys.argv[2]
def seconds(name):
    p = out / f"{name}.seconds"
    return int(p.read_text()) if p.exists() else None
def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
rows = []
for name in ("grpo", "rft", "sft"):
    summary = json.loads((out / name / "summary.json").read_text())
    before, after = summary["before"]["accuracy"], summary["after"]["accuracy"]
    wall = seconds(name)
    if name == "sft" and wall is not None and seconds("teacher") is not None:
        wall += seconds("teacher")
    if name == "rft":
        m = lines(out / "rft" / "metrics.jsonl")
        data = f"{sum(r['kept'] for r in m)} of {sum(r['samples'] for r in m)} samples kept, {sum(r['sft_steps'] for r in m)} steps"
    elif name == "sft":
        data = f"{len(lines(out / 'teacher-rows.jsonl'))} teacher rows, {summary['global_step']} steps"
    else:
        data = f"{summary['global_step']} steps"
    rows.append((name, before, after, wall, data))
first = Path(json.loads((out / "grpo" / "summary.json").read_text())["evals"]["step-0"]["dir"])
n_tasks = json.loads((first / "results.json").read_text())["n_tasks"]
print(f"one-digit sums, SmolLM2-135M-Instruct + LoRA, seed {seed}; held-out: test split, {n_tasks} tasks, greedy")
print(f"{'method':<6} {'before':>7} {'after':>7} {'delta':>7} {'wall':>9}  trained on")
for name, before, after, wall, data in rows:
    w = "-" if wall is None else f"{wall // 60}m{wall % 60:02d}s"
    print(f"{name:<6} {before:>7.3f} {after:>7.3f} {after - before:>+7.3f} {w:>9}  {data}")
PY
