#!/usr/bin/env bash
# The runs of one study: every system x seed, each a sweep of one run into SWEEP, two at a time
# (one torch thread each, niced), seed by seed, from a checkout of the study's commit.
#
#   bash scripts/study_runs.sh NAME COMMIT "SEEDS" "OVERRIDES" "SYSTEM" ["SYSTEM" ...]
#   bash scripts/study_runs.sh encodings_2026 COMMIT "0 1 2" "experiment=compare" "pe=rope" ...
#
# The same command starts and resumes: it makes the checkout (a git worktree of COMMIT) when it
# is missing, restores the archived runs (docs/study/runs/NAME.tar.xz) that SWEEP lacks, and
# runs every run: a finished one answers "nothing to do", an interrupted one goes on from its
# last checkpoint. Archive what finished with `python scripts/archive_runs.py save SWEEP
# docs/study/runs/NAME.tar.xz`.
#
# Settings (environment): CHECKOUT (default outputs/study_COMMIT), PY (default .venv/bin/python
# of this checkout), SWEEP (default outputs/sweeps/NAME of this checkout), JOBS (2),
# POSENC_DATA (default: the data folder the runs so far recorded, else the fetched local mix,
# posenc-data fetch).
set -euo pipefail
if [ "$#" -lt 5 ]; then
  echo "usage: bash scripts/study_runs.sh NAME COMMIT \"SEEDS\" \"OVERRIDES\" \"SYSTEM\" ..." >&2
  exit 2
fi
NAME=$1 COMMIT=$2 SEEDS=$3 OVERRIDES=$4
shift 4
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CHECKOUT="${CHECKOUT:-$ROOT/outputs/study_$COMMIT}"
PY="${PY:-$ROOT/.venv/bin/python}"
SWEEP="${SWEEP:-$ROOT/outputs/sweeps/$NAME}"
ARCHIVE="$ROOT/docs/study/runs/$NAME.tar.xz"
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
try:
    print(next((d for d in recorded if d and Path(d).is_dir()), None) or local_data_dir())
except ValueError as err:  # no data and no network: one line
    sys.exit(f"study_runs: {err}")
PY
)"
fi
export POSENC_DATA HF_HUB_OFFLINE=1 PYTHONPATH="$CHECKOUT/src"
for seed in $SEEDS; do
  for system in "$@"; do
    echo "$system seed=$seed"
  done
done | xargs -P "${JOBS:-2}" -I{} sh -c "cd '$CHECKOUT' && nice -n 19 '$PY' train.py -m \
  $OVERRIDES name=$NAME {} threads=1 trainer.progress=false logger.csv=true \
  'hydra.sweep.dir=$SWEEP' \
  > \"$SWEEP/driver.\$(echo '{}' | tr ' =.' '_-_').log\" 2>&1 || echo 'failed: {}'"
