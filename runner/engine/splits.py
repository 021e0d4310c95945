"""The run's end: best.pth's weights on the val split and on DATA.TEST_SPLIT, once, with per-class accuracy and the
confusion matrix (results.json's test/* and splits), each matrix drawn as OUTPUT_DIR/confusion_<split>.png and as
an image in TensorBoard."""
from __future__ import annotations

import copy
import logging
from contextlib import nullcontext
from pathlib import Path

import torch.nn as nn

from runner import distributed
from runner.distributed import Dist
from runner.engine.evaluation import evaluate
from runner.engine.hooks import Hook, RunState
from runner.fsutil import atomic_write
from runner.model import load_weights
from runner.rundir.layout import BEST, CHECKPOINTS, checkpoints, confusion_name
from runner.sinks.figures import MAX_CLASSES, confusion_image

log = logging.getLogger("runner")


def class_names(names: list[str], outputs: int) -> list[str]:
    """A name for each of the model's outputs: the data's class names, then indices for any extra output."""
    return [str(n) for n in names[:outputs]] + [str(i) for i in range(len(names[:outputs]), outputs)]


def split_entry(res: dict, names: list[str]) -> dict:
    """One split's part of results.json's splits: top-1/top-5, loss, count, per-class accuracy (percent, None for
    a class without images) and the confusion matrix (rows: true class, columns: predicted; None past MAX_CLASSES)."""
    matrix = res["confusion"]
    per_class = {name: (100.0 * row[i] / sum(row) if sum(row) else None)
                 for i, (name, row) in enumerate(zip(names, matrix, strict=True))}
    return {"top1": res["top1"], "top5": res["top5"], "loss": res["loss"], "count": res["count"],
            "per_class": per_class, "confusion": matrix if len(names) <= MAX_CLASSES else None}


class SplitResults(Hook):
    """After training, once (a resume that still owes the results does it then): best.pth on each split given."""

    def __init__(self, out: Path, dist: Dist, loaders: dict, names: list[str], autocast=nullcontext):
        """`loaders`: split name -> evaluation loader (val, and test with DATA.TEST_SPLIT). From the run state it
        reads the step best.pth holds (the best's), the Evaluator's own result of those weights where this process
        made it, the watchdog's clock and the metric sinks; it leaves its results there."""
        self.out, self.dist, self.loaders, self.names = Path(out), dist, dict(loaders), list(names)
        self.autocast = autocast
        self.found: dict = {}

    def after_train(self, trainer) -> None:
        """Evaluate best.pth (the final weights when there is none) on each split; rank 0 draws the matrices. The
        val result of best.pth's weights is taken from their evaluation during the run where this process made it
        (the same weights, already measured: 1.2 s of a 20 s digits run was this evaluation again)."""
        run = trainer.run_state
        best_step = run.best.step if run.best is not None else None
        kept = _kept(run, best_step)
        evaluated = [split for split in self.loaders if not (kept and split == "val")]
        model, weights = (self._weights(trainer.stepper.bare) if evaluated else
                          (trainer.stepper.bare, f"{CHECKPOINTS}/{BEST}"))
        names = class_names(self.names, _outputs(model))
        found = {"weights": weights, "step": best_step if weights != "last" else trainer.step, "classes": names}
        for split in self.loaders:
            res = kept if split not in evaluated else self._evaluate(model, self.loaders[split], len(names),
                                                                     run.progress)
            found[split] = split_entry(res, names)
            log.info("%s with %s: top1 %.2f top5 %.2f (%d images)%s", split, weights, res["top1"], res["top5"],
                     res["count"], f" (its evaluation at step {found['step']})" if split not in evaluated else "")
        self.found = found
        run.split_results = self.results()
        if self.dist.is_main:
            self._draw(found, trainer.step, run.metrics.writer if run.metrics is not None else None)

    def _evaluate(self, model: nn.Module, loader, classes: int, progress) -> dict:
        """One split's result with its confusion matrix; `progress`: the watchdog's clock, or None."""
        if progress is not None:  # a pass starts: the watchdog allows for its first batch
            progress()
        return evaluate(model, loader, self.dist.device, self.autocast, progress, num_classes=classes)

    def _weights(self, bare: nn.Module) -> tuple[nn.Module, str]:
        """A copy of the model with best.pth's weights and "checkpoints/best.pth", or the model and "last"."""
        distributed.barrier()  # rank 0 writes best.pth after the last collective: every rank reads it once written
        best = checkpoints(self.out) / BEST
        if not best.is_file():  # no evaluation was ever judged best (CHECKPOINT.BEST_METRIC never logged)
            log.warning("no %s in %s: per-class results are those of the final weights", BEST, best.parent)
            return bare, "last"
        model = copy.deepcopy(bare)
        load_weights(model, str(best))
        return model, f"{best.parent.name}/{BEST}"

    def _draw(self, found: dict, step: int, writer) -> None:
        """confusion_<split>.png in OUTPUT_DIR and an image per split in TensorBoard (rank 0; `writer`: the metric
        sinks, or None)."""
        for split in self.loaders:
            entry = found[split]
            if entry["confusion"] is None:
                log.info("%d classes: no confusion matrix drawn (at most %d)", len(found["classes"]), MAX_CLASSES)
                return
            title = f"{split}: {found['weights']} (step {found['step']}), top-1 {entry['top1']:.2f}%"
            img = confusion_image(entry["confusion"], found["classes"], title)
            atomic_write(self.out / confusion_name(split), lambda f, img=img: img.save(f, format="PNG"))
            if writer is not None:
                writer.image(f"confusion/{split}", img, step)

    def results(self) -> dict:
        """results.json's part: test/top1, test/top5, test/count (with a test split) and splits."""
        if not self.found:
            return {}
        flat = {f"{split}/{k}": self.found[split][k] for split in self.loaders if split != "val"
                for k in ("top1", "top5", "count")}
        return {**flat, "splits": self.found}


def _kept(run: RunState, best_step: int | None) -> dict | None:
    """The run's own val result of best.pth's weights with its confusion matrix, or None (evaluate again)."""
    kept = run.best_eval
    if kept is None or kept[0] != best_step or "confusion" not in kept[1]:
        return None
    return kept[1]


def _outputs(model: nn.Module) -> int:
    """The model's number of outputs (timm's num_classes)."""
    return int(model.num_classes)
