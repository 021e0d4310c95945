"""One search worker: pick a job under ROOT's lock, train its trial to the rung, report, again, until the study is
done. No controller process: the journal (ROOT/study.journal) and the trial folders (ROOT/trial_N) are the state.

A job is marked taken in the journal (the trial's user attr `job`: rung epoch, worker host:pid, time) while the
decision's lock is held, so two workers never take the same job. A worker stopped by a signal lets its trial save
(tools/train.py exits 75), releases the job (worker None) and exits 75: the next worker resumes the trial from its
checkpoint, exactly. A worker that died without releasing (SIGKILL, a lost node) is found out by its pid and that
process's start time (same host) or by its trial folder's lock and file times (another host); its job is then
resumed the same way. Its trial's process gets SIGTERM when the worker dies (it saves and exits 75), and the next
worker waits for it to let go of the folder. A segment killed by a signal no stop sent is resumed too (MAX_KILLS
times in a row). The study is never closed: a trial left waiting at a rung stays RUNNING (Optuna's state), so
raising `trials` may still promote it.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from runner.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_USER
from runner.rundir import reader
from runner.rundir.layout import LOCK as RUN_LOCK
from runner.rundir.layout import RUN_JSON
from runner.rundir.lock import IN_USE, is_locked
from runner.sweep import asha, warm, warmserver
from runner.sweep.search import Search
from runner.sweep.study import distributions, make_sampler, open_study, trial_handle

LOCK = "search.lock"
POLL_S = 5.0  # how often a worker with nothing to do looks again while other workers train
TAKE_GRACE_S = 300.0  # another host's job counts as alive this long after it was taken (start-up writes nothing)
TRAIN_PY = Path(__file__).resolve().parents[2] / "tools" / "train.py"
STOP_CODES = (EXIT_PREEMPTED, EXIT_INTERRUPTED)  # the trial saved (or was stopped): it resumes, the worker stops
HEADER = "=== "  # how each segment's header line in ROOT/logs/trial_N.log begins
BUSY_POLL_S = 0.2  # how often a worker waiting for a trial's folder (held by a killed worker's trial) looks again
# a segment killed by a signal no stop sent (the OOM killer, kill -9) is resumed this many times in a row, then FAIL
MAX_KILLS = 3
KILLS = "kills"  # trial user attr: its segments killed by a signal since its last rung value
# what each worker's warm server imports; None: warm.preload_for the trials' data source (the tests' torch-free
# trainer sets [])
WARM_PRELOAD: list[str] | None = None


@contextlib.contextmanager
def locked(root: str) -> Iterator[None]:
    """ROOT/search.lock held exclusively: one worker at a time reads the study, chooses and marks a job."""
    # fcntl.flock is exact on one machine and on NFSv4 / Lustre / GPFS with locking on; on old NFS (v2/v3 without
    # lockd) or a mount with `nolock` it only locks on this host, and two hosts could take one job
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, LOCK), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def worker_id() -> str:
    """This worker as host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def live(search: Search, trial: FrozenTrial, now: float | None = None) -> bool:
    """True while the worker that took the trial's job is alive (or may be: another host's, recently)."""
    job = trial.user_attrs.get(asha.JOB) or {}
    host, _, pid = str(job.get("worker") or "").rpartition(":")
    if not pid.isdigit():
        return False  # released by a stopped worker
    if host == socket.gethostname():
        # the pid alone could be another process's by now (pids are reused): its start time must match too
        started = job.get("started")
        return _pid_alive(int(pid)) and (started is None or process_start(int(pid)) in (None, started))
    now = time.time() if now is None else now
    return now - float(job.get("since", 0)) < TAKE_GRACE_S or reader.state(search.trial_dir(trial.number)) == "running"


def process_start(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat); None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return int(fields[19])  # starttime, field 22 of proc(5), counted after the command's closing parenthesis


