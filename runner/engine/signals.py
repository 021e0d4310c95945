"""Stopping on request: preemption signals agreed on by every rank, and PROFILE.ONLY; save first, then stop."""
from __future__ import annotations

import logging
import signal

import torch

from runner import distributed, runstate
from runner.engine.hooks import Checkpointer, Hook, Profiler, StopRun
from runner.errors import Preempted

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

    def install(self) -> None:
        """SIGTERM, SIGUSR1 and a first Ctrl-C ask the run to finish its step, save and exit."""
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            self.old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        """Note the request; a second Ctrl-C is left to Python (KeyboardInterrupt: stop at once)."""
        self.local = True
        again = ""
        if signum == signal.SIGINT:  # a second Ctrl-C stops at once (KeyboardInterrupt), without saving
            signal.signal(signal.SIGINT, signal.default_int_handler)
            again = " (Ctrl-C again to stop at once, without saving)"
        log.warning("received %s: finishing the current step, then saving and exiting%s",
                    signal.Signals(signum).name, again)

    def poll(self) -> bool:
        """True once stopping is agreed; distributed runs reduce the flag one step late, asynchronously."""
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

    def close(self) -> None:
        """Finish the pending reduce; restore the previous handlers, or ignore the signals when stopping on one."""
        if self.work is not None:
            self.work.wait()
            self.work = None
        for sig, old in self.old.items():
            # saved and exiting: torchrun SIGTERMs the ranks still exiting once one has gone; let them exit 75
            # (SIG_IGN, unlike a Python handler, also holds while the interpreter shuts down)
            signal.signal(sig, signal.SIG_IGN if self.stopping else old)
        self.old.clear()


class Preemption(Hook):
    """Stop requests, after the step's logging and periodic checkpoint: PROFILE.ONLY, then preemption signals."""

    def __init__(self, flag: StopFlag, checkpointer: Checkpointer, profiler: Profiler | None = None,
                 profile_only: bool = False):
        self.flag, self.checkpointer = flag, checkpointer
        self.profiler, self.profile_only = profiler, profile_only

    def before_train(self, trainer) -> None:
        """Take over SIGTERM, SIGUSR1 and SIGINT."""
        self.flag.install()

    def after_step(self, trainer) -> None:
        """Save and stop once the profiled window is recorded (PROFILE.ONLY), or when a rank was signalled."""
        if self.profile_only and self.profiler is not None and self.profiler.done:
            self.checkpointer.save(trainer)
            raise StopRun(runstate.PROFILED, "PROFILE.ONLY: stopped after the profiled steps (checkpoint saved; "
                                             "rerun without it to go on)")
        if self.flag.poll():
            self.checkpointer.save(trainer)
            distributed.barrier()  # no rank exits before rank 0's checkpoint is on disk
            out = self.checkpointer.out
            raise Preempted(f"preempted at step {trainer.step}: checkpoint saved in {out / 'checkpoints'}; "
                            "rerun the same command to continue")

    def after_epoch(self, trainer) -> None:
        """A signal that came during the epoch's end: the checkpoint of that end is already saved."""
        if self.flag.poll():
            distributed.barrier()
            raise Preempted(f"preempted after epoch {trainer.epoch}: checkpoint saved; rerun the same command")

    def close(self, trainer) -> None:
        """Finish the pending reduce and hand the signals back (or ignore them, when stopping on one)."""
        self.flag.close()

