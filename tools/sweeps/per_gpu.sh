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

# the points of lr_x_model.sh (sourced, it only defines them), in their folders
source "$(dirname "${BASH_SOURCE[0]}")/lr_x_model.sh"
per_gpu_points() { lr_x_model_points "$@"; }  # [KEY VALUE ...]: every LR x model

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
