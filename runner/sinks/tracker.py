"""What the experiment trackers (W&B, MLflow) share as sinks: rows sent only once a checkpoint covers them, the
tracker's run id in OUTPUT_DIR/trackers.json, every library call guarded.

A tracker receives the rows metrics.jsonl gets, but only once a checkpoint covers them (Sink.flush runs right
before each save): a killed run never sent a step its resume will log again, so a resumed run continues the
same tracker run with no step twice, as metrics.jsonl is truncated. The tracker's run id and the last step it
was sent live in OUTPUT_DIR/trackers.json. A tracker that fails warns once and is dropped; the run goes on.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from runner.errors import one_line
from runner.fsutil import atomic_write
from runner.rundir import layout, reader
from runner.sinks.base import Sink, SinkContext

log = logging.getLogger("runner")


def read_state(out: Path) -> dict:
    """OUTPUT_DIR/trackers.json: per tracker, its run id and the last step it was sent; {} when absent."""
    return reader.read_object(out, layout.TRACKERS)[0] or {}


class TrackerSink(Sink):
    """Buffers rows until a checkpoint covers them; every call into the library is guarded (warns once)."""

    name = ""  # the key in trackers.json
    label = ""  # the name in messages

    def __init__(self, ctx: SinkContext):
        """`ctx.params`: the keys TensorBoard's HParams shows (a sweep's swept keys), for tags."""
        self.cfg, self.out, self.params = ctx.cfg, Path(ctx.out), dict(ctx.params)
        self.resume_step = ctx.resume_step
        self.rows: list[tuple[int, int, dict]] = []
        self.sent = 0  # the last step the tracker holds: rows up to it are never sent again
        self.state: dict = {}
        self.failed = False
        self.done = False

    @classmethod
    def open(cls, ctx: SinkContext) -> TrackerSink | None:
        """The module's open_sink: start or continue the tracker's run; None (after one warning) when that fails."""
        sink = cls(ctx)
        return sink if sink.start_run() else None

    def start_run(self) -> bool:
        """Start, or continue the run in trackers.json when resuming from a checkpoint; False when that fails."""
        earlier = read_state(self.out).get(self.name, {}) if self.resume_step > 0 else {}
        if earlier and not self.same_store(earlier):
            earlier = {}
        self.sent = int(earlier.get("step", 0))
        state = self.guard("starting its run", self.start, earlier)
        if state is None:
            return False
        self.state = {**state, "step": self.sent}
        self.save_state()
        return True

    def same_store(self, earlier: dict) -> bool:
        """True when the run in trackers.json lives where this config logs (the store may have changed)."""
        return True

    def write(self, step: int, epoch: int, scalars: dict[str, float]) -> None:
        """Keep a row until a checkpoint covers it (no I/O here: this runs after training steps)."""
        if step > self.sent and not self.failed:
            self.rows.append((step, epoch, dict(scalars)))

    def flush(self) -> None:
        """A checkpoint is about to cover every row kept: send them."""
        if not self.rows or self.failed:
            return
        rows, self.rows = self.rows, []
        if self.guard("logging", self.send, rows) is not None:
            self.sent = rows[-1][0]
            self.state["step"] = self.sent
            self.save_state()

    def finish(self, hparams: dict, metrics: dict) -> None:
        """The run completed: the rows left, then its final results as the run's summary."""
        self.flush()
        if not self.failed:
            self.done = self.guard("writing the results", self.summary, {**metrics, "status": "done"}) is not None

    def close(self) -> None:
        """End the tracker's run; rows no checkpoint covers are dropped (a resume logs them again)."""
        self.rows = []
        if not self.failed:
            self.guard("closing its run", self.end, self.done)

    def guard(self, what: str, fn, *args):
        """fn(*args), or None after one warning on failure (the tracker is then dropped: the run goes on)."""
        try:
            result = fn(*args)
        except Exception as e:  # any library or store failure: a tracker never costs a run
            self.failed = True
            log.warning("%s: %s failed (%s: %s); the run goes on without %s", self.label, what, type(e).__name__,
                        (one_line(str(e)).strip().splitlines() or [""])[0][:200], self.label)
            return None
        return True if result is None else result

    def save_state(self) -> None:
        """Write this tracker's entry of trackers.json (rank 0 only writes: trackers open on rank 0)."""
        state = read_state(self.out)
        state[self.name] = self.state
        atomic_write(layout.path(self.out, layout.TRACKERS), json.dumps(state, indent=1) + "\n")

    # ---- what each tracker module implements --------------------------------------------------------------
    def start(self, earlier: dict) -> dict:
        """Open a new run, or continue `earlier` (its trackers.json entry); returns the entry to keep."""
        raise NotImplementedError

    def send(self, rows: list[tuple[int, int, dict]]) -> None:
        """Log (step, epoch, scalars) rows, in step order."""
        raise NotImplementedError

    def summary(self, results: dict) -> None:
        """The run's final results."""
        raise NotImplementedError

    def end(self, done: bool) -> None:
        """Close the run (done: it completed; otherwise it stopped and may be resumed)."""
        raise NotImplementedError


def logged_rows(out: Path, last_step: int) -> list[tuple[int, int, dict]]:
    """metrics.jsonl's rows up to `last_step` as (step, epoch, scalars); non-finite values (null) left out."""
    rows = []
    for row in reader.metrics_rows(out):
        if row["step"] <= last_step:
            scalars = {k: v for k, v in row.items() if k not in ("step", "epoch") and v is not None}
            rows.append((row["step"], row["epoch"], scalars))
    return rows


def run_name(out: Path) -> str:
    """The tracker run's name: OUTPUT_DIR's folder name."""
    return Path(out).resolve().name


def group_name(out: Path) -> str:
    """OUTPUT_DIR's parent folder name: a sweep's folder, so a sweep's points land together."""
    return Path(out).resolve().parent.name


def flat_config(cfg) -> dict:
    """The merged config as flattened KEY: value pairs (lists as text), as the summary table uses them."""
    from runner.config import flatten

    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in flatten(cfg).items()}
