#!/usr/bin/env bash
# The study of docs/RESULTS.md on a 2-core CPU: `compare` (the issue's eight encodings, seeds
# 0, 1, 2), `compare_long` (the seed report's four encodings, 1500 steps, seeds 0, 1) then
# `extrapolation`, two single-threaded jobs at a time. Re-running skips finished
# runs and resumes unfinished ones. Then: scripts/report.py on each sweep, scripts/update_results.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PES=${PES:-nonepe,sinpe,learned,rpe,t5,rope,alibi,fox}
SEEDS=${SEEDS:-0,1,2}
common=(threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=2 trainer.progress=false)
$PY train.py -m experiment=compare "pe=$PES" "seed=$SEEDS" "${common[@]}"
$PY train.py -m experiment=compare name=compare_long trainer.max_steps=1500 \
  "pe=${LONG_PES:-nonepe,sinpe,rpe,rope}" "seed=${LONG_SEEDS:-0,1}" "${common[@]}"
$PY train.py -m experiment=extrapolation "pe=$PES" "${common[@]}"
