"""tools/train.py with a crash injected on one rank (a test's fault injection, run as a script under torchrun).

    CRASH_RANK=1 CRASH_STEP=3 CRASH_HOW=raise|exit python tests/engine/crash_rank.py [train.py arguments]

`raise`: a RuntimeError (a real failure, not a user mistake) from the step; `exit`: the process ends at once
without a word (os._exit), as a rank killed by the kernel would.
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from runner.engine import step as step_module

TRAIN = str(Path(__file__).resolve().parents[2] / "tools" / "train.py")
_train_batch = step_module.TrainStep.train_batch


def _crashing(self, x, y, last):
    """The step, except on CRASH_RANK at CRASH_STEP."""
    if os.environ.get("RANK") == os.environ["CRASH_RANK"] and self.step + 1 == int(os.environ["CRASH_STEP"]):
        if os.environ["CRASH_HOW"] == "exit":
            os._exit(9)
        raise RuntimeError("injected crash in the step")
    return _train_batch(self, x, y, last)


if __name__ == "__main__":
    step_module.TrainStep.train_batch = _crashing
    sys.argv = [TRAIN, *sys.argv[1:]]
    runpy.run_path(TRAIN, run_name="__main__")
