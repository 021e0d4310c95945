"""Stopping on request: preemption signals and TRAIN.TIME_LIMIT agreed on by every rank, and PROFILE.ONLY;
save first, then stop. A stop never waits for an epoch end's evaluation: one agreed before the end saves with the
end owed, and in a single process a stop signal during its evaluation cuts it (the resumed run evaluates)."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import torch

from runner import distributed
from runner.engine.hooks import Checkpointer, EvaluationCut, Hook, Profiler, RunState, StopRun
from runner.errors import DataUnavailable, Preempted, UserError, one_line
from runner.process import signalsafe
from runner.rundir import marker
from runner.rundir.layout import CHECKPOINTS

log = logging.getLogger("runner")


class StopFlag:
    """Preemption signals, agreed on by every rank at the same step without touching the GPU."""

    def __init__(self, group):
        """`group`: the run's CPU control group (DIST.TIMEOUT_S applies), or None in a single process."""
        self.local = False
        self.group = group
        self.buf = torch.zeros(1)
        self.work = None
        self.old = {}
        self.stopping = False
        self.reason = ""  # why this rank asked to stop, when it was not a signal (TRAIN.TIME_LIMIT)
        self.cuts = False  # an evaluation in progress that a stop signal cuts (see cutting)
        self.launcher = LauncherWatch(self) if os.environ.get("TORCHELASTIC_RUN_ID") else None

    def request(self, reason: str) -> None:
        """Ask every rank to stop at the same step and save, as a signal would."""
        if not self.local:
            self.local, self.reason = True, reason
            log.warning("%s: finishing the current step, then saving and exiting", reason)

    def install(self) -> None:
        """SIGTERM, SIGUSR1 and a first Ctrl-C ask the run to finish its step, save and exit."""
        signalsafe.start()
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            self.old[sig] = signal.signal(sig, self._handle)
        if self.launcher is not None:
            self.launcher.start()

    def _handle(self, signum, frame) -> None:
        """Note the request; a second Ctrl-C is left to Python (KeyboardInterrupt: stop at once)."""
        self.local = True
        again = ""
        if signum == signal.SIGINT:  # a second Ctrl-C stops at once (KeyboardInterrupt), without saving
            signal.signal(signal.SIGINT, signal.default_int_handler)
            again = " (Ctrl-C again to stop at once, without saving)"
        signalsafe.later(log.warning, "received %s: finishing the current step, then saving and exiting%s",
                         signal.Signals(signum).name, again)
        if self.cuts:  # the evaluation's loader may wait minutes for a batch: leave it at once
            self.cuts = False
            raise EvaluationCut(f"{signal.Signals(signum).name} during the evaluation")

    @contextlib.contextmanager
    def cutting(self) -> Iterator[None]:
        """An evaluation that a stop signal cuts (EvaluationCut, raised by the handler wherever it waits), or one
        asked already; in a single process only: ranks could not agree at which batch to leave."""
        if self.group is not None or not self.old:
            yield
            return
        if self.local:
            raise EvaluationCut("a stop was asked before the evaluation")
        self.cuts = True
        try:
            yield
        finally:
            self.cuts = False

    def poll(self) -> bool:
        """True once stopping is agreed; distributed runs reduce the flag one step late, asynchronously."""
        if self.local:
            signalsafe.drain()  # the handler's line, ahead of what the stop logs
        if self.group is None:
            self.stopping = self.local
            return self.stopping
        if self.work is not None:
            self.work.wait()
            self.stopping = bool(self.buf.item())
        self.buf.fill_(float(self.local))
        self.work = torch.distributed.all_reduce(self.buf, op=torch.distributed.ReduceOp.MAX,
                                                 group=self.group, async_op=True)
        return self.stopping

    def agree(self) -> bool:
        """True once every rank has asked to stop, agreed now (a blocking reduce of the flag as it is, on the
        control group: once per epoch end), where poll() agrees one step late."""
        if self.group is None:
            return self.poll()
        if self.local:
            signalsafe.drain()
        if self.work is not None:  # the pending reduce is of an older flag: the one below covers it
            self.work.wait()
            self.work = None
        self.buf.fill_(float(self.local))
        torch.distributed.all_reduce(self.buf, op=torch.distributed.ReduceOp.MAX, group=self.group)
        self.stopping = bool(self.buf.item())
        return self.stopping

    def close(self) -> None:
        """Finish the pending reduce; restore the previous handlers, or ignore the signals when stopping on one."""
        if self.launcher is not None:
            self.launcher.stop()
        if self.work is not None:
            self.work.wait()
            self.work = None
        for sig, old in self.old.items():
            # saved and exiting: torchrun SIGTERMs the ranks still exiting once one has gone; let them exit 75
            # (SIG_IGN, unlike a Python handler, also holds while the interpreter shuts down)
            signal.signal(sig, signal.SIG_IGN if self.stopping else old)
        self.old.clear()


