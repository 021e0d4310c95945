#!/usr/bin/env bash
# One array task of tools/sweeps/slurm.sh (sbatch runs a copy of this file, so the folder comes as argument):
#   slurm_task.sh TOOLS_SWEEPS_DIR MANIFEST
# Trains line SLURM_ARRAY_TASK_ID of MANIFEST (TAB-separated fields: point, root, run folder, then python's arguments
# one per field: tools/train.py's, or a search worker's `-m runner.sweep search`; no field holds a TAB or a
# newline, slurm.sh refuses them, and none is ever evaluated) through srun: one process, or one torchrun per node
# with the c10d rendezvous on the allocation's first node. NPROC_PER_NODE (default: the GPUs per node, else 1) is
# the processes per node; a search worker runs on one node, and with NPROC_PER_NODE=n above 1 each segment of its
# trials runs under torchrun with n processes (`search --nproc n`). The warning signal (USR1 or
# USR2 to this shell) goes on to the training processes as USR1: they save and exit 75, and this task requeues
# its own array element, which then resumes from the checkpoint. Exit 76 (hung) is requeued once; other
# failures are not. SIGTERM from SLURM (scontrol requeue, scancel, the time limit) is left to SLURM.
set -uo pipefail
HERE=$1 MANIFEST=$2
PY=${PYTHON:-python}
HELPER=("$PY" "$HERE/slurm_helper.py")
task=${SLURM_ARRAY_TASK_ID:-0}

manifest_fields() {  # LINE: FIELDS, its TAB-separated fields as they are (empty ones kept; nothing is evaluated)
  local rest=$1
  FIELDS=()
  while [[ $rest == *$'\t'* ]]; do
    FIELDS+=("${rest%%$'\t'*}")
    rest=${rest#*$'\t'}
  done
  FIELDS+=("$rest")
}

IFS= read -r line < <(sed -n "$((task + 1))p" "$MANIFEST") || line=""
manifest_fields "$line"
((${#FIELDS[@]} >= 4)) || { echo "slurm task: line $((task + 1)) of $MANIFEST is missing" >&2; exit 2; }
name=${FIELDS[0]} root=${FIELDS[1]} out=${FIELDS[2]}
args=("${FIELDS[@]:3}")
log=$root/logs/$name.log events=$root/slurm/events/$name.jsonl
if [[ -e $root/slurm/STOP ]]; then
  echo "slurm task: $name not started: $root/slurm/STOP exists (the sweep was stopped; re-submit to go on)"
  exit 0
fi

# TRAIN.TIME_LIMIT from the job's time left: a backstop where the warning signal does not come in time. The
# task's own id: the last task of an array has the array's job id, which squeue -j expands to every task
self=${SLURM_JOB_ID:-0}
[[ -z ${SLURM_ARRAY_JOB_ID:-} ]] || self=${SLURM_ARRAY_JOB_ID}_$task
left=$(squeue -h -j "$self" -o %L 2>/dev/null) || left=""
limit=$("${HELPER[@]}" time-limit "${left:-UNLIMITED}")
injected=()  # keys this launcher set, not the user: the table does not show them as swept
train=0  # a point (tools/train.py), not a search worker (python -m runner.sweep search: it starts its trials)
[[ ${args[0]} != */train.py ]] || train=1
if ((train)) && [[ -n $limit && " ${args[*]} " != *" TRAIN.TIME_LIMIT "* ]]; then
  args+=(TRAIN.TIME_LIMIT "$limit")
  injected=(--injected TRAIN.TIME_LIMIT)
fi

nodes=${SLURM_JOB_NUM_NODES:-1}
gpus=${SLURM_GPUS_PER_NODE:-}
gpus=${gpus##*:}  # type:count -> count
nproc=${NPROC_PER_NODE:-${gpus:-1}}
if ((train == 0)); then  # a search worker, on one node: with nproc above 1 each segment of a trial under torchrun
  nodes=1
  ((nproc == 1)) || args=("${args[@]:0:3}" --nproc "$nproc" "${args[@]:3}")  # -m runner.sweep search --nproc N ...
  run=("$PY" "${args[@]}")
elif ((nodes == 1 && nproc == 1)); then
  run=("$PY" "${args[@]}")
else
  head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
  port=${RDZV_PORT:-$((20000 + ${SLURM_JOB_ID:-0} % 20000))}  # per job: tasks sharing a node do not collide
  run=("$PY" -m torch.distributed.run --nnodes="$nodes" --nproc_per_node="$nproc" --rdzv-backend=c10d
    --rdzv-id="${SLURM_JOB_ID:-0}" --rdzv-endpoint="$head:$port" "${args[@]}")
fi
mkdir -p "$root/logs"
echo "slurm task: $name, job ${SLURM_JOB_ID:-?} (array ${SLURM_ARRAY_JOB_ID:-?}_$task, restart" \
  "${SLURM_RESTART_COUNT:-0}), $nodes node(s) x $nproc process(es), log $log"
# the log is appended to, never truncated (a requeue or a re-submission keeps the earlier lines): one header a start
printf '=== %s start %s: job %s, array %s_%s, restart %s, on %s:%s\n' "$(date '+%Y-%m-%d %H:%M:%S %z')" "$name" \
  "${SLURM_JOB_ID:-?}" "${SLURM_ARRAY_JOB_ID:-?}" "$task" "${SLURM_RESTART_COUNT:-0}" "${HOSTNAME:-?}" \
  "$(printf ' %q' "${run[@]}")" >>"$log"
"${HELPER[@]}" start "$events" "${injected[@]}"

signalled="" interrupted=0
forward() {  # SIG: the warning signal or a scancel --signal: every training process saves and stops
  signalled=$1 interrupted=1
  echo "slurm task: SIG$1: asking the training processes of $name to save and stop"
  scancel --signal=USR1 "${SLURM_JOB_ID:-0}" 2>/dev/null || kill -USR1 "$pid" 2>/dev/null || true
}
trap 'forward USR1' USR1
trap 'forward USR2' USR2
trap 'signalled=TERM interrupted=1' TERM
# torchrun dies of USR1 (no handler): the step ignores it, the runner in each worker installs its own
srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 bash -c 'trap "" USR1 USR2; exec "$@"' step \
  "${run[@]}" >>"$log" 2>&1 &
pid=$!
rc=""
while [[ -z $rc ]]; do
  interrupted=0
  wait "$pid"
  r=$?
  ((interrupted)) || rc=$r  # a trap cut the wait short: the step still runs (or its status is kept for wait)
done

IFS=$'\t' read -r action why < <("${HELPER[@]}" end "$events" "$out" "$log" "$rc" "$signalled" -- "${args[@]:1}")
echo "slurm task: $name: ${action:-failed} (${why:-the helper gave no answer})"
case ${action:-failed} in
  requeue)
    scontrol requeue "${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}_$task" ||
      echo "slurm task: scontrol requeue failed; re-submit the sweep to continue $name" >&2
    exit 0 ;;
  done | busy) exit 0 ;;
  *) exit $((rc ? rc : 1)) ;;
esac
