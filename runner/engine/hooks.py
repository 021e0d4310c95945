"""The loop's side duties, each a Hook owning its state and its part of the checkpoint.

The run's hooks are a fixed, ordered list (runner.engine.build.run_hooks), not a registry: Profiler,
MetricLogger, Evaluator (runner.engine.evaluation), Checkpointer, Preemption (runner.engine.signals) and
RunStatus (runner.engine.status). No hook holds another: what they share (results, the watchdog's clock, the
pending checkpoint write) is the loop's RunState, `trainer.run_state`.
The order is the order of the duties after a step: the profiler marks the step's end, the metric window is
written, a periodic checkpoint is saved, then a stop is honoured. At an epoch's end a stop comes first
(`stop_point`: it saves with the end owed, and the resumed run runs it); then the last window, the evaluation (a
stop signal during it cuts it: EvaluationCut), the checkpoint, a stop.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from runner import checkpoint as ckpt
from runner import distributed
from runner.distributed import Dist
from runner.engine.best import Best, EarlyStopping
from runner.profiler import NullProfiler, StepProfiler
from runner.sinks import MetricWriter

log = logging.getLogger("runner")


def _nothing() -> None:
    """No checkpoint is being written: nothing to wait for."""


def _free() -> float:
    """A stop's save costs nothing beyond what the step's duties time."""
    return 0.0


@dataclass
class RunState:
    """What the hooks share while a run goes (detectron2's `trainer.storage`): `trainer.run_state`, one per loop.

    Each field has one writer, named in its comment; any hook reads it. A hook offers its part as it joins the
    loop (Hook.share), so no hook holds another: each can be read, tested and added alone.
    """

    metrics: MetricLogger | None = None  # MetricLogger: where any hook writes scalars; the run's throughput
    best: Best | None = None  # Evaluator: the best evaluation by CHECKPOINT.BEST_METRIC (saved in its part)
    early: EarlyStopping | None = None  # Evaluator: early stopping on that metric (saved in its part)
    last_eval: dict[str, float] = field(default_factory=dict)  # Evaluator: the latest evaluation's scalars
    # Evaluator: (step, the model's own full result, confusion matrix included) of the evaluation judged best in
    # this process; the run's end reuses it for best.pth on val instead of evaluating the same weights again
    best_eval: tuple[int, dict] | None = None
    eval_is_best: bool = False  # Evaluator sets, the next save takes: best.pth is then that checkpoint
    eval_unsaved: bool = False  # Evaluator sets, every save clears: the Checkpointer saves right after it
    split_results: dict = field(default_factory=dict)  # SplitResults, at the run's end: test/* and splits
    progress: Callable[..., None] | None = None  # Watchdog: an evaluation pass's clock (a stalled batch hangs)
    hold: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # Watchdog: paused meanwhile
    cutting: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # Preemption: a stop
    # signal cuts the evaluation run inside it (EvaluationCut): the save never waits for an evaluation
    settle: Callable[[], None] = _nothing  # Checkpointer: returns once the checkpoint being written is on disk
    save_cost: Callable[[], float] = _free  # Checkpointer: what a stop's save may take (TRAIN.TIME_LIMIT)

    def best_results(self) -> dict:
        """results.json's best/* (by BEST_METRIC) and early_stop (None unless it ended the run); the placeholders
        of best/* without an evaluator."""
        best = self.best if self.best is not None else Best("val/top1", "max")
        return {**best.results(), "early_stop": self.early.stopped if self.early is not None else None}


class Hook:
    """A side duty of the loop; every method does nothing unless overridden. `trainer` is the loop."""

    def share(self, run: RunState) -> None:
        """As the hook joins a loop (Trainer.hooks): put what it offers the others into the loop's run state, or
        keep the state where the hook needs it outside the loop's events (its part of the checkpoint)."""

    def before_train(self, trainer) -> None:
        """Before the first step of this process (not called when a resumed run has no step left)."""

    def before_epoch(self, trainer) -> None:
        """Before an epoch's first batch (the resume position's, for the epoch a run resumes in)."""

    def after_step(self, trainer) -> None:
        """After each optimizer step (not after accumulation micro-steps)."""

    def stop_point(self, trainer) -> None:
        """Before an epoch's end hooks (position not yet advanced), and again once a stop has cut them: a stop
        agreed by every rank saves here and exits, the end owed to the resumed run (runner.engine.signals)."""

    def after_epoch(self, trainer) -> None:
        """After an epoch's last step (position already advanced), or after the run's last step mid-epoch."""

    def after_train(self, trainer) -> None:
        """After the last epoch: the run is complete."""

    def on_exception(self, trainer, error: BaseException) -> None:
        """The run stopped on `error` (a failure, a stop signal, or StopRun); it is raised again afterwards."""

    def close(self, trainer) -> None:
        """Release what before_train opened; called in reverse order, however the run ended."""

    state_key: str | None = None  # the name of this hook's part of the checkpoint; None: the class name

    def state_dict(self) -> dict:
        """This hook's part of the checkpoint (saved under checkpoint["hooks"][its key]; {}: none)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Take this hook's part back ({} when the checkpoint has none for it)."""


class StopRun(Exception):
    """A hook ends the run early and cleanly (exit 0): `status` goes to run.json, `message` to the log."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class EvaluationCut(Exception):
    """A stop signal came during an epoch end's evaluation: it is dropped unfinished, the loop puts the epoch's end
    back as owed, and the stop saves (stop_point); the resumed run evaluates from the start."""


def epoch_of_last_step(trainer) -> int:
    """The 1-based epoch of the latest step: the one in progress, or the one that just ended."""
    return trainer.epoch + 1 if trainer.batch_in_epoch else trainer.epoch


class Profiler(Hook):
    """torch.profiler over a window of steps (PROFILE.*), or a stand-in that does nothing."""

    def __init__(self, open_profiler: Callable[[], StepProfiler | NullProfiler]):
        """`open_profiler` starts it: called right before the loop."""
        self.open_profiler = open_profiler
        self.prof: StepProfiler | NullProfiler = NullProfiler()

    @property
    def done(self) -> bool:
        """True once the profiled window is recorded."""
        return self.prof.done

    def before_train(self, trainer) -> None:
        """Start profiling."""
        self.prof = self.open_profiler()

    def after_step(self, trainer) -> None:
        """Mark the step's end (first of the hooks: their work belongs to the next step's range)."""
        self.prof.step()

    def close(self, trainer) -> None:
        """Stop; a window cut short by the end of the run is still saved."""
        self.prof.close()


class MetricLogger(Hook):
    """Windows of LOG.PERIOD steps: loss, LR, img/s and data wait, written to every sink (rank 0)."""

    def __init__(self, period: int, dist: Dist, open_writer: Callable[[int], MetricWriter], banner: str = ""):
        """`open_writer(resume_step)` opens the sinks (runner.sinks: metrics.jsonl, TensorBoard, trackers, the
        console's line) at the loop's start."""
        self.period, self.dist = period, dist
        self.open_writer = open_writer
        self.banner = banner
        self.writer: MetricWriter | None = None
        self.throughput = [0, 0.0]  # images and seconds over every logged window, across resumes
        self.window = (0.0, 0, 0, 0.0)  # perf_counter, step, images and data wait at the window's start
        self.saved: dict | None = None  # the window a checkpoint holds: captured for a save, or loaded

    def share(self, run: RunState) -> None:
        """The hooks that write scalars (evaluations, the run's end) write them here."""
        run.metrics = self

    def before_train(self, trainer) -> None:
        """Say what trains, open the sinks, continue the checkpoint's window or start one."""
        if self.banner:
            log.info(self.banner)
        self.writer = self.open_writer(trainer.step)
        if not self._continue_window(trainer):
            self.reset(trainer)

    def before_epoch(self, trainer) -> None:
        """Each epoch starts a window (evaluation and checkpoints are not training time); a run resumed inside an
        epoch goes on with the window it saved, as the run left alone does."""
        if trainer.batch_in_epoch == 0:
            self.reset(trainer)

    def after_step(self, trainer) -> None:
        """Write the window every LOG.PERIOD steps."""
        if trainer.step % self.period == 0:
            self.log_window(trainer)

    def after_epoch(self, trainer) -> None:
        """At the run's end, write what the last window holds."""
        if trainer.at_end and trainer.step > self.window[1]:
            self.log_window(trainer)

    def after_train(self, trainer) -> None:
        """Training is over: end the bar before RunStatus (a later hook) prints the `done:` line under it."""
        if self.writer is not None:
            self.writer.end_progress()

    def on_exception(self, trainer, error: BaseException) -> None:
        """End the bar before the stop's own lines (preempted, failed) are printed."""
        if self.writer is not None:
            self.writer.end_progress()

    def reset(self, trainer) -> None:
        """Start a new window at the loop's current counters."""
        self.window = (time.perf_counter(), trainer.step, trainer.images, trainer.data_wait)
        trainer.stepper.reset_loss()

    def log_window(self, trainer) -> None:
        """Read the window's loss (the one host sync), reduce it across ranks, write the scalars (the console's
        training line is one of the sinks: runner.sinks.console)."""
        epoch = epoch_of_last_step(trainer)
        trainer.stepper.check_finite(epoch)
        self.write(trainer.step, epoch, self._scalars(trainer))
        self.reset(trainer)

    def _scalars(self, trainer) -> dict[str, float]:
        """The window's training scalars; adds it to the run's throughput."""
        t0, step0, images0, wait0 = self.window
        world = self.dist.world_size
        loss = trainer.stepper.loss_sum.clone()
        distributed.all_reduce_(loss)
        mean_loss = loss.item() / max(trainer.step - step0, 1) / world
        dt = time.perf_counter() - t0
        images = trainer.images - images0
        self.throughput[0] += images * world
        self.throughput[1] += dt
        scalars = {"train/loss": mean_loss, "train/lr": trainer.stepper.optimizer.param_groups[0]["lr"],
                   "train/img_per_s": images * world / max(dt, 1e-9),
                   "train/data_wait_frac": (trainer.data_wait - wait0) / max(dt, 1e-9)}
        size = getattr(trainer.loader, "img_size", None)  # DATA.IMG_SIZE_SCHEDULE's (runner/data/resize.py)
        if size is not None:
            scalars["train/img_size"] = size
        if self.dist.device.type == "cuda":
            scalars["train/mem_alloc_mb"] = torch.cuda.max_memory_allocated() / 2**20
            scalars["train/mem_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
        return scalars

    def write(self, step: int, epoch: int, scalars: dict[str, float]) -> None:
        """Scalars of any producer (training, evaluation) into the open sinks."""
        if self.writer is not None:
            self.writer.write(step, epoch, scalars)

    def flush(self) -> None:
        """Put every scalar written so far into the files (before a checkpoint that covers them)."""
        if self.writer is not None:
            self.writer.flush()

    def close(self, trainer) -> None:
        """Flush and close every sink."""
        if self.writer is not None:
            self.writer.close()

    def capture(self, trainer, group=None) -> None:
        """Keep the window for the checkpoint being saved: its first step and every rank's loss sum, on rank 0.

        A collective (Checkpointer.save, on every rank); it reads the device, as the checkpoint does anyway.
        """
        ranks = distributed.gather_object(trainer.stepper.loss_window(), group)
        self.saved = {"step": trainer.step, "start": self.window[1], "ranks": ranks} if self.dist.is_main else None

    def _continue_window(self, trainer) -> bool:
        """Put the checkpoint's window back (True); False when it has none for this step (older checkpoints)."""
        saved, self.saved = self.saved, None
        if not saved or saved.get("step") != trainer.step:
            return False
        trainer.stepper.load_loss_window(rank_window(saved["ranks"], self.dist))
        self.window = (time.perf_counter(), saved["start"], trainer.images, trainer.data_wait)
        return True

    def state_dict(self) -> dict:
        """The run's throughput so far and the window captured for this checkpoint."""
        return {"throughput": list(self.throughput), **({"window": self.saved} if self.saved else {})}

    def load_state_dict(self, state: dict) -> None:
        """Continue the run's throughput; keep the window for before_train."""
        self.throughput = list(state.get("throughput", [0, 0.0]))
        self.saved = state.get("window")


def rank_window(ranks: list[dict], dist: Dist) -> dict:
    """This rank's part of a saved window: its own on as many processes as saved; on another number, rank 0 holds
    the saved sum scaled so that the logged mean (the sum over ranks / world / steps) is the saved one's."""
    if len(ranks) == dist.world_size:
        return ranks[dist.rank]
    total = sum(r["sum"] + sum(r["slots"]) for r in ranks)  # in float64: one rounding, in the float32 sum
    return {"sum": total * dist.world_size / len(ranks) if dist.is_main else 0.0, "slots": []}


class Checkpointer(Hook):
    """Atomic checkpoints every CHECKPOINT.PERIOD steps within an epoch, after each evaluation, at each epoch's end
    and at the end. With `background` (CHECKPOINT.ASYNC) the step waits only for a host copy of the state: one
    thread writes it (runner.checkpoint.CheckpointWriter), one write at a time; stops and the run's end wait().
    Sharded (DIST.STRATEGY fsdp), every process has a writer: its shards staged on the step, written by DCP's
    thread, then (rank 0) the folder renamed and the .pth written."""

    state_key = "checkpointer"  # its part (every rank's RNG state) is added by save

    def __init__(self, out: Path, period: int, keep: int, dist: Dist, stored: dict | None = None, group=None,
                 background: bool = False):
        """`stored`: entries saved as they are (the config's text, the class names); `group`: the run's CPU control
        group, over which rank 0 gathers every rank's RNG state; `background`: write off the training step (rank 0
        writes; sharded, every rank writes its shards). What it reads of the other hooks is in the run state: the
        evaluation since the last save (best.pth?), the metric window, the watchdog's pause."""
        self.out, self.period, self.keep, self.dist, self.group = Path(out), period, keep, dist, group
        self.stored = dict(stored or {})
        self.writer = ckpt.CheckpointWriter() if background else None  # the other ranks' write only shards
        self.run = RunState()  # the loop's, once it joins one (share)
        self.copy_s = 0.0  # the longest host copy

    def share(self, run: RunState) -> None:
        """Offer the pending write (a stop or a pause waits for it) and its cost; keep the run state: waiting for
        a write reads the watchdog's pause there."""
        run.settle, run.save_cost = self.wait, self.stop_cost
        self.run = run

    def after_step(self, trainer) -> None:
        """Every CHECKPOINT.PERIOD steps and right after an evaluation within an epoch (so that best.pth holds the
        evaluated weights and a resume neither repeats nor skips the evaluation), unless an epoch's end (saved
        anyway) comes with this step."""
        due = self.period and trainer.step % self.period == 0
        due = due or self.run.eval_unsaved
        if due and not trainer.at_end and not trainer.end_of_epoch:
            self.save(trainer)

    def after_epoch(self, trainer) -> None:
        """Every epoch's end (after its evaluation), and the run's last step: that one is on disk before the run's
        end reads best.pth (SplitResults) and says done."""
        self.save(trainer)
        if trainer.at_end:
            self.wait()

    def save(self, trainer) -> None:
        """Write the whole loop's state on rank 0, after making sure nothing non-finite gets in."""
        trainer.stepper.check_finite(trainer.epoch + 1)
        run = self.run
        best, run.eval_is_best, run.eval_unsaved = run.eval_is_best, False, False  # this save holds the evaluation
        rng = ckpt.capture_rng(self.dist, self.group)  # a collective: every rank's own, on rank 0
        if run.metrics is not None:
            run.metrics.capture(trainer, self.group)  # a collective too: every rank's metric window, on rank 0
        shards, finish = self._shards(trainer)
        if self.dist.is_main:
            self.wait()  # one write in flight at most; one that failed ends the run here, with its own error
            if run.metrics is not None:
                run.metrics.flush()  # a kill after the save must not lose scalars of the steps it covers
            state = {**self.stored, **trainer.state_dict()}
            state["hooks"][self.state_key] = {"rng": rng}
            if shards is not None:
                state[ckpt.SHARDS_KEY] = shards
            self._write(state, trainer.step, best, finish)
        elif finish is not None:
            self.writer.start(finish, trainer.step)

    def _shards(self, trainer) -> tuple[str | None, Callable[[], None] | None]:
        """DIST.STRATEGY fsdp: every rank's shards into a new folder (a collective); its name, and in the
        background the rest of their write (None when written on the step). (None, None) when not sharded."""
        shards = trainer.stepper.shards
        if shards is None:
            return None, None
        if self.writer is None:
            return ckpt.write_shards(shards.save, self.out, trainer.step, self.group), None
        self.wait()  # every rank: the previous write whole (its folder renamed) before the next is staged
        t0 = time.monotonic()
        started = ckpt.start_shards(shards.save_async, self.out, trainer.step, self.group, shards.write_group())
        self.copy_s = max(self.copy_s, time.monotonic() - t0)  # the staging is this write's host copy
        return started

    def save_now(self, trainer) -> None:
        """A stop's save: on disk when this returns."""
        self.save(trainer)
        self.wait()

    def _write(self, state: dict, step: int, best: bool, finish: Callable[[], None] | None = None) -> None:
        """On this thread; or a host copy here and the write in the writer's thread, after `finish()` (the rest of
        the shards' write: the .pth is written once its folder is in place)."""
        if self.writer is None:
            ckpt.save_checkpoint(state, self.out, step, self.keep, best)
            return
        t0 = time.monotonic()
        state = ckpt.host_copy(state)
        self.copy_s = max(self.copy_s, time.monotonic() - t0)
        if finish is None:
            self.writer.submit(state, self.out, step, self.keep, best)
            return
        self.writer.start(lambda: (finish(), ckpt.save_checkpoint(state, self.out, step, self.keep, best)), step)

    def wait(self) -> None:
        """Block until the checkpoint being written is on disk, raising its error if it failed (the watchdog
        paused meanwhile, as for a save); returns at once when nothing is being written."""
        if self.writer is None:
            return
        with self.run.hold() if self.writer.pending else contextlib.nullcontext():
            self.writer.wait()

    def stop_cost(self) -> float:
        """Seconds a stop's save may take, for TRAIN.TIME_LIMIT: the host copy and two writes (the one in flight,
        then its own); 0.0 when the save is on this thread (the time limit measures it there)."""
        if self.writer is None:
            return 0.0
        return self.copy_s + 2 * max(self.writer.longest, self.writer.in_flight())

    def on_exception(self, trainer, error: BaseException) -> None:
        """However the run stops, the write in flight ends before the run's status is written (a later hook)."""
        if not isinstance(error, KeyboardInterrupt):  # stopping at once: close() (and the exit) still wait
            self._settle()

    def close(self, trainer) -> None:
        """Nothing is left writing when the run returns."""
        self._settle()

    def _settle(self) -> None:
        """Wait for the write in flight; the run is ending on another error, so a failure of it is only logged."""
        try:
            self.wait()
        except KeyboardInterrupt:  # the thread goes on; the interpreter's exit waits for it (not a daemon)
            log.warning("Ctrl-C: not waiting for the checkpoint of step %d being written", self.writer.step)
        except Exception as e:
            log.warning("the checkpoint of step %d could not be written (%s); the previous one is intact",
                        self.writer.step, ckpt.describe(e))

    def load_state_dict(self, state: dict) -> None:
        """Every RNG this rank draws from, as the checkpoint left it."""
        ckpt.restore_rng(state["rng"], self.dist)
