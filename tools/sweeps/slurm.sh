#!/usr/bin/env bash
# A sweep of this folder as one SLURM job array: task i trains point i into the folder the local script uses,
# so the two are interchangeable and re-runnable either way. Submits and returns; done points are skipped.
#   [sweep settings: SWEEP_ROOT LRS MODELS CFG PYTHON] [THROTTLE=T] [WARN_SIGNAL=USR1@120] [NPROC_PER_NODE=n] \
#     tools/sweeps/slurm.sh [--SBATCH-OPTION=VALUE ...] SWEEP [KEY VALUE ...]
#   tools/sweeps/slurm.sh [--SBATCH-OPTION=VALUE ...] run --cfg FILE OUTPUT_DIR DIR [KEY VALUE ...]   (one run)
#   tools/sweeps/slurm.sh table ROOT [--sort KEY] [--asc|--desc]   (the table, with each point's SLURM story)
# sbatch options (--partition=, --account=, --time=, --nodes=, --gpus-per-node=, --qos=, --constraint=, ...)
# reach sbatch unchanged; write them as --name=value. THROTTLE: at most T tasks at once (--array=...%T).
# WARN_SIGNAL: SIG@SECONDS before the time limit (USR1 or USR2) to the batch shell, which passes USR1 on to the
# training processes; they save and exit 75 and the task requeues itself. NPROC_PER_NODE: processes per node
# (default: the GPUs per node, else 1); above 1 or with --nodes above 1 each node runs torchrun through srun.
# SBATCH names the sbatch program (default sbatch). Every point's config is built once before anything is
# submitted (data paths are left to the tasks). A single run keeps its SLURM files in DIR.slurm beside DIR.
# See docs/SWEEPS.md, "On a SLURM cluster".
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/common.sh"

slurm_fail() {  # MESSAGE: one line on stderr, exit 2, nothing submitted
  echo "slurm: $*" >&2
  exit 2
}

