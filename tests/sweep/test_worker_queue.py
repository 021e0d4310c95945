"""Workers queued for ROOT/search.lock: the holder decides a queued worker's job and that worker takes it without
waiting for the lock; a request decided by a holder that died before replying gets that job, not a second one; a
queued worker that died is dropped, not served; a new trial's records reach the disk with one fsync."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from runner.sweep import asha, worker
from runner.sweep.study import open_study
from tests.sweep.test_search import ROOT, fake_search
from tests.utils import env, wait_until

ASKER = """
import json, os, sys
from runner.sweep import worker
from runner.sweep.search import load_search
from runner.sweep.study import open_study
search = load_search(sys.argv[1])
study = open_study(search, create=False)
job, _ = worker.take(search, study)
print(json.dumps([job.number, job.epoch, job.why, os.getpid()]), flush=True)
"""


def me(ticket: str) -> worker.Taker:
    """This process as a worker asking for a job, request `ticket`."""
    return worker.Taker(worker.worker_id(), worker.process_start(os.getpid()), ticket)


def test_a_queued_worker_takes_the_job_the_holder_decided_while_the_lock_is_still_held(tmp_path):
    search = fake_search(tmp_path)
    with worker.locked(search.root):
        study = open_study(search)
    waiting = tmp_path / "out" / worker.WAITING
    with worker.locked(search.root):  # held until the asker has its job: it never gets the lock itself
        asker = subprocess.Popen([sys.executable, "-c", ASKER, search.sweep.path], stdout=subprocess.PIPE, text=True,
                                 cwd=ROOT, env=env())
        try:
            wait_until(lambda: waiting.is_dir() and any(waiting.iterdir()), asker, "the asker queued for the lock")
            mine, _ = worker.decide(search, study, me("holder"))
            assert worker.serve(search, study) == 1
            number, epoch, why, pid = json.loads(asker.communicate(timeout=60)[0])
        finally:
            asker.kill()
            asker.wait()
    assert (number, epoch, why) == (1, 1, "new") and mine.number == 0
    job = open_study(search, create=False).get_trials()[number].user_attrs[asha.JOB]
    assert job["worker"] == f"{socket.gethostname()}:{pid}" and job["epoch"] == 1
    assert not list(waiting.iterdir()), "the asker's pipe is left behind"


def test_a_request_already_decided_gets_that_job_and_a_new_request_a_new_one(tmp_path):
    search = fake_search(tmp_path)
    with worker.locked(search.root):
        study = open_study(search)
        first, _ = worker.decide(search, study, me("a"))
        again, _ = worker.decide(search, study, me("a"))  # the holder that decided it died before it replied
        other, _ = worker.decide(search, study, me("b"))
    assert (first.number, first.why) == (0, "new") and (again.number, again.epoch, again.why) == (0, 1, "resume")
    assert (other.number, other.why) == (1, "new") and len(study.get_trials()) == 2


def test_a_queued_worker_that_died_is_dropped_not_served(tmp_path):
    search = fake_search(tmp_path)
    with worker.locked(search.root):
        study = open_study(search)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = worker.Taker(f"{socket.gethostname()}:{dead.stdout.strip()}", 1, "t").path(search.root)
    os.mkfifo(path)  # its pipe, which nobody reads any more
    with worker.locked(search.root):
        assert worker.serve(search, study) == 0
    assert not path.exists() and study.get_trials() == []


def test_a_new_trial_is_one_fsync(tmp_path, monkeypatch):
    """Its records (the trial, its params, the job) are synced once, as the lock is let go (Optuna's backend
    synced each one: 3 ms apiece under the lock here)."""
    search = fake_search(tmp_path)
    with worker.locked(search.root):
        study = open_study(search)
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    job, _ = worker.take(search, study)
    assert job == asha.Job(0, 1, "new") and len(synced) == 1


def test_without_named_pipes_a_worker_waits_for_the_lock_itself(tmp_path, monkeypatch):
    """A ROOT on a file system that refuses mkfifo (some FUSE mounts): take still decides, under the lock."""
    search = fake_search(tmp_path)
    with worker.locked(search.root):
        study = open_study(search)

    def refused(path, *args):
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(worker.os, "mkfifo", refused)
    first, _ = worker.take(search, study)
    second, _ = worker.take(search, study)
    assert (first.number, first.why, second.number, second.why) == (0, "new", 1, "new")
    assert not (tmp_path / "out" / worker.WAITING).exists() or not list((tmp_path / "out" / worker.WAITING).iterdir())
