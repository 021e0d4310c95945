"""A torch.profiler window over a few training steps, or a stand-in that does nothing.

The loop calls `prof.step()` after every training step whether profiling is on or not; once the active
window has been recorded, `prof.done` turns True, the trace is in OUTPUT_DIR/profile/ and `prof.summary`
holds the top-ops table.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from runner.rundir.layout import PROFILE

TRACE_SUFFIX = ".pt.trace.json"  # the name TensorBoard's profiler plugin looks for; Perfetto opens it too


class NullProfiler:
    """Profiling off: every call is free and `done` never turns True."""

    done = False
    summary = ""
    trace_path: Path | None = None

    def step(self) -> None:
        """Nothing to record."""

    def close(self) -> None:
        """Nothing to stop."""

    def __enter__(self) -> NullProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StepProfiler:
    """torch.profiler over wait + warmup + active steps, then out of the way for the rest of the run.

    Starts on construction, so build it right before the loop (used with or without `with`).
    """

    def __init__(self, trace_dir: Path, device: torch.device, *, wait: int, warmup: int, active: int,
                 row_limit: int, worker: str, log: Callable[[str], None] | None = None) -> None:
        self.trace_dir = Path(trace_dir)
        self.done = False
        self.summary = ""
        self.trace_path: Path | None = None
        self._window = (wait, warmup, active)
        self._row_limit = row_limit
        self._worker = worker
        self._log = log
        self._cuda = device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else [])
        self._prof: profile | None = profile(
            activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=self._on_trace_ready, record_shapes=True)
        self._prof.start()

    def step(self) -> None:
        """Mark the end of one training step; stops the profiler for good once the window is saved."""
        if self._prof is None:
            return
        self._prof.step()
        if self.done:
            self.close()

    def close(self) -> None:
        """Stop profiling; a window cut short by the end of the run is still saved if it was recording."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        if not self.done and self._log is not None:
            wait, warmup, active = self._window
            self._log(f"profiler: the run ended within the first {wait + warmup} steps (wait {wait}, "
                      f"warmup {warmup}), before any step was recorded; no trace written")

    def __enter__(self) -> StepProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_trace_ready(self, prof: profile) -> None:
        """Write the trace (as tensorboard_trace_handler names it) and build the top-ops table."""
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        path = self.trace_dir / f"{self._worker}.{time.time_ns()}{TRACE_SUFFIX}"
        prof.export_chrome_trace(str(path))
        sort_by = "self_device_time_total" if self._cuda else "self_cpu_time_total"
        self.summary = prof.key_averages().table(sort_by=sort_by, row_limit=self._row_limit)
        self.trace_path = path
        self.done = True
        if self._log is not None:
            self._log(f"profiler: trace written to {path} (open it with `tensorboard --logdir "
                      f"{self.trace_dir.parent}` or at ui.perfetto.dev); top ops by {sort_by}:\n"
                      + self.summary)


def build_profiler(cfg, output_dir: str | Path, device: torch.device, *, rank: int = 0,
                   log: Callable[[str], None] | None = None) -> StepProfiler | NullProfiler:
    """A StepProfiler from cfg.PROFILE writing to output_dir/profile/, or a NullProfiler when it is off.

    Every rank profiles (so `done` turns True on the same step everywhere and PROFILE.ONLY stops all
    ranks together); each writes its own trace file named after host and rank. Pass `log` on rank 0 only
    to get the top-ops table once.
    """
    p = cfg.PROFILE
    if not p.ENABLED:
        return NullProfiler()
    return StepProfiler(Path(output_dir) / PROFILE, torch.device(device), wait=p.WAIT, warmup=p.WARMUP,
                        active=p.ACTIVE, row_limit=p.ROW_LIMIT, worker=f"{socket.gethostname()}_rank{rank}",
                        log=log)
