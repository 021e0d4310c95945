"""MetricWriter: the one place the engine's producers (training windows, evaluation, the final results) write
scalars through; it fans each call out to the sinks the config turns on (runner.sinks.catalog), none of
which the producers know."""
from __future__ import annotations

import time
from pathlib import Path

from runner.sinks.base import Sink, SinkContext
from runner.sinks.catalog import open_sinks


class MetricWriter:
    """Every open sink, called in the table's order. Rank 0 only: elsewhere (enabled False) it does nothing."""

    def __init__(self, output_dir: str, cfg, resume_step: int, enabled: bool, total_steps: int,
                 params: dict | None = None, t_start: float | None = None):
        """`params`: the run's HParams keys (run_hparams), which trackers use as tags; `t_start`: when this
        process started the run (time.time(); default now), for the console's ETA."""
        self.enabled = enabled
        self.sinks: list[Sink] = []
        if enabled:
            ctx = SinkContext(cfg, Path(output_dir), resume_step, total_steps, dict(params or {}),
                              time.time() if t_start is None else t_start)
            self.sinks = open_sinks(ctx)

    @property
    def bar(self):
        """The console's progress bar while it is drawn, else None."""
        return next((s.bar for s in self.sinks if getattr(s, "bar", None) is not None), None)

    def write(self, step: int, epoch: int, scalars: dict[str, float]) -> None:
        """Record scalars at `step` in every sink."""
        for sink in self.sinks:
            sink.write(step, epoch, scalars)

    def flush(self) -> None:
        """A checkpoint is about to cover every scalar written so far: each sink makes them durable."""
        for sink in self.sinks:
            sink.flush()

    def end_progress(self) -> None:
        """Training stopped: the progress bar closes (it stays on screen), the lines that follow print below it."""
        for sink in self.sinks:
            sink.end_progress()

    def image(self, tag: str, image, step: int) -> None:
        """Record a picture (a PIL image) at `step` in every sink that shows pictures (TensorBoard)."""
        for sink in self.sinks:
            draw = getattr(sink, "image", None)  # a sink written before pictures existed has no such method
            if draw is not None:
                draw(tag, image, step)

    def hparams(self, hparams: dict, metrics: dict) -> None:
        """The run completed: its HParams keys and final metrics to every sink (TensorBoard's HParams tab, the
        trackers' summaries)."""
        for sink in self.sinks:
            sink.finish(hparams, metrics)

    def close(self) -> None:
        """End the progress bar first (a sink's closing lines print below it), then close every sink."""
        self.end_progress()
        for sink in self.sinks:
            sink.close()
