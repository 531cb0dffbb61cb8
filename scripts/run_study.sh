#!/usr/bin/env bash
# The study of docs/RESULTS.md on a 2-core CPU: `compare` (every configs/pe/*.yaml, seeds 0, 1,
# 2), `compare_long` (its preset's encodings, 1500 steps, seeds 0, 1) then `extrapolation`
# (every encoding), then `encoder_forms` (the encoder forms of every encoding that has them, an
# `encoder_bias` setting in configs/pe, on the local data, 600 steps) and `encoder_forms_toy`
# (the same on the toy reversal task, seeds 0-2), two single-threaded jobs at a time.
# PES (compare, extrapolation), LONG_PES and FORMS_PES replace those lists: PES=a,b,c.
# Re-running skips finished runs and resumes unfinished ones.
# Then: scripts/report.py on each sweep, scripts/update_results.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SEEDS=${SEEDS:-0,1,2}
FORMS_PES=${FORMS_PES:-$($PY -c '
from pathlib import Path
from omegaconf import OmegaConf
configs = sorted(Path("configs/pe").glob("*.yaml"))
print(",".join(p.stem for p in configs if "encoder_bias" in OmegaConf.load(p)))')}
common=(threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=2 trainer.progress=false)
$PY train.py -m experiment=compare ${PES:+"pe=$PES"} "seed=$SEEDS" "${common[@]}"
$PY train.py -m experiment=compare_long ${LONG_PES:+"pe=$LONG_PES"} \
  ${LONG_SEEDS:+"seed=$LONG_SEEDS"} "${common[@]}"
$PY train.py -m experiment=extrapolation ${PES:+"pe=$PES"} "${common[@]}"
$PY train.py -m experiment=compare name=encoder_forms "pe=$FORMS_PES" \
  pe.encoder_bias=symmetric,asymmetric,split trainer.max_steps=600 eval.max_sentences=1000 \
  seed=0 "${common[@]}"
$PY train.py -m experiment=compare name=encoder_forms "pe=$FORMS_PES" \
  pe.encoder_bias=symmetric,split trainer.max_steps=600 eval.max_sentences=1000 seed=1 \
  "${common[@]}"
$PY train.py -m experiment=smoke name=encoder_forms_toy "pe=$FORMS_PES" \
  pe.encoder_bias=symmetric,asymmetric,split trainer.max_steps=600 trainer.valid_every=100 \
  trainer.warmup_steps=60 model.d_model=64 model.d_ff=256 eval.max_sentences=null seed=0,1,2 \
  threads=1
