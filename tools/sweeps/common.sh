# Shared helpers for the sweep scripts in this folder; `source` it, do not run it.
# A sweep script defines NAME_points (calls `point NAME KEY VALUE...` per point; slurm.sh sources the script for
# it, so the list lives once), then: sweep_points NAME "$@"; sweep_init NAME SLOTS "$@" (which also builds every
# point's config once, in one Python process, and refuses the sweep before anything starts if one is wrong); per
# point: `point_done NAME && continue; slot_wait; point_cmd I "$@"; slot_run NAME CMD...`; then sweep_end. SLOTS points run at once (SLOTS=1: one after another, output on the console; more: each
# point's output goes to ROOT/logs/NAME.log). Ctrl-C or SIGTERM stops the sweep: running points get SIGTERM,
# save their state and exit; re-running the same command continues where it stopped.
# Lists (LRS, MODELS): `sweep_list VAR DEFAULT` gives the array ITEMS, never glob-expanded (MODELS='resnet*'
# stays the text resnet*): one item per whitespace-separated word, or one per line when the value has a
# newline, so an item may hold spaces: MODELS=$'resnet18\nmy model'. Every expansion below is quoted.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python}
CFG=${CFG:-$REPO/configs/digits/test_resnet.yaml}

sweep_fail() {  # MESSAGE: a mistake in the sweep's settings: one line on stderr, exit 2, nothing started
  echo "sweep: $*" >&2
  exit 2
}

