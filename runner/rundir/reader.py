"""The one reader of a run folder, finished or running (torch-free): status, results, metrics rows, the stored
config, and the run's state in one word.

The summary, the trackers, the sweep launchers (through `python -m runner.rundir state DIR`) and the tools read a
run only through these functions.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.rundir.layout import CHECKPOINTS, CONFIG, LAST, LOCK, LOG, METRICS, PROFILE, RESULTS, RUN_JSON
from runner.rundir.lock import is_locked
from runner.rundir.marker import is_done, read_json

# A run with no results.json counts as running when one of its files changed this recently (seconds)
ACTIVE_S = 120.0
# Subfolders of a run that never hold runs themselves; skipping them keeps the walk fast
SKIP_DIRS = {CHECKPOINTS, PROFILE}
# Files whose modification time shows that a run is alive
ACTIVITY_FILES = (RUN_JSON, METRICS, LOG, f"{CHECKPOINTS}/{LAST}")


def read_object(out: str | os.PathLike, name: str) -> tuple[dict[str, Any] | None, str]:
    """(the JSON object in OUTPUT_DIR/name, '') or, when it cannot be read, (None, why); a missing file: (None, '')."""
    path = Path(out) / name
    if not path.is_file():
        return None, ""
    try:
        obj = json.loads(path.read_text())
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        return obj, ""
    except (ValueError, OSError) as e:
        return None, _first_line(e)


def results(out: str | os.PathLike) -> dict[str, Any] | None:
    """results.json (written once the run is done), or None when missing or unreadable."""
    return read_json(Path(out) / RESULTS)


def status(out: str | os.PathLike) -> dict[str, Any] | None:
    """run.json (the marker and the run's status), or None when missing or unreadable."""
    return read_json(Path(out) / RUN_JSON)


def finished(out: str | os.PathLike) -> bool:
    """True when results.json says the run is done."""
    return is_done(results(out))


def config_text(out: str | os.PathLike) -> str:
    """config.yaml's text (the frozen config the run trains with); raises OSError when it cannot be read."""
    return (Path(out) / CONFIG).read_text(errors="replace")


def stored_config(out: str | os.PathLike) -> str | None:
    """The run's config as YAML text: config.yaml, else the claim's run.json (a run killed before config.yaml)."""
    stored = Path(out) / CONFIG
    if stored.is_file():
        return stored.read_text()
    claimed = (status(out) or {}).get("config")
    return claimed if isinstance(claimed, str) else None


@dataclass
class Metrics:
    """metrics.jsonl read leniently: the rows that parse, the numbers (from 1) of those that do not, the line count."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    bad: list[int] = field(default_factory=list)
    lines: int = 0


def read_metrics(out: str | os.PathLike) -> Metrics | None:
    """metrics.jsonl's rows, skipping lines that do not parse (a run killed mid-write); None when there is none."""
    path = Path(out) / METRICS
    if not path.is_file():
        return None
    lines = path.read_bytes().splitlines()
    found = Metrics(lines=len(lines))
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError
        except ValueError:
            found.bad.append(number)
            continue
        found.rows.append(record)
    return found


def metrics_rows(out: str | os.PathLike) -> list[dict[str, Any]]:
    """Every row of metrics.jsonl (each has `step` and `epoch`); raises OSError or ValueError on a bad file."""
    return [json.loads(line) for line in (Path(out) / METRICS).read_text().splitlines()]


def find_runs(root: Path) -> list[Path]:
    """Every folder under root (root included) with a config.yaml or a run.lock, in sorted order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        if CONFIG in filenames or LOCK in filenames:
            found.append(Path(dirpath))
    return found


def lock_held(out: str | os.PathLike) -> bool:
    """True while a training process holds the run's lock (OUTPUT_DIR/run.lock)."""
    try:
        return is_locked(out)
    except OSError:
        return False


def recently_active(out: str | os.PathLike, now: float, active_s: float = ACTIVE_S) -> bool:
    """A log, metrics, status or checkpoint file of the run changed within active_s seconds."""
    for name in ACTIVITY_FILES:
        try:
            if now - (Path(out) / name).stat().st_mtime < active_s:
                return True
        except OSError:
            continue
    return False


# run.json statuses of a run that stopped and continues when its command is run again
_RESUMABLE = {"preempted": "preempted; re-run to continue",
              "hung": "ended by the hang watchdog (stacks in its hang/ folder); re-run to continue",
              "interrupted": "stopped with Ctrl-C twice; re-run to continue from the last checkpoint",
              "profiled": "stopped after profiling (PROFILE.ONLY); re-run without it to go on",
              "paused": "paused after an epoch (--pause-after-epoch); re-run to go on",
              "done": "run.json says done but results.json is missing; re-run to finish"}


def unfinished_state(out: Path, run: dict[str, Any] | None, now: float, active_s: float) -> tuple[str, str]:
    """(state, note) of a run without a done results.json, from its lock, run.json (`run`) and file times."""
    if lock_held(out):
        return "running", ""
    raw = str(run.get("status", "")) if run else ""
    if raw == "running" and run.get("host") not in (None, socket.gethostname()):
        # another machine's lock cannot be seen from here: trust recent writes instead
        running = recently_active(out, now, active_s)
        return ("running", f"on {run['host']}") if running else ("interrupted", f"on {run['host']}")
    if raw == "running":
        return "interrupted", "killed (no process holds the run lock); re-run to continue"
    if raw in _RESUMABLE:
        return "interrupted", _RESUMABLE[raw]
    if raw == "failed":
        return "failed", str(run.get("error", ""))
    if raw == "nonfinite":
        return "failed", f"loss became non-finite (step {run.get('step', '?')})"
    if raw:
        return "failed", f"run.json status {raw!r}"
    if recently_active(out, now, active_s):  # no run.json: a run from before run.json, or another tool
        return "running", f"files changed within {active_s:.0f} s"
    progress = (out / CHECKPOINTS).is_dir() or (out / METRICS).is_file()
    return "interrupted", "" if progress else "no metrics or checkpoints"


SETUP_FAILED = ("failed", "stopped during setup (the error is in the job's output)")


def stopped_in_setup(out: Path, run: dict[str, Any] | None) -> bool:
    """True for a folder that a start left without config.yaml, run.json (`run`) or a held lock."""
    return not (out / CONFIG).exists() and run is None and not lock_held(out)


def state_of(out: Path, done: dict[str, Any] | None, run: dict[str, Any] | None, now: float,
             active_s: float = ACTIVE_S) -> tuple[str, str]:
    """(state, note) of a run folder from its results.json (`done`) and run.json (`run`), read by the caller."""
    if is_done(done):
        return "done", ""
    if stopped_in_setup(out, run):
        return SETUP_FAILED
    return unfinished_state(out, run, now, active_s)


def state(out: str | os.PathLike, active_s: float = ACTIVE_S) -> str:
    """One word for a launcher: done | running | interrupted | failed (as the summary says) | missing (no run)."""
    out = Path(out)
    if not out.is_dir() or not any((out / name).exists() for name in (RUN_JSON, CONFIG, LOCK, RESULTS)):
        return "missing"
    return state_of(out, results(out), status(out), time.time(), active_s)[0]


def _first_line(e: BaseException) -> str:
    """First line of an exception message, for one-line notes."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
