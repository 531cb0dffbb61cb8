#!/usr/bin/env bash
# The runs of docs/study/plans/depth_recipe.yaml: 1+1 layers with the three-layer recipe, five
# systems x seeds 0-4, each a sweep of one run into SWEEP, two at a time (one torch thread each,
# niced), seed by seed, from a checkout of the three-layer runs' commit. Rerunning it resumes every run where it stopped; a
# finished run answers "nothing to do".
#
#   git worktree add --detach outputs/study_31da867 31da867
#   POSENC_DATA=DATA_FOLDER bash scripts/depth_recipe_runs.sh
#
# Settings (environment): CHECKOUT (default outputs/study_31da867), PY (default .venv/bin/python
# of this checkout), SWEEP (default outputs/sweeps/scaling_1layer of this checkout), JOBS (2).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CHECKOUT="$(cd "${CHECKOUT:-$ROOT/outputs/study_31da867}" && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
SWEEP="${SWEEP:-$ROOT/outputs/sweeps/scaling_1layer}"
mkdir -p "$SWEEP"
export HF_HUB_OFFLINE=1 PYTHONPATH="$CHECKOUT/src"
for seed in 0 1 2 3 4; do
  for system in "pe=nonepe" "pe=sinpe" "pe=rpe" "pe=rope" "pe=rope pe.cross_attention=rotated"; do
    echo "$system seed=$seed"
  done
done | xargs -P "${JOBS:-2}" -I{} sh -c "cd '$CHECKOUT' && nice -n 19 '$PY' train.py -m \
  experiment=scaling name=scaling_1layer model.encoder_layers=1 model.decoder_layers=1 {} \
  threads=1 trainer.progress=false logger.csv=true \
  'hydra.sweep.dir=$SWEEP' \
  > \"$SWEEP/driver.\$(echo '{}' | tr ' =.' '_-_').log\" 2>&1 || echo 'failed: {}'"
