"""Config-driven experiment runner for timm image models."""
from __future__ import annotations

import importlib.abc
import sys


class _NoWandbForTimm(importlib.abc.MetaPathFinder):
    """timm.utils.summary imports wandb at `import timm` whenever it is installed, for timm's own train.py
    logging: about 1 s of every run and tool, with LOG.WANDB off too. That one import is answered "not
    installed"; any other (the runner's W&B sink) loads wandb as usual."""

    def find_spec(self, name, path=None, target=None):
        """ImportError for `import wandb` from timm.utils.summary; None (no opinion) for everything else."""
        if name != "wandb":
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_globals.get("__name__") == "timm.utils.summary":
                raise ImportError("wandb is not imported for timm's own logging (see runner/__init__.py)")
            frame = frame.f_back
        return None


if not any(isinstance(f, _NoWandbForTimm) for f in sys.meta_path):
    sys.meta_path.insert(0, _NoWandbForTimm())

from runner import threads as _threads

_threads.configure()  # before any import of torch: libgomp reads OMP_NUM_THREADS and OMP_WAIT_POLICY as it loads