class LauncherWatch:
    """Under torchrun: a launcher that is gone (kill -9, the OOM killer, a scheduler that ended only what it
    started) asks this rank to save and stop, as a signal would. torchrun starts each rank in its own session,
    so nothing else would reach it: the ranks would train on as orphans, holding the run folder."""

    PERIOD = 1.0  # seconds between looks at the parent

    def __init__(self, flag: StopFlag):
        self.flag, self.parent = flag, os.getppid()
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Look at the parent every PERIOD seconds from now on."""
        self.thread = threading.Thread(target=self._run, name="runner-launcher-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        """Once the parent has changed (this process was re-parented), ask to stop."""
        while not self.done.wait(self.PERIOD):
            if os.getppid() != self.parent:
                self.flag.request(f"the launcher (torchrun, pid {self.parent}) is gone")
                return

    def stop(self) -> None:
        """End the thread."""
        self.done.set()


class Preemption(Hook):
    """Stop requests, after the step's logging and periodic checkpoint: PROFILE.ONLY, then preemption signals."""

    def __init__(self, flag: StopFlag, checkpointer: Checkpointer, profiler: Profiler | None = None,
                 profile_only: bool = False):
        self.flag, self.checkpointer = flag, checkpointer
        self.profiler, self.profile_only = profiler, profile_only

    def share(self, run: RunState) -> None:
        """A stop signal cuts an epoch end's evaluation (the Evaluator's passes run inside the flag's cutting)."""
        run.cutting = self.flag.cutting

    def before_train(self, trainer) -> None:
        """Take over SIGTERM, SIGUSR1 and SIGINT."""
        self.flag.install()

    def after_step(self, trainer) -> None:
        """Save and stop once the profiled window is recorded (PROFILE.ONLY), or when a rank was signalled."""
        if self.profile_only and self.profiler is not None and self.profiler.done:
            self.checkpointer.save_now(trainer)
            raise StopRun(marker.PROFILED, "PROFILE.ONLY: stopped after the profiled steps (checkpoint saved; "
                                             "rerun without it to go on)")
        if self.flag.poll():
            self._save_and_stop(trainer)

    def stop_point(self, trainer) -> None:
        """Before an epoch's end (or once a signal cut its evaluation): a stop saves now, the evaluation and
        checkpoint of that end owed to the resumed run, which runs them before training on."""
        if self.flag.agree():
            self._save_and_stop(trainer)

    def _save_and_stop(self, trainer) -> None:
        """Save at this step (on disk before any rank exits), then exit preempted."""
        self.checkpointer.save_now(trainer)
        distributed.barrier()  # no rank exits before rank 0's checkpoint is on disk
        out = self.checkpointer.out
        why = f"{self.flag.reason}: stopped" if self.flag.reason else "preempted"
        owed = f" (epoch {trainer.epoch + 1}'s end is left to the rerun)" if trainer.end_of_epoch else ""
        raise Preempted(f"{why} at step {trainer.step}{owed}: checkpoint saved in {out / CHECKPOINTS}; "
                        "rerun the same command to continue")

    def after_epoch(self, trainer) -> None:
        """A signal that came during the epoch's end: the checkpoint of that end is already saved (or being
        written: on disk before any rank exits)."""
        if self.flag.poll():
            self.checkpointer.wait()
            distributed.barrier()
            why = f"{self.flag.reason}: stopped" if self.flag.reason else "preempted"
            raise Preempted(f"{why} after epoch {trainer.epoch}: checkpoint saved; rerun the same command")

    def on_exception(self, trainer, error: BaseException) -> None:
        """The data server stayed down while a training batch was read (DataUnavailable): in a single process,
        save at the last optimizer step, so that the rerun continues from there. Under torchrun the other ranks
        wait in a collective, so nothing can be saved: the job ends 75 and resumes from the last checkpoint."""
        if not isinstance(error, DataUnavailable) or self.checkpointer.dist.distributed or not trainer.in_epoch:
            return
        accum = trainer.stepper.accum
        trainer.batch_in_epoch -= trainer.batch_in_epoch % accum  # the micro-batches of an unfinished step again
        try:
            self.checkpointer.save_now(trainer)
        except Exception as e:  # the run still stops as preempted (the rerun goes on from the previous checkpoint)
            log.warning("data unavailable: the checkpoint of step %d could not be saved (%s)", trainer.step,
                        one_line(str(e)))
            return
        log.warning("data unavailable: saved at step %d in %s", trainer.step, self.checkpointer.out / CHECKPOINTS)

    def close(self, trainer) -> None:
        """Finish the pending reduce and hand the signals back (or ignore them, when stopping on one)."""
        self.flag.close()



