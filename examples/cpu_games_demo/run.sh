#!/usr/bin/env bash
# GRPO on a text game on a CPU, measured: SmolLM2-135M-Instruct on TextArena's GuessTheNumber.
#
#   examples/cpu_games_demo/run.sh [RUN_DIR] [SEED]
#
# `arle train guess_the_number` (recipe.yaml): 10 GRPO + LoRA steps on training games (seeds
# 0-1999), with held-out games (test seeds 1000-1049, greedy) before and after; prints the
# win rate, the share of games lost to an invalid move and the moves per game, before and
# after, and the wall time. Needs the games extra: pip install 'arle[games]'. Offline.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
run="${1:-runs/cpu-games-demo}"
seed="${2:-1234}"
start=$(date +%s)
resume=(); [[ -f "$run/meta.json" ]] && resume=(--resume)

arle train guess_the_number --recipe "$here/recipe.yaml" --seed "$seed" --output "$run" "${resume[@]}"

python3 - "$run" "$(( $(date +%s) - start ))" <<'PY'
import json, sys
from pathlib import Path
run, seconds = Path(sys.argv[1]), int(sys.argv[2])
summary = json.loads((run / "summary.json").read_text())
for name in ("before", "after"):
    label = summary[name]["label"]
    results = json.loads((Path(summary["evals"][label]["dir"]) / "results.json").read_text())
    games = results["games"]
    print(f"{name:>6} ({label}): won {results['metrics']['accuracy']['value']:.3f} of "
          f"{games['games']} games, lost to an invalid move {games['invalid_move_rate']:.3f}, "
          f"{games['turns_per_game']:.2f} moves a game")
print(f"wall time: {seconds // 60} min {seconds % 60} s")
PY