need_count() {  # NAME VALUE [MIN]: exit 2 unless VALUE is a whole number of at least MIN (default 1); sets NAME
  [[ $2 =~ ^[0-9]+$ ]] && ((10#$2 >= ${3:-1})) ||
    sweep_fail "$1=$2 is not a whole number of at least ${3:-1}; e.g. $1=2"
  printf -v "$1" '%d' "$((10#$2))"  # decimal: bash arithmetic would read 08 as a bad octal number
}

sweep_list() {  # VAR DEFAULT: set ITEMS to the items of $VAR (DEFAULT when unset or empty), see the header
  local value=${!1:-$2} item
  local -a raw=()
  local -A seen=()
  ITEMS=()
  if [[ $value == *$'\n'* ]]; then
    mapfile -t raw <<<"$value"
  else
    read -ra raw <<<"$value"
  fi
  for item in "${raw[@]}"; do
    item=${item#"${item%%[![:space:]]*}"}  # a line's leading and trailing blanks are not part of its item
    item=${item%"${item##*[![:space:]]}"}
    [[ -n $item ]] || continue
    # the same item twice would be two points in one folder, racing each other when they run side by side
    [[ -z ${seen[$item]+set} ]] || sweep_fail "$1 lists $item twice; give each value once"
    seen[$item]=1
    ITEMS+=("$item")
  done
  ((${#ITEMS[@]})) || sweep_fail "$1 holds no value; give a space-separated list, e.g. $1=\"$2\""
}

check_extra() {  # KEY=VAR... -- ARGS...: exit 2 when an extra argument sets a key the sweep sets per point
  # (the extra arguments come last on each point's command line, so they would win: every point the same)
  local -A owner=([OUTPUT_DIR]=SWEEP_ROOT)
  while [[ $1 != -- ]]; do owner[${1%%=*}]=${1#*=}; shift; done
  shift
  local arg
  for arg in "$@"; do
    [[ -z ${owner[$arg]+set} ]] ||
      sweep_fail "$arg is set per point by this sweep; drop it from the arguments and give ${owner[$arg]}=... instead"
  done
}

point_name() {  # TEXT: a point's folder name: TEXT with / made _ (one folder per point, never a subfolder)
  echo "${1//\//_}"
}

point() {  # NAME KEY VALUE...: one point of a sweep; a sweep's SWEEP_points function calls it per point
  local folder
  folder=$(point_name "$1")
  # two points in one folder: the second would meet the first's lock (busy) or its finished run, never training
  [[ -z ${POINT_OF[$folder]+set} ]] || sweep_fail "points ${POINT_OF[$folder]} and $1 would train in one folder," \
    "$(point_dir "$folder") (a / in a name becomes _); give values whose names differ elsewhere too"
  POINT_OF[$folder]=$1
  POINTS+=("$folder")
  shift
  local keys=""
  (($#)) && printf -v keys '%q ' "$@"  # quoted once here, read back by point_cmd: a value may hold spaces
  POINT_KEYS+=("$keys")
}

point_dir() {  # NAME: the folder point NAME trains in: POINT_PARENT (slurm.sh run) or ROOT, then NAME
  echo "${POINT_PARENT:-$ROOT}/$1"
}

sweep_points() {  # SWEEP ARGS...: POINTS (folder names) and POINT_KEYS from SWEEP_points, the one list of
  # points that the local script and slurm.sh both train; sets ROOT (SWEEP_ROOT or output/sweeps/SWEEP)
  ROOT=${SWEEP_ROOT:-output/sweeps/$1}
  POINTS=() POINT_KEYS=()
  declare -gA POINT_OF=()
  "$1_points" "${@:2}"
  ((${#POINTS[@]})) || sweep_fail "the sweep $1 has no points; give its lists at least one value each"
}

point_cmd() {  # I EXTRA...: CMD, the train.py command line of point I (folder ROOT/NAME), EXTRA last (wins)
  local -a keys
  eval "keys=(${POINT_KEYS[$1]})"
  CMD=("$PY" "$REPO/tools/train.py" --cfg "$CFG" "${keys[@]}" OUTPUT_DIR "$(point_dir "${POINTS[$1]}")" "${@:2}")
}

sweep_check() {  # EXTRA...: every point's config built once, in one Python process (CHECK_PATHS=0: data paths
  # are not looked at, for slurm.sh: the compute nodes may see other files); a mistake: one line, exit 2
  local i why opts=()
  [[ ${CHECK_PATHS:-1} != 0 ]] || opts=(--no-paths)
  why=$(for i in "${!POINTS[@]}"; do
    point_cmd "$i" "$@"
    printf '%s\0' "${POINTS[i]}" "$((${#CMD[@]} - 2))" "${CMD[@]:2}"  # name, count, train.py's arguments
  done | "$PY" "$REPO/tools/sweeps/check_points.py" "${opts[@]}" 2>&1) || sweep_fail "${why#error: }"
}

sweep_init() {  # NAME SLOTS EXTRA...: checks the settings and every point (sweep_check), makes ROOT; bookkeeping
  ROOT=${SWEEP_ROOT:-output/sweeps/$1}
  need_count JOBS "$2"
  NSLOTS=$JOBS
  command -v "$PY" >/dev/null || sweep_fail "PYTHON=$PY is not a program found on PATH; give the interpreter"
  [[ -f $CFG ]] || sweep_fail "CFG=$CFG is not a file; give a config file, e.g. CFG=configs/digits/test_resnet.yaml"
  sweep_check "${@:3}"
  mkdir -p -- "$ROOT" 2>/dev/null || sweep_fail "SWEEP_ROOT=$ROOT cannot be made a folder; give a folder path"
  SLOT=0 STOP=0 SKIPPED=0 SLOT_PID=() FAILED=() STOPPED=()
  declare -gA NAME_OF=()
  trap sweep_stop INT TERM
  echo "sweep: $ROOT, $NSLOTS point(s) at a time"
}

sweep_stop() {  # on Ctrl-C/SIGTERM: ask the running points to save and exit, start no new ones
  STOP=1
  echo "sweep: stopping; running points save their state (re-run the same command to continue)" >&2
  local pid
  for pid in "${SLOT_PID[@]}"; do [[ -z $pid ]] || kill -TERM "$pid" 2>/dev/null || true; done
}

point_done() {  # NAME: true when ROOT/NAME is a done run, as runner.rundir's reader says (no torch is imported)
  [[ -z ${SWEEP_RECHECK:-} ]] || return 1  # SWEEP_RECHECK=1: let train.py decide (e.g. after raising EPOCHS)
  local dir; dir=$(point_dir "$1")
  # the file contract (runner/rundir/layout.py): a done run has results.json. Without it no Python is started, so a
  # point still to train is submitted as fast as before; whether it says done is the reader's to tell
  [[ -e $dir/results.json ]] || return 1
  [[ $("$PY" -m runner.rundir state "$dir" 2>/dev/null) == done ]] || return 1
  echo "sweep: skip $1 (done)"
  SKIPPED=$((SKIPPED + 1))
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

slot_run() {  # NAME CMD...: run CMD in the background in slot SLOT (nothing once the sweep is stopping)
  local name=$1
  shift
  ((STOP == 0)) || return 0
  if ((NSLOTS > 1)); then
    mkdir -p "$ROOT/logs"
    echo "sweep: start $name in slot $SLOT (output: $ROOT/logs/$name.log)"
    "$@" >"$ROOT/logs/$name.log" 2>&1 &
  else
    echo "sweep: start $name"
    "$@" &  # in the background, so that a signal reaches the trap at once
  fi
  SLOT_PID[SLOT]=$!
  NAME_OF[$!]=$name
}

sweep_end() {  # wait for the running points, print the summary; exit 1 when points failed, 75 when some stopped
  while busy; do reap_one; done
  "$PY" "$REPO/tools/summarize.py" "$ROOT" || true
  if ((SKIPPED)); then
    echo "sweep: $SKIPPED finished point(s) skipped without starting Python; after raising TRAIN.EPOCHS or" \
      "TRAIN.MAX_STEPS, re-run with SWEEP_RECHECK=1 so that train.py extends them"
  fi
  if ((STOP)); then
    echo "sweep: stopped; re-run the same command to continue" >&2
    exit 75
  fi
  if ((${#STOPPED[@]})); then
    echo "sweep: ${#STOPPED[@]} point(s) stopped before their end, state saved (re-run the same command to" \
      "continue):" >&2
    printf '  %s\n' "${STOPPED[@]}" >&2
  fi
  if ((${#FAILED[@]})); then
    echo "sweep: ${#FAILED[@]} point(s) failed (see their log.txt; re-running retries them):" >&2
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
