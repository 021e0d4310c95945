#!/usr/bin/env bash
# A sweep file's points on this machine, then one table; safe to re-run: done points are skipped, interrupted ones
# resume, missing ones start (docs/SWEEPS.md). KEY VALUE arguments go to every point (they cannot set a swept key).
#   [JOBS=n] [NUM_GPUS=n] [NPROC=n [MAX_RESTARTS=0]] [SWEEP_ROOT=dir] [PYTHON=python] \
#     tools/sweeps/run.sh FILE [KEY VALUE ...]
#   tools/sweeps/run.sh --cfg CONFIG --grid KEY V1,V2 [--grid ...] [KEY VALUE ...]  (writes ROOT/sweep.yaml first)
# JOBS points at once (default: one per GPU, CUDA_VISIBLE_DEVICES else nvidia-smi, NUM_GPUS to cap or set the count;
# without a GPU one at a time on the CPU), each on its own GPU, a GPU taking the next point when its point ends.
# NPROC=n: each point under torchrun with n processes (its own free rendezvous port, n GPUs of its own; default
# JOBS: the GPUs / n). With JOBS above 1 each point's output is appended to ROOT/logs/<point>.log. The table is
# tools/summarize.py ROOT --sort best/val/top1. SWEEP_ROOT: the points' folders there instead of the file's root:.
# A file with search: instead runs JOBS workers of `python -m runner.sweep search --no-table FILE` (one GPU each
# where there are GPUs; with NPROC=n each trial under torchrun with n processes, n GPUs per worker; their lines
# in ROOT/logs/worker_<k>.log when JOBS is above 1) until the study is done, then
# prints its table (python -m runner.sweep search --table FILE). Mistakes: one line, exit 2, before anything runs.
# A point whose folder another job holds (a second run.sh on the same file, a SLURM task) is busy: said, skipped,
# and not a failure. Exit: 0 done (busy points included), 1 some point failed, 75 some point stopped (saved).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

free_port() {  # a TCP port free now and not given to a running point of this sweep
  local port
  while :; do
    port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')
    [[ " ${SLOT_PORT[*]} " == *" $port "* ]] || break
  done
  echo "$port"
}

slot_devices() {  # N: the GPUs of slot SLOT, comma-separated: N of them, wrapping around the list
  local i ids=()
  for ((i = 0; i < $1; i++)); do ids+=("${GPUS[(SLOT * $1 + i) % ${#GPUS[@]}]}"); done
  (IFS=,; echo "${ids[*]}")
}

device_env() {  # N: DEVICE, the env assignment that gives slot SLOT its N GPUs (none without GPUs)
  DEVICE=()
  ((NGPU == 0)) || DEVICE=("CUDA_VISIBLE_DEVICES=$(slot_devices "$1")")
}

run_search() {  # FILE ARGS...: JOBS workers of the search, then its table
  [[ -z ${SWEEP_ROOT:-} ]] || sweep_fail "SWEEP_ROOT is not used by a search (its study lives in the file's root:," \
    "$ROOT); unset it, or give root: in the file"
  local k nproc=${NPROC:-1} opts=()
  if [[ -n ${NPROC:-} ]]; then  # each trial's segments under torchrun with NPROC processes (GPUs) of its worker's
    need_count NPROC "$NPROC"
    ((NGPU == 0 || NPROC <= NGPU)) ||
      sweep_fail "NPROC=$NPROC is more than the $NGPU GPU(s) found; give NPROC=$NGPU or less"
    opts=(--nproc "$NPROC")
  fi
  UNIT=worker
  sweep_init "${JOBS:-$((NGPU >= 2 * nproc ? NGPU / nproc : 1))}"
  for ((k = 0; k < NSLOTS; k++)); do
    slot_wait
    device_env "$nproc"
    slot_run "worker_$k" env "${DEVICE[@]}" "$PY" -m runner.sweep search --no-table "${opts[@]}" "$@"
  done
  sweep_end "$PY" -m runner.sweep search --table "$@"
}

run_points() {  # ARGS...: every point not done, JOBS at once (under torchrun with NPROC), then the table
  local i name nproc=${NPROC:-1}
  if [[ -n ${NPROC:-} ]]; then
    need_count NPROC "$NPROC"
    need_count MAX_RESTARTS "${MAX_RESTARTS:-0}" 0
    ((NGPU == 0 || NPROC <= NGPU)) ||
      sweep_fail "NPROC=$NPROC is more than the $NGPU GPU(s) found; give NPROC=$NGPU or less"
  fi
  sweep_init "${JOBS:-$((NGPU >= 2 * nproc ? NGPU / nproc : 1))}"
  SLOT_PORT=()
  for i in "${!NAMES[@]}"; do
    name=${NAMES[i]}
    point_done "$i" && continue
    slot_wait
    DIR_OF[$name]=${DIRS[i]}
    device_env "$nproc"
    point_cmd "$i"
    if [[ -z ${NPROC:-} ]]; then
      slot_run "$name" env "${DEVICE[@]}" "${CMD[@]}"
      continue
    fi
    SLOT_PORT[SLOT]=$(free_port)
    slot_run "$name" env "${DEVICE[@]}" "$PY" -m torch.distributed.run --nnodes=1 --nproc_per_node="$NPROC" \
      --max-restarts="$MAX_RESTARTS" --rdzv-backend=c10d --rdzv-endpoint="localhost:${SLOT_PORT[SLOT]}" \
      --rdzv-id="${name//[^A-Za-z0-9_.-]/_}" "${CMD[@]:1}"
  done
  sweep_end "$PY" "$REPO/tools/summarize.py" "$ROOT" --sort best/val/top1
}

(($#)) || sweep_fail "no sweep file given; usage: tools/sweeps/run.sh FILE [KEY VALUE ...] (e.g." \
  "configs/sweeps/lr_x_model.yaml; docs/SWEEPS.md)"
[[ -z ${JOBS+set} ]] || need_count JOBS "$JOBS"
gpu_list
NGPU=${#GPUS[@]}
sweep_plan "$@"
if [[ $KIND == search ]]; then run_search "$@"; else run_points; fi
