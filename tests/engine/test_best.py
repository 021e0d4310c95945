"""Best by any metric, early stopping and evaluation every N steps, in-process: the toy loop of test_loop.py with an
Evaluator whose metric values are scripted per step, and the real Checkpointer writing into a temporary folder."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from runner.config.schema import EMA_METRICS, EVAL_METRICS
from runner.distributed import Dist
from runner.engine.best import Best, EarlyStopping, resolve_mode
from runner.engine.evaluation import Evaluator
from runner.engine.hooks import Checkpointer
from runner.engine.loop import Trainer
from tests.engine.test_loop import ToyLoader, toy, weights

DIST = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


class Scripted(Evaluator):
    """An Evaluator whose val/loss at step s is values[s] (val/top1 its negative); records the steps evaluated."""

    def __init__(self, values: dict[int, float], *, period_steps: int = 0, metric: str = "val/loss",
                 mode: str = "auto", patience: int = 0, min_delta: float = 0.0):
        super().__init__(None, 1, DIST, period_steps=period_steps, best=Best(metric, mode),
                         early=EarlyStopping(metric, mode, patience, min_delta))
        self.values, self.seen = values, []

    def _measure(self, stepper) -> dict[str, float]:
        self.seen.append(stepper.step)
        v = self.values[stepper.step]
        return {"val/top1": -v, "val/top5": 0.0, "val/loss": v, "val/count": 1}


class Saves(Checkpointer):
    """The real Checkpointer; also keeps each saved state in memory, by step."""

    def __init__(self, out: Path, period: int = 0):
        super().__init__(out, period, 100, DIST)  # the evaluation to save comes through the loop's run state
        self.states: dict[int, dict] = {}

    def save(self, trainer) -> None:
        super().save(trainer)
        self.states[trainer.step] = torch.load(self.out / "checkpoints" / "last.pth", weights_only=True)


def run(tmp: Path, values: dict[int, float], epochs: int = 3, period: int = 0, **kw) -> tuple[Trainer, Scripted, Saves]:
    """A toy run of `epochs` x 6 steps with a scripted evaluator and the checkpointer, trained to its end."""
    evaluator = Scripted(values, **kw)
    saver = Saves(tmp, period)
    trainer = toy([evaluator, saver], epochs=epochs)
    trainer.train()
    return trainer, evaluator, saver


def saved_step(path: Path) -> int:
    """The step a checkpoint file holds."""
    return torch.load(path, map_location="cpu", weights_only=True)["step"]


# ---- the pieces ----------------------------------------------------------------------------------------------
def test_auto_mode_is_min_for_a_loss_and_max_otherwise():
    assert [resolve_mode(m, "auto") for m in ("val/loss", "val/top1", "val_ema/top5")] == ["min", "max", "max"]
    assert resolve_mode("val/loss", "max") == "max"


def test_best_is_strictly_better_first_of_equals_and_never_nan():
    best = Best("val/top1", "max")
    assert best.update({"val/top1": 50.0, "val/top5": 90.0}, 10, 1)
    assert not best.update({"val/top1": 50.0, "val/top5": 95.0}, 20, 2)  # equal: the first stays
    assert not best.update({"val/top1": math.nan, "val/top5": 99.0}, 30, 3)
    assert (best.value, best.step, best.scalars["val/top5"]) == (50.0, 10, 90.0)


def test_early_stopping_counts_evaluations_without_an_improvement_beyond_min_delta():
    early = EarlyStopping("val/loss", "auto", patience=2, min_delta=0.1)
    # 1.0 sets the reference; 0.95 is better but not by more than 0.1 (wait 1); 0.85 is (reference, wait 0);
    # 0.8 and 0.9 are not (wait 1, 2: stop)
    assert [early.update(v, s, 1) for s, v in enumerate([1.0, 0.95, 0.85, 0.8, 0.9])] == [False] * 4 + [True]
    why = early.stop(4, 1)
    assert early.stopped["best"] == 0.85 and early.stopped["best_step"] == 2 and early.stopped["step"] == 4
    assert why == ("val/loss (min) not below 0.85 (step 2) by more than 0.1 in 2 evaluations "
                   "(TRAIN.EARLY_STOP_PATIENCE 2)")


def test_the_metrics_a_config_may_name_are_the_evaluators():
    """CHECKPOINT.BEST_METRIC's allowed names (config/schema.py) are what the Evaluator logs, with and without EMA."""
    from timm.utils import ModelEmaV3

    model = nn.Linear(4, 3)

    class Stepper:
        bare, ema = model, None

    evaluator = Evaluator(ToyLoader(2), 1, DIST)
    assert set(evaluator._measure(Stepper)) >= set(EVAL_METRICS)
    Stepper.ema = ModelEmaV3(model)
    assert set(evaluator._measure(Stepper)) >= set(EVAL_METRICS + EMA_METRICS)


