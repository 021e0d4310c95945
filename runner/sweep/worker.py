"""One search worker: pick a job under ROOT's lock, train its trial to the rung, report, again, until the study is
done. No controller process: the journal (ROOT/study.journal) and the trial folders (ROOT/trial_N) are the state.

A job is marked taken in the journal (the trial's user attr `job`: rung epoch, worker host:pid, time) while the
decision's lock is held, so two workers never take the same job. A worker that wants a job and finds the lock held
queues a named pipe in ROOT/waiting and sleeps on it, trying the lock now and then; the holder decides the jobs of
its host's queued workers, one after another as each would have, and writes each its job (`serve`): hundreds of
workers asking at once wait for batches, not for hundreds of lock hand-overs. The journal is fsynced once per hold
of the lock, not per record. A worker stopped by a signal lets its trial save (tools/train.py exits 75), releases
the job (worker None) and exits 75: the next worker resumes the trial from its checkpoint, exactly. A worker that
died without releasing (SIGKILL, a lost node) is found out by its pid and that process's start time (same host) or
by its trial folder's lock and file times (another host); its job is then resumed the same way. Its trial's process
gets SIGTERM when the worker dies (it saves and exits 75), and the next worker waits for it to let go of the folder.
A segment killed by a signal no stop sent is resumed too (MAX_KILLS times in a row). The study is never closed: a
trial left waiting at a rung stays RUNNING (Optuna's state), so raising `trials` may still promote it.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
from runner.sweep.study import distributions, make_sampler, open_study, sync_written, trial_handle

LOCK = "search.lock"
POLL_S = 5.0  # how often a worker with nothing to do looks again while other workers train
# ROOT/waiting/host:pid:start:ticket: a named pipe, a worker queued for the lock; the holder writes it the job it
# decided for that worker (`serve`)
WAITING = "waiting"
# how often a queued worker tries the lock itself (between, it sleeps on its pipe); at 256 workers the tries take
# the lock ahead of the reports blocked on it (report p99 18 s); trying every 1 s with reports serving the queue
# was worse there (report p99 52 s: a report held the lock for its 16 decisions)
LOCK_TRY_S = 0.1
SERVED = ".served"  # the suffix of a queued worker's pipe once a holder wrote its job
SERVE_MAX = 16  # the most queued workers one holder decides for: its own segment and the reports queued wait that long
PID_REUSE_S = 10.0  # a live pid's start time is checked against its job's once the job is this old (`live`)
START_TTL_S = 1.0  # how long a worker trusts a live pid's start time it read from /proc (`_known_start`)
_STARTS: dict[int, tuple[int | None, float]] = {}  # pid -> (its start time, when read)
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
def locked(root: str, wait: bool = True) -> Iterator[bool]:
    """ROOT/search.lock held exclusively: one worker at a time reads the study, chooses and marks a job. Yields
    True once held; with `wait` False it yields False at once when another process holds it."""
    # fcntl.flock is exact on one machine and on NFSv4 / Lustre / GPFS with locking on; on old NFS (v2/v3 without
    # lockd) or a mount with `nolock` it only locks on this host, and two hosts could take one job
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, LOCK), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            try:
                sync_written()  # the decision's journal records on disk before the next decision reads them
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def worker_id() -> str:
    """This worker as host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def live(search: Search, trial: FrozenTrial, now: float | None = None, read: bool = True) -> bool:
    """True while the worker that took the trial's job is alive (or may be: another host's, recently); `read`
    False: a pid of this host whose start time is not known yet counts as its own (see `_known_start`)."""
    job = trial.user_attrs.get(asha.JOB) or {}
    host, _, pid = str(job.get("worker") or "").rpartition(":")
    if not pid.isdigit():
        return False  # released by a stopped worker
    if host == socket.gethostname():
        # the pid alone could be another process's by now (pids are reused): its start time must match too
        started = job.get("started")
        # a job taken moments ago: its pid is its worker's (a pid is reused only after the others have cycled), and
        # skipping /proc for it spares N workers starting at once N x N reads
        read = read and time.time() - float(job.get("since", 0)) > PID_REUSE_S
        return _pid_alive(int(pid)) and (started is None or _known_start(int(pid), read) in (None, started))
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


