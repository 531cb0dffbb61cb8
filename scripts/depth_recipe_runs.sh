#!/usr/bin/env bash
# The runs of docs/study/plans/depth_recipe.yaml: 1+1 layers with the three-layer recipe, five
# systems x seeds 0-4, from a checkout of the three-layer runs' commit (31da867), into
# outputs/sweeps/scaling_1layer, archived as docs/study/runs/scaling_1layer.tar.xz
# (scripts/study_runs.sh: the same command starts and resumes; its settings apply).
#
#   bash scripts/depth_recipe_runs.sh
exec bash "$(dirname "$0")/study_runs.sh" scaling_1layer 31da867 "0 1 2 3 4" \
  "experiment=scaling model.encoder_layers=1 model.decoder_layers=1" \
  "pe=nonepe" "pe=sinpe" "pe=rpe" "pe=rope" "pe=rope pe.cross_attention=rotated"
