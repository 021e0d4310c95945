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
from runner.engine.best import Best, EarlyStopping
from runner.engine.hooks import Hook, RunState, epoch_of_last_step

log = logging.getLogger("runner")

@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, autocast=nullcontext,
             progress: Callable[..., None] | None = None, num_classes: int = 0) -> dict:
    """Top-1/top-5 (percent) and mean loss over the whole split, summed across ranks (no padding); `progress`
    is called after each batch, and with done=True after the last (the hang watchdog's clock). With
    `num_classes` (the model's outputs), also "confusion": counts[true][predicted], a list of rows."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=device)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
    loader.set_epoch(0, 0)
    try:  # a stop signal may cut the pass (EvaluationCut): the model trains on in its own mode
        for x, y in loader:
            with autocast():
                out = model(x)
            _count(out.float(), y, totals, confusion if num_classes else None)
            if progress is not None:
                progress()
    finally:
        model.train(was_training)
    if progress is not None:  # waiting for slower ranks from here: the heartbeats tell whether they live
        progress(done=True)
    distributed.all_reduce_(totals)
    c1, c5, n, loss = totals.tolist()
    n = max(n, 1)
    res = {"top1": 100.0 * c1 / n, "top5": 100.0 * c5 / n, "loss": loss / n, "count": int(n)}
    if num_classes:
        res["confusion"] = distributed.all_reduce_(confusion).tolist()
    return res


def _count(out: torch.Tensor, y: torch.Tensor, totals: torch.Tensor, confusion: torch.Tensor | None) -> None:
    """Add one batch's top-1 and top-5 hits, count and loss sum to `totals`, its predictions to `confusion`."""
    k = min(5, out.shape[1])
    hit = out.topk(k, dim=1).indices.eq(y[:, None])
    totals[0] += hit[:, 0].sum()
    totals[1] += hit.any(1).sum()
    totals[2] += len(y)
    totals[3] += F.cross_entropy(out, y, reduction="sum")
    if confusion is not None:  # on the device, no host sync; one-hots, as bincount is not deterministic on GPUs
        classes = confusion.shape[0]
        confusion += (F.one_hot(y, classes).T.float() @ F.one_hot(out.argmax(1), classes).float()).long()


