"""One table of every run under a folder: python tools/summarize.py ROOT [--sort KEY] [--format md|csv]."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runner.errors import UserError, argument_error, cli
from runner.rundir.reader import ACTIVE_S
from runner.sweep.summary import DEFAULT_SORT, TrialView, best_index, sort_rows, summarize, to_csv, to_markdown


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        description="List every run (a folder with config.yaml) under ROOT: the keys that differ from the "
        "defaults, the status and the results. Status: done | running (a process holds the run lock; for "
        f"runs of other machines or without run.json: a file changed within {ACTIVE_S:.0f} s) | interrupted "
        "(killed or preempted: re-run the same command to continue) | failed (see the note and log.txt). "
        f"The best run (*): the highest finite {DEFAULT_SORT} (NaN and infinities never win), a tie going to "
        "the run whose folder name comes first (numbers compared as numbers). A search's trials (ROOT/trial_N "
        "beside ROOT/study.journal) are shown as the search shows them: status done | training | paused (at a "
        "rung, may be promoted) | stopped (at its rung, not promoted) | failed | to resume | to start, the "
        "columns rung and rung/METRIC (the metric at the rung reached), the search's order, and the search's "
        "best (*): trained to the full length, the best metric there, the earlier trial on a tie.")
    parser.add_argument("root", type=Path, help="folder to search, at any depth (e.g. a sweep root)")
    parser.add_argument("--sort", default=None, metavar="KEY",
                        help=f"column to sort by (default {DEFAULT_SORT}; a search's trials: the search's order), "
                        "e.g. TRAIN.LR, wall_s, run")
    parser.add_argument("--format", choices=("md", "csv"), default="md", help="markdown table or CSV")
    order = parser.add_mutually_exclusive_group()
    order.add_argument("--desc", dest="descending", action="store_true", default=True,
                       help="largest first (default)")
    order.add_argument("--asc", dest="descending", action="store_false", help="smallest first")
    parser.error = argument_error  # one line, like every other tool
    return parser.parse_args(argv)


@cli
def main(argv: list[str] | None = None) -> int:
    """Print the summary table of ROOT."""
    args = parse_args(argv)
    if not args.root.exists():
        raise UserError(f"ROOT {args.root} does not exist; give the folder that holds the run folders")
    if not args.root.is_dir():
        raise UserError(f"ROOT {args.root} is a file, not a folder; give the folder that holds the run folders "
                        f"(e.g. {args.root.parent})")
    rows = summarize(args.root, studies=read_study)
    if not rows:
        print(f"no runs under {args.root} (a run folder holds a config.yaml)", file=sys.stderr)
        return 0
    if args.sort is not None and args.sort not in rows[0]:
        raise UserError(f"--sort {args.sort!r} is not a column; columns: {', '.join(rows[0])}")
    rows = sort_rows(rows, args.sort, args.descending)
    best = best_index(rows)
    sys.stdout.write(to_csv(rows, best) if args.format == "csv" else to_markdown(rows, best))
    line = getattr(rows[best], "best_line", "") if best is not None else ""
    if line and args.format == "md":
        print(f"\n{line}")  # the search's own answer and the command that trains it again, as its table says
    return 0


def read_study(root: Path) -> dict[str, TrialView]:
    """A search's trials as its study says (Optuna is imported here only: where a study.journal is)."""
    from runner.sweep.table import trial_views

    return trial_views(str(root))


if __name__ == "__main__":
    main()
