#!/usr/bin/env bash
# Learning rates x models, one point after another; safe to re-run: done points are skipped, interrupted
# ones resume, missing ones start. Extra arguments are KEY VALUE overrides passed to every point.
#   [SWEEP_ROOT=dir] [LRS="0.008 0.002"] [MODELS="test_resnet resnet10t"] [CFG=file] [PYTHON=python] \
#     tools/sweeps/lr_x_model.sh [KEY VALUE ...]
# LRS and MODELS are lists taken as typed, never glob-expanded (MODELS='resnet*' is the model name resnet*):
# space-separated, or one item per line when an item holds spaces (MODELS=$'a b\nc'). A KEY VALUE argument
# with spaces is passed whole when quoted: ... AUG.SCALE '(0.5, 1.0)'. A / in a point's name becomes _.
# Extra arguments must not set TRAIN.LR, MODEL.NAME or OUTPUT_DIR (give LRS, MODELS, SWEEP_ROOT).
# The same points as one SLURM job array: tools/sweeps/slurm.sh lr_x_model [KEY VALUE ...] (docs/SWEEPS.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

lr_x_model_points() {  # [KEY VALUE ...]: every LR x model; the one list, also read by slurm.sh
  local lr model lrs models
  sweep_list LRS "0.008 0.004 0.002"  # around the default CFG's AdamW LR (0.004)
  lrs=("${ITEMS[@]}")
  sweep_list MODELS "test_resnet resnet10t"
  models=("${ITEMS[@]}")
  check_extra TRAIN.LR=LRS MODEL.NAME=MODELS -- "$@"
  for lr in "${lrs[@]}"; do
    for model in "${models[@]}"; do
      point "lr${lr}_${model}" TRAIN.LR "$lr" MODEL.NAME "$model"
    done
  done
}

[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0  # sourced (by slurm.sh): the points only

sweep_points lr_x_model "$@"
sweep_init lr_x_model 1 "$@"
for i in "${!POINTS[@]}"; do
  point_done "${POINTS[i]}" && continue
  slot_wait
  point_cmd "$i" "$@"
  slot_run "${POINTS[i]}" "${CMD[@]}"
done
sweep_end
