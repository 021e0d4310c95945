"""The run's state on disk: run.json at each change, and results.json with TensorBoard's hparams at the end."""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import torch

from runner.distributed import Dist
from runner.engine.hooks import Hook, StopRun
from runner.errors import DataUnavailable, NonFiniteLoss, Preempted, UserError, one_line
from runner.rundir import marker
from runner.rundir.layout import KEPT_RESULTS_GLOB
from runner.sinks import log_to_file
from runner.weights.hub import Pretrained

log = logging.getLogger("runner")


class RunStatus(Hook):
    """run.json (rank 0, once the folder is this run's) and, when the run completes, results.json."""

    def __init__(self, out: Path, dist: Dist, t_start: float, *, epochs: int = 0, max_steps: int = 0,
                 hparams: dict | None = None, pretrained: Pretrained | None = None):
        """`hparams`: the keys for TensorBoard's HParams tab (runner.sinks.run_hparams); `pretrained`: the weights
        the model started from (results.json names their repo, revision and sha256). The results come from the
        run state: the evaluations, the throughput, each split's results."""
        self.out, self.dist, self.t_start = Path(out), dist, t_start
        self.pretrained = pretrained
        self.epochs, self.max_steps, self.hparams = epochs, max_steps, dict(hparams or {})
        self.claimed = False  # True once rank 0 holds the lock and has marked the folder as this run's
        self.wall_before = 0.0  # wall time of the earlier processes of this run
        self.silent_ranks = None  # set by the watchdog: () -> the ranks whose heartbeat stopped

    def write(self, status: str, step: int, **extra) -> None:
        """Update run.json on rank 0, once the folder is this run's."""
        if self.dist.is_main and self.claimed:
            marker.write_status(self.out, status, step=step, **extra)

    def record_failure(self, e: BaseException, when: str, step: int) -> None:
        """run.json and log.txt say why the run stopped (rank 0, once the folder is ours)."""
        if isinstance(e, KeyboardInterrupt):
            self.write(marker.INTERRUPTED, step)
            return
        text, rank = f"{type(e).__name__}: {one_line(str(e))}", self.dist.rank
        silent = [] if isinstance(e, UserError) or self.silent_ranks is None else self.silent_ranks()
        if silent:  # the first rank that stopped without a word is the cause; this rank's error is the effect
            text, rank = f"rank {silent[0]} stopped without a word (its process ended or froze); then {text}", silent[0]
            log.error("%s", text)
        self.write(marker.FAILED, step, error=text[:500], **({"rank": rank} if self.dist.distributed else {}))
        if isinstance(e, UserError):
            log_to_file(f"error {when}: {one_line(str(e))}")
        else:
            log.exception("rank %d failed %s", self.dist.rank, when)

    def on_exception(self, trainer, error: BaseException) -> None:
        """The status the run stopped with."""
        step = trainer.step
        if isinstance(error, StopRun):
            self.write(error.status, step)
            log.info("%s", error.message)
        elif isinstance(error, NonFiniteLoss):
            self.write(marker.NONFINITE, step)
        elif isinstance(error, Preempted):
            self.write(marker.PREEMPTED, step)
        elif isinstance(error, DataUnavailable):  # a cluster fault: rerun like a preemption, the reason kept
            text = one_line(str(error))
            self.write(marker.PREEMPTED, step, error=text[:500], **({"rank": self.dist.rank}
                                                                       if self.dist.distributed else {}))
            log_to_file(f"stopped at step {step}: {text}")
        elif isinstance(error, KeyboardInterrupt):
            self.write(marker.INTERRUPTED, step)
            log.warning("stopped at once after step %d; rerun the same command to continue from the last "
                        "checkpoint", step)
        else:
            self.record_failure(error, f"at step {step}", step)

    def after_train(self, trainer) -> None:
        """results.json, TensorBoard's hparams, status done; the results are what the loop returns."""
        results = self.results(trainer)
        if self.dist.is_main:
            metrics = {k: v for k, v in results.items() if k.startswith(("val", "best/val")) and v is not None}
            sinks = trainer.run_state.metrics
            writer = sinks.writer if sinks is not None else None
            if writer is not None:
                writer.hparams(self.hparams, metrics)
            marker.write_results(self.out, results)
            self.write(marker.DONE, trainer.step)
        log.info("done: val/top1 %s val/top5 %s (best %s %s at step %s, epoch %s), %d steps, %.1fs; OUTPUT_DIR %s",
                 _fmt(results["val/top1"]), _fmt(results["val/top5"]), results["best/metric"],
                 _fmt(results["best/value"]), results["best/step"], results["best/epoch"], trainer.step,
                 results["wall_s"], self.out.resolve())
        trainer.results = results

    def results(self, trainer) -> dict:
        """What results.json holds: final and best val metrics, length, wall time, throughput, memory."""
        run = trainer.run_state
        last = run.last_eval
        imgs, secs = run.metrics.throughput if run.metrics is not None else (0, 0.0)
        results = {
            "status": marker.DONE,
            "val/top1": last.get("val/top1"), "val/top5": last.get("val/top5"),
            # best/*: every metric of the best evaluation by CHECKPOINT.BEST_METRIC (best/metric, best/mode), the one
            # best.pth holds: best/val/top5 is the top-5 of that evaluation, not the highest top-5; early_stop: why
            # and where the run stopped early (None: it ran its full length)
            **run.best_results(),
            "epoch": trainer.epoch, "step": trainer.step, "epochs": self.epochs, "max_steps": self.max_steps,
            "wall_s": round(self.wall_s(), 3),
            "train/img_per_s": imgs / secs if secs else None,
            "world_size": self.dist.world_size,
        }
        kept = sorted(p.name for p in self.out.glob(KEPT_RESULTS_GLOB))
        if kept:  # a run trained on (TRAIN.EXTEND): never to be taken for a fresh run of this length
            results["extended_from"] = kept
        for k in ("val_ema/top1", "val_ema/top5"):
            if k in last:
                results[k] = last[k]
        if self.pretrained is not None:
            results["pretrained"] = self.pretrained.record()
        results.update(run.split_results)  # test/top1, test/top5, test/count and each split's per-class results
        if self.dist.device.type == "cuda":
            results["mem_alloc_mb"] = torch.cuda.max_memory_allocated() / 2**20
            results["mem_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
        return results

    def wall_s(self) -> float:
        """Wall time of the whole run: the earlier processes' and this one's."""
        return self.wall_before + time.time() - self.t_start

    def state_dict(self) -> dict:
        """The run's wall time so far."""
        return {"wall_s": self.wall_s()}

    def load_state_dict(self, state: dict) -> None:
        """Continue the run's wall time."""
        self.wall_before = state.get("wall_s", 0.0)


def _fmt(v) -> str:
    """A metric for the log: 2 decimals or '-'."""
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"
