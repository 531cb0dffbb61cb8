#!/usr/bin/env bash
# The study of docs/RESULTS.md on a 2-core CPU: `compare` (the issue's eight encodings, seeds
# 0, 1, 2), `compare_long` (the seed report's four encodings, 1500 steps, seeds 0, 1) then
# `extrapolation`, then `encoder_forms` (ALiBi's and KERPLE's encoder forms on the local data, 600
# steps) and `encoder_forms_toy` (the same on the toy reversal task, seeds 0-2), two
# single-threaded jobs at a time. Re-running skips finished runs and resumes unfinished ones.
# Then: scripts/report.py on each sweep, scripts/update_results.py.
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
$PY train.py -m experiment=compare name=encoder_forms pe=alibi,kerple \
  pe.encoder_bias=symmetric,asymmetric,split trainer.max_steps=600 eval.max_sentences=1000 \
  seed=0 "${common[@]}"
$PY train.py -m experiment=compare name=encoder_forms pe=alibi,kerple \
  pe.encoder_bias=symmetric,split trainer.max_steps=600 eval.max_sentences=1000 seed=1 \
  "${common[@]}"
$PY train.py -m experiment=smoke name=encoder_forms_toy pe=alibi,kerple \
  pe.encoder_bias=symmetric,asymmetric,split trainer.max_steps=600 trainer.valid_every=100 \
  trainer.warmup_steps=60 model.d_model=64 model.d_ff=256 eval.max_sentences=null seed=0,1,2 \
  threads=1
