"""The best evaluation by one metric (CHECKPOINT.BEST_METRIC, BEST_MODE) and early stopping on it
(TRAIN.EARLY_STOP_PATIENCE, EARLY_STOP_MIN_DELTA), as Lightning's ModelCheckpoint and EarlyStopping judge them.

Plain numbers only (no torch): both are saved in the Evaluator's part of the checkpoint, so a resumed run keeps
the same best and the same count of evaluations without improvement as the run left alone.
"""
from __future__ import annotations

import math

from runner.config.derived import best_mode as resolve_mode  # torch-free: the summary uses it too


def beats(value: float, ref: float | None, mode: str, delta: float = 0.0) -> bool:
    """True when `value` is better than `ref` by more than `delta` in `mode`; NaN never is."""
    if value is None or math.isnan(value):
        return False
    if ref is None:
        return True
    return value > ref + delta if mode == "max" else value < ref - delta


class Best:
    """The evaluation with the best value of `metric` so far (strictly better: the first of equal ones wins)."""

    def __init__(self, metric: str, mode: str):
        """`mode`: max, min or auto (see resolve_mode)."""
        self.metric, self.mode = metric, resolve_mode(metric, mode)
        self.value: float | None = None
        self.step, self.epoch = -1, -1
        self.scalars: dict[str, float] = {}  # every metric of that evaluation

    def update(self, scalars: dict[str, float], step: int, epoch: int) -> bool:
        """Take one evaluation; True when it is the new best."""
        value = scalars[self.metric]
        if not beats(value, self.value, self.mode):
            return False
        self.value, self.step, self.epoch, self.scalars = value, step, epoch, dict(scalars)
        return True

    def results(self) -> dict:
        """results.json's best/*: the metric, its mode and value, when, and every metric of that evaluation."""
        out = {"best/metric": self.metric, "best/mode": self.mode, "best/value": self.value,
               "best/step": self.step, "best/epoch": self.epoch}
        # before any evaluation: today's placeholders, so consumers that compare numbers keep working
        out.update({"best/val/top1": -1.0, "best/val/top5": -1.0})
        out.update({f"best/{k}": v for k, v in self.scalars.items() if k != "val/count"})
        return out

    def state_dict(self) -> dict:
        """The best so far, for the checkpoint."""
        return {"metric": self.metric, "mode": self.mode, "value": self.value, "step": self.step,
                "epoch": self.epoch, "scalars": dict(self.scalars)}

    def load_state_dict(self, state: dict) -> None:
        """The checkpoint's best; one from before BEST_METRIC (best top-1) is read as such when it matches."""
        if "metric" not in state:  # {"val/top1", "val/top5", "epoch"}: the highest top-1
            if self.metric == "val/top1" and self.mode == "max" and state.get("epoch", -1) >= 0:
                self.value, self.epoch = state["val/top1"], state["epoch"]
                self.scalars = {"val/top1": state["val/top1"], "val/top5": state["val/top5"]}
            return
        self.value, self.step, self.epoch = state["value"], state["step"], state["epoch"]
        self.scalars = dict(state["scalars"])


class EarlyStopping:
    """Stop after `patience` evaluations in a row without an improvement of more than `min_delta` over the
    reference, the value of the last improvement (Lightning's EarlyStopping); patience 0: off."""

    def __init__(self, metric: str, mode: str, patience: int, min_delta: float):
        self.metric, self.mode = metric, resolve_mode(metric, mode)
        self.patience, self.min_delta = patience, min_delta
        self.ref: float | None = None
        self.ref_step, self.ref_epoch = -1, -1
        self.wait = 0  # evaluations since the last improvement
        self.stopped: dict | None = None  # results.json's early_stop, once it stopped the run

    def update(self, value: float, step: int, epoch: int) -> bool:
        """Take one evaluation's value; True when patience has run out (the run should end here)."""
        if not self.patience:
            return False
        if beats(value, self.ref, self.mode, self.min_delta):
            self.ref, self.ref_step, self.ref_epoch, self.wait = value, step, epoch, 0
            return False
        self.wait += 1
        return self.wait >= self.patience

    def stop(self, step: int, epoch: int) -> str:
        """Record the stop at (step, epoch); the reason, in words."""
        better = f"{'above' if self.mode == 'max' else 'below'} {self.ref:.6g} (step {self.ref_step})"
        if self.min_delta:
            better += f" by more than {self.min_delta:g}"
        why = (f"{self.metric} ({self.mode}) not {better} in {self.wait} evaluations (TRAIN.EARLY_STOP_PATIENCE "
               f"{self.patience})")
        self.stopped = {"step": step, "epoch": epoch, "metric": self.metric, "mode": self.mode,
                        "patience": self.patience, "min_delta": self.min_delta,
                        "evaluations_without_improvement": self.wait, "best": self.ref,
                        "best_step": self.ref_step, "best_epoch": self.ref_epoch, "reason": why}
        return why

    def state_dict(self) -> dict:
        """The reference, the count and the stop, for the checkpoint."""
        return {"ref": self.ref, "ref_step": self.ref_step, "ref_epoch": self.ref_epoch, "wait": self.wait,
                "stopped": self.stopped}

    def load_state_dict(self, state: dict) -> None:
        """Continue the count from the checkpoint ({}: from none)."""
        self.ref, self.wait, self.stopped = state.get("ref"), state.get("wait", 0), state.get("stopped")
        self.ref_step, self.ref_epoch = state.get("ref_step", -1), state.get("ref_epoch", -1)