def _pid_alive(pid: int) -> bool:
    """True when a process with this id exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def take(search: Search, study: optuna.Study) -> tuple[asha.Job | None, bool]:
    """(the job this worker takes, or None; whether other workers still train), decided under the lock."""
    is_live = functools.partial(live, search)
    trials = study.get_trials(deepcopy=False)  # a look without the lock first: most polls find nothing to do,
    if search.schedule().next_job(trials, is_live) is None:  # and N idle workers would queue on it for that
        return None, asha.busy(trials, is_live)
    with locked(search.root):
        trials = study.get_trials(deepcopy=False)  # again: another worker may have taken it meanwhile
        job = search.schedule().next_job(trials, is_live)
        if job is None:
            return None, asha.busy(trials, is_live)
        if job.number is None:
            study.sampler = make_sampler(search, len(trials))
            job = asha.Job(study.ask(distributions(search)).number, job.epoch, job.why)
        mark(study, job.number, {"epoch": job.epoch, "worker": worker_id(), "started": process_start(os.getpid()),
                                 "since": time.time()})
        return job, True


def mark(study: optuna.Study, number: int, job: dict | None) -> None:
    """Set (or clear, None) trial `number`'s job attr."""
    trial_handle(study, study.get_trials(deepcopy=False)[number]).set_user_attr(asha.JOB, job)


def command(search: Search, trial: FrozenTrial, epoch: int, nproc: int = 1) -> list[str]:
    """tools/train.py's command for the trial to the end of `epoch` (no pause at the full length); under torchrun
    with `nproc` processes (its own free rendezvous port) when nproc > 1."""
    launch = [sys.executable]
    if nproc > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    argv = [*launch, str(TRAIN_PY), *search.argv(trial.params, search.trial_dir(trial.number))]
    return argv if epoch >= search.rungs[-1] else [*argv, "--pause-after-epoch", str(epoch)]


def train(search: Search, trial: FrozenTrial, epoch: int, stop: StopRequest, log=print, nproc: int = 1,
          server: warm.WarmServer | None = None) -> int:
    """Run the trial's segment (forked from `server`, else a new process; output appended to
    ROOT/logs/trial_N.log); its exit code."""
    if not wait_free(search, trial.number, stop, log):
        return EXIT_PREEMPTED  # stopped while waiting: the job is released as a stop's
    path = _log_path(search, trial.number)
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = command(search, trial, epoch, nproc)
    with open(path, "ab") as out:  # appended, never truncated: the earlier segments' lines are the trial's record
        out.write(_log_header(trial.number, epoch, argv).encode())
        out.flush()  # before the child writes to the same file
        started = time.time()
        if server is None:  # a new process: under torchrun (it starts its own ranks) or --cold
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_bound_to(os.getpid()))
        else:
            proc = server.segment(argv[1:], path)
        stop.child = proc
        if stop.requested:  # a stop that came while the segment started (the warm server still importing)
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait()
        finally:
            stop.child = None
    return _ranks_code(search, trial.number, code, started) if nproc > 1 else code


def _ranks_code(search: Search, number: int, code: int, started: float) -> int:
    """torchrun's exit code as the ranks meant it: it exits 1 for any rank's failure, so a segment whose ranks
    saved and stopped (run.json `preempted`, written since `started`) is 75, and a busy folder's refusal 2."""
    if code <= 0:
        return code
    run = Path(search.trial_dir(number)) / RUN_JSON
    try:
        fresh = run.stat().st_mtime >= started and (reader.status(run.parent) or {}).get("status") == "preempted"
    except OSError:
        fresh = False
    if fresh:
        return EXIT_PREEMPTED
    return EXIT_USER if refused_busy(search, number) else code


def wait_free(search: Search, number: int, stop: StopRequest, log=print) -> bool:
    """Wait while another process holds the trial's folder (a killed worker's trial, saving before it exits);
    False when this worker is stopped meanwhile."""
    folder = search.trial_dir(number)
    said = False
    while is_locked(folder):
        if stop.requested:
            return False
        if not said:
            holder = (Path(folder) / RUN_LOCK).read_text(errors="replace").strip() or "another process"
            log(f"search: trial {number}: {folder} is in use ({holder}); waiting for it to save and exit")
            said = True
        time.sleep(BUSY_POLL_S)
    return True


