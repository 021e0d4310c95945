"""Every point of a sweep built into its config once, in one process, before anything starts or is submitted.

    ... | check_points.py [--no-paths]

Standard input: per point its name, the number N of its tools/train.py arguments, then those N arguments, each
ended by a NUL byte (tools/sweeps/slurm.sh's run_point writes it). Prints nothing and exits 0 when every
config loads; otherwise one line, 'point NAME: what is wrong', and exit 2. --no-paths skips the checks that data
and checkpoint files exist (slurm.sh: the compute nodes may see other files than the login node).
"""
from __future__ import annotations

import argparse
import sys

from runner.config import load_config
from runner.errors import UserError, argument_error, cli, one_line


def read_points(data: bytes) -> list[tuple[str, list[str]]]:
    """(name, train.py arguments) of each point in the NUL-separated input."""
    fields = [f.decode(errors="surrogateescape") for f in data.split(b"\0")[:-1]]
    points, i = [], 0
    while i + 1 < len(fields):
        name, count = fields[i], int(fields[i + 1])
        points.append((name, fields[i + 2:i + 2 + count]))
        i += 2 + count
    return points


def check(points: list[tuple[str, list[str]]], check_paths: bool) -> None:
    """Load each point's config as tools/train.py would; the first mistake as a UserError naming the point."""
    for name, argv in points:
        try:
            load_config(argv, check_paths=check_paths)
        except UserError as e:
            raise UserError(f"point {name}: {one_line(str(e))}") from None


@cli
def main(argv: list[str] | None = None) -> int:
    """Check the points given on standard input."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-paths", action="store_true", help="do not look at data or checkpoint files")
    parser.error = argument_error
    args = parser.parse_args(argv)
    check(read_points(sys.stdin.buffer.read()), check_paths=not args.no_paths)
    return 0


if __name__ == "__main__":
    main()
