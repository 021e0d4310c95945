"""Evaluation: top-1/top-5 over a whole split, and the hook that evaluates during a run and keeps the best."""
from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

from runner import distributed
from runner.distributed import Dist
from runner.engine.hooks import Hook, MetricLogger

log = logging.getLogger("runner")

NO_BEST = {"val/top1": -1.0, "val/top5": -1.0, "epoch": -1}  # before any evaluation


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, autocast=nullcontext,
             progress: Callable[..., None] | None = None) -> dict[str, float]:
    """Top-1/top-5 (percent) and mean loss over the whole split, summed across ranks (no padding); `progress`
    is called after each batch, and with done=True after the last (the hang watchdog's clock)."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=device)
    loader.set_epoch(0, 0)
    for x, y in loader:
        with autocast():
            out = model(x)
        out = out.float()
        k = min(5, out.shape[1])
        hit = out.topk(k, dim=1).indices.eq(y[:, None])
        totals[0] += hit[:, 0].sum()
        totals[1] += hit.any(1).sum()
        totals[2] += len(y)
        totals[3] += F.cross_entropy(out, y, reduction="sum")
        if progress is not None:
            progress()
    if progress is not None:  # waiting for slower ranks from here: the heartbeats tell whether they live
        progress(done=True)
    distributed.all_reduce_(totals)
    c1, c5, n, loss = totals.tolist()
    model.train(was_training)
    n = max(n, 1)
    return {"top1": 100.0 * c1 / n, "top5": 100.0 * c5 / n, "loss": loss / n, "count": int(n)}


class Evaluator(Hook):
    """The val split at every EVAL.PERIOD-th epoch's end and at the run's end (the model and its EMA); the best."""

    def __init__(self, loader, period: int, dist: Dist, metrics: MetricLogger | None = None,
                 autocast=nullcontext, compile_fn: Callable[[nn.Module], nn.Module] | None = None):
        """`compile_fn` wraps each evaluated module once (torch.compile under MODEL.COMPILE)."""
        self.loader, self.period, self.dist, self.metrics, self.autocast = loader, period, dist, metrics, autocast
        self.compile_fn = compile_fn
        self.compiled: dict[int, nn.Module] = {}
        self.best = dict(NO_BEST)
        self.last_val: dict[str, float] = {}
        self.is_best = False  # set by an evaluation, taken by the checkpoint that follows it
        self.progress: Callable[..., None] | None = None  # told when a pass starts, after each batch, at its end

    def after_epoch(self, trainer) -> None:
        """Evaluate when due: every EVAL.PERIOD-th whole epoch, and at the end."""
        whole = trainer.batch_in_epoch == 0
        if trainer.at_end or (whole and trainer.epoch % self.period == 0):
            self.validate(trainer)

    def validate(self, trainer) -> None:
        """Evaluate the model (and its EMA) on the whole val split and log the result."""
        stepper = trainer.stepper
        modules = [stepper.bare] + ([stepper.ema.module] if stepper.ema is not None else [])
        if self.progress is not None:
            self.progress()
        self._sync_buffers(modules)
        res = evaluate(self._runnable(stepper.bare), self.loader, self.dist.device, self.autocast, self.progress)
        scalars = {"val/top1": res["top1"], "val/top5": res["top5"], "val/loss": res["loss"],
                   "val/count": res["count"]}
        if stepper.ema is not None:
            ema = evaluate(self._runnable(stepper.ema.module), self.loader, self.dist.device, self.autocast,
                           self.progress)
            scalars.update({"val_ema/top1": ema["top1"], "val_ema/top5": ema["top5"]})
        self.last_val = scalars
        self.is_best = res["top1"] > self.best["val/top1"]
        if self.is_best:
            self.best = {"val/top1": res["top1"], "val/top5": res["top5"], "epoch": trainer.epoch}
        if self.metrics is not None:
            self.metrics.write(trainer.step, trainer.epoch, scalars)
        log.info("eval epoch %d step %d: val/top1 %.2f val/top5 %.2f (%d images)%s", trainer.epoch, trainer.step,
                 res["top1"], res["top5"], res["count"], " best" if self.is_best else "")

    def _runnable(self, module: nn.Module) -> nn.Module:
        """The module as evaluation runs it: compiled once (sharing its weights), or itself."""
        # the training model is DDP-wrapped and compiled for train mode; a separate compile of the bare module
        # keeps evaluation out of DDP and out of the training graph's guards
        if self.compile_fn is None:
            return module
        if id(module) not in self.compiled:
            self.compiled[id(module)] = self.compile_fn(module)
        return self.compiled[id(module)]

    def _sync_buffers(self, modules: list[nn.Module]) -> None:
        """Give every rank rank 0's buffers (BatchNorm statistics, the EMA's too) before evaluating."""
        # the other ranks' running statistics follow their own batches and are never saved: without this the
        # metrics would not be those of rank 0's checkpoint, and would change when a run resumes from it
        if not self.dist.distributed:
            return
        for module in modules:
            for buf in module.buffers():
                torch.distributed.broadcast(buf, src=0)

    def take_best(self) -> bool:
        """True once after an evaluation that beat the best so far."""
        best, self.is_best = self.is_best, False
        return best

    def state_dict(self) -> dict:
        """The best and the latest evaluation."""
        return {"best": dict(self.best), "last_val": dict(self.last_val)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from the checkpoint's best and latest evaluation."""
        self.best, self.last_val = state.get("best", self.best), state.get("last_val", {})
