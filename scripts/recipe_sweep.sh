#!/usr/bin/env bash
# The CPU recipe sweep (docs/METHODS.md §3): round 1 changes every setting of experiment=recipe
# one at a time, rounds 2 and 3 combine the winners, the best two then run to 6 minutes. Two
# lanes of one thread each (this machine has two cores). Re-running skips finished runs.
#   bash scripts/recipe_sweep.sh && python scripts/recipe_table.py outputs/sweeps/recipe \
#     --minutes 0.5,1,1.5,2,2.5,6
set -euo pipefail
PY=${PY:-python}
run() { HF_HUB_OFFLINE=1 $PY train.py -m experiment=recipe "$@" > /dev/null; }
lane_a() {
  run seed=0
  run model.d_model=64 model.d_ff=256
  run model.d_model=256 model.d_ff=1024
  run model.encoder_layers=1 model.decoder_layers=1
  run model.encoder_layers=3 model.decoder_layers=3
  run trainer.lr=5e-4
  run trainer.lr=2e-3
}
lane_b() {
  run seed=1
  run trainer.lr=3e-3
  run trainer.warmup_steps=30
  run trainer.warmup_steps=300
  run model.dropout=0.0
  run trainer.max_tokens=1024
  run trainer.max_tokens=4096
}
lane_a & lane_b & wait
# Round 2: the winners of round 1 combined (lr 2e-3/3e-3, 1024-token batches, no dropout,
# 1+1 layers, short warmup).
COMBINED=(trainer.max_tokens=1024 model.dropout=0.0)
lane_c() {
  run trainer.lr=3e-3 "${COMBINED[@]}"
  run trainer.lr=3e-3 "${COMBINED[@]}" model.encoder_layers=1 model.decoder_layers=1
}
lane_d() {
  run trainer.lr=2e-3 "${COMBINED[@]}"
  run trainer.lr=3e-3 "${COMBINED[@]}" trainer.warmup_steps=30
}
lane_c & lane_d & wait
# Round 3: further along the two directions that helped most (smaller batches, higher lr).
lane_e() { run trainer.lr=3e-3 model.dropout=0.0 trainer.max_tokens=512; }
lane_f() { run trainer.lr=5e-3 "${COMBINED[@]}"; }
lane_e & lane_f & wait
# The two best combinations continued to 6 minutes (trainer.max_time is not part of a run's
# name, so the same runs go on; the inverse-sqrt schedule does not depend on the budget).
lane_g() {
  run trainer.lr=3e-3 "${COMBINED[@]}" model.encoder_layers=1 model.decoder_layers=1 \
    trainer.max_time=360
}
lane_h() { run trainer.lr=3e-3 "${COMBINED[@]}" trainer.max_time=360; }
lane_g & lane_h & wait
