#!/usr/bin/env python
"""Keep the CPU busy the way other people's torch jobs do: N processes, each multiplying 2000x2000 float matrices
in a loop with torch's default threads, for S seconds or until killed (docs/PERFORMANCE.md, "CPU threads on a
loaded machine").

    python benchmarks/cpu_load.py --procs 2 --seconds 600 &   # then time a run beside it; kill %1 when done
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import time


def spin(seconds: float) -> None:
    """One load process: torch.mm on 2000x2000 floats until `seconds` pass (torch's threads as it chooses them)."""
    import torch  # imported here, not by the parent: every process sets up its own OpenMP threads

    a, b = torch.rand(2000, 2000), torch.rand(2000, 2000)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.mm(a, b)


def main() -> None:
    """Start the processes, wait for them; SIGTERM or Ctrl-C stops them all."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=2, help="load processes (default 2)")
    p.add_argument("--seconds", type=float, default=3600, help="how long they run (default 3600)")
    args = p.parse_args()
    for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        os.environ.pop(name, None)  # the load is torch's defaults, whatever the shell that started it set
    procs = [mp.get_context("spawn").Process(target=spin, args=(args.seconds,), daemon=True)
             for _ in range(args.procs)]
    for proc in procs:
        proc.start()
    signal.signal(signal.SIGTERM, lambda *_: [proc.terminate() for proc in procs])
    print(f"cpu_load: {args.procs} processes (pids {' '.join(str(proc.pid) for proc in procs)}) for "
          f"{args.seconds:g} s", flush=True)
    try:
        for proc in procs:
            proc.join()
    except KeyboardInterrupt:
        for proc in procs:
            proc.terminate()


if __name__ == "__main__":
    main()