def _known_start(pid: int, read: bool = True) -> int | None:
    """process_start(pid), read again at most every START_TTL_S (None: unknown and not `read`). A take looks at
    every trial's worker twice, and reading /proc for 256 of them cost 10 ms under the lock: there the look reads
    none (read=False) and trusts what the look before the lock read; a pid reused meanwhile only delays its job's
    resume to a later look, it never makes a live worker's job look dead."""
    now = time.monotonic()
    cached = _STARTS.get(pid)
    if cached is None or now - cached[1] > START_TTL_S:
        if not read:
            return None if cached is None else cached[0]
        cached = _STARTS[pid] = (process_start(pid), now)
    return cached[0]


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
    """(the job this worker takes, or None; whether other workers still train), decided under the lock: by this
    worker, or for it by the worker that held the lock while it waited (`serve`)."""
    is_live = functools.partial(live, search)
    trials = study.get_trials(deepcopy=False)  # a look without the lock first: most polls find nothing to do,
    if search.schedule().next_job(trials, is_live) is None:  # and N idle workers would queue on it for that
        return None, asha.busy(trials, is_live)
    me = Taker(worker_id(), process_start(os.getpid()), str(time.monotonic_ns()))
    path = me.path(search.root)
    try:
        os.mkfifo(path)  # queued: the holder of the lock may decide this worker's job while it waits, and write it here
    except OSError:  # a file system without named pipes (some FUSE mounts): wait for the lock itself, unserved
        with locked(search.root):
            return decide(search, study, me)
    reply = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a holder writes only while this end is open (else ENXIO)
    try:
        while True:
            with locked(search.root, wait=False) as held:
                if held:
                    return _take_held(search, study, me, reply)
            served = _served(reply, LOCK_TRY_S)  # asleep until a holder writes (no CPU) or it is time to try again
            if served is not None:
                return served
    finally:
        os.close(reply)
        for name in (path, _served_path(path)):
            name.unlink(missing_ok=True)


def _take_held(search: Search, study: optuna.Study, me: Taker, reply: int) -> tuple[asha.Job | None, bool]:
    """take's part under the lock: a job served meanwhile, else this worker's own decision, then the queued
    workers' (`serve`)."""
    served = _served(reply, 0)
    if served is not None:
        return served
    me.path(search.root).unlink(missing_ok=True)  # before deciding: no holder serves it from now on
    job, others = decide(search, study, me)
    if job is not None:
        serve(search, study)
    return job, others


@dataclass(frozen=True)
class Taker:
    """A worker asking for a job: host:pid, its process start (a reused pid is not it), and a ticket naming this
    one request (ROOT/waiting/host:pid:start:ticket while it waits)."""

    worker: str
    started: int | None
    ticket: str

    def path(self, root: str) -> Path:
        """Its file in ROOT/waiting (the folder made if missing)."""
        folder = Path(root) / WAITING
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{self.worker}:{self.started}:{self.ticket}"


def decide(search: Search, study: optuna.Study, taker: Taker,
           is_live: Callable[[FrozenTrial], bool] | None = None) -> tuple[asha.Job | None, bool]:
    """The next job, marked taken by `taker`, or None and whether others train; under the lock. A job already
    marked for this request (by a holder that died before it wrote the reply) is that job."""
    trials = study.get_trials(deepcopy=False)  # again: another worker may have taken it meanwhile
    for trial in trials:
        job = trial.user_attrs.get(asha.JOB) or {}
        if trial.state == TrialState.RUNNING and job.get("ticket") == taker.ticket and job["worker"] == taker.worker:
            return asha.Job(trial.number, job["epoch"], "resume"), True
    is_live = is_live or functools.partial(live, search, read=False)  # /proc was read by the look before the lock
    job = search.schedule().next_job(trials, is_live)
    if job is None:
        return None, asha.busy(trials, is_live)
    if job.number is None:
        study.sampler = make_sampler(search, len(trials))
        job = asha.Job(study.ask(distributions(search)).number, job.epoch, job.why)
    mark(study, job.number, {"epoch": job.epoch, "worker": taker.worker, "started": taker.started,
                             "since": time.time(), "ticket": taker.ticket})
    return job, True


