"""The one interface of every destination of scalars, and what a sink is opened with.

Like detectron2's EventWriter: producers (the training windows, evaluation, the final results) write scalars
once, through runner.sinks.writer.MetricWriter; each sink decides how to write them, what a resume truncates,
and how it closes. No sink knows of another.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SinkContext:
    """What a sink is opened with (rank 0 only, at the loop's start)."""

    cfg: Any  # the frozen run config
    out: Path  # OUTPUT_DIR
    resume_step: int  # the step the run continues from (0: a fresh run); rows past it are written again
    total_steps: int  # the run's last step
    params: dict = field(default_factory=dict)  # the run's HParams keys and values (tensorboard.run_hparams)
    t_start: float = 0.0  # time.time() when this process started the run (the console's ETA)


class Sink:
    """A destination of scalars; every method does nothing unless overridden.

    The lifecycle: built by its module's `open_sink(ctx)` (catalog.SINKS), then `write` per row, `flush` before
    each checkpoint, `end_progress` when training stops, `finish` once when the run completed, `close` always.
    """

    def write(self, step: int, epoch: int, scalars: dict[str, float]) -> None:
        """Record a row of scalars at `step` (training windows and evaluations may share a step)."""

    def flush(self) -> None:
        """A checkpoint is about to cover every row written so far: make them durable now."""

    def end_progress(self) -> None:
        """Training stopped (done or not): what the sink draws on the terminal ends, lines follow below it."""

    def image(self, tag: str, image: Any, step: int) -> None:
        """Record a picture (a PIL image, e.g. a confusion matrix) at `step`; sinks without pictures skip it."""

    def finish(self, hparams: dict, metrics: dict) -> None:
        """The run completed: its HParams keys and values, and its final metrics (results.json's)."""

    def close(self) -> None:
        """Release what the sink holds, however the run ended (rows no checkpoint covers may be dropped)."""