def _bound_to(parent: int):
    """A preexec_fn that makes the trial's process get SIGTERM when the worker `parent` dies (Linux's
    PR_SET_PDEATHSIG), so a killed worker leaves no orphan training on: the trial saves and exits 75, as a rank
    does when torchrun is gone. None where there is no prctl."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child between fork and exec should only call it
    return functools.partial(warmserver.die_with, parent, signal.SIGTERM, libc)


def _log_header(number: int, epoch: int, argv: list[str]) -> str:
    """The line that opens one segment's output in the trial's log: when, which segment, which worker, what."""
    when = time.strftime("%Y-%m-%d %H:%M:%S %z")
    return f"{HEADER}{when} start trial {number} to epoch {epoch}, worker {worker_id()}: {shlex.join(argv)}\n"


def _log_path(search: Search, number: int) -> Path:
    """ROOT/logs/trial_N.log: what the trial's segments printed, appended."""
    return Path(search.root) / "logs" / f"trial_{number}.log"


def rung_value(search: Search, number: int, epoch: int) -> float | None:
    """The metric of the evaluation at the end of `epoch`, from the trial's metrics.jsonl (None: not there)."""
    metrics = reader.read_metrics(search.trial_dir(number))
    rows = [r for r in (metrics.rows if metrics else []) if r.get("epoch") == epoch and search.metric in r]
    return float(rows[-1][search.metric]) if rows else None


def finish(search: Search, study: optuna.Study, job: asha.Job, code: int, stopping: bool = False) -> None:
    """Record a segment's end under the lock: its rung value, COMPLETE at the last rung, FAIL, or released
    (`stopping`: this worker was asked to stop while the segment ran)."""
    with locked(search.root):
        trial = trial_handle(study, study.get_trials(deepcopy=False)[job.number])
        if _released(search, job, code, stopping):
            mark(study, job.number, {"epoch": job.epoch, "worker": None, "since": time.time()})
            return
        if code < 0 and int(trial.user_attrs.get(KILLS, 0)) < MAX_KILLS:
            trial.set_user_attr(KILLS, int(trial.user_attrs.get(KILLS, 0)) + 1)  # resumed from its checkpoint
            mark(study, job.number, {"epoch": job.epoch, "worker": None, "since": time.time()})
            return
        value = rung_value(search, job.number, job.epoch) if code == 0 else None
        if value is None:
            trial.set_user_attr("error", _error_text(search, job, code))
            trial.set_user_attr(asha.JOB, None)
            study.tell(job.number, state=TrialState.FAIL)
            return
        trial.report(value, step=job.epoch)
        trial.set_user_attr(asha.JOB, None)
        if trial.user_attrs.get(KILLS):
            trial.set_user_attr(KILLS, 0)
        if job.epoch >= search.rungs[-1]:
            study.tell(job.number, value)


def _released(search: Search, job: asha.Job, code: int, stopping: bool) -> bool:
    """True when the segment's end is no verdict on the trial: it saved and stopped (75, 130), a stop signal
    ended it while it was starting, or its folder was still held by another process (it waits, then resumes)."""
    if code in STOP_CODES or (code < 0 and stopping):
        return True
    return code == EXIT_USER and refused_busy(search, job.number)


def refused_busy(search: Search, number: int) -> bool:
    """Whether the trial's latest segment was refused because another process held its folder (under torchrun the
    rank's line is followed by torchrun's own report, so any line of the segment counts, not only the last)."""
    return any(IN_USE in line for line in segment_lines(search, number))


def segment_lines(search: Search, number: int) -> list[str]:
    """The non-empty lines the trial's latest segment printed (after its header in ROOT/logs/trial_N.log)."""
    try:
        text = _log_path(search, number).read_text(errors="replace")
    except OSError:
        return []
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith(HEADER)]
    return lines[starts[-1] + 1:] if starts else lines


def _error_text(search: Search, job: asha.Job, code: int) -> str:
    """Why a segment failed, in one line: the exit code and the last line that segment printed."""
    if code == 0:
        return f"exit 0 but no {search.metric} at epoch {job.epoch} in metrics.jsonl"
    how = f"exit {code}" if code > 0 else f"killed by {_signal_name(-code)} {MAX_KILLS + 1} times in a row"
    lines = segment_lines(search, job.number)
    return f"{how}: {lines[-1][:200]}" if lines else f"{how}, before it printed anything"


