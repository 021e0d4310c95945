# slurm.sh's helpers for reading a sweep file; `source` it, do not run it. (run.sh's launcher, with the slot pool,
# is Python: python -m runner.sweep run, runner/sweep/launch.py.)
# A sweep given on the command line (--cfg FILE --grid KEY V1,V2 ...) is first written as a sweep file (grid_file).
# sweep_plan FILE ARGS... reads a sweep file once (tools/sweeps/plan.py: every point's config, or the search, checked
# in one Python process; a mistake is one line and exit 2 before anything is submitted); then per point I,
# point_done I (skip it) or point_cmd I (its train.py command line). Every expansion is quoted.

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
