"""The run lock (runner/rundir/lock.py): one job per OUTPUT_DIR, its holder named in one format."""
from __future__ import annotations

import os
import signal

import pytest

from runner.errors import UserError
from runner.rundir.lock import RunLock, holder_text, is_holder_text, is_locked, refuse_if_locked
from runner.rundir.marker import is_our_run
from tests.utils import is_alive


def test_second_holder_is_refused_naming_the_first(tmp_path):
    first = RunLock(tmp_path / "run")
    first.acquire()
    try:
        assert is_locked(tmp_path / "run")
        text = (tmp_path / "run" / "run.lock").read_text()
        assert text == holder_text() and is_holder_text(text)
        for refused in (RunLock(tmp_path / "run").acquire, lambda: refuse_if_locked(tmp_path / "run")):
            with pytest.raises(UserError, match=rf"is in use by a running job \({text}\); wait for it"):
                refused()
    finally:
        first.release()
    assert not is_locked(tmp_path / "run")
    refuse_if_locked(tmp_path / "run")  # free again


def test_a_bare_lock_of_ours_marks_the_folder(tmp_path):
    lock = RunLock(tmp_path)
    lock.acquire()
    lock.release()
    assert is_our_run(tmp_path)  # a start-up that stopped before run.json: still ours
    for other in ("not ours\n", "pid x on host", ""):
        (tmp_path / "run.lock").write_text(other)
        assert not is_holder_text(other) and not is_our_run(tmp_path)


_ORPHANING = """
import os, sys, time
from runner.rundir.lock import RunLock
lock = RunLock(sys.argv[1])
lock.acquire()
child = os.fork()
if child == 0:  # a loader worker, say: it outlives the run that forked it
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(30)
    os._exit(0)
print("locked", child, flush=True)
os._exit(137)  # the run dies at once, as under SIGKILL
"""


def test_a_dead_runs_forked_children_do_not_hold_its_lock(tmp_path):
    """A requeue reruns at once: the killed run's orphaned workers must not keep OUTPUT_DIR locked."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _ORPHANING, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert "locked" in proc.stdout, proc.stderr
    orphan = int(proc.stdout.split()[-1])
    try:
        assert is_alive(orphan)
        lock = RunLock(tmp_path)
        lock.acquire()  # refused as 'in use by a running job' while the orphan held it
        lock.release()
    finally:
        os.kill(orphan, signal.SIGKILL)
