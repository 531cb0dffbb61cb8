#!/usr/bin/env bash
# The runs of docs/study/plans/depth_recipe.yaml: 1+1 layers with the three-layer recipe, five
# systems x seeds 0-4, each a sweep of one run into SWEEP, two at a time (one torch thread each,
# niced), seed by seed, from a checkout of the three-layer runs' commit (COMMIT).
#
#   bash scripts/depth_recipe_runs.sh
#
# The same command starts and resumes: it makes the checkout (a git worktree) when it is
# missing, restores the archived runs (docs/study/runs/scaling_1layer.tar.xz) that SWEEP lacks,
# and runs every run: a finished one answers "nothing to do", an interrupted one goes on from
# its last checkpoint. Archive what finished with `python scripts/archive_runs.py save SWEEP
# docs/study/runs/scaling_1layer.tar.xz`.
#
# Settings (environment): CHECKOUT (default outputs/study_31da867), PY (default .venv/bin/python
# of this checkout), SWEEP (default outputs/sweeps/scaling_1layer of this checkout), JOBS (2),
# POSENC_DATA (default: the data folder the runs so far recorded, else the fetched local mix,
# posenc-data fetch).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
COMMIT=31da867
CHECKOUT="${CHECKOUT:-$ROOT/outputs/study_$COMMIT}"
PY="${PY:-$ROOT/.venv/bin/python}"
SWEEP="${SWEEP:-$ROOT/outputs/sweeps/scaling_1layer}"
ARCHIVE="$ROOT/docs/study/runs/scaling_1layer.tar.xz"
if [ ! -d "$CHECKOUT/src" ]; then
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add --detach "$CHECKOUT" "$COMMIT"
fi
CHECKOUT="$(cd "$CHECKOUT" && pwd)"
mkdir -p "$SWEEP"
if [ -f "$ARCHIVE" ]; then
  PYTHONPATH="$ROOT/src" "$PY" "$ROOT/scripts/archive_runs.py" restore "$ARCHIVE" "$SWEEP"
fi
if [ -z "${POSENC_DATA:-}" ]; then  # the folder the runs so far read (a run resumes only on
  # the data it trained on), else the fetched local mix
  POSENC_DATA="$(PYTHONPATH="$ROOT/src" "$PY" - "$SWEEP" <<'PY'
import sys
from pathlib import Path

from posenc.data.fetch import local_data_dir
from posenc.runtime.untrusted import read_config

recorded = [read_config(p).data.get("dir") for p in sorted(Path(sys.argv[1]).glob("*/config.yaml"))]
print(next((d for d in recorded if d and Path(d).is_dir()), None) or local_data_dir())
PY
)"
fi
export POSENC_DATA HF_HUB_OFFLINE=1 PYTHONPATH="$CHECKOUT/src"
for seed in 0 1 2 3 4; do
  for system in "pe=nonepe" "pe=sinpe" "pe=rpe" "pe=rope" "pe=rope pe.cross_attention=rotated"; do
    echo "$system seed=$seed"
  done
done | xargs -P "${JOBS:-2}" -I{} sh -c "cd '$CHECKOUT' && nice -n 19 '$PY' train.py -m \
  experiment=scaling name=scaling_1layer model.encoder_layers=1 model.decoder_layers=1 {} \
  threads=1 trainer.progress=false logger.csv=true \
  'hydra.sweep.dir=$SWEEP' \
  > \"$SWEEP/driver.\$(echo '{}' | tr ' =.' '_-_').log\" 2>&1 || echo 'failed: {}'"