def process_started() -> float:
    """When this process started, as time.time() (Linux /proc), or now where that cannot be read."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


class Pause(Hook):
    """`--pause-after-epoch E`: the run stops cleanly once epoch E is evaluated and saved (run.json `paused`, exit
    0); the same command with a later E, or without it, resumes it exactly. Not part of the config: a search
    trains a trial configured for its full length (its LR schedule spans the whole run) rung by rung."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def before_train(self, trainer) -> None:
        """Resumed at or past E already (the same rung asked again): nothing to train."""
        if trainer.closed and trainer.epoch >= self.epoch:
            self._pause(trainer)

    def after_epoch(self, trainer) -> None:
        """After epoch E's evaluation and checkpoint, unless the run ends there anyway."""
        if trainer.epoch >= self.epoch and not trainer.at_end:
            self._pause(trainer)

    def _pause(self, trainer) -> None:
        """Stop with status paused, once the checkpoint is on disk (the run state's pending write)."""
        trainer.run_state.settle()
        raise StopRun(marker.PAUSED, f"paused after epoch {trainer.epoch} (--pause-after-epoch {self.epoch}): "
                                     "checkpoint saved; re-run with a later epoch, or without it, to go on")


class DutiesStart(Hook):
    """Notes when the duties after a step or an epoch begin, for TimeLimit (later in the list) to time them."""

    def __init__(self):
        self.t = time.monotonic()

    def after_step(self, trainer) -> None:
        """The step's duties begin."""
        self.t = time.monotonic()

    def after_epoch(self, trainer) -> None:
        """The epoch's duties (evaluation, checkpoint) begin."""
        self.t = time.monotonic()


