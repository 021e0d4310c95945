"""The run state the hooks share (runner.engine.hooks.RunState), in-process on the toy loop of test_loop.py: each
hook offers its part as it joins the loop, so a hook is added, read and tested alone, with no wiring between hooks
(what engine/build.py's run_hooks did by hand before)."""
from __future__ import annotations

import time

import torch

from runner.engine.evaluation import Evaluator
from runner.engine.hooks import Checkpointer, Hook, MetricLogger
from runner.engine.signals import Pause, Preemption, StopFlag
from runner.engine.status import RunStatus
from runner.engine.watchdog import Watchdog
from tests.engine.test_best import LOSS, Saves, Scripted
from tests.engine.test_loop import ToyLoader, toy
from tests.engine.test_metric_window import CPU as DIST
from tests.engine.test_metric_window import Rows


class Reads(Hook):
    """A new duty placed after the checkpointer: it reads what the others left there, knowing none of them."""

    def __init__(self):
        self.seen: list[tuple] = []

    def after_epoch(self, trainer) -> None:
        run = trainer.run_state
        self.seen.append((trainer.step, run.last_eval["val/loss"], run.best.step, run.eval_unsaved))


def test_each_hook_offers_its_part_as_it_joins_the_loop(tmp_path):
    dog, evaluator = Watchdog(60.0, tmp_path, DIST, None), Evaluator(ToyLoader(2), 1, DIST)
    ck, flag, metrics = Checkpointer(tmp_path, 0, 2, DIST), StopFlag(None), MetricLogger(4, DIST, lambda step: Rows())
    run = toy([metrics, dog, evaluator, ck, Preemption(flag, ck)]).run_state
    assert run.metrics is metrics and run.progress == dog.progress and run.hold.args == (dog,)
    assert run.best is evaluator.best and run.early is evaluator.early
    assert run.settle == ck.wait and run.save_cost == ck.stop_cost and run.cutting == flag.cutting


def test_results_reach_the_checkpointer_the_status_and_a_new_hook_through_the_run_state(tmp_path):
    """The scripted evaluation is best at step 8: best.pth is that checkpoint, RunStatus's results say so, and a hook
    added after the checkpointer sees every epoch's evaluation saved; none of them is given another hook."""
    rows, reads = Rows(), Reads()
    metrics = MetricLogger(100, DIST, lambda step: rows)
    status = RunStatus(tmp_path, DIST, time.time(), epochs=3)
    saver = Saves(tmp_path)
    results = toy([metrics, Scripted(LOSS, period_steps=2), saver, reads, status], epochs=3).train()
    assert (results["best/step"], results["best/value"], results["val/top1"]) == (8, 0.4, -0.85)
    assert torch.load(tmp_path / "checkpoints" / "best.pth", weights_only=True)["step"] == 8
    assert reads.seen == [(6, 0.7, 4, False), (12, 0.6, 8, False), (18, 0.85, 8, False)]
    assert [r["step"] for r in rows.rows if "val/loss" in r] == sorted(LOSS)  # the evaluator writes to the sinks too
    assert rows.hparam_metrics["best/val/loss"] == 0.4  # and RunStatus finds them


def test_an_evaluation_ticks_the_watchdogs_clock_and_a_pause_waits_for_the_write(tmp_path):
    """The watchdog's clock reaches the evaluator's passes, and Pause waits for the checkpointer's write in the
    background, each offered by its hook alone."""
    dog = Watchdog(60.0, tmp_path, DIST, None)
    ck = Checkpointer(tmp_path, 1, 2, DIST, background=True)
    trainer = toy([dog, Evaluator(ToyLoader(2), 1, DIST), ck, dog.resumer, Pause(1)])
    assert trainer.train()["status"] == "paused"
    assert dog.evaluated  # an evaluation batch ticked the clock (a stalled one would be a hang)
    assert not ck.writer.pending and ck.writer.step == 6  # the epoch's checkpoint was on disk before the pause
