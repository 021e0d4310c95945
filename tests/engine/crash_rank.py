"""tools/train.py with a fault injected on one rank (a test's fault injection, run as a script under torchrun).

    CRASH_RANK=1 CRASH_STEP=3 CRASH_HOW=raise|exit|stop|slow|block python tests/engine/crash_rank.py [arguments]

`raise`: a RuntimeError (a real failure, not a user mistake) from the step; `exit`: the process ends at once
without a word (os._exit), as a rank killed by the kernel would; `stop`: the process freezes (SIGSTOP), at
CRASH_AT `step` (the default), `eval` (the first evaluation) or `setup` (before the process group forms);
`slow`: every evaluation (CRASH_AT eval) sleeps CRASH_SLEEP seconds first; `block`: the main thread waits forever
(a loader whose worker never answers). Without RANK (one process) the rank is 0.
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path

from runner.engine import evaluation
from runner.engine import step as step_module

TRAIN = str(Path(__file__).resolve().parents[2] / "tools" / "train.py")
_train_batch = step_module.TrainStep.train_batch
_evaluate = evaluation.evaluate


def _chosen() -> bool:
    """True on the rank the fault is injected into."""
    return os.environ.get("RANK", "0") == os.environ["CRASH_RANK"]  # no RANK: a single process, rank 0


def _fault() -> None:
    """The injected fault."""
    how = os.environ["CRASH_HOW"]
    if how == "slow":  # no failure: the work is only late (a slow evaluation, say)
        time.sleep(float(os.environ.get("CRASH_SLEEP", "5")))
        return
    if how == "exit":
        os._exit(9)
    if how == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if how == "block":  # the process lives on (its threads beat), its main thread never comes back
        threading.Event().wait()
    raise RuntimeError("injected crash in the step")


def _crashing(self, x, y, last):
    """The step, except on CRASH_RANK at CRASH_STEP."""
    if _chosen() and os.environ.get("CRASH_AT", "step") == "step" and self.step + 1 == int(os.environ["CRASH_STEP"]):
        _fault()
    return _train_batch(self, x, y, last)


def _evaluating(*args, **kwargs):
    """The evaluation, except on CRASH_RANK with CRASH_AT eval."""
    if _chosen() and os.environ.get("CRASH_AT") == "eval":
        _fault()
    return _evaluate(*args, **kwargs)


if __name__ == "__main__":
    step_module.TrainStep.train_batch = _crashing
    evaluation.evaluate = _evaluating
    if _chosen() and os.environ.get("CRASH_AT") == "setup":
        _fault()
    sys.argv = [TRAIN, *sys.argv[1:]]
    runpy.run_path(TRAIN, run_name="__main__")