class Evaluator(Hook):
    """The val split at every EVAL.PERIOD-th epoch's end, every EVAL.PERIOD_STEPS steps and at the run's end (the
    model and its EMA); the best by CHECKPOINT.BEST_METRIC, and early stopping on it."""

    def __init__(self, loader, period: int, dist: Dist, autocast=nullcontext,
                 compile_fn: Callable[[nn.Module], nn.Module] | None = None, *, period_steps: int = 0,
                 best: Best | None = None, early: EarlyStopping | None = None):
        """`compile_fn` wraps each evaluated module once (torch.compile under MODEL.COMPILE); `best` and `early`:
        by val/top1 (max), and no early stopping, unless given. Its results go to the run state (share)."""
        self.loader, self.period, self.dist, self.autocast = loader, period, dist, autocast
        self.period_steps = period_steps
        self.compile_fn = compile_fn
        self.compiled: dict[int, nn.Module] = {}
        self.best = best if best is not None else Best("val/top1", "max")
        self.early = early if early is not None else EarlyStopping(self.best.metric, self.best.mode, 0, 0.0)
        self.evaluated_step = -1  # the step of the latest evaluation: never twice at one step
        self._latest: dict = {}
        self.run = RunState()
        self.share(self.run)  # its own until it joins a loop

    def share(self, run: RunState) -> None:
        """Offer the best and early stopping (the objects this hook judges with and saves); keep the run state,
        where each evaluation's results go."""
        run.best, run.early, self.run = self.best, self.early, run

    def after_step(self, trainer) -> None:
        """Every EVAL.PERIOD_STEPS optimizer steps of the run; one that ends an epoch (or the run) is left to
        after_epoch, which evaluates then anyway."""
        if not self.period_steps or trainer.step % self.period_steps or trainer.end_of_epoch or trainer.at_end:
            return
        self.validate(trainer, epoch_of_last_step(trainer))

    def after_epoch(self, trainer) -> None:
        """Evaluate when due: every EVAL.PERIOD-th whole epoch, at a step EVAL.PERIOD_STEPS names, and at the end."""
        if self.evaluated_step == trainer.step:  # a step evaluation that ended the run (early stopping)
            return
        whole = trainer.batch_in_epoch == 0
        on_step = bool(self.period_steps) and trainer.step % self.period_steps == 0
        if trainer.at_end or (whole and (trainer.epoch % self.period == 0 or on_step)):
            self.validate(trainer, trainer.epoch, cut=True)

    def validate(self, trainer, epoch: int | None = None, cut: bool = False) -> None:
        """Evaluate the model (and its EMA) on the whole val split, log the result under `epoch` (default: the
        epochs done), judge it for best.pth and early stopping. `cut`: a stop signal during the passes drops them
        (EvaluationCut, before anything is logged or judged; the loop leaves the epoch's end owed)."""
        epoch, run = trainer.epoch if epoch is None else epoch, self.run
        with run.cutting() if cut else nullcontext():
            scalars = self._measure(trainer.stepper)
        run.last_eval, self.evaluated_step, run.eval_unsaved = scalars, trainer.step, True
        observe = getattr(trainer.stepper.scheduler, "observe", None)
        if observe is not None:  # an LR schedule that steps on evaluations (plateau); the step saves its state
            observe(scalars)
        run.eval_is_best = self.best.update(scalars, trainer.step, epoch)
        if run.eval_is_best:
            run.best_eval = (trainer.step, self._latest)
        if run.metrics is not None:
            run.metrics.write(trainer.step, epoch, scalars)
        log.info("eval epoch %d step %d: val/top1 %.2f val/top5 %.2f (%d images)%s", epoch, trainer.step,
                 scalars["val/top1"], scalars["val/top5"], scalars["val/count"], " best" if run.eval_is_best else "")
        if self.early.update(scalars[self.early.metric], trainer.step, epoch) and not trainer.at_end:
            log.info("early stop at step %d: %s", trainer.step, self.early.stop(trainer.step, epoch))
            trainer.end_early()

    def _measure(self, stepper) -> dict[str, float]:
        """The val scalars of the model and, with one, its EMA."""
        modules = [stepper.bare] + ([stepper.ema.module] if stepper.ema is not None else [])
        progress = self.run.progress  # a stalled evaluation (its loader, a collective) is a hang too
        if progress is not None:
            progress()
        self._sync_buffers(modules)
        res = evaluate(self._runnable(stepper.bare), self.loader, self.dist.device, self.autocast, progress,
                       num_classes=int(getattr(stepper.bare, "num_classes", 0) or 0))
        self._latest = res
        scalars = {"val/top1": res["top1"], "val/top5": res["top5"], "val/loss": res["loss"],
                   "val/count": res["count"]}
        if stepper.ema is not None:
            ema = evaluate(self._runnable(stepper.ema.module), self.loader, self.dist.device, self.autocast,
                           progress)
            scalars.update({"val_ema/top1": ema["top1"], "val_ema/top5": ema["top5"]})
        return scalars

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

    def results(self) -> dict:
        """results.json's part: best/* (by BEST_METRIC) and early_stop (None unless it ended the run)."""
        return self.run.best_results()

    def state_dict(self) -> dict:
        """The best, the early stopping count and the latest evaluation."""
        return {"best": self.best.state_dict(), "early_stop": self.early.state_dict(),
                "last_val": dict(self.run.last_eval), "evaluated_step": self.evaluated_step}

    def load_state_dict(self, state: dict) -> None:
        """Continue from the checkpoint's best, early stopping count and latest evaluation."""
        self.best.load_state_dict(state.get("best", {}))
        self.early.load_state_dict(state.get("early_stop", {}))
        self.run.last_eval, self.evaluated_step = state.get("last_val", {}), state.get("evaluated_step", -1)
