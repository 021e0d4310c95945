"""OUTPUT_DIR/metrics.jsonl as a sink: one JSON object per row, each with `step` and `epoch`."""
from __future__ import annotations

import json
import math
from pathlib import Path

from runner.fsutil import atomic_write
from runner.rundir import layout
from runner.sinks.base import Sink, SinkContext


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop lines past `last_step` (and any partial trailing line) so a resumed run never duplicates steps."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write(path, "".join(line + "\n" for line in kept))


def _clean(v: float) -> float | None:
    """JSON has no NaN: non-finite values are written as null."""
    v = float(v)
    return v if math.isfinite(v) else None


class JsonlSink(Sink):
    """Appends a line per row, flushed at once (a killed run keeps every row it wrote)."""

    def __init__(self, ctx: SinkContext):
        """Cut the file at the resume step (opened first of all sinks: the trackers replay what is left)."""
        path = layout.path(ctx.out, layout.METRICS)
        truncate_jsonl(path, ctx.resume_step)
        self.file = open(path, "a")

    def write(self, step: int, epoch: int, scalars: dict[str, float]) -> None:
        """One line: step, epoch, then the scalars (non-finite ones as null)."""
        row = {"step": step, "epoch": epoch, **{k: _clean(v) for k, v in scalars.items()}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def close(self) -> None:
        """Close the file."""
        self.file.close()


open_sink = JsonlSink
