#!/usr/bin/env bash
# A sweep file as one SLURM job array: task i trains point i into the folder tools/sweeps/run.sh uses, so the two
# are interchangeable and re-runnable either way. Submits and returns; done points are skipped.
#   [SWEEP_ROOT=dir] [THROTTLE=T] [WARN_SIGNAL=USR1@120] [NPROC_PER_NODE=n] [PYTHON=python] \
#     tools/sweeps/slurm.sh [--SBATCH-OPTION=VALUE ...] FILE [KEY VALUE ...]
#   tools/sweeps/slurm.sh [--SBATCH-OPTION=VALUE ...] run --cfg FILE OUTPUT_DIR DIR [KEY VALUE ...]   (one run)
#   tools/sweeps/slurm.sh [--SBATCH-OPTION=VALUE ...] --cfg FILE --grid KEY V1,V2 [--grid ...] [KEY VALUE ...]
#     (a sweep from the command line: written as ROOT/sweep.yaml first, runner/sweep/grid.py, then submitted)
#   tools/sweeps/slurm.sh table ROOT [--sort KEY] [--asc|--desc]   (the table, with each point's SLURM story)
# FILE is a sweep file (.yaml or .yml, docs/SWEEPS.md). One with search: is an array of WORKERS=K workers (default:
# THROTTLE, else 1), each `python -m runner.sweep search --no-table FILE ...` until the study is done; a requeued
# worker's trial resumes. sbatch options (--partition=, --account=, --time=, --nodes=, --gpus-per-node=, --qos=,
# --constraint=, ...) reach sbatch unchanged; write them as --name=value. THROTTLE: at most T tasks at once
# (--array=...%T). WARN_SIGNAL: SIG@SECONDS before the time limit (USR1 or USR2) to the batch shell, which passes
# USR1 on to the training processes; they save and exit 75 and the task requeues itself. NPROC_PER_NODE: processes
# per node (default: the GPUs per node, else 1); above 1 or with --nodes above 1 each node runs torchrun through srun;
# a search's worker runs on one node (--nodes above 1 is refused) and, with NPROC_PER_NODE=n above 1, each segment
# of its trials under torchrun with n processes. SBATCH names the sbatch program (default sbatch). Every
# point's config (or the search) is checked before anything is submitted (data paths of points are left to the
# tasks). A single run keeps its SLURM files in DIR.slurm beside DIR. A dependent job writes the table:
# ROOT/slurm/table.md. See docs/SWEEPS.md, "On a SLURM cluster".
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/common.sh"
USAGE="usage: tools/sweeps/slurm.sh [--SBATCH-OPTION=VALUE ...] FILE|run [...] (FILE: a sweep file, .yaml or .yml)"

slurm_fail() {  # MESSAGE: one line on stderr, exit 2, nothing submitted
  echo "slurm: $*" >&2
  exit 2
}

manifest_line() {  # NAME ROOT RUN_DIR ARG...: append a task's line to LINES; a TAB or newline in a field: exit 2
  # the task reads its fields back split at TABs and runs them as they are, never through eval: a field that held a
  # TAB or a newline would shift the others, so it is refused here, before anything is written or submitted
  local field line
  for field in "$@"; do
    [[ $field != *[$'\t\n']* ]] || slurm_fail "$(printf %q "$field") (task $(printf %q "$1")) holds a TAB or a newline, which" \
      "no field of a task may hold; rename it (the sweep's root:, SWEEP_ROOT, a point's value, the file's path)"
  done
  printf -v line '%s\t' "$@"
  LINES+=("${line%$'\t'}")
}