class TimeLimit(Hook):
    """TRAIN.TIME_LIMIT: ask every rank to stop and save (as a preemption) while the stop still fits in the budget.

    Placed after the checkpointer, with its DutiesStart before the evaluator: a step's time runs from the end of the
    previous step's duties to the DutiesStart, the duties' time (periodic checkpoints) from the DutiesStart to here, an
    epoch end's (evaluation and checkpoint) likewise. Before they are measured, a save is taken to last SAVE_S
    and an epoch end a quarter of an epoch's steps.
    """

    SAVE_S, MARGIN_S = 3.0, 3.0  # a save not yet timed; the process's exit after the save

    def __init__(self, seconds: float, flag: StopFlag, stamp: DutiesStart, *, started: float, lag: int):
        """`started`: the job's start (time.time()); `lag`: steps a stop takes to be agreed (1 under torchrun).
        A stop's save may take longer than the duties time (with background writes they time a host copy, while a
        stop waits for whole writes): the run state's save_cost (Checkpointer.stop_cost) says how much."""
        self.seconds, self.deadline = seconds, started + seconds
        self.flag, self.stamp, self.lag = flag, stamp, lag
        self.steps: deque[float] = deque(maxlen=50)
        self.duties = 0.0  # the longest step duties (a periodic checkpoint), or a stop's save (save_cost)
        self.epoch_end: float | None = None  # the longest epoch end
        self.t_last = time.monotonic()
        self.first = False  # the next step is this job's first

    def before_train(self, trainer) -> None:
        """An epoch end left over from the last job (its evaluation and save) runs first: it must fit the budget."""
        self.t_last = time.monotonic()
        left, spent = self.deadline - time.time(), self.seconds - (self.deadline - time.time())
        if trainer.end_of_epoch and self.epoch_end is not None:
            need = self.epoch_end + self.MARGIN_S
            if need > left:  # a rerun would start the same evaluation again and be cut short again
                raise UserError(f"TRAIN.TIME_LIMIT {self.seconds:g} s leaves {max(left, 0):.0f} s after start-up "
                                f"({spent:.0f} s), less than the {need:.0f} s this run's pending evaluation and "
                                "save took: raise TRAIN.TIME_LIMIT")
        self.first = True

    def before_epoch(self, trainer) -> None:
        """An epoch's first step starts now."""
        self.t_last = time.monotonic()

    def after_step(self, trainer) -> None:
        """Time the step and its duties; stop now if one more step would not leave time to save."""
        now = time.monotonic()
        self.steps.append(self.stamp.t - self.t_last)
        self.duties = max(self.duties, now - self.stamp.t, trainer.run_state.save_cost())
        self.t_last = now
        if self.need(trainer) > self.deadline - time.time():
            if self.first:
                log.warning("TRAIN.TIME_LIMIT %g s: the budget was gone at start (start-up took %.0f s): every job "
                            "trains one step; raise TRAIN.TIME_LIMIT", self.seconds,
                            self.seconds - (self.deadline - time.time()) - self.steps[-1])
            self.flag.request(f"TRAIN.TIME_LIMIT {self.seconds:g} s is near")
        self.first = False

    def state_dict(self) -> dict:
        """The measured times, for the next job's budget (its first steps and a pending epoch end)."""
        return {"time_limit": {"step": max(self.steps, default=0.0), "duties": self.duties,
                               "epoch_end": self.epoch_end}}

    def load_state_dict(self, state: dict) -> None:
        """Start from the last job's measured times (a longer one measured here replaces them)."""
        saved = state.get("time_limit") or {}
        if saved.get("step"):
            self.steps.append(float(saved["step"]))
        self.duties = max(self.duties, float(saved.get("duties") or 0.0))
        if saved.get("epoch_end") is not None:
            self.epoch_end = max(self.epoch_end or 0.0, float(saved["epoch_end"]))

    def after_epoch(self, trainer) -> None:
        """Time the epoch's end."""
        now = time.monotonic()
        self.epoch_end = max(self.epoch_end or 0.0, now - self.stamp.t)
        self.t_last = now

    def need(self, trainer) -> float:
        """Seconds to go on one more step and then stop: the steps, an epoch end among them, the save, the exit."""
        step = max(self.steps)
        ahead = 1 + self.lag
        need = ahead * step + max(self.duties, self.SAVE_S) + self.MARGIN_S
        left_in_epoch = trainer.steps_per_epoch - trainer.batch_in_epoch // trainer.stepper.accum
        if left_in_epoch <= ahead or trainer.step + ahead >= trainer.total_steps:
            guess = 0.25 * trainer.steps_per_epoch * step + self.SAVE_S
            need += self.epoch_end if self.epoch_end is not None else guess
        return need
