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
# in ROOT/logs/worker_<k>.log when JOBS is above 1) until the study is done, then prints its table.
# A point whose folder another job holds (a second run.sh on the same file, a SLURM task) is busy: said, skipped,
# and not a failure. Ctrl-C or SIGTERM: the running points save and exit, the sweep exits 75.
# Exit: 0 done (busy points included), 1 some point failed, 75 some point stopped (saved), 2 a mistake (one line,
# before anything runs). The launcher itself is Python: python -m runner.sweep run (runner/sweep/launch.py).
set -euo pipefail
PY=${PYTHON:-python}
command -v "$PY" >/dev/null || { echo "sweep: PYTHON=$PY is not a program found on PATH; give the interpreter" >&2; exit 2; }
exec "$PY" -m runner.sweep run --prog tools/sweeps/run.sh "$@"
