"""Print the environment report (versions, CPUs, GPUs, backends): `python tools/env_info.py [--json]`."""
from __future__ import annotations

import argparse
import json

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

from runner.errors import argument_error, cli
from runner.rundir.envinfo import collect_env, format_env


@cli
def main(argv: list[str] | None = None) -> int:
    """Parse the flags and print the report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.error = argument_error  # one line, like every other tool
    args = parser.parse_args(argv)
    info = collect_env()
    print(json.dumps(info, indent=2) if args.json else format_env(info), end="\n" if args.json else "")
    return 0


if __name__ == "__main__":
    main()
