"""The hang watchdog and errors from any rank, passed through the process group's store, never a collective.

Every rank runs a daemon thread. Each tick it writes this rank's heartbeat to the store; rank 0 reads the
failures other ranks post there, the other ranks read the verdict rank 0 posts. The loop reports progress
from `after_step` with plain Python stores (no tensor is read, so no host sync). When no optimizer step
completes for DIST.HANG_TIMEOUT_S, each live rank writes every thread's stack to OUTPUT_DIR/hang/rank<r>.txt
(faulthandler); the reporting rank (rank 0, or the lowest live rank when rank 0 itself froze) names the ranks
whose heartbeat stopped, marks run.json `hung` and ends the job with exit 76. A hung collective cannot be
interrupted: once its files are flushed the process ends with os._exit, and a frozen rank on the same host
is killed so that nothing is left behind (torchrun would wait 30 s before killing it).
"""
from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from functools import partial
from pathlib import Path

from runner import distributed
from runner.distributed import Dist
from runner.engine.hooks import Hook, RunState
from runner.errors import EXIT_HUNG, EXIT_PREEMPTED, EXIT_USER, Hung, Preempted, UserError, describe
from runner.rundir import marker
from runner.rundir.layout import HANG
from runner.sinks import log_to_file

log = logging.getLogger("runner")

TICK = 1.0  # seconds between heartbeats
SETUP_ALLOWANCE = 600.0  # before this process's first step (set-up, resume, the first batch) the limit is at least this
AUTO_MIN, AUTO_FACTOR = 300.0, 20  # DIST.HANG_TIMEOUT_S -1: max(AUTO_MIN, AUTO_FACTOR x the slowest step so far)
VERDICT_WAIT = 15.0  # how long a non-zero rank waits for rank 0 to answer before presuming rank 0 frozen
_P = "runner/watchdog/"
_RETIRED = "retired"  # the heartbeat of a rank whose run ended (it may exit before the others)


class JobBoard:
    """Heartbeats, failures and the verdict, under one prefix of the job's store (it answers during a hang)."""

    def __init__(self, store, rank: int, world: int):
        self.store, self.rank, self.world = store, rank, world
        self.me = f"{socket.gethostname()} {os.getpid()}"
        self.seq = 0

    def beat(self, step: int) -> None:
        """This rank is alive (and at `step`): a new heartbeat."""
        self.seq += 1
        self.store.set(f"{_P}hb/{self.rank}", f"{self.seq} {step} {self.me}")

    def heartbeats(self) -> dict[int, list[str]]:
        """Every rank's latest heartbeat, [seq, step, host, pid], for the ranks that wrote one."""
        beats = {}
        for r in range(self.world):
            key = f"{_P}hb/{r}"
            if self.store.check([key]):
                beats[r] = self.store.get(key).decode().split()
        return beats

    def retire(self) -> None:
        """This rank's watchdog stopped with its run: no heartbeat any more, and not a frozen rank."""
        self.store.set(f"{_P}hb/{self.rank}", _RETIRED)

    def beat_of(self, rank: int) -> str | None:
        """`rank`'s latest heartbeat as written, None before its first beat."""
        key = f"{_P}hb/{rank}"
        return self.store.get(key).decode() if self.store.check([key]) else None

    def frozen(self, window: float, tick: float, step: int) -> tuple[list[int], dict[int, list[str]]]:
        """The ranks whose heartbeat does not move for `window` seconds (this one beats meanwhile); the last beats."""
        before = self.heartbeats()
        end = time.monotonic() + window
        while time.monotonic() < end:
            self.beat(step)
            time.sleep(tick)
        after = self.heartbeats()
        frozen = [r for r in range(self.world) if r not in after or before.get(r, [""])[0] == after[r][0]]
        return [r for r in frozen if after.get(r) != [_RETIRED]], after

    def post_failure(self, code: int, line: str, trace: str = "") -> None:
        """This rank is ending with `code`: its one line (and a crash's traceback), for rank 0 to report."""
        if trace:  # before the line: rank 0 reads the traceback once it sees the failure
            self.store.set(f"{_P}trace/{self.rank}", trace[-20000:])
        self.store.set(f"{_P}fail/{self.rank}", f"{code}\t{line}")
        self.store.add(f"{_P}failures", 1)

    def trace(self, rank: int) -> str:
        """The traceback `rank` posted with its failure, or ''."""
        key = f"{_P}trace/{rank}"
        return self.store.get(key).decode(errors="replace") if self.store.check([key]) else ""

    def failures(self) -> list[tuple[int, int, str]]:
        """(rank, exit code, line) of every rank that posted a failure; one counter read when there is none."""
        if self.store.add(f"{_P}failures", 0) == 0:
            return []
        found = []
        for r in range(self.world):
            key = f"{_P}fail/{r}"
            if self.store.check([key]):
                code, line = self.store.get(key).decode().split("\t", 1)
                found.append((r, int(code), line))
        return found

    def post_verdict(self, code: int, text: str) -> None:
        """The job ends with `code`: every rank follows."""
        self.store.set(f"{_P}verdict", f"{code}\t{text}")
        self.store.add(f"{_P}verdicts", 1)

    def verdict(self) -> tuple[int, str] | None:
        """(exit code, text) once a verdict is posted, else None."""
        if self.store.add(f"{_P}verdicts", 0) == 0:
            return None
        code, text = self.store.get(f"{_P}verdict").decode().split("\t", 1)
        return int(code), text

    def await_verdict(self, seconds: float, tick: float, step: int) -> tuple[int, str] | None:
        """Wait up to `seconds` for the verdict, beating meanwhile (a waiting rank is not a frozen one)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            found = self.verdict()
            if found is not None:
                return found
            self.beat(step)
            time.sleep(tick)
        return self.verdict()


def job_board(dist: Dist) -> JobBoard | None:
    """The JobBoard of this job's process group, or None in a single process."""
    store = distributed.job_store()
    return None if store is None else JobBoard(store, dist.rank, dist.world_size)


