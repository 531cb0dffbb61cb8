#!/usr/bin/env bash
# The one command to run on the GPU machine, from the repository root, with the
# git-ignored gpu_bundle/ carried along (bash scripts/gpu/build_bundle.sh builds it here):
#
#   bash scripts/gpu/run.sh STEP [ARGS...]
#
# It installs the bundle's wheels with pip --no-index --no-deps into SITE (a folder put first on
# PYTHONPATH: the image's torch and other packages stay as they are; a venv made from
# /opt/torch/.venv would not see them), takes posenc from src/ (PYTHONPATH), reads the data from
# gpu_bundle/data (POSENC_DATA) and writes at most a few files straight under $OUT (the device
# tool brings back 8 files, none deeper than two folders). Steps, ARGS going to the step's command:
#   test         pytest -q -n 8 on the suite (on a GPU every failure, each test stopped after
#                300 s; on the CPU -x); junit XML and the log to $OUT
#   bench        scripts/bench.py at model=base (L=128, 16,384 tokens a batch: its model-FLOP
#                utilisation), scripts/profile_step.py of nonepe, rpe and rope there, then
#                scripts/bench.py at model=small (L=64 and 128); JSON and markdown to $OUT
#   forms        scripts/gpu/step_forms.py at model=base (L=128, 16,384 tokens): the training step
#                eager, with bf16 weights, compiled and compiled into CUDA graphs, timed
#                interleaved and profiled; nonepe, rpe and rope eager beside them; JSON and
#                markdown to $OUT
#   seed_report  train.py -m experiment=seed_report, pe=SEED_REPORT_PES (scripts/study_sets.sh),
#                all at once (joblib), then scripts/report.py; the sweep without checkpoints as
#                seed_report.tar.gz and its report as seed_report.md
#   scaling      train.py -m experiment=scaling (six encodings) and each of SCALING_VARIANTS, all
#                at once, then the report: scaling.tar.gz and scaling.md
#   depth        train.py -m experiment=depth (model=base, five encodings, DEPTH_SEEDS) and each of
#                DEPTH_VARIANTS, all at once, then the report: depth.tar.gz and depth.md
#   study        seed_report and scaling at once: the study's GPU runs in one call of the device
#                tool (15 minutes of device time a loan)
#   smoke        a tiny train + decode + score (experiment=smoke); its metrics to $OUT
# Settings (environment): PYTHON (default /opt/torch/.venv/bin/python3, else python3); DEVICE
# (default cuda when torch sees a GPU, else cpu: then every step runs with device=cpu on tiny
# budgets, which is how tests/test_gpu_bundle.py checks this script); OUT (default
# outputs/gpu); WORK (run directories, default a new folder in /tmp); SITE (default
# /tmp/posenc_site); POSENC_CACHE (default /tmp/posenc_cache); TEST_WORKERS; SEED_MAX_TIME and
# SCALING_MAX_TIME (training seconds per seed_report or scaling run, default 300: preparing the
# corpus, decoding and the report take the rest of the ten minutes; a second call with the same
# WORK on the still-warm machine resumes the runs up to a larger value); SCALING_SEED (default
# 0); DEPTH_MAX_TIME (training seconds of each depth run, default 300) and DEPTH_SEEDS (default
# 0, a sweep's list: 0,1); DEADLINE (seconds from the start by which every step has ended, default 580 on a GPU, where
# a call to the GPU machine stops at 600; 3600 on the CPU). On a GPU each run gets the machine's
# cores divided by the runs the step starts at once as torch threads (`threads`, not part of a
# run's name).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
STEP="${1:-}"
case "$STEP" in
  test | bench | forms | seed_report | scaling | depth | study | smoke) shift ;;
  *)
    echo "usage: bash scripts/gpu/run.sh test|bench|forms|seed_report|scaling|depth|study|smoke" \
      "[ARGS...]" >&2
    exit 2
    ;;
esac

if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ -x /opt/torch/.venv/bin/python3 ] && PYTHON=/opt/torch/.venv/bin/python3
fi
case "$PYTHON" in  # absolute: seed_report runs from WORK
  */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;;
esac
OUT="${OUT:-$ROOT/outputs/gpu}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="${WORK:-$(mktemp -d /tmp/posenc_gpu.XXXXXX)}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
SITE="${SITE:-/tmp/posenc_site}"
LOG="$OUT/$STEP.log"

