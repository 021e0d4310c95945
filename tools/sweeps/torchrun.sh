#!/usr/bin/env bash
# Learning rates x models, each point under torchrun with NPROC processes (default: all GPUs; 2 on the CPU).
# With at least twice NPROC GPUs (or JOBS=n), points run side by side on disjoint GPU sets, each with its own
# rendezvous port (a free port picked per point, never one held by another running point of this sweep), so
# concurrent jobs never collide. Safe to re-run like lr_x_model.sh; output: $SWEEP_ROOT/logs/<point>.log
# when points run side by side.
#   [SWEEP_ROOT=dir] [NPROC=n] [NUM_GPUS=n] [JOBS=n] [MAX_RESTARTS=0] [LRS=...] [MODELS=...] [CFG=file] \
#     tools/sweeps/torchrun.sh [KEY VALUE ...]
# LRS and MODELS are lists taken as typed, never glob-expanded (MODELS='resnet*' is the model name resnet*):
# space-separated, or one item per line when an item holds spaces (MODELS=$'a b\nc'). A KEY VALUE argument
# with spaces is passed whole when quoted: ... AUG.SCALE '(0.5, 1.0)'. A / in a point's name becomes _.
# Extra arguments must not set TRAIN.LR, MODEL.NAME or OUTPUT_DIR (give LRS, MODELS, SWEEP_ROOT).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# the points of lr_x_model.sh (sourced, it only defines them), in their folders
source "$(dirname "${BASH_SOURCE[0]}")/lr_x_model.sh"
torchrun_points() { lr_x_model_points "$@"; }  # [KEY VALUE ...]: every LR x model

free_port() {  # a TCP port free now and not given to a running point of this sweep
  local port
  while :; do
    port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')
    [[ " ${SLOT_PORT[*]} " == *" $port "* ]] || break
  done
  echo "$port"
}

slot_devices() {  # the GPUs of slot SLOT, comma-separated: NPROC of them, wrapping around the list
  local i ids=()
  for ((i = 0; i < NPROC; i++)); do ids+=("${GPUS[(SLOT * NPROC + i) % ${#GPUS[@]}]}"); done
  (IFS=,; echo "${ids[*]}")
}

[[ ${BASH_SOURCE[0]} == "$0" ]] || return 0  # sourced (by slurm.sh, which runs its own srun+torchrun): the points

sweep_points torchrun "$@"
gpu_list
NGPU=${#GPUS[@]}
NPROC=${NPROC:-$((NGPU ? NGPU : 2))}
need_count NPROC "$NPROC"
need_count MAX_RESTARTS "${MAX_RESTARTS:-0}" 0
((NGPU == 0 || NPROC <= NGPU)) ||
  sweep_fail "NPROC=$NPROC is more than the $NGPU GPU(s) found; give NPROC=$NGPU or less"
sweep_init torchrun "${JOBS:-$((NGPU >= 2 * NPROC ? NGPU / NPROC : 1))}" "$@"
SLOT_PORT=()
for i in "${!POINTS[@]}"; do
  name=${POINTS[i]}
  point_done "$name" && continue
  slot_wait
  SLOT_PORT[SLOT]=$(free_port)
  device=()
  ((NGPU == 0)) || device=("CUDA_VISIBLE_DEVICES=$(slot_devices)")
  point_cmd "$i" "$@"
  slot_run "$name" env "${device[@]}" "$PY" -m torch.distributed.run --nnodes=1 --nproc_per_node="$NPROC" \
    --max-restarts="$MAX_RESTARTS" --rdzv-backend=c10d --rdzv-endpoint="localhost:${SLOT_PORT[SLOT]}" \
    --rdzv-id="${name//[^A-Za-z0-9_.-]/_}" "${CMD[@]:1}"
done
sweep_end
