#!/usr/bin/env bash
# Learning rates x models, one point per GPU at a time: a job-slot queue where a GPU takes the next point as
# soon as its point ends. GPUs: CUDA_VISIBLE_DEVICES, else nvidia-smi; NUM_GPUS=n overrides the count.
# JOBS=n runs n points at once instead (spread over the GPUs; on a machine without GPU, n CPU processes:
# default 1). Safe to re-run like lr_x_model.sh. Each point's output: $SWEEP_ROOT/logs/<point>.log.
#   [SWEEP_ROOT=dir] [NUM_GPUS=n] [JOBS=n] [LRS=...] [MODELS=...] [CFG=file] tools/sweeps/per_gpu.sh [KEY VALUE ...]
# LRS and MODELS are lists taken as typed, never glob-expanded (MODELS='resnet*' is the model name resnet*):
# space-separated, or one item per line when an item holds spaces (MODELS=$'a b\nc'). A KEY VALUE argument
# with spaces is passed whole when quoted: ... AUG.SCALE '(0.5, 1.0)'. A / in a point's name becomes _.
# Extra arguments must not set TRAIN.LR, MODEL.NAME or OUTPUT_DIR (give LRS, MODELS, SWEEP_ROOT).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

per_gpu_points() {  # [KEY VALUE ...]: every LR x model (the points of lr_x_model.sh, in their folders)
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

sweep_points per_gpu "$@"
gpu_list
sweep_init per_gpu "${JOBS:-$((${#GPUS[@]} ? ${#GPUS[@]} : 1))}" "$@"
for i in "${!POINTS[@]}"; do
  point_done "${POINTS[i]}" && continue
  slot_wait
  device=()
  ((${#GPUS[@]} == 0)) || device=("CUDA_VISIBLE_DEVICES=${GPUS[SLOT % ${#GPUS[@]}]}")
  point_cmd "$i" "$@"
  slot_run "${POINTS[i]}" env "${device[@]}" "${CMD[@]}"
done
sweep_end