# --- install: the bundle's wheels this python can use, into SITE, offline --------------------
WHEELS="$ROOT/gpu_bundle/wheels"
if [ -d "$WHEELS" ]; then
  selected="$("$PYTHON" scripts/gpu/bundle.py select "$WHEELS")"
  mapfile -t wheels <<<"$selected"
  if [ -n "$selected" ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --disable-pip-version-check --upgrade --target "$SITE" "${wheels[@]}"
  fi
elif ! "$PYTHON" -c "import hydra, omegaconf" 2>/dev/null; then
  echo "no gpu_bundle/wheels and $PYTHON lacks hydra: run 'make gpu-bundle' here and carry" \
    "gpu_bundle" >&2
  exit 1
else
  echo "no gpu_bundle/wheels: using the packages of $PYTHON" >&2
fi
export PYTHONPATH="$SITE:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$ROOT/gpu_bundle/data" ]; then
  export POSENC_DATA="${POSENC_DATA:-$ROOT/gpu_bundle/data}"
fi
export POSENC_CACHE="${POSENC_CACHE:-/tmp/posenc_cache}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

if [ -z "${DEVICE:-}" ]; then
  DEVICE=cpu
  "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" && DEVICE=cuda
fi
GPU=0
[ "$DEVICE" = cpu ] || GPU=1
DEADLINE="${DEADLINE:-$([ $GPU = 1 ] && echo 580 || echo 3600)}"

{
  echo "step=$STEP device=$DEVICE python=$PYTHON out=$OUT work=$WORK"
  echo "POSENC_DATA=${POSENC_DATA:-} POSENC_CACHE=$POSENC_CACHE SITE=$SITE"
  "$PYTHON" - <<'PY'
import importlib.metadata as md
import platform

import torch

gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"python {platform.python_version()}, torch {torch.__version__}, GPU {gpu}")
for name in ("hydra-core", "omegaconf", "datasets", "bert-score", "transformers", "tokenizers",
             "sacrebleu", "numpy", "pyarrow", "huggingface-hub", "fsspec", "pytest-xdist"):
    try:
        print(f"  {name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"  {name} absent")
PY
} 2>&1 | tee "$OUT/env.txt"

step() {  # the command, its output to the console and to $LOG, stopped (SIGTERM) in time to
  # leave RESERVE seconds before DEADLINE
  local left=$((DEADLINE - SECONDS - ${RESERVE:-0}))
  if [ "$left" -le 0 ]; then
    echo "no time left for: $*" | tee -a "$LOG"
    return 124
  fi
  # its own process group, ended whole afterwards: sweep workers that outlive an interrupted
  # sweep would otherwise hold the output open until they time out
  local rc=0
  setsid timeout --signal=TERM --kill-after=15 "$left" "$@" > >(tee -a "$LOG") 2>&1 &
  local pid=$!
  wait "$pid" || rc=$?
  for _ in 1 2 3 4 5 6 7 8 9 10; do  # stopped ones get 10 s to save their checkpoints
    kill -0 -- "-$pid" 2>/dev/null || break
    sleep 1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  return "$rc"
}

source scripts/study_sets.sh  # SEED_REPORT_PES, SCALING_VARIANTS, DEPTH_VARIANTS

