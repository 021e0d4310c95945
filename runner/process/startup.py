"""What a process that trains, evaluates or times a model sets up before torch loads, called by its entry point.

Importing a runner module changes nothing in the process: the entry points (tools/*.py, the benchmarks, a
user's own script) call `prepare()` first, before anything imports torch or timm.
"""
from __future__ import annotations

import importlib.abc
import sys

from runner.process import malloc, threads


class _NoWandbForTimm(importlib.abc.MetaPathFinder):
    """timm.utils.summary imports wandb at `import timm` whenever it is installed, for timm's own train.py
    logging: about 1 s of every run and tool, with LOG.WANDB off too. That one import is answered "not
    installed"; any other (the runner's W&B sink) loads wandb as usual."""

    def find_spec(self, name, path=None, target=None):
        """ImportError for `import wandb` from timm.utils.summary; None (no opinion) for everything else."""
        if name == "wandb" and _on_stack("timm.utils.summary"):
            raise ImportError("wandb is not imported for timm's own logging (see runner/process/startup.py)")
        return None


def prepare() -> threads.Choice:
    """Before torch loads: the CPU-thread choice in the environment (libgomp reads it once, as torch loads),
    timm's own `import wandb` skipped and malloc keeping freed memory (runner.process.malloc); idempotent. Returns the
    thread choice."""
    skip_timms_wandb()
    malloc.configure()
    return threads.configure(look=not _main_rerun_by_multiprocessing())


def skip_timms_wandb() -> None:
    """Answer timm's own `import wandb` with "not installed" in this process from now on; idempotent."""
    if not any(isinstance(f, _NoWandbForTimm) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoWandbForTimm())


def _main_rerun_by_multiprocessing() -> bool:
    """Whether the tool calling this runs as `__mp_main__`: multiprocessing re-running it in a loader worker or
    the fork server, where torch runs one thread and the 0.2 s look at the cores would only delay the first
    batch (the main process's write of a worker's start-up data waits for the worker to have done this)."""
    return _on_stack("__mp_main__")


def _on_stack(module: str) -> bool:
    """Whether code of the module named `module` is among this call's callers."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == module:
            return True
        frame = frame.f_back
    return False