def _signal_name(number: int) -> str:
    """SIGKILL for 9; the number where it names no signal."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def progress(search: Search, trials: list[FrozenTrial], job: asha.Job) -> str:
    """One line after a segment: what the trial reached (its rank at that rung) and how far the study is."""
    trial = trials[job.number]
    value = trial.intermediate_values.get(job.epoch)
    if trial.state == TrialState.FAIL:
        what = f"failed ({trial.user_attrs.get('error', '')})"
    elif value is None:
        what = f"stopped before epoch {job.epoch} (it resumes)"
    else:
        board = asha.ranked(trials, job.epoch, search.maximize)
        rank = [t.number for t in board].index(trial.number) + 1
        what = f"{search.metric} {value:.4f} at epoch {job.epoch} ({rank} of {len(board)} there)"
    done = sum(t.state == TrialState.COMPLETE for t in trials)
    return f"search: trial {job.number}: {what}; {len(trials)} of {search.trials} trials started, {done} done"


class StopRequest:
    """SIGTERM, SIGUSR1 or Ctrl-C: the worker takes no new job; SIGTERM and SIGUSR1 are passed to the trial."""

    def __init__(self) -> None:
        self.requested, self.child = False, None

    def install(self) -> None:
        """Take over the three signals (the trial's own process saves on them and exits 75)."""
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        """Note it; pass SIGTERM/SIGUSR1 on (a second one is harmless to train.py; Ctrl-C reaches the group)."""
        self.requested = True
        child = self.child
        if child is not None and signum != signal.SIGINT and child.poll() is None:
            child.send_signal(signum)


def run_worker(search: Search, poll_s: float = POLL_S, log=print, nproc: int = 1, cold: bool = False) -> int:
    """Take and train jobs until the study is done (0) or a signal stops this worker (75); each segment under
    torchrun with `nproc` processes when nproc > 1 (give every worker of a study the same count: the global
    batch is DATA.BATCH_SIZE x processes), else forked from this worker's warm server (unless `cold`)."""
    stop = StopRequest()
    stop.install()
    server = warm.WarmServer(_preload(search)) if nproc == 1 and not cold else None
    if server is not None:
        server.start()  # its imports run while this worker opens the study and takes its first job
    try:
        study = open_study(search, create=False)  # a read, outside the lock: N workers starting need not queue
        if study is None:
            with locked(search.root):  # made once, by the first worker
                study = open_study(search)
        return _work(search, study, stop, poll_s, log, nproc, server)
    finally:
        if server is not None:
            server.close()


def _preload(search: Search) -> list[str]:
    """What the worker's warm server imports: WARM_PRELOAD, else PRELOAD and the trials' data source's modules."""
    import yaml

    if WARM_PRELOAD is not None:
        return list(WARM_PRELOAD)
    name = search.base.get("DATA.NAME")
    return warm.preload_for(yaml.safe_load(name) if name else None)


def _work(search: Search, study: optuna.Study, stop: StopRequest, poll_s: float, log, nproc: int,
          server: warm.WarmServer | None) -> int:
    """run_worker's loop: take a job, train its segment, record it; until done (0) or stopped (75)."""
    while not stop.requested:
        job, others = take(search, study)
        if job is None and not others:
            return 0  # trials waiting at a rung stay RUNNING: raising `trials` may still promote them
        if job is None:
            time.sleep(poll_s)
            continue
        trial = study.get_trials(deepcopy=False)[job.number]
        log(f"search: trial {job.number}: {job.why}, to epoch {job.epoch} ({search.trial_dir(job.number)})")
        code = train(search, trial, job.epoch, stop, log, nproc, server)
        finish(search, study, job, code, stop.requested)
        log(progress(search, study.get_trials(deepcopy=False), job))
        if code in STOP_CODES or stop.requested:
            return EXIT_PREEMPTED
    return EXIT_PREEMPTED
