"""Warm segments: a search worker starts each one-process segment of a trial from a warm server, a process of its
own that imported torch, timm and the runner once (runner.sweep.warmserver), so a promotion costs the run's set-up
and its checkpoint load, not an interpreter and its imports (issue 47). Torch-free here.

The server starts with the worker (its imports run while the worker opens the study) and forks one segment at a
time on request: `python tools/train.py ARGS` as a fresh process would run it, its output appended to the trial's
log. A segment is a fresh fork: nothing one segment does is seen by the next, and a promoted trial still equals
its config trained straight. The server holds the stop signals back (a SIGTERM to the job's process group, from
scancel or a terminal, leaves it alive to report its segment's exit code); each segment lets them through first
thing. The server dies with the worker (PR_SET_PDEATHSIG), and a segment with the server: it gets SIGTERM, saves
and exits 75, as a segment started cold does when its worker dies. Under torchrun (--nproc above 1) segments start
cold: torchrun starts its own ranks. A segment's loader workers' fork server (DATA.NUM_WORKERS above 0) is a fork
of the segment too, made at tools/train.py's early start (runner.data.workerstart.allow_warm_start,
runner.process.serverfork), not a new interpreter that imports torch and the data source again.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

# what the server imports before its first fork (module names): what tools/train.py needs before its first step
PRELOAD = ["torch", "timm", "PIL.Image", "torch.utils.tensorboard", "runner.config", "runner.preflight",
           "runner.rundir.rules", "runner.rundir.envinfo", "runner.data", "runner.data.workerstart", "runner.engine",
           "runner.sinks.console", "runner.sinks.jsonl"]


def preload_for(data_name: str | None) -> list[str]:
    """PRELOAD and the modules of the data source DATA.NAME `data_name` (its own and its loader workers')."""
    from runner.data.sources import SOURCES

    src = SOURCES.get(data_name or "")
    return PRELOAD + ([src.module, *src.worker_modules] if src is not None else [])


class WarmServer:
    """The worker's side of its warm server: started once, asked for one segment at a time."""

    def __init__(self, preload: list[str] | None = None):
        """`preload`: the modules the server imports (default PRELOAD)."""
        self.preload = PRELOAD if preload is None else preload
        self.proc = None

    def start(self) -> None:
        """Start the server now unless it runs (again, if it died)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        from runner.data.workerstart import stop_signals_held

        cmd = [sys.executable, "-m", "runner.sweep.warmserver", json.dumps(self.preload), str(os.getpid())]
        with stop_signals_held():  # the server inherits them held back; each segment lets them through
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def segment(self, argv: list[str], log: Path) -> Segment:
        """Fork `python ARGV` (ARGV[0] the script) from the server, its output appended to `log`."""
        self.start()
        try:
            self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log)}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the server died: read_code says so
        return Segment(self.proc)

    def close(self) -> None:
        """Let the server go (it exits when its input closes)."""
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()


class Segment:
    """One segment forked from the server: what the worker's stop and wait need of a subprocess.Popen."""

    def __init__(self, server: subprocess.Popen):
        """Read the segment's pid from the server (None when the server died before forking it)."""
        self.server, self.code = server, None
        line = server.stdout.readline()
        self.pid = int(line) if line.strip().isdigit() else None
        if self.pid is None:
            self.code = -signal.SIGKILL  # lost with its server: resumed like a segment killed by a signal

    def poll(self) -> int | None:
        """Its exit code, or None while it runs."""
        return self.code

    def send_signal(self, signum: int) -> None:
        """Pass a stop signal on to it while it runs."""
        if self.code is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        """Wait for its end; its exit code (negative: the signal that killed it, or its server)."""
        if self.code is None:
            line = self.server.stdout.readline()
            self.code = int(line) if line.strip().lstrip("-").isdigit() else -signal.SIGKILL
        return self.code