def relay_failure(error: BaseException) -> None:
    """Before a failing rank exits: post its line so that the whole job ends now (rank 0 reports it)."""
    store = distributed.job_store()
    if store is None or isinstance(error, (Preempted, Hung, KeyboardInterrupt, SystemExit)):
        return
    board = JobBoard(store, *distributed.rank_and_world())
    code, line = describe(error)
    try:
        if board.rank == 0:
            board.post_verdict(code, f"rank 0: {line}")
        else:  # exiting before rank 0 has read it would break its collective first, with a traceback of its own
            ended = board.verdict()
            if ended is not None:  # the job already ended (rank 0 reported a hang): this error is its echo
                _exit(ended[0])
            # rank 0 exits once it has reported this line, and torchrun then SIGTERMs this rank: the signal ends
            # it quietly with its own code (ignored, it was lost, and the rank spoke a second line 20 s later)
            signal.signal(signal.SIGTERM, lambda *_: _exit(code))
            trace = "" if code in (EXIT_USER, EXIT_PREEMPTED) else "".join(traceback.format_exception(error))
            board.post_failure(code, line, trace)
            if board.await_verdict(VERDICT_WAIT, 0.1, -1) is not None:
                error.relayed = True  # rank 0 reports the job's failure: this rank prints nothing more
    except Exception:  # the store is gone: the job is ending anyway
        pass


