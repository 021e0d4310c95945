"""The loader workers' fork server started warm (runner/data/workerstart.py, `start_server(..., warm=True)`): forked
from a process that has imported torch and the data source already (a search's warm segment, runner.sweep.warm),
in place of the new interpreter that multiprocessing starts and that imports them again: that took seconds of
every warm segment with loader workers on a loaded 2-core machine (docs/PERFORMANCE.md, "Search: warm segments").

Otherwise it is the server multiprocessing starts: multiprocessing's own start (its listener, its "alive" pipe, its
record of the server's pid) runs unchanged and only the exec of `python -c "from multiprocessing.forkserver import
main; main(...)"` becomes a fork that runs that same code. In the fork only stdio and the descriptors multiprocessing
passes stay open (a new interpreter has no others: holding the alive pipe's write end would keep the server from
ever seeing its parent go), and it ends without its parent's exit handlers (os._exit, as serverexit does)."""
from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterator

# the code multiprocessing runs in the new interpreter it starts for a fork server
SERVER_COMMAND = "from multiprocessing.forkserver import main"


@contextlib.contextmanager
def forking_spawn() -> Iterator[None]:
    """Meanwhile, multiprocessing's start of a fork server forks this process instead (other starts unchanged)."""
    from multiprocessing import util

    spawn = util.spawnv_passfds
    util.spawnv_passfds = functools.partial(_fork_or_spawn, spawn)
    try:
        yield
    finally:
        util.spawnv_passfds = spawn


def _fork_or_spawn(spawn: Callable[..., int], path: str, args: list[str], passfds: list[int]) -> int:
    """The fork server's command run in a fork of this process; anything else started by `spawn`. Its pid."""
    if args[-2:-1] != ["-c"] or not args[-1].startswith(SERVER_COMMAND):
        return spawn(path, args, passfds)
    for stream in (sys.stdout, sys.stderr):  # what this process buffered is written once, by this process
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _serve(args[-1], passfds)
    return pid


def _serve(command: str, passfds: list[int]) -> None:
    """In the fork: stdio and `passfds` open, nothing else; the server's command; its end without exit handlers."""
    code = 1
    try:
        gc.freeze()  # the parent's uncollected objects stay so here: their finalizers (a file's close) are its own
        _close_all_but({0, 1, 2, *passfds})
        from multiprocessing import forkserver

        # held by the parent's ensure_running as it forked; a worker forked from here starts with a free one
        forkserver._forkserver._lock = threading.Lock()
        # a new interpreter's `-c` main: each worker finds its parent's script there as it would (multiprocessing
        # imports it as __mp_main__), not this fork's copy of it, run only up to the fork
        sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(command, "<forkserver>", "exec"), {"__name__": "__forkserver__"})
        code = 0
    except SystemExit as e:  # the server's own end: its alive pipe closed
        code = e.code if isinstance(e.code, int) else 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _close_all_but(keep: set[int]) -> None:
    """Close every file descriptor of this process but those in `keep`."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: every possible one
        fds = list(range(os.sysconf("SC_OPEN_MAX")))
    for fd in fds:
        if fd not in keep:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(fd)
