"""python -m runner.sweep: sweep files run, listed and searched (no torch is imported by this process).

    python -m runner.sweep run [--jobs N] [--num-gpus N] [--nproc N] [--max-restarts N] [--root DIR] \
        FILE [KEY VALUE ...]

run: the launcher of tools/sweeps/run.sh (runner/sweep/launch.py): every point not done, JOBS at once, each on
its own GPUs (under torchrun with NPROC), then the table; a search: file runs JOBS search workers instead. Each
option defaults to its environment variable (JOBS, NUM_GPUS, NPROC, MAX_RESTARTS, SWEEP_ROOT). Exit 0 done, 1
some point failed, 75 some point stopped (saved: run it again), 2 a mistake (nothing started).

    python -m runner.sweep points [--no-paths] [--root DIR] FILE [KEY VALUE ...]
    python -m runner.sweep root FILE

points: reads FILE, builds every point's config once (KEY VALUE: for every point, see runner/sweep/points.py) and
prints, per point, its folder name, its OUTPUT_DIR, the number N of its tools/train.py arguments and those N
arguments, each field ended by a NUL byte: no field is ever read or evaluated by a shell, so values with spaces,
quotes, $() or newlines come through exactly. --no-paths: data and checkpoint files are not looked at (SLURM: the
compute nodes may see other files); --root DIR: the points' folders under DIR instead of the file's root.
Read it in bash (4.4 or later) with

    out=$(mktemp)
    python -m runner.sweep points "$FILE" "$@" >"$out" || exit 2   # a mistake: its line is on stderr
    mapfile -d '' -t F <"$out"
    for ((i = 0; i < ${#F[@]}; i += 3 + F[i + 2])); do
      name=${F[i]} dir=${F[i + 1]} args=("${F[@]:i + 3:F[i + 2]}")
      python tools/train.py "${args[@]}"
    done

root: prints the sweep's root folder and a newline (`root=$(python -m runner.sweep root "$FILE")`).

    python -m runner.sweep grid [--root DIR] --cfg FILE --grid KEY V1,V2 [--grid KEY ...] [KEY VALUE ...]

grid: writes the sweep file of a command-line grid into the sweep's root and prints its path (runner/sweep/grid.py).

    python -m runner.sweep search [--table | --no-table] [--nproc N] [--cold] FILE [KEY VALUE ...]

search: runs ONE worker of the file's search: (runner/sweep/search.py) until the study in ROOT/study.journal is
done, then prints its table and the best trial's command and writes ROOT/report.html. Run several at once (one
machine or a cluster's shared file system) and they share the study. Exit 0 done, 75 stopped by a signal (its
trial saved: run it again), 1 when every finished trial failed. --table: the table only (trains nothing);
--no-table: the worker only. --nproc N: each trial's segments under torchrun with N processes (gloo on the CPU,
one GPU each where there are GPUs; every worker of a study should give the same N: the global batch is
DATA.BATCH_SIZE x N). Each one-process segment is forked from the worker's warm server, which imported torch,
timm and the runner once (runner/sweep/warm.py); --cold: each segment a new `python tools/train.py` instead.

    python -m runner.sweep plan FILE [KEY VALUE ...]

plan: the search checked as `search` checks it, then what it will do (runner/sweep/plan.py): its scheduler and
rungs, how many trials reach each rung, about how many epochs it trains against its trials trained to the end.
Nothing is trained or written.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from runner.errors import UserError, cli
from runner.sweep.points import Point, load_points
from runner.sweep.spec import read_sweep

USAGE = ("usage: python -m runner.sweep run [--jobs N] [--nproc N] FILE [KEY VALUE ...] | "
         "python -m runner.sweep points [--no-paths] [--root DIR] FILE [KEY VALUE ...] | "
         "python -m runner.sweep root FILE | "
         "python -m runner.sweep search [--table | --no-table] [--nproc N] [--cold] FILE [KEY VALUE ...] | "
         "python -m runner.sweep plan FILE [KEY VALUE ...]")


def encode(points: Sequence[Point]) -> bytes:
    """The points as NUL-ended fields: name, OUTPUT_DIR, N, then N tools/train.py arguments, per point."""
    fields: list[str] = []
    for point in points:
        fields += [point.name, point.output_dir, str(len(point.argv)), *point.argv]
    # surrogateescape: an argument that was not UTF-8 on our command line goes out as the same bytes
    return b"".join(field.encode("utf-8", "surrogateescape") + b"\0" for field in fields)


def _options(args: list[str]) -> tuple[bool, str | None, list[str]]:
    """(check paths, root or None, FILE and the rest) from `points`' arguments."""
    check_paths, root = True, None
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag == "--no-paths":
            check_paths = False
        elif flag == "--root" and args:
            root = args.pop(0)
        elif flag.startswith("--root="):
            root = flag.split("=", 1)[1]
        else:
            raise UserError(f"unknown option {flag}; {USAGE}")
    if not args:
        raise UserError(f"no sweep file given; {USAGE}")
    if root is not None and not root:
        raise UserError("--root is empty: give a folder")
    return check_paths, root, args


@cli
def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; `points` and `root` check everything before a byte is written to stdout."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command = args.pop(0) if args else ""
    if command == "root" and len(args) == 1:
        print(read_sweep(args[0]).root)
    elif command == "grid":
        from runner.sweep.grid import grid_command

        print(grid_command(args))
    elif command == "plan" and args and not args[0].startswith("-"):
        from runner.sweep.plan import render_plan  # Optuna is imported by the search only
        from runner.sweep.search import load_search

        print(render_plan(load_search(args[0], args[1:])))
    elif command == "run":
        from runner.sweep.launch import run_command  # the slot pool: tools/sweeps/run.sh's launcher

        return run_command(args)
    elif command == "search":
        from runner.sweep.cli import search_command  # Optuna is imported by the search only

        return search_command(args, USAGE)
    elif command == "points":
        check_paths, root, rest = _options(args)
        _, points = load_points(rest[0], rest[1:], root=root, check_paths=check_paths)
        sys.stdout.buffer.write(encode(points))
        sys.stdout.flush()
    else:
        raise UserError(USAGE)
    return 0


if __name__ == "__main__":
    main()