class Watchdog(Hook):
    """Ends a job whose optimizer steps stopped, and relays the failures of other ranks (see the module)."""

    def __init__(self, timeout: float, out: Path, dist: Dist, board: JobBoard | None, status=None, *,
                 tick: float = TICK, setup_allowance: float = SETUP_ALLOWANCE, compiled_eval: bool = False):
        """`timeout`: seconds, -1 auto, 0 off (the thread then only relays failures); `status`: RunStatus;
        `compiled_eval`: MODEL.COMPILE (the first evaluation batch compiles: the set-up allowance)."""
        self.timeout, self.out, self.dist, self.board, self.status = timeout, Path(out), dist, board, status
        self.tick, self.setup_allowance = tick, setup_allowance
        self.last = time.monotonic()  # the latest progress; written by the loop's thread only
        self.step = 0
        self.stepped = False  # a step completed in this process
        self.fresh = True  # the next gap follows set-up or an epoch's start: not a step time
        self.paused = False  # evaluation, checkpoints: not a hang however long, unless an evaluation batch stalls
        self.evaluating = False  # in an evaluation (paused): each batch must come within eval_limit()
        self.evaluated, self.compiled_eval = False, compiled_eval  # an evaluation batch completed in this process
        self.slowest, self.dumped = 0.0, False
        self.seen: dict[int, tuple[str | None, float]] = {}  # while paused: rank -> (heartbeat, when it last moved)
        self.ending = threading.Lock()  # one report, whichever thread finds the hang first
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.resumer = _Resume(self)
        # torchrun's agent hosts the job's store: once it is gone, every use of the store prints C++ warnings
        self.agent = os.getppid() if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else None

    # ---- the loop's side: plain stores, no tensor read ---------------------------------------------------
    def share(self, run: RunState) -> None:
        """Offer the clock evaluation passes tick (a stalled batch hangs) and the pause of waits for a write."""
        run.progress, run.hold = self.progress, partial(paused_while_waiting, self)

    def after_step(self, trainer) -> None:
        """Progress; the hooks that follow (a checkpoint) are paused until the resumer runs."""
        now = time.monotonic()
        if self.fresh:
            self.fresh = False
        else:
            self.slowest = max(self.slowest, now - self.last)
        self.last, self.step, self.stepped, self.paused = now, trainer.step, True, True

    def before_epoch(self, trainer) -> None:
        """An epoch starts (its first batch is not a step time)."""
        self.step, self.fresh = trainer.step, True
        self.resume()

    def after_epoch(self, trainer) -> None:
        """The epoch's evaluation and checkpoint are no hang, however long (but see progress)."""
        self.paused = True

    def progress(self, done: bool = False) -> None:
        """An evaluation pass started or one of its batches is done (a plain store, no tensor read): the next
        one must come within eval_limit(), or the run is hung (a loader's worker stuck); `done`: its last."""
        self.evaluated = self.evaluated or self.evaluating
        self.last, self.evaluating = time.monotonic(), not done

    def after_train(self, trainer) -> None:
        """The run's results are written: nothing left to watch."""
        self.paused = True

    def on_exception(self, trainer, error: BaseException) -> None:
        """A collective that timed out is a hang: named in one line, exit 76, not a gloo traceback."""
        if self.board is None or isinstance(error, (UserError, Preempted, KeyboardInterrupt)):
            return
        if _timed_out(error):
            log_to_file("".join(traceback.format_exception(error)).rstrip())
            self._hang(f"a collective waited DIST.TIMEOUT_S and gave up after step {self.step}")

    def close(self, trainer) -> None:
        """Stop the thread."""
        self.stop()

    def resume(self) -> None:
        """Watch again, from now."""
        self.last, self.paused, self.evaluating = time.monotonic(), False, False

    # ---- the thread ------------------------------------------------------------------------------------
    def limit(self) -> float:
        """Seconds without a step that make a hang: the timeout (or auto), at least SETUP_ALLOWANCE before step 1."""
        base = self.timeout if self.timeout > 0 else max(AUTO_MIN, AUTO_FACTOR * self.slowest)
        return base if self.stepped else max(base, self.setup_allowance)

    def eval_limit(self) -> float:
        """Seconds an evaluation batch may take: as a step, with the set-up allowance for the first one when it
        compiles the model (its loader's workers start within the step's limit)."""
        first = self.compiled_eval and not self.evaluated
        return max(self.limit(), self.setup_allowance) if first else self.limit()

    def start(self) -> None:
        """Start the thread (not in a single process with the watchdog off)."""
        if self.timeout == 0 and self.board is None:
            return
        self.last = time.monotonic()
        if self.board is not None:  # beat now, not a tick later: a rank frozen in its first second (set-up is quick)
            try:  # would have no heartbeat, so rank 0 could not know its pid to kill it
                self.board.beat(self.step)
            except Exception as e:  # the store went away: the thread keeps watching this rank alone
                log.debug("watchdog: store unavailable (%s)", e)
        self.thread = threading.Thread(target=self._run, name="runner-watchdog", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """End the thread (the run is over); the other ranks then no longer wait for this one's heartbeat."""
        self.stopped.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=5 * self.tick)
        if self.board is not None and not self.store_gone():
            try:
                self.board.retire()
            except Exception:  # the store is gone: the job is over
                pass

    def store_gone(self) -> bool:
        """True once the launcher that hosted the job's store is gone (this process was re-parented)."""
        return self.agent is not None and os.getppid() != self.agent

    def _run(self) -> None:
        """Each tick: heartbeat and messages, then the hang check."""
        while not self.stopped.wait(self.tick):
            if self.board is not None and self.store_gone():
                self.board = None  # the ranks' own collectives still work: they save and stop (LauncherWatch)
            if self.board is not None:
                try:
                    self._exchange()
                except Exception as e:  # the store went away (the job is ending): keep watching this rank alone
                    log.debug("watchdog: store unavailable (%s)", e)
            if self.timeout != 0 and not self.paused and time.monotonic() - self.last > self.limit():
                self._hang()
            if self.timeout != 0 and self.paused and self.evaluating and \
                    time.monotonic() - self.last > self.eval_limit():
                self._hang(f"no evaluation batch for {self.eval_limit():.0f} s in the evaluation after step "
                           f"{self.step} (DIST.HANG_TIMEOUT_S)")
            if self.timeout != 0 and self.paused and self.board is not None:
                if self._silent_for(self.limit()):
                    self._hang(f"no heartbeat for {self.limit():.0f} s during the evaluation or checkpoint after "
                               f"step {self.step} (DIST.HANG_TIMEOUT_S)")
            else:
                self.seen.clear()  # a later pause starts its own clock

    def _exchange(self) -> None:
        """Heartbeat; rank 0 reads the failures posted, the others the verdict."""
        self.board.beat(self.step)
        if self.dist.is_main:
            failures = self.board.failures()
            if failures:
                self._relay(failures)
        else:
            verdict = self.board.verdict()
            if verdict is not None:
                if verdict[0] == EXIT_HUNG:
                    self._dump()
                _exit(verdict[0])

    def _silent_for(self, limit: float) -> bool:
        """Paused: True once a watched rank's heartbeat has not moved for `limit` s (rank 0 watches every
        rank, the others rank 0: store reads that do not grow with the job on every rank)."""
        watched = [r for r in range(self.dist.world_size) if r != self.dist.rank] if self.dist.is_main else [0]
        now = time.monotonic()
        try:
            beats = {r: self.board.beat_of(r) for r in watched}
        except Exception:  # the store went away: the job is ending
            return False
        for r, beat in beats.items():
            if beat == _RETIRED:
                self.seen.pop(r, None)
            elif r not in self.seen or self.seen[r][0] != beat:
                self.seen[r] = (beat, now)
        return any(now - since > limit for _, since in self.seen.values())

    def _relay(self, failures: list[tuple[int, int, str]]) -> None:
        """Rank 0: another rank failed (its line is reported, the job exits with its code) or saw a hang."""
        errors = [f for f in failures if f[1] != EXIT_HUNG]
        if not errors:
            self._hang(f"rank {failures[0][0]} saw {failures[0][2]}")
            return
        rank, code, line = errors[0]
        text = f"rank {rank}: {line}"
        self.board.post_verdict(code, text)
        if self.status is not None:  # 75: a rank's data server stayed down; the job reruns like a preempted one
            status = marker.PREEMPTED if code == EXIT_PREEMPTED else marker.FAILED
            self.status.write(status, self.step, error=text[:500], rank=rank)
        trace = self.board.trace(rank)
        trace = f"\nrank {rank}'s traceback:\n{trace.rstrip()}" if trace else ""
        log_to_file(f"error at step {self.step}: {text}{trace}")
        print(f"error: {text}" if code == EXIT_USER else text, file=sys.stderr, flush=True)
        _exit(code)

    def silent_ranks(self) -> list[int]:
        """Rank 0, failing itself: the other ranks whose heartbeat stopped (a rank that died without a word
        breaks rank 0's next collective, and rank 0's own error would otherwise take the blame)."""
        if self.board is None:
            return []
        try:
            frozen, _ = self.board.frozen(max(3 * self.tick, 2.0), self.tick, self.step)
        except Exception:  # the store went with the dead rank: nothing more to learn
            return []
        return [r for r in frozen if r != self.dist.rank]

    def _hang(self, cause: str = "") -> None:
        """No step for too long (or `cause`): stacks, the frozen ranks, run.json, exit 76 (every rank follows)."""
        if not self.ending.acquire(blocking=False):  # the other thread is reporting it and will end the process
            threading.Event().wait()
        limit = self.limit()
        cause = cause or f"no optimizer step for {limit:.0f} s after step {self.step} (DIST.HANG_TIMEOUT_S)"
        self._dump()
        frozen, beats = [], {}
        if self.board is not None:
            if not self.dist.is_main:
                self.board.post_failure(EXIT_HUNG, cause)
                if self.board.await_verdict(VERDICT_WAIT, self.tick, self.step) is not None:
                    _exit(EXIT_HUNG)  # rank 0 reported it
            frozen, beats = self.board.frozen(max(3 * self.tick, 2.0), self.tick, self.step)
            live = [r for r in range(self.dist.world_size) if r not in frozen]
            if live and live[0] != self.dist.rank:
                _exit(EXIT_HUNG)
        text = (f"hung: {cause}; "
                + (f"rank {', '.join(map(str, frozen))} stopped reporting" if frozen else
                   "every rank still reports (a deadlock, not a dead rank)")
                + f"; each live rank's stacks are in {self.out / HANG}; the same command resumes from the "
                  "last checkpoint")
        if self.board is not None:
            self.board.post_verdict(EXIT_HUNG, text)
        self._report(text, frozen)
        killed = _kill_frozen(frozen, beats)
        if killed:  # where they went: torchrun, seeing one exit, would otherwise wait 30 s for the frozen ones
            log_to_file(f"killed the frozen {killed}")
        _exit(EXIT_HUNG)

    def _report(self, text: str, frozen: list[int]) -> None:
        """run.json `hung` with the step and the frozen ranks; the line on stderr and in log.txt."""
        extra = {"step": self.step, "hung_ranks": frozen, "error": text[:500]}
        if self.dist.is_main and self.status is not None:
            self.status.write(marker.HUNG, **extra)
            log_to_file(text)
        elif marker.is_our_run(self.out):  # rank 0 froze: the lowest live rank writes in its place
            marker.write_status(self.out, marker.HUNG, **extra)
        print(text, file=sys.stderr, flush=True)

    def _dump(self) -> None:
        """Every thread's Python stack to OUTPUT_DIR/hang/rank<r>.txt (once)."""
        if self.dumped:
            return
        self.dumped = True
        folder = self.out / HANG
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"rank{self.dist.rank}.txt", "w") as f:
            f.write(f"rank {self.dist.rank} (pid {os.getpid()} on {socket.gethostname()}): no optimizer step for "
                    f"{time.monotonic() - self.last:.0f} s after step {self.step}; every thread's stack, "
                    "most recent call first:\n\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)


@contextlib.contextmanager
def paused_while_waiting(watchdog: Watchdog):
    """While the loop's thread waits for a checkpoint being written: paused, as during a save (a rank whose
    heartbeat stops meanwhile is still found); the clock restarts after, unless it was paused already."""
    was = watchdog.paused
    watchdog.paused = True
    try:
        yield
    finally:
        if not was:
            watchdog.last, watchdog.paused = time.monotonic(), False


class _Resume(Hook):
    """Placed after the checkpointer: the pause for evaluation and checkpoints ends, the clock restarts."""

    def __init__(self, watchdog: Watchdog):
        self.watchdog = watchdog

    def after_step(self, trainer) -> None:
        """The step's checkpoint (if any) is saved."""
        self.watchdog.resume()

    def after_epoch(self, trainer) -> None:
        """The epoch's evaluation and checkpoint are done."""
        self.watchdog.resume()


def _timed_out(error: BaseException) -> bool:
    """True for a collective or store that gave up waiting (gloo, NCCL's watchdog, the TCPStore)."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timed out" in text or "timeout" in text)


def _kill_frozen(frozen: list[int], beats: dict[int, list[str]]) -> str:
    """SIGKILL the frozen ranks on this host (they can run no code; torchrun would wait 30 s to kill them);
    what was done, in words."""
    host, done = socket.gethostname(), []
    for r in frozen:
        beat = beats.get(r)
        if beat is None or len(beat) != 4 or beat[2] != host:
            done.append(f"rank {r}: not on this host or no heartbeat ({' '.join(beat or ['none'])}), left to torchrun")
            continue
        try:
            os.kill(int(beat[3]), signal.SIGKILL)
            done.append(f"rank {r} (pid {beat[3]})")
        except (ProcessLookupError, PermissionError, ValueError) as e:
            done.append(f"rank {r} (pid {beat[3]}): {e}")
    return "; ".join(done)


def _exit(code: int) -> None:
    """End the process now, whatever its main thread is stuck in, once what was written is flushed."""
    for handler in log.handlers:  # the streams, not handler.flush(): a lock the stuck thread holds never frees
        stream = getattr(handler, "stream", None)
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
