"""The metric window in the checkpoint, in-process: a toy loop with the real MetricLogger and Checkpointer.

A run saved inside a LOG.PERIOD window and resumed logs what the run left alone logs, bit for bit; the step's
loss window round-trips; a checkpoint from before the window was saved still resumes (an empty window).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runner.distributed import Dist
from runner.engine import Hook, StopRun
from runner.engine.hooks import Checkpointer, MetricLogger, rank_window
from tests.engine.test_loop import toy

CPU = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
TIMINGS = ("train/img_per_s", "train/data_wait_frac")


class Rows:
    """A stand-in for the sinks: every written row, timings left out, and the metrics of the run's hparams."""

    def __init__(self):
        self.rows: list[dict] = []
        self.hparam_metrics: dict = {}

    def hparams(self, hparams: dict, metrics: dict) -> None:
        self.hparam_metrics = metrics

    def write(self, step: int, epoch: int, scalars: dict) -> None:
        self.rows.append({"step": step, "epoch": epoch, **{k: v for k, v in scalars.items() if k not in TIMINGS}})

    def end_progress(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class StopAt(Hook):
    """Stops the run after `step` (a kill after its last checkpoint)."""

    def __init__(self, step: int):
        self.step = step

    def after_step(self, trainer):
        if trainer.step == self.step:
            raise StopRun("stopped", f"at step {self.step}")


def logged_run(out: Path, *, stop: int = 0, resume: dict | None = None, accum: int = 2) -> tuple[list[dict], Rows]:
    """A toy run of 2 epochs of 5 steps with LOG.PERIOD 4 and a checkpoint every 3 steps in `out`, stopped after
    `stop` or resumed from `resume`; its logged rows."""
    rows = Rows()
    metrics = MetricLogger(4, CPU, open_writer=lambda step: rows)
    hooks = [metrics, Checkpointer(out, 3, 2, CPU), *([StopAt(stop)] if stop else [])]
    trainer = toy(hooks, accum=accum, batches=5 * accum)
    if resume is not None:
        trainer.load_state_dict(resume)
    trainer.train()
    return rows.rows, rows


def last(out: Path) -> dict:
    """The newest checkpoint in `out`."""
    return torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)


@pytest.mark.parametrize("accum", [1, 2])
def test_a_run_resumed_inside_a_window_logs_what_the_run_left_alone_logs(tmp_path, accum):
    ref, _ = logged_run(tmp_path / "ref", accum=accum)
    assert [r["step"] for r in ref] == [4, 8, 10]  # 5 steps an epoch: the window restarts at each epoch's start
    logged_run(tmp_path / "run", stop=7, accum=accum)
    state = last(tmp_path / "run")
    window = state["hooks"]["MetricLogger"]["window"]
    assert state["step"] == 6 and window["start"] == 5  # epoch 2's window, holding step 6's loss
    assert window["ranks"][0]["sum"] + sum(window["ranks"][0]["slots"]) > 0
    rows, _ = logged_run(tmp_path / "run", resume=state, accum=accum)
    assert rows == ref[1:]  # step 8's row: the mean of steps 6, 7 and 8, as left alone


def test_a_checkpoint_without_the_window_still_resumes_with_an_empty_one(tmp_path):
    ref, _ = logged_run(tmp_path / "ref")
    logged_run(tmp_path / "run", stop=7)
    state = last(tmp_path / "run")
    del state["hooks"]["MetricLogger"]["window"]  # written before the window was saved
    rows, _ = logged_run(tmp_path / "run", resume=state)
    assert [r["step"] for r in rows] == [8, 10] and rows[1] == ref[2]
    assert rows[0]["train/loss"] != ref[1]["train/loss"]  # steps 7 and 8 only, as before


def test_the_loss_window_round_trips_exactly_and_a_finiteness_check_folds_nothing():
    """Saved with losses not yet folded into the sum, and a check_finite (every checkpoint's) in between: the
    sums that follow are the uninterrupted run's, to the bit."""
    alone, cut = toy(epochs=2, batches=6), toy(epochs=2, batches=6)
    alone.run_until(9)
    cut.run_until(5)
    cut.stepper.check_finite(1)
    window = cut.stepper.loss_window()
    assert len(window["slots"]) == 5 and window["sum"] == 0.0
    resumed = toy(epochs=2, batches=6)
    resumed.load_state_dict({**cut.state_dict(), "hooks": {}})
    resumed.stepper.load_loss_window(window)
    assert resumed.stepper.loss_window() == window
    resumed.run_until(9)
    assert resumed.stepper.loss_sum.item() == alone.stepper.loss_sum.item()


def test_a_window_resumed_on_another_number_of_processes_logs_the_same_mean():
    """The logged mean is the sum over ranks / world / steps: what the saved ranks summed is what the new ranks
    sum, scaled to the new world (rank 0 holds it)."""
    saved = [{"sum": 3.0, "slots": [0.5]}, {"sum": 2.0, "slots": [1.5]}]  # 2 ranks: a mean of 3.5 per process
    one = rank_window(saved, Dist(0, 1, 0, torch.device("cpu")))
    assert one == {"sum": 3.5, "slots": []}
    four = [rank_window(saved, Dist(r, 4, r, torch.device("cpu"))) for r in range(4)]
    assert [w["sum"] for w in four] == [14.0, 0.0, 0.0, 0.0] and sum(w["sum"] for w in four) / 4 == 3.5
    assert rank_window(saved, Dist(1, 2, 1, torch.device("cpu"))) == saved[1]  # same world: each rank its own
