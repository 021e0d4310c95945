"""`python -m runner.rundir state DIR...`: each run folder's state in one word per line, for shell scripts.

The words: done | running | interrupted | failed (as tools/summarize.py says) | missing (no folder, or no run in
it). tools/sweeps/common.sh (slurm.sh) skips a point whose folder says `done` (the local launcher,
runner/sweep/launch.py, asks the reader in its own process); no script parses a run's files itself.
"""
from __future__ import annotations

import sys

from runner.rundir.reader import state

USAGE = "usage: python -m runner.rundir state DIR [DIR ...]"


def main(argv: list[str]) -> int:
    """Print the state of each folder; 2 with a usage line for anything else."""
    if len(argv) < 2 or argv[0] != "state":
        print(USAGE, file=sys.stderr)
        return 2
    for folder in argv[1:]:
        print(state(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