sweep_names() {  # the sweeps of this folder: each file NAME.sh that defines NAME_points
  local f name
  for f in "$HERE"/*.sh; do
    name=$(basename -- "$f" .sh)
    grep -q "^${name}_points() *{" -- "$f" && printf '%s ' "$name"
  done
  return 0
}

SBATCH_OPTS=()
while (($#)) && [[ $1 == -* ]]; do
  [[ $1 == --*=* ]] || slurm_fail "sbatch option $1: write sbatch options as --name=value before the sweep" \
    "name (e.g. --partition=gpu, --time=4:00:00)"
  SBATCH_OPTS+=("$1")
  shift
done
(($#)) || slurm_fail "no sweep named; usage: tools/sweeps/slurm.sh [--SBATCH-OPTION=VALUE ...] SWEEP|run [...]" \
  "(sweeps: $(sweep_names))"
SWEEP=$1
shift

if [[ $SWEEP == table ]]; then
  (($#)) || slurm_fail "table needs the sweep's root folder (e.g. output/sweeps/lr_x_model), then [--sort KEY]"
  exec "$PY" "$HERE/slurm_helper.py" table "$@"
fi

if [[ $SWEEP == run ]]; then  # one training run: an array of one, its folder is OUTPUT_DIR
  [[ ${1:-} == --cfg && $# -ge 2 ]] || slurm_fail "run needs --cfg FILE first, then KEY VALUE pairs with OUTPUT_DIR"
  CFG=$2
  shift 2
  run_args=() out=""
  while (($#)); do
    if [[ $1 == OUTPUT_DIR ]]; then
      (($# >= 2)) || slurm_fail "OUTPUT_DIR has no value; give the run's folder, e.g. OUTPUT_DIR output/run1"
      out=${2%/}
      shift 2
    else
      run_args+=("$1")
      shift
    fi
  done
  [[ -n $out ]] || slurm_fail "run needs OUTPUT_DIR DIR among its KEY VALUE pairs (the run's folder, e.g." \
    "OUTPUT_DIR output/run1): the requeued task resumes from it"
  POINT_PARENT=$(dirname -- "$out")  # the run trains in OUTPUT_DIR; its logs and SLURM files go to DIR.slurm,
  SWEEP_ROOT=$out.slurm              # not into the parent folder beside the user's other runs
  run_points() { point "$(basename -- "$out")"; }  # the folder is the point
  set -- "${run_args[@]}"
else
  [[ " $(sweep_names) " == *" $SWEEP "* ]] ||
    slurm_fail "$SWEEP is not a sweep of tools/sweeps/ (give one of: $(sweep_names)or run; a sweep NAME.sh" \
      "defines NAME_points)"
  source "$HERE/$SWEEP.sh"
fi

# every setting is checked before anything is submitted
[[ -z ${THROTTLE+set} ]] || need_count THROTTLE "$THROTTLE"
[[ -z ${NPROC_PER_NODE+set} ]] || need_count NPROC_PER_NODE "$NPROC_PER_NODE"
WARN_SIGNAL=${WARN_SIGNAL:-USR1@120}
[[ $WARN_SIGNAL =~ ^(USR1|USR2)@[0-9]+$ ]] ||
  slurm_fail "WARN_SIGNAL=$WARN_SIGNAL is not SIG@SECONDS with SIG USR1 or USR2; e.g. WARN_SIGNAL=USR1@120"
SBATCH=${SBATCH:-sbatch}
command -v "$SBATCH" >/dev/null || slurm_fail "SBATCH=$SBATCH is not a program found on PATH; run this where" \
  "SLURM's sbatch is installed (a login node), or give its path in SBATCH"
if [[ -n ${SLURM_CONF:-} ]]; then
  [[ -f $SLURM_CONF && -r $SLURM_CONF ]] ||
    slurm_fail "SLURM_CONF=$SLURM_CONF is not a readable file; give the cluster's slurm.conf or unset SLURM_CONF"
fi
sweep_points "$SWEEP" "$@"
CHECK_PATHS=0 sweep_init "$SWEEP" 1 "$@" >/dev/null  # every point's config, before anything is submitted
trap - INT TERM  # nothing runs here: sweep_init's stop trap has nothing to stop

todo=()
for i in "${!POINTS[@]}"; do
  if point_done "${POINTS[i]}" >/dev/null; then echo "slurm: skip ${POINTS[i]} (done)"; else todo+=("$i"); fi
done
mkdir -p "$ROOT/slurm/events" "$ROOT/slurm/logs" "$ROOT/logs"
rm -f "$ROOT/slurm/STOP"  # a new submission: requeues are wanted again
if ((${#todo[@]} == 0)); then
  echo "slurm: all ${#POINTS[@]} point(s) of $ROOT are done; nothing submitted"
  exit 0
fi

manifest="$ROOT/slurm/submit-$(date +%Y%m%d-%H%M%S)-$$.tsv"
for i in "${todo[@]}"; do
  point_cmd "$i" "$@"
  printf -v line '%q ' "${CMD[@]:1}"  # the interpreter is the task's own PYTHON (and torchrun's)
  printf '%s\t%s\t%s\t%s\n' "${POINTS[i]}" "$ROOT" "$(point_dir "${POINTS[i]}")" "$line"
done >"$manifest"

n=${#todo[@]}
array="0-$((n - 1))${THROTTLE:+%$THROTTLE}"
job=$("$SBATCH" --parsable --requeue --job-name="sweep-$SWEEP" --array="$array" --signal="B:$WARN_SIGNAL" \
  --open-mode=append --output="$ROOT/slurm/logs/%A_%a.out" "${SBATCH_OPTS[@]}" \
  "$HERE/slurm_task.sh" "$HERE" "$manifest") || slurm_fail "sbatch refused the array (its message is above)"
job=${job%%;*}
echo "slurm: submitted $n point(s) as array job $job ($array); $((${#POINTS[@]} - n)) done point(s) skipped"
for k in "${!todo[@]}"; do echo "  task $k: ${POINTS[todo[k]]} (log: $ROOT/logs/${POINTS[todo[k]]}.log)"; done

# the table once every task has ended (requeued tasks included); on the same partition/account as the array
table_opts=()
for opt in "${SBATCH_OPTS[@]}"; do
  case $opt in --partition=* | --account=* | --qos=* | --clusters=* | --reservation=*) table_opts+=("$opt") ;; esac
done
printf -v table_cmd '%q ' "$PY" "$HERE/slurm_helper.py" table "$ROOT" --out "$ROOT/slurm/table.md"
table_job=$("$SBATCH" --parsable --job-name="sweep-$SWEEP-table" --dependency="afterany:$job" \
  --kill-on-invalid-dep=yes --output="$ROOT/slurm/logs/table-%j.out" "${table_opts[@]}" --wrap "$table_cmd") ||
  slurm_fail "sbatch refused the table job (the array $job is submitted; run: tools/sweeps/slurm.sh table $ROOT)"
echo "slurm: the table lands in $ROOT/slurm/table.md after job ${table_job%%;*}" \
  "(now: tools/sweeps/slurm.sh table $ROOT; progress: squeue -j $job)"
