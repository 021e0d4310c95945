#!/usr/bin/env python
"""Time a command on a quiet machine and beside a load that started DELAY seconds before it, as on a shared
machine that just got busy (docs/PERFORMANCE.md, "CPU threads on a loaded machine").

    python benchmarks/busy_start.py [--runs 3] [--delays 0,3,60] [--procs 2] -- python tools/train.py --cfg ...

Delay 0 is the quiet run (no load). For each other delay, `--procs` load processes (benchmarks/cpu_load.py: torch
matrix products with torch's default threads) start (in this session unless --own-session), the command starts
DELAY s later, and the load stops when it ends. Each command's `{run}` is replaced by a fresh name (e.g.
OUTPUT_DIR /tmp/x/{run}). Runs alternate over the delays round by round. Prints each run, then one table of
medians and their ratio to the quiet median, and one JSON line. The command's own stdout/stderr are discarded; a
failure stops the benchmark with its output.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

LOAD = Path(__file__).resolve().parent / "cpu_load.py"


def start_load(procs: int, own_session: bool) -> subprocess.Popen:
    """benchmarks/cpu_load.py with `procs` processes, in its own process group (and session, if asked); returns
    once they compute."""
    # Linux's autogroup (kernel.sched_autogroup_enabled) shares the CPU fairly between sessions, not threads: a
    # load in another session (another login's job) leaves the command about half the machine, one in the same
    # session (a sweep's other points, a job started from the same shell) only its threads' share
    load = subprocess.Popen([sys.executable, str(LOAD), "--procs", str(procs), "--seconds", "3600"],
                            stdout=subprocess.PIPE, text=True, start_new_session=own_session,
                            process_group=None if own_session else 0)
    load.stdout.readline()  # "cpu_load: N processes (pids ...)": they are started
    return load


def stop_load(load: subprocess.Popen) -> None:
    """Stop the load processes (their whole group) and wait for them."""
    os.killpg(load.pid, signal.SIGTERM)
    load.wait(timeout=30)


def timed(cmd: list[str], run: str) -> float:
    """The command's wall time in seconds, `{run}` replaced; exits on a failure."""
    argv = [a.replace("{run}", run) for a in cmd]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall


def one(cmd: list[str], delay: float, procs: int, run: str, own_session: bool) -> dict:
    """One run at `delay` (0: quiet), with the load average at its start."""
    load = start_load(procs, own_session) if delay else None
    try:
        time.sleep(delay)  # the point of the benchmark: how long the load has run when the command starts
        avg = os.getloadavg()[0]
        wall = timed(cmd, run)
    finally:
        if load is not None:
            stop_load(load)
    return {"delay": delay, "wall_s": wall, "load1": avg}


def main() -> None:
    """Parse, alternate the delays round by round, print the runs and the summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="runs per delay (default 3)")
    p.add_argument("--delays", default="0,3,60", help="seconds the load runs before the command; 0 = quiet")
    p.add_argument("--procs", type=int, default=2, help="load processes (default 2)")
    p.add_argument("--own-session", action="store_true",
                   help="start the load in a session of its own (as another login's job; see start_load)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to time")
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        p.error("give the command to time after --")
    delays = [float(d) for d in a.delays.split(",")]
    rows = []
    for r in range(a.runs):
        for delay in delays:
            rows.append(one(cmd, delay, a.procs, f"busy-{os.getpid()}-{r}-{delay:g}", a.own_session))
            print(f"round {r + 1} delay {delay:g} s: {rows[-1]['wall_s']:.1f} s (load {rows[-1]['load1']:.2f})",
                  flush=True)
    med = {d: statistics.median(x["wall_s"] for x in rows if x["delay"] == d) for d in delays}
    quiet = med.get(0.0)
    for d in delays:
        ratio = f", {med[d] / quiet:.2f}x quiet" if quiet else ""
        print(f"{'quiet' if d == 0 else f'load started {d:g} s before'}: median {med[d]:.1f} s{ratio}")
    print(json.dumps({"cmd": cmd, "procs": a.procs, "own_session": a.own_session, "runs": rows,
                      "median_s": {f"{d:g}": m for d, m in med.items()}}))


if __name__ == "__main__":
    main()