run_point() {  # --cfg FILE KEY VALUE ... with OUTPUT_DIR DIR: the one point of `run`, checked (NAMES, DIRS, point_cmd)
  [[ ${1:-} == --cfg && $# -ge 2 ]] || slurm_fail "run needs --cfg FILE first, then KEY VALUE pairs with OUTPUT_DIR"
  local cfg=$2 out="" args=() why
  shift 2
  while (($#)); do
    if [[ $1 == OUTPUT_DIR ]]; then
      (($# >= 2)) || slurm_fail "OUTPUT_DIR has no value; give the run's folder, e.g. OUTPUT_DIR output/run1"
      out=${2%/}
      shift 2
    else
      args+=("$1")
      shift
    fi
  done
  [[ -n $out ]] || slurm_fail "run needs OUTPUT_DIR DIR among its KEY VALUE pairs (the run's folder, e.g." \
    "OUTPUT_DIR output/run1): the requeued task resumes from it"
  command -v "$PY" >/dev/null || sweep_fail "PYTHON=$PY is not a program found on PATH; give the interpreter"
  # the run trains in OUTPUT_DIR; its logs and SLURM files go to DIR.slurm, not beside the user's other runs
  KIND=points ROOT=$out.slurm NAMES=("$(basename -- "$out")") DIRS=("$out") AT=(0)
  FIELDS=(--cfg "$cfg" "${args[@]}" OUTPUT_DIR "$out") COUNT=("${#FIELDS[@]}")
  why=$(printf '%s\0' "${NAMES[0]}" "${COUNT[0]}" "${FIELDS[@]}" |
    "$PY" "$HERE/check_points.py" --no-paths 2>&1) || slurm_fail "${why#error: }"
}

SBATCH_OPTS=()
while (($#)) && [[ $1 == -* && $1 != --cfg && $1 != --cfg=* ]]; do  # --cfg: a sweep from the command line
  [[ $1 == --*=* ]] || slurm_fail "sbatch option $1: write sbatch options as --name=value before the sweep" \
    "file (e.g. --partition=gpu, --time=4:00:00)"
  SBATCH_OPTS+=("$1")
  shift
done
(($#)) || slurm_fail "no sweep file named; $USAGE"
WHAT=$1
shift

if [[ $WHAT == table ]]; then
  (($#)) || slurm_fail "table needs the sweep's root folder (e.g. output/sweeps/lr_x_model), then [--sort KEY]"
  exec "$PY" "$HERE/slurm_helper.py" table "$@"
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

if [[ $WHAT == run ]]; then  # one training run: an array of one, its folder is OUTPUT_DIR
  run_point "$@"
  set --
  NAME=run
elif [[ $WHAT == *.yaml || $WHAT == *.yml ]]; then
  [[ -f $WHAT ]] || slurm_fail "sweep file $WHAT not found"
  FILE=$(cd "$(dirname -- "$WHAT")" && pwd)/$(basename -- "$WHAT")  # the tasks may start in another folder
  CHECK_PATHS=0 sweep_plan "$FILE" "$@"
  NAME=$(basename -- "$FILE")
  NAME=${NAME%.*}
elif [[ $WHAT == --cfg || $WHAT == --cfg=* ]]; then  # --cfg FILE --grid KEY V1,V2 ...: its sweep file first
  grid_file "$WHAT" "$@"
  set --
  FILE=$(cd "$(dirname -- "$GRID_FILE")" && pwd)/$(basename -- "$GRID_FILE")
  SWEEP_ROOT='' CHECK_PATHS=0 sweep_plan "$FILE"  # the file's root: is the folder it was written into
  NAME=$(basename -- "$(dirname -- "$FILE")")
else
  slurm_fail "$WHAT is neither a sweep file (.yaml or .yml) nor run or table; $USAGE"
fi

LINES=()  # the task manifest: one line per task, every field checked (manifest_line), written once all are
if [[ $KIND == search ]]; then  # K workers; each line: worker_k, root, root, python's arguments
  for opt in "${SBATCH_OPTS[@]}"; do  # a trial's segment is one torchrun on its worker's node (worker.py)
    [[ $opt != --nodes=* || ${opt#--nodes=} == 1 ]] || slurm_fail "$opt: a search worker trains its trials on one" \
      "node (NPROC_PER_NODE processes each); give --nodes=1, and more workers with WORKERS=K"
  done
  WORKERS=${WORKERS:-${THROTTLE:-1}}
  need_count WORKERS "$WORKERS"
  for ((k = 0; k < WORKERS; k++)); do
    manifest_line "worker_$k" "$ROOT" "$ROOT" -m runner.sweep search --no-table "$FILE" "$@"
  done
  n=$WORKERS what="worker(s)" skipped=""
  table_cmd=("$PY" -m runner.sweep search --table "$FILE" "$@")
  printf -v now '%q ' "${table_cmd[@]}"
else
  todo=()
  SKIPPED=0
  for i in "${!NAMES[@]}"; do
    if point_done "$i" >/dev/null; then echo "slurm: skip ${NAMES[i]} (done)"; else todo+=("$i"); fi
  done
  if ((${#todo[@]} == 0)); then
    echo "slurm: all ${#NAMES[@]} point(s) of $ROOT are done; nothing submitted"
    exit 0
  fi
  for i in "${todo[@]}"; do
    point_cmd "$i"
    manifest_line "${NAMES[i]}" "$ROOT" "${DIRS[i]}" "${CMD[@]:1}"  # the interpreter: the task's own PYTHON
  done
  n=${#todo[@]} what="point(s)" skipped="; $((${#NAMES[@]} - n)) done point(s) skipped"
  table_cmd=("$PY" "$HERE/slurm_helper.py" table "$ROOT" --sort best/val/top1)
  printf -v now 'tools/sweeps/slurm.sh table %q' "$ROOT"
fi

mkdir -p "$ROOT/slurm/events" "$ROOT/slurm/logs" "$ROOT/logs" 2>/dev/null ||
  slurm_fail "the sweep's root $ROOT cannot be made a folder; give a folder path"
rm -f "$ROOT/slurm/STOP"  # a new submission: requeues are wanted again
manifest="$ROOT/slurm/submit-$(date +%Y%m%d-%H%M%S)-$$.tsv"
printf '%s\n' "${LINES[@]}" >"$manifest"

array="0-$((n - 1))${THROTTLE:+%$THROTTLE}"
job=$("$SBATCH" --parsable --requeue --job-name="sweep-$NAME" --array="$array" --signal="B:$WARN_SIGNAL" \
  --open-mode=append --output="$ROOT/slurm/logs/%A_%a.out" "${SBATCH_OPTS[@]}" \
  "$HERE/slurm_task.sh" "$HERE" "$manifest") || slurm_fail "sbatch refused the array (its message is above)"
job=${job%%;*}
echo "slurm: submitted $n $what as array job $job ($array)$skipped"
k=0
while IFS=$'\t' read -r name _; do
  echo "  task $k: $name (log: $ROOT/logs/$name.log)"
  k=$((k + 1))
done <"$manifest"

# the table once every task has ended (requeued tasks included); on the same partition/account as the array
table_opts=()
for opt in "${SBATCH_OPTS[@]}"; do
  case $opt in --partition=* | --account=* | --qos=* | --clusters=* | --reservation=*) table_opts+=("$opt") ;; esac
done
printf -v wrap '%q ' "${table_cmd[@]}"
wrap="$wrap| tee $(printf '%q' "$ROOT/slurm/table.md")"
table_job=$("$SBATCH" --parsable --job-name="sweep-$NAME-table" --dependency="afterany:$job" \
  --kill-on-invalid-dep=yes --output="$ROOT/slurm/logs/table-%j.out" "${table_opts[@]}" --wrap "$wrap") ||
  slurm_fail "sbatch refused the table job (the array $job is submitted; run: ${now% })"
echo "slurm: the table lands in $ROOT/slurm/table.md after job ${table_job%%;*}" \
  "(now: ${now% }; progress: squeue -j $job)"
