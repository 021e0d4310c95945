"""Imported only inside the loader workers' fork server (runner/data/workerstart.py puts it in the server's
preload), never by a run: when the run ends, the server leaves at once instead of tearing down an interpreter that
imported torch. That teardown took 1.3 s on a 2-core machine, and the server holds the run's stdout and stderr
meanwhile, so whoever reads the run's output to its end (a pipe, `| tee`, a sweep's log, subprocess.run) waited
that long after the run had exited (docs/PERFORMANCE.md, "Speed, second round"). Its workers end with os._exit
anyway, as multiprocessing ends every forked process, so they never run this."""
from __future__ import annotations

import atexit
import os
import sys


def _leave() -> None:
    """Flush what the server printed, then exit without the interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or missing: nothing left to lose
            pass
    os._exit(0)


atexit.register(_leave)
