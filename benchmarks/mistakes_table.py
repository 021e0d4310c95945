#!/usr/bin/env python
"""The table of bad inputs the tests try: exit code, stderr lines, traceback or not, and the message.

    MISTAKES_LOG=/tmp/mistakes.jsonl python -m pytest tests -k "not slow" -p no:randomly
    python benchmarks/mistakes_table.py /tmp/mistakes.jsonl

Every call of tests/utils.py assert_user_error appends one row to MISTAKES_LOG before asserting.
"""
from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    """Print the rows as a markdown table, one per distinct test, and a count of those that broke the rule."""
    rows = {}
    for line in open(path):
        row = json.loads(line)
        rows[row["test"]] = row
    print("| # | bad input (test) | exit | stderr lines | traceback | message |")
    print("|---:|---|---:|---:|---|---|")
    bad = 0
    for i, row in enumerate(rows.values(), 1):
        ok = row["rc"] == 2 and row["stderr_lines"] == 1 and not row["traceback"]
        bad += not ok
        message = row["line"].replace("|", "\\|")[:160]
        print(f"| {i} | `{row['test'].split('::', 1)[-1]}` | {row['rc']} | {row['stderr_lines']} | "
              f"{'yes' if row['traceback'] else 'no'} | {message} |")
    print(f"\n{len(rows)} bad inputs, {bad} not exit 2 with one line")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
