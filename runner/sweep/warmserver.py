"""A search worker's warm server (runner.sweep.warm), never a run:

    python -m runner.sweep.warmserver '["torch", ...]' WORKER_PID      (it dies with process WORKER_PID)

It prepares itself as tools/train.py does before torch loads (runner.process.startup: timm's own `import wandb` skipped,
malloc keeping freed memory, the CPU-thread choice in the environment before libgomp reads it), imports the
modules named, then for each request line on stdin ({"argv": [SCRIPT, ARGS...], "log": PATH}) forks a segment,
writes its pid, waits for it and writes its exit code (negative: the signal that ended it), one line each."""
from __future__ import annotations

import ctypes
import importlib
import json
import os
import runpy
import signal
import sys
import traceback

from runner.data.workerstart import STOP_SIGNALS, allow_warm_start
from runner.process.startup import prepare

PR_SET_PDEATHSIG = 1  # prctl(2)


def main() -> None:
    """Import, then serve one segment at a time until the worker closes stdin."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # held back (inherited too): each segment unblocks them
    prepare()
    for name in json.loads(sys.argv[1]):
        importlib.import_module(name)
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed by mistake goes to stderr, never into the replies
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _segment(request["argv"], request["log"], reply)
        reply.write(f"{pid}\n")
        reply.write(f"{os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}\n")
    os._exit(0)  # no teardown of an interpreter that imported torch


def _segment(argv: list[str], log: str, reply) -> None:
    """In the fork: stdin from /dev/null, output to `log`, bound to the server, the stop signals through; run."""
    code = 1
    try:
        server = os.getppid()
        reply.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        die_with(server)
        allow_warm_start()  # the run's loader fork server: a fork of this process, which has the imports
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # one sent meanwhile arrives now
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")  # tools/train.py ends the process itself (run_script)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _exit_code(code) -> int:
    """The process exit code Python gives SystemExit(code)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def die_with(parent: int, signum: int = signal.SIGTERM, libc=None) -> None:
    """Linux: get `signum` when process `parent` ends, and at once when it already has (`libc`: loaded already)."""
    if sys.platform.startswith("linux"):
        (libc or ctypes.CDLL(None, use_errno=True)).prctl(PR_SET_PDEATHSIG, signum)
        if os.getppid() != parent:
            os.kill(os.getpid(), signum)


if __name__ == "__main__":
    die_with(int(sys.argv[2]), signal.SIGKILL)
    main()