# torch threads per run on the GPU: the machine's cores shared by every run the step starts at
# once. joblib would give each sweep's jobs cpu_count / n_jobs threads, but a step runs several
# sweeps at once (scaling's variants are sweeps of one job each), so they ask for more threads
# than there are cores (docs/RESULTS.md, finding 7, says what that cost).
IFS=, read -ra seed_report_pes <<<"$SEED_REPORT_PES"
scaling_encodings=6  # configs/experiment/scaling.yaml's pe list, one job each
scaling_runs=$((scaling_encodings + ${#SCALING_VARIANTS[@]}))
IFS=, read -ra depth_seeds <<<"${DEPTH_SEEDS:-0}"
depth_encodings=$((5 * ${#depth_seeds[@]}))  # configs/experiment/depth.yaml's pe list, per seed
depth_runs=$((depth_encodings + ${#DEPTH_VARIANTS[@]} * ${#depth_seeds[@]}))
case "$STEP" in
  seed_report) runs_at_once=${#seed_report_pes[@]} ;;
  scaling) runs_at_once=$scaling_runs ;;
  depth) runs_at_once=$depth_runs ;;
  *) runs_at_once=$((${#seed_report_pes[@]} + scaling_runs)) ;;
esac
run_threads=$(($(nproc) / runs_at_once))
[ "$run_threads" -ge 1 ] || run_threads=1

tiny=(trainer.max_steps=20 trainer.valid_every=10 trainer.warmup_steps=5 data.train_size=2000
  eval.max_sentences=20 eval.bertscore.model=null threads=1)  # the CPU's check of the steps

prepare() {  # prepare EXPERIMENT OVERRIDES...: the corpus and tokenizer the runs will share,
  # once, before the jobs start (the data and tokenizer settings among OVERRIDES)
  local args=("experiment=$1") o
  shift
  for o in "$@"; do
    case "$o" in data.* | tokenizer.* | +data.* | +tokenizer.*) args+=("$o") ;; esac
  done
  step "$PYTHON" -m posenc.data.prepare "${args[@]}"
}

sweep_out() {  # sweep_out NAME: the report, then the sweep without checkpoints as NAME.tar.gz
  RESERVE=-10 step "$PYTHON" "$ROOT/scripts/report.py" "outputs/sweeps/$1" ||
    echo "the report ended with status $?" | tee -a "$LOG"
  tar -czf "$OUT/$1.tar.gz" --exclude='*.pt' --exclude=checkpoints -C outputs/sweeps "$1"
  cp "outputs/sweeps/$1/report/report.md" "$OUT/$1.md" 2>/dev/null || true
}

seed_report() {  # the seed report's setting, every encoding at once; its own log and outputs
  local LOG="$OUT/seed_report.log" pes="$SEED_REPORT_PES" budget overrides
  if [ $GPU = 1 ]; then
    budget=("trainer.max_time=${SEED_MAX_TIME:-300}" "hydra.launcher.n_jobs=${#seed_report_pes[@]}"
      "threads=$run_threads")
  else
    pes=nonepe,rope
    budget=("${tiny[@]}" hydra.launcher.n_jobs=2)
  fi
  overrides=(experiment=seed_report "pe=$pes" hydra/launcher=parallel "device=$DEVICE"
    trainer.progress=false logger.csv=true "${budget[@]}" "$@")
  cd "$WORK"
  prepare seed_report "${overrides[@]}"
  RESERVE=60 step "$PYTHON" "$ROOT/train.py" -m "${overrides[@]}" ||
    echo "the sweep ended with status $?" | tee -a "$LOG"
  sweep_out seed_report
}

at_once() {  # at_once NAME ENCODING_JOBS VARIANTS_ARRAY OVERRIDES...: train.py -m
  # experiment=NAME (its pe list, ENCODING_JOBS jobs at once) and each variant of the array named
  # VARIANTS_ARRAY, every run at once, then the report; its own log and outputs. On the CPU: two
  # encodings and one variant on tiny budgets
  local name=$1 jobs=$2 variants_name=$3
  shift 3
  local -n variants=$variants_name
  local LOG="$OUT/$name.log" shared variant pids=()
  shared=(experiment="$name" hydra/launcher=parallel "device=$DEVICE" trainer.progress=false
    logger.csv=true "$@")
  cd "$WORK"
  prepare "$name" "${shared[@]}"
  if [ $GPU = 1 ]; then
    RESERVE=60 step "$PYTHON" "$ROOT/train.py" -m "${shared[@]}" "hydra.launcher.n_jobs=$jobs" &
  else
    RESERVE=60 step "$PYTHON" "$ROOT/train.py" -m "${shared[@]}" pe=nonepe,rope &
  fi
  pids+=($!)
  for variant in "${variants[@]}"; do
    # shellcheck disable=SC2086  # a variant is several overrides
    RESERVE=60 step "$PYTHON" "$ROOT/train.py" -m $variant "${shared[@]}" &
    pids+=($!)
    [ $GPU = 1 ] || break  # the CPU's check: one variant
  done
  wait "${pids[@]}" || echo "a $name sweep ended with status $?" | tee -a "$LOG"
  sweep_out "$name"
}

scaling() {  # experiment=scaling and SCALING_VARIANTS, every run at once
  local budget
  if [ $GPU = 1 ]; then
    budget=("trainer.max_time=${SCALING_MAX_TIME:-300}" "threads=$run_threads")
  else
    budget=("${tiny[@]}" trainer.max_steps=12 trainer.valid_every=6)
  fi
  at_once scaling "$scaling_encodings" SCALING_VARIANTS "seed=${SCALING_SEED:-0}" "${budget[@]}" "$@"
}

depth() {  # experiment=depth (model=base) and DEPTH_VARIANTS, every run at once
  local budget
  if [ $GPU = 1 ]; then
    budget=("trainer.max_time=${DEPTH_MAX_TIME:-300}" "threads=$run_threads")
  else
    budget=("${tiny[@]}" trainer.max_steps=12 trainer.valid_every=6 model=tiny)
  fi
  at_once depth "$depth_encodings" DEPTH_VARIANTS "seed=${DEPTH_SEEDS:-0}" "${budget[@]}" "$@"
}

case "$STEP" in
  test)
    args=(-q -n "${TEST_WORKERS:-$([ $GPU = 1 ] && echo 8 || echo 2)}" -p no:cacheprovider)
    if [ $GPU = 1 ]; then  # one call to the GPU machine: every failure, none hanging
      ! "$PYTHON" -c "import pytest_timeout" 2>/dev/null || args+=(--timeout=300)
    else
      args+=(-x)
    fi
    if [ ! -d docs ]; then  # set aside for the call's size limit (make gpu-aside)
      echo "docs/ is absent: tests/test_guide.py, which checks the documents, is left out" |
        tee -a "$LOG"
      args+=(--ignore=tests/test_guide.py)
    fi
    if ! "$PYTHON" -c "import mlflow" 2>/dev/null; then  # mlflow-skinny is not carried
      args+=(--deselect tests/test_run_control.py::test_mlflow_gets_the_settings_and_every_scalar_in_a_local_store)
    fi
    step "$PYTHON" -m pytest "${args[@]}" --junitxml="$OUT/junit.xml" "$@"
    ;;
  bench)  # base, then the profile of its step, then small: the first two fit one call (measured
    # on an H100, 2026-11-27: base's table took 200 s, small at two lengths and five repeats over 150 s)
    if [ $GPU = 1 ]; then
      base=(--model base --lengths 128 --tokens 16384 --repeats 3)
      profile=(--model base --tokens 16384 --length 128 --pe nonepe,rpe,rope)
      small=(--model small --lengths 64,128 --repeats 3)
    else
      base=(--model tiny --quick --pe nonepe,rope --no-memory --threads 1)
      profile=(--model tiny --tokens 256 --length 16 --steps 1 --pe nonepe)
      small=()
    fi
    bench() {  # bench ARGS...: scripts/bench.py into $OUT/bench_MODEL.json
      step "$PYTHON" scripts/bench.py --device "$DEVICE" "$@" --out "$OUT/bench_$2.json" ||
        echo "bench ended with status $?" | tee -a "$LOG"
    }
    bench "${base[@]}" "$@"
    step "$PYTHON" scripts/profile_step.py --device "$DEVICE" "${profile[@]}" \
      --out "$OUT/profile.md" || echo "the profile ended with status $?" | tee -a "$LOG"
    [ ${#small[@]} = 0 ] || bench "${small[@]}" "$@"
    ;;
  forms)  # the forms of one training step, then their profiles, in one process
    if [ $GPU = 1 ]; then
      forms=(--model base --tokens 16384 --length 128)
    else
      forms=(--model tiny --tokens 256 --length 16 --pe nonepe,rope --forms eager,compiled
        --warmup 1 --rounds 2 --steps 1)
    fi
    step "$PYTHON" scripts/gpu/step_forms.py --device "$DEVICE" "${forms[@]}" "$@" --out "$OUT" ||
      echo "the forms ended with status $?" | tee -a "$LOG"
    ;;
  seed_report) seed_report "$@" ;;
  scaling) scaling "$@" ;;
  depth) depth "$@" ;;
  study)  # both at once, as one call to the GPU machine (a loan is 15 minutes of it)
    seed_report "$@" &
    first=$!
    scaling "$@" || echo "scaling ended with status $?" | tee -a "$LOG"
    wait "$first" || echo "seed_report ended with status $?" | tee -a "$LOG"
    ;;
  smoke)
    run="$WORK/smoke"
    step "$PYTHON" train.py experiment=smoke "device=$DEVICE" eval.max_sentences=12 \
      "hydra.run.dir=$run" "$@"
    cp "$run/metrics.json" "$OUT/smoke_metrics.json"
    cp "$run/train_summary.json" "$OUT/smoke_train_summary.json"
    ;;
esac
echo "done: $STEP on $DEVICE; results in $OUT" | tee -a "$LOG"
