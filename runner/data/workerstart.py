"""Where DataLoader workers start from: the fork server (DATA.WORKER_START forkserver), started once per process
and as early as the config is known, and the stop signals held back while worker processes start. Torch-free:
tools/train.py starts the server before it imports torch itself, so that the server's own import of torch and
the dataset's module (about 2 s of one core) runs beside the run's imports and set-up instead of after them
(docs/PERFORMANCE.md, "Speed, second round")."""
from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from runner.data.sources import source
from runner.process.threads import affinity_cpus

# The signals by which a run is asked to save and stop (runner.engine.signals): the main process answers them.
# SLURM, Kubernetes, systemd and `timeout` send them to every process of the job, workers included: a worker
# that died of one would fail the main process in the middle of its save.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """The stop signals held back in this thread (processes started meanwhile inherit that), then released:
    one that came meanwhile is handled then."""
    from multiprocessing import resource_tracker

    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        # multiprocessing's resource tracker (a forkserver's queues need it) starts now if not yet running, so
        # that it too holds SIGUSR1 back (it ignores SIGTERM and SIGINT itself); starting it unblocks SIGTERM
        # and SIGINT in this thread: block them again
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# imported in the server only, first and last: it skips timm's own import of wandb, and it leaves at once when
# the run ends (its interpreter's teardown held the run's output streams open for 1.3 s after the run had exited)
SERVER_START = "runner.process.serverstart"
SERVER_EXIT = "runner.process.serverexit"
SERVER_ONLY = (SERVER_START, SERVER_EXIT)


def start_server(preload: list[str], warm: bool = False) -> None:
    """Start this process's fork server now, importing `preload` once in it (not per worker); a no-op when it
    runs already (the preload of its first start stays). `warm`: fork it from this process where that is safe
    and saves the imports (see fork_ready), instead of starting a new interpreter."""
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload([SERVER_START, *preload, SERVER_EXIT])
    with stop_signals_held():  # the server and every worker it forks inherit them held back
        if warm and fork_ready(preload):
            from runner.process.serverfork import forking_spawn

            with forking_spawn():
                forkserver.ensure_running()
        else:
            forkserver.ensure_running()


# The process whose early start may fork its fork server from itself (allow_warm_start): a pid, so that a process
# forked from it later (a loader worker, the server itself) does not inherit the permission.
_warm_pid = 0


def allow_warm_start() -> None:
    """Let this process's early start (start_early) fork the loader workers' fork server from this process, which
    has imported torch and the data source already: a search's warm segment (runner.sweep.warmserver) does, as
    it begins. A cold run's server imports them beside the run's own imports instead."""
    global _warm_pid
    _warm_pid = os.getpid()


def _take_warm() -> bool:
    """Whether this process may fork its server warm now; the permission is used up (later starts, after the run
    has started threads or touched CUDA, start a new interpreter)."""
    global _warm_pid
    warm, _warm_pid = _warm_pid == os.getpid(), 0
    return warm


def fork_ready(preload: list[str]) -> bool:
    """Whether a fork of this process can be the fork server: some of `preload` imported already (else a fork
    saves nothing; the server imports the rest), CUDA not initialised (a forked child cannot use it, and the
    workers must not inherit it), and no other thread (a fork copies a lock another thread holds, never released
    in the child)."""
    import sys

    if not any(name in sys.modules for name in preload):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return False
    return threading.active_count() == 1


# How long the exit waits for the loader queues' feeder threads (each ends once its queue's last put is written)
FEEDER_WAIT_S = 3.0
_quiet_exit_pid = 0  # the process that registered quiet_exit (a forked child inherits the flag, not the finalizer)


def quiet_exit() -> None:
    """Have this process's exit wait for its loader queues' feeder threads; idempotent.

    A forkserver or spawn loader's queues hold named semaphores, registered with multiprocessing's resource
    tracker. When a loader is dropped, a garbage collection that a feeder thread happens to run can unlink them;
    a process that ends while that thread is between the unlink and telling the tracker makes the tracker print
    four lines of warnings on the run's stderr after it has exited (seen in CI on tools/predict.py). Queues are
    told to close at exit priority 10 (multiprocessing's own finalizers); this runs at 5: it turns automatic
    collection off for the rest of the exit, so no other thread starts one, and joins the feeder threads.
    """
    global _quiet_exit_pid
    if _quiet_exit_pid != os.getpid():
        from multiprocessing import util

        util.Finalize(None, _join_feeders, exitpriority=5)
        _quiet_exit_pid = os.getpid()


def _join_feeders() -> None:
    """Stop automatic garbage collection, then wait (FEEDER_WAIT_S at most) for the queues' feeder threads."""
    gc.disable()
    end = time.monotonic() + FEEDER_WAIT_S
    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread" and thread is not threading.current_thread():
            thread.join(max(0.0, end - time.monotonic()))


def cpu_share() -> tuple[int, int]:
    """(CPUs this process may use shared among the local ranks, the worker count DATA.NUM_WORKERS -1 takes)."""
    share = max(1, affinity_cpus() // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    return share, (max(1, min(8, share - 1)) if share > 1 else 0)


def start_early(cfg: Any) -> bool:
    """Start the fork server for the run's loader workers, where the config will have some: DATA.WORKER_START
    forkserver, a source with workers, DATA.NUM_WORKERS above 0 (or -1 with more than one CPU per local rank);
    forked from this process where allow_warm_start let it. Returns whether it started."""
    warm = _take_warm()
    src = source(cfg.DATA.NAME)
    workers = cfg.DATA.NUM_WORKERS > 0 or (cfg.DATA.NUM_WORKERS < 0 and cpu_share()[1] > 0)
    if cfg.DATA.WORKER_START != "forkserver" or src.in_process or not workers:
        return False
    start_server(["torch", *src.worker_modules], warm=warm)
    return True
