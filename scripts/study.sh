#!/usr/bin/env bash
# The study of docs/RESULTS.md on a 2-core CPU, one stage after another, two single-threaded jobs at a time:
#   compare    every configs/pe/*.yaml (ALiBi and KERPLE in their default forms) and the
#              VARIANTS below (the symmetric encoder forms among them); seed 0 for
#              all, then seed 1, then seed 2 (partial results stay balanced across encodings)
#   beam5      a standalone beam-5 evaluation of every finished compare run
#   extrap     experiment=extrapolation, the same encodings and seeds, EXTRAP_VARIANTS and
#              RoPE's test-time scalings (ROPE_SCALINGS) on each trained rope run
#   bench      a quiet benchmark at compare's shape (model=cpu, 1024-token batches), the
#              variants included, for the report's benchmark-time axis and cost table
#              (nothing else may run meanwhile): outputs/study/
#   seed_report  the seed report's own setting for nonepe, sinpe, rpe, rope and alibi, seed 0
#   scaling    experiment=scaling: the seed report's four and compare's best two at model=small
#              and 8,000 steps (4x compare's), seed 0: does the short budget's ranking hold?
#              Also RoPE with its last layer NoPE (SCALING_VARIANTS): compare's model has one
#              layer a stack, where switching a layer off is nonepe itself; SCALING_SEED=N
#              trains seed N instead (as scripts/gpu/run.sh's)
# Usage: BUDGET=SECONDS STAGES="compare beam5" bash scripts/study.sh
# BUDGET bounds the whole call: then the sweep gets SIGTERM and its jobs end (an unfinished run
# loses at most trainer.valid_every steps, back to its last checkpoint; to stop exactly after a
# step, send SIGTERM to the joblib worker processes themselves). Running it again resumes:
# finished runs return at once, unfinished ones continue from their checkpoint.
# outputs/ may not outlive the machine: every sweep's finished runs are archived in
# $ARCHIVE/<sweep>.tar.xz (default docs/study/runs; scripts/archive_runs.py: at the start, every ARCHIVE_EVERY
# seconds and at the end) and restored from there before the sweep resumes; commit docs/study/runs.
# Then: scripts/report.py on each sweep (docs/RESULTS.md says which), scripts/update_results.py.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
STAGES=${STAGES:-compare extrap seed_report beam5 scaling}
SEEDS=${SEEDS:-0 1 2}
BUDGET=${BUDGET:-36000}
deadline=$(($(date +%s) + BUDGET))
common=(threads=1 hydra/launcher=joblib hydra.launcher.n_jobs=2 trainer.progress=false logger.csv=true)

source scripts/study_sets.sh  # VARIANTS ... SEED_REPORT_PES
ARCHIVE_EVERY=${ARCHIVE_EVERY:-300}
ARCHIVE=${ARCHIVE:-docs/study/runs}  # where the runs are archived (another checkout's, say)
SWEEPS=(compare extrapolation seed_report scaling)

archive() {  # save (or restore) every sweep's finished runs in $ARCHIVE/<sweep>.tar.xz
  local sweep
  for sweep in "${SWEEPS[@]}"; do
    if [ "$1" = save ] && [ -d "outputs/sweeps/$sweep" ]; then
      $PY scripts/archive_runs.py save "outputs/sweeps/$sweep" "$ARCHIVE/$sweep.tar.xz"
    elif [ "$1" = restore ] && [ -f "$ARCHIVE/$sweep.tar.xz" ]; then
      $PY scripts/archive_runs.py restore "$ARCHIVE/$sweep.tar.xz" "outputs/sweeps/$sweep"
    fi
  done
}
archive restore
(while sleep "$ARCHIVE_EVERY"; do archive save; done) &
archiver=$!
trap 'kill $archiver 2>/dev/null; archive save' EXIT

left() { echo $((deadline - $(date +%s))); }
bounded() {  # run "$@" within what is left of the budget; the study ends once it is spent
  local seconds status
  seconds=$(left)
  ((seconds > 60)) || { echo "study: budget spent"; exit 0; }
  timeout --signal=TERM --kill-after=120 "$seconds" "$@"
  status=$?
  ((status == 124 || status == 137 || status == 143)) && { echo "study: budget spent"; exit 0; }
  return 0  # a failed job is in its failed.json; the study goes on
}

side_by_side() {  # side_by_side OVERRIDES... -- VARIANTS...: each variant (one encoding and its
  # options, a multirun of one job) as its own call, two calls at a time so both cores work
  local shared=() variants i pids
  while [ "$1" != "--" ]; do shared+=("$1"); shift; done
  shift
  variants=("$@")
  for ((i = 0; i < ${#variants[@]}; i += 2)); do
    pids=()  # wait for these two only: the archiver runs in the background too
    # shellcheck disable=SC2086  # a variant is several overrides
    bounded $PY train.py -m ${variants[i]} "${shared[@]}" "${common[@]}" &
    pids+=($!)
    if ((i + 1 < ${#variants[@]})); then
      # shellcheck disable=SC2086
      bounded $PY train.py -m ${variants[i + 1]} "${shared[@]}" "${common[@]}" &
      pids+=($!)
    fi
    wait "${pids[@]}"
    (($(left) > 60)) || { echo "study: budget spent"; exit 0; }
  done
}

for stage in $STAGES; do
  case $stage in
    compare)
      for seed in $SEEDS; do
        bounded $PY train.py -m experiment=compare "seed=$seed" "${common[@]}"
        side_by_side experiment=compare "seed=$seed" -- "${VARIANTS[@]}"
      done ;;
    beam5)
      for run in outputs/sweeps/compare/*@*/; do
        [ -f "$run/metrics.json" ] || continue
        bounded $PY -m posenc.evaluation "run_dir=$run" eval.beam_size=5 threads=2 \
          trainer.progress=false
      done ;;
    extrap)
      for seed in $SEEDS; do
        bounded $PY train.py -m experiment=extrapolation "seed=$seed" "${common[@]}"
        side_by_side experiment=extrapolation "seed=$seed" -- "${EXTRAP_VARIANTS[@]}"
        for run in outputs/sweeps/extrapolation/pe=rope,seed="$seed"@*/; do  # RoPE's scalings
          [ -f "$run/metrics.json" ] || continue
          bounded $PY -m posenc.evaluation "run_dir=$run" "$ROPE_SCALINGS" threads=2 \
            trainer.progress=false
        done
      done ;;
    bench)  # the variants too, under the report's names for them
      variant_args=()
      for variant in "${VARIANTS[@]}" "${EXTRAP_VARIANTS[@]}"; do
        variant_args+=(--variant "$variant")
      done
      bounded $PY scripts/bench.py --model cpu --tokens 1024 --lengths 32,64 --repeats 7 \
        --threads 1 "${variant_args[@]}" --out outputs/study/bench_cpu.json ;;
    seed_report)
      bounded $PY train.py -m experiment=seed_report "pe=$SEED_REPORT_PES" seed=0 "${common[@]}" ;;
    scaling)
      bounded $PY train.py -m experiment=scaling "seed=${SCALING_SEED:-0}" "${common[@]}"
      side_by_side experiment=scaling "seed=${SCALING_SEED:-0}" -- "${SCALING_VARIANTS[@]}" ;;
    *) echo "study: unknown stage $stage" >&2; exit 2 ;;
  esac
done
