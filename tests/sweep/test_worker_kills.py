"""A search worker and its trial's process under kills: no orphan trains on after its worker, a busy folder is
waited for (never a FAIL), a stop while a segment starts releases the trial, a trial killed by a signal nobody
sent is resumed (a few times), a failed trial's error is its own segment's, a reused pid is not a live worker, and
trials left waiting at a rung are promoted when `trials` is raised. The trainer is tests/sweep/fake_train.py (no
torch) except where the trial's own stop matters."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from optuna.trial import TrialState

from runner.sweep import asha, worker
from runner.sweep.search import load_search
from runner.sweep.study import distributions, open_study, trial_handle
from tests.sweep.test_search import FAKE, ROOT, calls, fake_search, search_file
from tests.utils import env, is_alive, wait_until


def quiet(_line: str) -> None:
    """A worker's log, dropped."""


def trials_of(search):
    """The study's trials as the journal holds them now."""
    return open_study(search, create=False).get_trials()


def test_a_reused_pid_is_not_the_worker_that_took_the_job(tmp_path):
    search = fake_search(tmp_path)
    with worker.locked(search.root):
        study = open_study(search)
    trial = study.ask()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = socket.gethostname()
        started = worker.process_start(other.pid)
        assert started is not None
        for when, alive in ((started, True), (started - 1, False), (None, True)):  # None: a job of an older worker
            trial_handle(study, trial).set_user_attr(
                asha.JOB, {"epoch": 1, "worker": f"{host}:{other.pid}", "started": when, "since": 0})
            assert worker.live(search, study.get_trials()[0]) is alive, when
    finally:
        other.kill()
        other.wait()


def test_a_busy_folder_is_waited_for_and_never_failed(tmp_path, fake):
    """A killed worker's trial still holds its folder (saving): the next worker waits for it, then resumes it."""
    search = fake_search(tmp_path, trials=3)
    with worker.locked(search.root):
        study = open_study(search)
    number = study.ask(distributions(search)).number
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    worker.mark(study, number, {"epoch": 1, "worker": f"{socket.gethostname()}:{dead.stdout.strip()}", "since": 0})
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from runner.rundir.lock import RunLock; "
                               f"RunLock({search.trial_dir(number)!r}).acquire(); print('held', flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env=env())
    assert holder.stdout.readline().strip() == "held"
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if "is in use" in line:  # the worker waits: let the holder go (it exits, the OS drops the lock)
            holder.stdin.close()

    try:
        assert worker.run_worker(search, poll_s=0.1, log=log) == 0
    finally:
        holder.kill()
        holder.wait()
    assert any(f"trial {number}: " in x and "waiting for it to save and exit" in x for x in lines), lines
    trials = trials_of(search)
    assert not [t for t in trials if t.state == TrialState.FAIL], [t.user_attrs for t in trials]
    assert calls(Path(search.root))[f"trial_{number}"][0] == "1-1"


def test_a_busy_refusal_from_the_trial_releases_it(tmp_path, fake):
    """The folder taken between the look and the start (train.py's own refusal, exit 2): released, not failed."""
    search = fake_search(tmp_path, trials=3)
    with worker.locked(search.root):
        study = open_study(search)
    job = asha.Job(study.ask().number, 1, "new")
    log = Path(search.root) / "logs" / "trial_0.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"{worker.HEADER}start\n{search.trial_dir(0)} is in use by a running job (pid 1 on h); wait\n")
    worker.finish(search, study, job, 2)
    trial = trials_of(search)[0]
    assert trial.state == TrialState.RUNNING and trial.user_attrs[asha.JOB]["worker"] is None
    # under torchrun the rank's refusal is followed by torchrun's report, and torchrun exits 1
    report = "".join(f"torch.distributed.elastic: line {i}\n" for i in range(8))
    log.write_text(f"{worker.HEADER}start\n{search.trial_dir(0)} is in use by a running job (pid 1 on h)\n{report}")
    worker.mark(study, 0, {"epoch": 1, "worker": "h:1", "since": 0})
    worker.finish(search, study, job, worker._ranks_code(search, 0, 1, time.time()))
    trial = trials_of(search)[0]
    assert trial.state == TrialState.RUNNING and trial.user_attrs[asha.JOB]["worker"] is None


