# Shared helpers of run.sh and slurm.sh; `source` it, do not run it.
# A sweep given on the command line (--cfg FILE --grid KEY V1,V2 ...) is first written as a sweep file (grid_file).
# A launcher reads a sweep file once with sweep_plan FILE ARGS... (tools/sweeps/plan.py: every point's config, or
# the search, checked in one Python process; a mistake is one line and exit 2 before anything starts), then, to run
# points here: sweep_init SLOTS; per point `point_done I && continue; slot_wait; point_cmd I; slot_run NAME CMD...`;
# then sweep_end TABLE_CMD.... SLOTS points run at once (SLOTS=1: one after another, output on the console; more:
# each one's output is appended to ROOT/logs/NAME.log after a header line, never truncated). Ctrl-C or SIGTERM stops
# the sweep: running points get SIGTERM, save their state and exit; re-running the same command continues where it
# stopped. Every expansion is quoted.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python}

sweep_fail() {  # MESSAGE: a mistake in the sweep's settings: one line on stderr, exit 2, nothing started
  echo "sweep: $*" >&2
  exit 2
}

need_count() {  # NAME VALUE [MIN]: exit 2 unless VALUE is a whole number of at least MIN (default 1); sets NAME
  [[ $2 =~ ^[0-9]+$ ]] && ((10#$2 >= ${3:-1})) ||
    sweep_fail "$1=$2 is not a whole number of at least ${3:-1}; e.g. $1=2"
  printf -v "$1" '%d' "$((10#$2))"  # decimal: bash arithmetic would read 08 as a bad octal number
}

sweep_plan() {  # FILE ARGS...: KIND (points|search), ROOT, and per point I: NAMES[I], DIRS[I], point_cmd I
  # CHECK_PATHS=0: data paths are not looked at (slurm.sh); SWEEP_ROOT: the points' folders under it
  # FILE may be `--cfg FILE --grid KEY V1,V2 ... [KEY VALUE ...]`: a sweep from the command line, written first
  local out rc=0 i=2 opts=() SWEEP_ROOT=${SWEEP_ROOT:-}
  command -v "$PY" >/dev/null || sweep_fail "PYTHON=$PY is not a program found on PATH; give the interpreter"
  if [[ ${1:-} == --cfg || ${1:-} == --cfg=* ]]; then
    grid_file "$@"
    set -- "$GRID_FILE"
    SWEEP_ROOT=''  # the written file's root: is the folder it lies in (SWEEP_ROOT's, when given)
  fi
  [[ ${CHECK_PATHS:-1} != 0 ]] || opts+=(--no-paths)
  [[ -z ${SWEEP_ROOT:-} ]] || opts+=(--root "$SWEEP_ROOT")
  out=$(mktemp)
  "$PY" "$REPO/tools/sweeps/plan.py" "${opts[@]}" -- "$@" >"$out" || rc=$?  # a mistake: its line is on stderr
  mapfile -d '' -t FIELDS <"$out"
  rm -f -- "$out"
  ((rc == 0)) || exit "$rc"
  KIND=${FIELDS[0]} ROOT=${FIELDS[1]} NAMES=() DIRS=() AT=() COUNT=()
  while ((i < ${#FIELDS[@]})); do  # name, OUTPUT_DIR, N, then N train.py arguments
    NAMES+=("${FIELDS[i]}") DIRS+=("${FIELDS[i + 1]}") COUNT+=("${FIELDS[i + 2]}") AT+=("$((i + 3))")
    i=$((i + 3 + FIELDS[i + 2]))
  done
}

grid_file() {  # --cfg FILE --grid KEY V1,V2 ... [KEY VALUE ...]: GRID_FILE, the sweep file written for them
  # (runner/sweep/grid.py: into the sweep's root, SWEEP_ROOT or one named after the config and the swept keys)
  local opts=()
  command -v "$PY" >/dev/null || sweep_fail "PYTHON=$PY is not a program found on PATH; give the interpreter"
  [[ -z ${SWEEP_ROOT:-} ]] || opts+=(--root "$SWEEP_ROOT")
  GRID_FILE=$("$PY" -m runner.sweep grid "${opts[@]}" "$@") || exit $?  # a mistake: its line is on stderr
  echo "sweep: wrote $GRID_FILE (re-run it: tools/sweeps/run.sh $(printf %q "$GRID_FILE"))"
}

point_cmd() {  # I: CMD, the tools/train.py command line of point I (its OUTPUT_DIR last)
  CMD=("$PY" "$REPO/tools/train.py" "${FIELDS[@]:AT[$1]:COUNT[$1]}")
}

point_done() {  # I: true when point I's folder is a done run, as runner.rundir's reader says (no torch imported)
  [[ -z ${SWEEP_RECHECK:-} ]] || return 1  # SWEEP_RECHECK=1: let train.py decide (e.g. after raising EPOCHS)
  local dir=${DIRS[$1]}
  # the file contract (runner/rundir/layout.py): a done run has results.json. Without it no Python is started, so a
  # point still to train is started as fast as before; whether it says done is the reader's to tell
  [[ -e $dir/results.json ]] || return 1
  [[ $("$PY" -m runner.rundir state "$dir" 2>/dev/null) == done ]] || return 1
  echo "sweep: skip ${NAMES[$1]} (done)"
  SKIPPED=$((SKIPPED + 1))
}

point_busy() {  # NAME RC: true when point NAME ended refused because another job holds its folder's run lock
  # train.py refuses a folder in use with exit 2 (torchrun reports a worker's 2 as 1), as slurm_helper.py's
  # "busy"; the folder's lock, still held by the other job (or its run done since), tells it from a mistake
  local dir=${DIR_OF[$1]:-} word
  [[ -n $dir ]] && { ((${2} == 2)) || { [[ -n ${NPROC:-} ]] && ((${2} == 1)); }; } || return 1
  word=$("$PY" -m runner.rundir state "$dir" 2>/dev/null) || return 1
  [[ $word == running || $word == done ]]
}

sweep_init() {  # SLOTS: checks JOBS, makes ROOT; the slots' bookkeeping and the stop trap
  need_count JOBS "$1"
  NSLOTS=$JOBS
  # the points running side by side share this machine's cores, as torchrun's local ranks do (runner/threads.py)
  ((NSLOTS == 1)) || export RUNNER_CPU_SHARE=${RUNNER_CPU_SHARE:-$NSLOTS}
  mkdir -p -- "$ROOT" 2>/dev/null || sweep_fail "the sweep's root $ROOT cannot be made a folder; give a folder path"
  SLOT=0 STOP=0 SKIPPED=0 SLOT_PID=() FAILED=() STOPPED=() BUSY=()
  declare -gA NAME_OF=() DIR_OF=()  # DIR_OF: a point's folder (point_busy), set by the launcher before slot_run
  trap sweep_stop INT TERM
  echo "sweep: $ROOT, $NSLOTS ${UNIT:-point}(s) at a time"
}

sweep_stop() {  # on Ctrl-C/SIGTERM: ask the running points to save and exit, start no new ones
  STOP=1
  echo "sweep: stopping; running points save their state (re-run the same command to continue)" >&2
  local pid
  for pid in "${SLOT_PID[@]}"; do [[ -z $pid ]] || kill -TERM "$pid" 2>/dev/null || true; done
}

busy() {  # true while some slot runs a point
  local pid
  for pid in "${SLOT_PID[@]}"; do [[ -z $pid ]] || return 0; done
  return 1
}

reap_one() {  # wait for one running point to end; record it when it failed or stopped
  local pid rc=0 s name running=()
  for pid in "${SLOT_PID[@]}"; do [[ -z $pid ]] || running+=("$pid"); done
  ((${#running[@]})) || return 0
  wait -n -p pid "${running[@]}" || rc=$?
  [[ -n ${pid:-} ]] || return 0  # a trapped signal interrupted wait; the caller waits again
  for s in "${!SLOT_PID[@]}"; do [[ ${SLOT_PID[s]} != "$pid" ]] || SLOT_PID[s]=""; done
  name=${NAME_OF[$pid]}
  if ((rc == 0)); then
    echo "sweep: $name finished"
  elif ((rc == 75)); then  # saved and stopped (SIGTERM/USR1, TRAIN.TIME_LIMIT): not a failure, a re-run continues it
    STOPPED+=("$name")
    echo "sweep: $name stopped with exit code 75 (its state is saved; re-run the same command to continue it)" >&2
  elif point_busy "$name" "$rc"; then  # another job (a second run.sh, a SLURM task) trains it: not a failure
    BUSY+=("$name")
    echo "sweep: $name is busy: another job holds ${DIR_OF[$name]} (skipped; that job trains it)"
  else
    FAILED+=("$name (exit code $rc)")
    echo "sweep: $name failed with exit code $rc" >&2
  fi
}

slot_wait() {  # set SLOT to a free slot, waiting for a running point to end when all are busy
  while :; do
    for ((SLOT = 0; SLOT < NSLOTS; SLOT++)); do [[ -n ${SLOT_PID[SLOT]:-} ]] || return 0; done
    reap_one
  done
}

log_header() {  # LOG NAME CMD...: append one line saying when and what starts, so each run's lines are told apart
  printf '=== %s start %s on %s (sweep pid %s):%s\n' "$(date '+%Y-%m-%d %H:%M:%S %z')" "$2" "${HOSTNAME:-?}" "$$" \
    "$(printf ' %q' "${@:3}")" >>"$1"
}

slot_run() {  # NAME CMD...: run CMD in the background in slot SLOT (nothing once the sweep is stopping)
  local name=$1
  shift
  ((STOP == 0)) || return 0
  if ((NSLOTS > 1)); then
    mkdir -p "$ROOT/logs"
    echo "sweep: start $name in slot $SLOT (output: $ROOT/logs/$name.log)"
    log_header "$ROOT/logs/$name.log" "$name" "$@"
    "$@" >>"$ROOT/logs/$name.log" 2>&1 &  # appended: an earlier run's lines (a finished study's) are its record
  else
    echo "sweep: start $name"
    "$@" &  # in the background, so that a signal reaches the trap at once
  fi
  SLOT_PID[SLOT]=$!
  NAME_OF[$!]=$name
}

sweep_end() {  # TABLE_CMD...: wait for the running points, print the table; exit 1 when some failed, 75 stopped
  # (busy points, which another job trains, are said and skipped: 0 when nothing else failed or stopped)
  while busy; do reap_one; done
  "$@" || true
  if ((SKIPPED)); then
    echo "sweep: $SKIPPED finished point(s) skipped without starting Python; after raising TRAIN.EPOCHS or" \
      "TRAIN.MAX_STEPS, re-run with SWEEP_RECHECK=1 so that train.py extends them"
  fi
  if ((${#BUSY[@]})); then
    echo "sweep: ${#BUSY[@]} point(s) busy, skipped: another job held their folder (re-run the same command after" \
      "it ends to check them):"
    printf '  %s\n' "${BUSY[@]}"
  fi
  if ((STOP)); then
    echo "sweep: stopped; re-run the same command to continue" >&2
    exit 75
  fi
  if ((${#STOPPED[@]})); then
    echo "sweep: ${#STOPPED[@]} ${UNIT:-point}(s) stopped before their end, state saved (re-run the same command" \
      "to continue):" >&2
    printf '  %s\n' "${STOPPED[@]}" >&2
  fi
  if ((${#FAILED[@]})); then
    echo "sweep: ${#FAILED[@]} ${UNIT:-point}(s) failed (see their log; re-running retries them):" >&2
    printf '  %s\n' "${FAILED[@]}" >&2
    exit 1
  fi
  ((${#STOPPED[@]} == 0)) || exit 75
}

gpu_list() {  # set GPUS to the device ids: CUDA_VISIBLE_DEVICES, else nvidia-smi; NUM_GPUS caps (or sets) the count
  local i n=0 ids=()
  [[ -z ${NUM_GPUS:-} ]] || need_count NUM_GPUS "$NUM_GPUS" 0
  if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then  # set but empty hides every GPU: the points then use the CPU
    IFS=$', \t' read -ra ids <<<"$CUDA_VISIBLE_DEVICES"
  else
    n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || n=0
    n=${NUM_GPUS:-$n}  # where nvidia-smi is missing, NUM_GPUS says how many there are
    for ((i = 0; i < n; i++)); do ids+=("$i"); done
  fi
  GPUS=("${ids[@]:0:${NUM_GPUS:-${#ids[@]}}}")
  ((${#GPUS[@]})) || echo "sweep: no GPU found: points run on the CPU"
}