def serve(search: Search, study: optuna.Study) -> int:
    """Decide the jobs of this host's workers queued for the lock (ROOT/waiting), up to SERVE_MAX; how many.
    One holder deciding many jobs costs one lock hand-over and one fsync, where each worker deciding its own
    queued N decisions one after another (256 workers starting at once waited 24 s for the last)."""
    is_live = _remembered(functools.partial(live, search, read=False))
    count, tried = 0, set()
    while count < SERVE_MAX:
        queued = [q for q in _queued(Path(search.root) / WAITING) if q[0] not in tried]  # again: workers queue
        if not queued:                                                                     # while it serves
            break
        for path, taker in queued[:SERVE_MAX - count]:
            tried.add(path)
            served, more = _reply_to(search, study, path, taker, is_live)
            count += served
            if not more:  # nothing left to decide: the others queued are told so (one decision each, no ask)
                for path, taker in _queued(Path(search.root) / WAITING):
                    count += _reply_to(search, study, path, taker, is_live)[0]
                return count
    return count


def _reply_to(search: Search, study: optuna.Study, path: Path, taker: Taker,
              is_live: Callable[[FrozenTrial], bool]) -> tuple[bool, bool]:
    """Decide the queued `taker`'s job and write it to its pipe (a worker not listening is skipped): (whether it
    was served, whether jobs are left to decide)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: it is not listening (it just left, or died)
    except OSError:
        if not _pid_alive(int(taker.worker.rpartition(":")[2])):
            path.unlink(missing_ok=True)
        return False, True
    try:
        job, others = decide(search, study, taker, is_live)
        os.replace(path, _served_path(path))  # first: no other holder serves it again (its open end reads on)
        answer = {"others": others} if job is None else {"number": job.number, "epoch": job.epoch, "why": job.why}
        os.write(fd, (json.dumps(answer) + "\n").encode())  # nothing to do is an answer too: it stops waiting
        return True, job is not None
    finally:
        os.close(fd)


def _queued(folder: Path) -> list[tuple[Path, Taker]]:
    """This host's workers queued for the lock and not served yet."""
    host, out = socket.gethostname(), []
    for path in sorted(folder.glob(f"{host}:*")):
        pid, start, ticket = (path.name[len(host) + 1:].split(":") + ["", ""])[:3]
        if not path.name.endswith(SERVED) and pid.isdigit():
            out.append((path, Taker(f"{host}:{pid}", int(start) if start.isdigit() else None, ticket)))
        elif pid.isdigit() and not _pid_alive(int(pid)):
            path.unlink(missing_ok=True)  # served, then killed before it read its job (the job is resumed)
    return out


def _served_path(path: Path) -> Path:
    """Where a queued worker's pipe is moved once a holder wrote its job."""
    return path.with_name(path.name + SERVED)


def _remembered(is_live: Callable[[FrozenTrial], bool]) -> Callable[[FrozenTrial], bool]:
    """`is_live` asked once per trial and job: a batch of decisions would ask it of every trial for each (N x N;
    a worker that dies meanwhile is found by the next batch)."""
    seen: dict[tuple, bool] = {}

    def ask(trial: FrozenTrial) -> bool:
        """The first answer for this trial's current job."""
        job = trial.user_attrs.get(asha.JOB) or {}
        key = (trial.number, job.get("worker"), job.get("since"))
        if key not in seen:
            seen[key] = is_live(trial)
        return seen[key]
    return ask


def _served(reply: int, timeout: float) -> tuple[asha.Job | None, bool] | None:
    """What a holder wrote to this worker's pipe, as take's answer (the job or None, whether others train), waiting
    up to `timeout` seconds for it; None if nothing came."""
    if not select.select([reply], [], [], timeout)[0]:
        return None
    line = os.read(reply, 4096).split(b"\n")[0]  # one write below PIPE_BUF: whole; a second one (a holder that
    if not line:                                   # died before it moved the pipe, then the next) says the same
        time.sleep(timeout)  # a holder opened the pipe and died before it wrote: no spinning on that end of file
        return None
    got = json.loads(line)
    return (None, got["others"]) if "others" in got else (asha.Job(got["number"], got["epoch"], got["why"]), True)


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