def test_a_killed_worker_leaves_no_orphan_and_its_rerun_finishes(tmp_path):
    """kill -9 of the worker: its trial's process gets SIGTERM (it would save and exit 75), and a re-run resumes."""
    path = search_file(tmp_path, "trials: 2\nseed: 1\n")
    script = ("import sys, time; from pathlib import Path; from runner.sweep import worker; "
              "from runner.sweep.search import load_search; "
              f"worker.TRAIN_PY = Path({str(tmp_path / 'slow_train.py')!r}); "
              "sys.exit(worker.run_worker(load_search(sys.argv[1]), poll_s=0.1))")
    # a trainer that announces itself, then trains until a SIGTERM ends it (exit 75, as tools/train.py saves)
    (tmp_path / "slow_train.py").write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n"
        "print('training', os.getpid(), flush=True)\n"
        "while True:\n    time.sleep(0.05)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log = tmp_path / "out" / "logs" / "trial_0.log"
    wait_until(lambda: log.exists() and "training" in log.read_text(), proc, "the trial's first line", 60)
    trainer = int(log.read_text().split("training ")[1].split()[0])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    end = time.monotonic() + 30
    while is_alive(trainer) and time.monotonic() < end:
        time.sleep(0.05)
    alive = is_alive(trainer)
    if alive:
        os.kill(trainer, signal.SIGKILL)
    assert not alive, "the trial's process outlived its worker"
    search = load_search(str(path))
    trial = trials_of(search)[0]
    assert trial.state == TrialState.RUNNING and not worker.live(search, trial)


def test_a_stop_of_the_group_while_a_segment_starts_releases_it(tmp_path):
    """SIGTERM to the whole job while the trial's process has no handler yet (it dies of the signal): the trial is
    released like a save (exit 75), with no error, and the next worker trains it on."""
    path = search_file(tmp_path, "trials: 3\nseed: 1\nasha: {eta: 3, min_epochs: 1}\n")
    script = ("import sys; from pathlib import Path; from runner.sweep import worker; "
              "from runner.sweep.search import load_search; "
              f"worker.TRAIN_PY = Path({str(FAKE)!r}); "
              "sys.exit(worker.run_worker(load_search(sys.argv[1]), poll_s=0.1))")
    run = subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, capture_output=True, text=True,
                         env=env(FAKE_GROUP_TERM="2"), start_new_session=True, timeout=120)
    assert run.returncode == 75, run.stdout + run.stderr
    search = load_search(str(path))
    trials = trials_of(search)
    assert not [t for t in trials if t.state == TrialState.FAIL], [t.user_attrs for t in trials]
    again = subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, capture_output=True, text=True,
                           env=env(), timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [t.state for t in trials_of(search)].count(TrialState.COMPLETE) == 1


def test_a_trial_killed_by_a_signal_is_resumed(tmp_path, fake):
    fake.setenv("FAKE_SIGNAL", f"{int(signal.SIGKILL)}:1:2")  # twice, then it trains
    search = fake_search(tmp_path, trials=3)
    assert worker.run_worker(search, poll_s=0.1, log=quiet) == 0
    trials = trials_of(search)
    assert not [t for t in trials if t.state == TrialState.FAIL], [t.user_attrs for t in trials]
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 1


def test_a_trial_killed_every_time_fails_with_why(tmp_path, fake):
    fake.setenv("FAKE_SIGNAL", f"{int(signal.SIGKILL)}:1:99")
    search = fake_search(tmp_path, trials=3)
    assert worker.run_worker(search, poll_s=0.1, log=quiet) == 0
    trials = trials_of(search)
    assert all(t.state == TrialState.FAIL for t in trials)
    assert trials[0].user_attrs["error"] == (
        f"killed by SIGKILL {worker.MAX_KILLS + 1} times in a row, before it printed anything")


def test_the_error_is_the_failed_segments_own(tmp_path, fake):
    """The segment before printed "paused after epoch 1"; the one that failed printed nothing."""
    fake.setenv("FAKE_EXIT", "1:3")
    search = fake_search(tmp_path, trials=3)
    assert worker.run_worker(search, poll_s=0.1, log=quiet) == 0
    failed = [t for t in trials_of(search) if t.state == TrialState.FAIL]
    assert failed and all(t.user_attrs["error"] == "exit 1, before it printed anything" for t in failed)
    assert "paused after epoch 1" in (Path(search.root) / "logs" / f"trial_{failed[0].number}.log").read_text()


