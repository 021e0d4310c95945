"""The loop: epochs and batches from a resume position, the step, and the hooks in their fixed order.

Like detectron2's TrainerBase: the loop only steps; evaluation, checkpoints, metrics, profiling, stop requests
and the run's status are hooks (runner.engine.hooks). It reads no config: runner.engine.build wires it, and a
test can build one around any model and any loader with `set_epoch`.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from runner.engine.hooks import EvaluationCut, Hook, RunState, StopRun
from runner.engine.step import TrainStep
from runner.process import threads


class Trainer:
    """Runs `stepper` over `loader` epoch after epoch, calling each hook around steps, epochs and the run."""

    def __init__(self, stepper: TrainStep, loader, hooks: Iterable[Hook] = (), *, steps_per_epoch: int,
                 total_steps: int, t_start: float | None = None, samples_per_batch: int = 0):
        """`steps_per_epoch` optimizer steps use that many x accumulation batches of each epoch;
        `samples_per_batch`: samples of the global order one batch position of every rank consumes (batch x
        processes), by which checkpoints count the position in samples (0: in this rank's batches only)."""
        self.stepper = stepper
        self.loader = loader
        self.run_state = RunState()  # what the hooks share: results, the watchdog's clock, the pending write
        self.hooks = hooks
        self.steps_per_epoch = steps_per_epoch
        self.batches_per_epoch = steps_per_epoch * stepper.accum
        self.total_steps = total_steps
        self.t_start = time.time() if t_start is None else t_start  # when this process started the run
        self.epoch = 0  # epochs completed
        self.batch_in_epoch = 0  # micro-batches of the current epoch consumed
        self.images = 0  # images this process trained on (every micro-batch)
        self.data_wait = 0.0  # seconds this process waited for batches
        self.results: dict = {}  # what train() returns; the status hook fills it
        self.on_close: list = []  # what close() releases (the run lock, the process group)
        self.samples_per_batch = samples_per_batch
        self._batches: Iterator | None = None
        self._next: tuple[int, Iterator] | None = None  # the next epoch's batches, started before its end's hooks
        # False from an optimizer step until the epoch end (or the stop inside an epoch) that follows it: a job
        # stopped right after an epoch's last step (a stop saves before the end's hooks) still owes its evaluation
        # and checkpoint, and the next one pays them before training on
        self.closed = True
        self.ended_early = False  # a hook ended the run before its length (early stopping): see end_early

    @property
    def hooks(self) -> list[Hook]:
        """The side duties, in the order they run."""
        return self._hooks

    @hooks.setter
    def hooks(self, hooks: Iterable[Hook]) -> None:
        """Take `hooks` in their order; each offers its part of the run state as it joins (Hook.share)."""
        self._hooks = list(hooks)
        for hook in self._hooks:
            hook.share(self.run_state)

    @property
    def step(self) -> int:
        """Optimizer steps taken in the whole run."""
        return self.stepper.step

    @property
    def at_end(self) -> bool:
        """True once the run's last step is taken."""
        return self.step >= self.total_steps

    @property
    def in_epoch(self) -> bool:
        """True while an epoch's training batches are being read (not in its end's evaluation and checkpoint)."""
        return self._batches is not None

    @property
    def end_of_epoch(self) -> bool:
        """True when the latest step was the epoch's last."""
        return self.batch_in_epoch >= self.batches_per_epoch

    def train(self) -> dict:
        """The whole run from the resume position, with every hook; the results (or StopRun's status)."""
        if self.at_end and self.closed:  # resumed from the last checkpoint: only the results are left to write
            self._call("after_train")
            return self.results
        try:
            self._call("before_train")
            self.run_until(self.total_steps)
            if not self.closed:  # the last step's epoch end, or a stop inside an epoch (TRAIN.MAX_STEPS): close it
                if self.end_of_epoch:
                    self._end_epoch()
                else:
                    self._call("stop_point")
                    self._batches, self.closed = None, True
                    self._end_hooks(self._reopen_run_end)
            self._call("after_train")
        except BaseException as e:
            self._call("on_exception", e)
            if isinstance(e, StopRun):
                return {"status": e.status, "step": self.step}
            raise
        finally:
            self._stop_loader()
            for hook in reversed(self.hooks):
                hook.close(self)
        return self.results

    def _stop_loader(self) -> None:
        """Stop the epoch's batches now: its readers and worker processes end here, not when the garbage collector
        gets to them (an exception keeps the loop alive to the process's exit, and workers that ignore SIGTERM
        would then block that exit)."""
        pending = [self._batches, self._next[1] if self._next else None]
        self._batches = self._next = None
        for batches in pending:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def run_until(self, last_step: int) -> None:
        """Optimizer steps up to `last_step`, epoch after epoch; the epoch in progress stays open for more."""
        self.stepper.model.train()
        while self.step < last_step and not self.ended_early:
            if self._batches is None:
                if self.end_of_epoch:  # stopped after an epoch's last step, before its end: end it now
                    self._end_epoch()
                    continue
                self._begin_epoch()
            t0 = time.perf_counter()
            x, y = next(self._batches)
            self.data_wait += time.perf_counter() - t0
            self.images += x.shape[0]
            self.batch_in_epoch += 1
            if self.stepper.train_batch(x, y, self.batch_in_epoch % self.stepper.accum == 0):
                self.closed = False
                self._call("after_step")
                if self.end_of_epoch:
                    self._end_epoch()

    def end_early(self) -> None:
        """End the run at the current step (early stopping): from here it is complete, as if its length ended here;
        the checkpoints that follow say so, and a resume from one of them only finishes."""
        self.total_steps, self.ended_early = self.step, True

    def _begin_epoch(self) -> None:
        """The loader at the current epoch and position (started at the last epoch's end, if so); the epoch's
        hooks."""
        started, self._next = self._next, None
        if started is not None and started[0] == self.epoch and self.batch_in_epoch == 0:
            self._call("before_epoch")
            self._batches = started[1]
            return
        self.loader.set_epoch(self.epoch, self.batch_in_epoch)
        self._call("before_epoch")
        self._batches = iter(self.loader)

    def _end_epoch(self) -> None:
        """A stop first (it saves with the end owed); else advance the position to the next epoch's start, start its
        batches, then the epoch's hooks."""
        self._call("stop_point")
        self.epoch += 1
        self.batch_in_epoch = 0
        self._batches, self.closed = None, True  # before the hooks: the checkpoint they save has the epoch closed
        if self.step < self.total_steps and not self.ended_early:
            # the loader's workers read the next epoch's first batches during this one's evaluation and
            # checkpoint, instead of after them (0.03-0.04 s per epoch start on the digits folder job, 2 cores)
            self.loader.set_epoch(self.epoch, 0)
            self._next = (self.epoch, iter(self.loader))
        self._end_hooks(self._reopen_epoch_end)

    def _end_hooks(self, reopen) -> None:
        """The end's hooks; a stop signal that cut its evaluation puts the end back as owed (`reopen`), then the
        stop saves and exits (stop_point), so that a save never waits for an evaluation."""
        try:
            self._call("after_epoch")
        except EvaluationCut:
            reopen()
            self._call("stop_point")
            raise  # no hook stopped the run (a test's own hooks): the cut is an error

    def _reopen_epoch_end(self) -> None:
        """The position back at the epoch's last step, its end owed (the hooks before the cut change nothing a
        resume repeats: MetricLogger's run-end window restarts at this step, and the checkpoint holds that)."""
        self.epoch -= 1
        self.batch_in_epoch, self.closed = self.batches_per_epoch, False

    def _reopen_run_end(self) -> None:
        """The run's end inside an epoch (TRAIN.MAX_STEPS) owed again."""
        self.closed = False

    def _call(self, event: str, *args) -> None:
        """Every hook's method for `event`, in order."""
        for hook in self.hooks:
            getattr(hook, event)(self, *args)

    def state_dict(self) -> dict:
        """Everything needed to continue exactly: the position, the step's state and every hook's part."""
        state = {**self.stepper.state_dict(), "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                 "step": self.step, "epoch_closed": self.closed, "ended_early": self.ended_early,
                 "cpu_threads": threads.in_use()}  # a resume computes with the same count (threads.follow_run)
        if self.samples_per_batch:  # the layout-free position: a resume on another number of processes uses it
            state["samples_in_epoch"] = self.batch_in_epoch * self.samples_per_batch
            state["global_batch"] = self.samples_per_batch * self.stepper.accum
        state["hooks"] = {key: part for key, hook in self.hook_keys() if (part := hook.state_dict())}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint: the step's state, the position, then every hook's part."""
        self.stepper.load_state_dict(state)
        self.epoch, self.batch_in_epoch = state["epoch"], state["batch_in_epoch"]
        self.closed = state.get("epoch_closed", True)  # older checkpoints: as before
        if state.get("ended_early"):
            self.end_early()
        if self.samples_per_batch and "samples_in_epoch" in state:
            self.batch_in_epoch = state["samples_in_epoch"] // self.samples_per_batch
        parts = state.get("hooks")
        for key, hook in self.hook_keys():  # a checkpoint from before the hooks' parts were apart: the whole one
            hook.load_state_dict(state if parts is None else parts.get(key, {}))

    def hook_keys(self) -> list[tuple[str, Hook]]:
        """Each hook with the key of its part of the checkpoint: its `state_key` or class name, numbered from the
        second hook of a kind on (the hooks' order is fixed by the builder, so the keys are stable)."""
        keys, seen = [], {}
        for hook in self.hooks:
            base = getattr(hook, "state_key", None) or type(hook).__name__
            seen[base] = seen.get(base, 0) + 1
            keys.append((base if seen[base] == 1 else f"{base}.{seen[base]}", hook))
        return keys

    def close(self) -> None:
        """Release what the builder took for this run (the run lock, the process group), last taken first."""
        while self.on_close:
            self.on_close.pop()()
