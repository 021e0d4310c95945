"""A sweep file as the launchers of this folder (run.sh, slurm.sh) take it: its kind, its root, its points, checked.

    plan.py [--no-paths] [--root DIR] [--] FILE [KEY VALUE ...]

Prints NUL-ended fields: the kind, `points` (grid:/points:) or `search` (search:), the root folder, then for
`points` every point as `python -m runner.sweep points` prints it (name, OUTPUT_DIR, N, then N tools/train.py
arguments). Everything is checked before a byte is printed (every point's config; a search's space, metric and
rungs, runner/sweep/search.py): a mistake is one line on stderr and exit 2. --no-paths: data and checkpoint files
are not looked at (slurm.sh: the compute nodes may see other files); --root DIR (SWEEP_ROOT): the points' folders
under DIR. A search keeps its study where its file's root: says, so --root is refused for it.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from runner.errors import UserError, cli
from runner.sweep.__main__ import encode
from runner.sweep.launch import read_plan

USAGE = "usage: tools/sweeps/plan.py [--no-paths] [--root DIR] [--] FILE [KEY VALUE ...]"


def parse(args: list[str]) -> tuple[bool, str | None, str, list[str]]:
    """(check paths, root or None, FILE, KEY VALUE ...) from the command line."""
    check_paths, root = True, None
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag == "--":
            break
        if flag == "--no-paths":
            check_paths = False
        elif flag == "--root" and args and args[0]:
            root = args.pop(0)
        else:
            raise UserError(f"{flag}: unknown option or a --root without a folder; {USAGE}")
    if not args:
        raise UserError(f"no sweep file given; {USAGE}")
    return check_paths, root, args[0], args[1:]


def plan(path: str, extra: list[str], root: str | None, check_paths: bool) -> bytes:
    """The NUL-ended fields of the module's docstring for the sweep file at `path` (runner.sweep.launch's plan)."""
    kind, root, points = read_plan(path, extra, root, check_paths)
    return b"".join(f.encode("utf-8", "surrogateescape") + b"\0" for f in (kind, root)) + encode(points)


@cli
def main(argv: Sequence[str] | None = None) -> int:
    """Print the plan of the file given on the command line."""
    check_paths, root, path, extra = parse(list(sys.argv[1:] if argv is None else argv))
    sys.stdout.buffer.write(plan(path, extra, root, check_paths))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    main()