def test_raising_trials_promotes_trials_left_waiting(tmp_path, fake):
    """3 trials (eta 3) promote their best; raised to 9, the top 3 of 9 at epoch 1 are promoted, whichever ran
    first: a trial that waited at the rung through the first study's end is one of them here."""
    asha_of = "seed: 13\nasha: {eta: 3, min_epochs: 1}\n"  # seed 13: trial 0 waits, then is in the top 3 of 9
    search = load_search(str(search_file(tmp_path, f"trials: 3\n{asha_of}")))
    assert worker.run_worker(search, poll_s=0.1, log=quiet) == 0
    waiting = {t.number for t in trials_of(search) if 3 not in t.intermediate_values}
    assert len(waiting) == 2
    more = load_search(str(search_file(tmp_path, f"trials: 9\n{asha_of}")))
    assert worker.run_worker(more, poll_s=0.1, log=quiet) == 0
    trials = trials_of(more)
    top = sorted(trials, key=lambda t: (-t.intermediate_values[1], t.number))[:3]
    assert waiting & {t.number for t in top}, "the precondition: a trial that waited is in the top 3 of 9"
    assert sorted(t.number for t in trials if 3 in t.intermediate_values) == sorted(t.number for t in top)
    assert all(t.state == TrialState.COMPLETE for t in top)


def test_torchruns_exit_1_is_read_as_the_ranks_meant_it(tmp_path):
    """torchrun exits 1 for any rank's failure: ranks that saved on a stop (run.json preempted since the segment
    began) are 75, a busy folder's refusal 2, anything else stays a failure."""
    search = fake_search(tmp_path, trials=3)
    trial = Path(search.trial_dir(0))
    trial.mkdir(parents=True)
    log = Path(search.root) / "logs" / "trial_0.log"
    log.parent.mkdir(parents=True)
    log.write_text(f"{worker.HEADER}start\nRuntimeError: boom\n")
    (trial / "run.json").write_text('{"status": "preempted"}')
    stale = time.time() + 60  # run.json older than the segment: an earlier segment's
    assert worker._ranks_code(search, 0, 1, stale) == 1
    assert worker._ranks_code(search, 0, 1, time.time() - 60) == worker.EXIT_PREEMPTED
    (trial / "run.json").unlink()
    log.write_text(f"{worker.HEADER}start\n{trial} is in use by a running job (pid 1 on h); wait\n")
    assert worker._ranks_code(search, 0, 1, time.time()) == worker.EXIT_USER
    assert worker._ranks_code(search, 0, 0, time.time()) == 0


def test_a_study_left_without_a_full_length_trial_finishes_its_best(tmp_path, fake):
    """Two of 3 trials fail at epoch 1, so rung 1's board (1 trial) never promotes: with the budget spent and
    nobody training, the best trial of the highest rung reached trains on to the full length."""
    fake.setenv("FAKE_FAIL_ABOVE", "0.003")
    search = load_search(str(search_file(tmp_path, "trials: 3\nseed: 4\nasha: {eta: 3, min_epochs: 1}\n")))
    lines: list[str] = []
    assert worker.run_worker(search, poll_s=0.1, log=lines.append) == 0
    trials = trials_of(search)
    states = [t.state for t in trials]
    assert states.count(TrialState.FAIL) == 2, [t.params for t in trials]  # the precondition
    assert states.count(TrialState.COMPLETE) == 1
    assert any(": finish, to epoch 3" in x for x in lines), lines


def test_a_writer_killed_holding_the_journal_lock_blocks_nobody(tmp_path):
    """The journal's lock is an flock: a worker SIGKILLed mid-append leaves nothing that makes the next writer wait
    (Optuna's symlink lock would be waited out for 30 s, with the search's lock held)."""
    from runner.sweep.study import FlockLock

    path = str(tmp_path / "study.journal")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from runner.sweep.study import FlockLock; "
                               f"FlockLock({path!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env())
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    lock = FlockLock(path)
    t0 = time.monotonic()
    assert lock.acquire() and time.monotonic() - t0 < 2.0
    lock.release()