# ---- best.pth by any metric, evaluations every N steps -----------------------------------------------------
LOSS = {2: 1.0, 4: 0.5, 6: 0.7, 8: 0.4, 10: 0.45, 12: 0.6, 14: 0.9, 16: 0.8, 18: 0.85}


def test_best_by_val_loss_min_picks_that_evaluations_checkpoint(tmp_path):
    trainer, evaluator, saver = run(tmp_path, LOSS, period_steps=2)
    assert evaluator.seen == sorted(LOSS)  # every 2 steps, epoch ends (6, 12, 18) among them, each once
    assert sorted(saver.states) == sorted(LOSS)  # a checkpoint right after each evaluation
    assert saved_step(tmp_path / "checkpoints" / "best.pth") == 8
    res = evaluator.results()
    assert {k: res[k] for k in ("best/metric", "best/mode", "best/value", "best/step", "best/epoch")} == {
        "best/metric": "val/loss", "best/mode": "min", "best/value": 0.4, "best/step": 8, "best/epoch": 2}
    assert res["best/val/top1"] == -0.4 and res["early_stop"] is None and trainer.step == 18


def test_best_by_max_follows_the_mode(tmp_path):
    _, evaluator, _ = run(tmp_path, LOSS, period_steps=2, metric="val/top1", mode="max")
    assert saved_step(tmp_path / "checkpoints" / "best.pth") == 8  # top1 is -loss here
    _, evaluator, _ = run(tmp_path / "min", LOSS, period_steps=2, metric="val/top1", mode="min")
    assert saved_step(tmp_path / "min" / "checkpoints" / "best.pth") == 2  # the highest loss


def test_step_evaluations_are_in_the_whole_runs_steps_not_per_epoch(tmp_path):
    values = dict.fromkeys(range(1, 19), 1.0)
    _, evaluator, saver = run(tmp_path, values, period_steps=4, period=5)
    assert evaluator.seen == [4, 6, 8, 12, 16, 18]  # every 4th step of the run, and the epoch ends
    assert sorted(saver.states) == [4, 5, 6, 8, 10, 12, 15, 16, 18]  # after each, and CHECKPOINT.PERIOD's


# ---- early stopping ------------------------------------------------------------------------------------------
EARLY = {2: 1.0, 4: 0.9, 6: 0.95, 8: 0.92, 10: 0.5, 12: 0.4}


def test_early_stop_ends_the_run_at_its_evaluation(tmp_path):
    trainer, evaluator, saver = run(tmp_path, EARLY, period_steps=2, patience=2)
    assert trainer.step == 8 and trainer.ended_early and trainer.epoch == 1  # mid-epoch 2
    assert evaluator.seen == [2, 4, 6, 8]  # the stop's evaluation is not repeated at the run's end
    assert max(saver.states) == 8 and saver.states[8]["ended_early"]
    stop = evaluator.results()["early_stop"]
    assert {k: stop[k] for k in ("step", "epoch", "best", "best_step", "patience", "min_delta")} == {
        "step": 8, "epoch": 2, "best": 0.9, "best_step": 4, "patience": 2, "min_delta": 0.0}
    assert "in 2 evaluations" in stop["reason"]


def test_early_stop_at_an_epoch_end(tmp_path):
    trainer, evaluator, saver = run(tmp_path, {6: 1.0, 12: 1.0, 18: 1.0}, epochs=4, metric="val/top1", patience=1)
    assert trainer.step == 12 and trainer.epoch == 2 and evaluator.seen == [6, 12] and max(saver.states) == 12


def test_the_run_ending_on_its_own_is_no_early_stop(tmp_path):
    trainer, evaluator, _ = run(tmp_path, {6: 1.0, 12: 1.0, 18: 1.0}, patience=2)
    assert trainer.step == 18 and not trainer.ended_early and evaluator.results()["early_stop"] is None


@pytest.mark.parametrize("at", [3, 4, 6, 7, 8])
def test_resumed_from_any_checkpoint_stops_at_the_same_step(tmp_path, at):
    """From each checkpoint (CHECKPOINT.PERIOD 1: every step), a new loop evaluates at the same steps, stops at the
    same step with the same weights and results; from the stop's own checkpoint it only finishes."""
    ref, ref_eval, _ = run(tmp_path / "ref", EARLY, period=1, period_steps=2, patience=2)
    _, _, saver = run(tmp_path / "first", EARLY, period=1, period_steps=2, patience=2)
    evaluator = Scripted(EARLY, period_steps=2, patience=2)
    resumed = toy([evaluator, Saves(tmp_path / "again")], epochs=3)
    resumed.load_state_dict(saver.states[at])
    resumed.train()
    assert resumed.step == 8 and evaluator.seen == [s for s in ref_eval.seen if s > at]
    assert evaluator.results() == ref_eval.results()
    for a, b in zip(weights(ref), weights(resumed), strict=True):
        assert torch.equal(a, b)
