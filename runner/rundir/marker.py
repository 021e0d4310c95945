"""run.json: the marker that says a folder is a run of ours (and which format), and the run's status; results.json.

Light on purpose (no torch import): tools/train.py asks whether a folder is ours before anything heavy loads.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

from runner.fsutil import atomic_write
from runner.rundir.layout import LOCK, RESULTS, RUN_JSON
from runner.rundir.lock import is_holder_text

# OUTPUT_DIR/run.json "status" values; results.json exists only for "done".
RUNNING, DONE, FAILED, PREEMPTED, NONFINITE, PROFILED, INTERRUPTED, HUNG, PAUSED = (
    "running", "done", "failed", "preempted", "nonfinite", "profiled", "interrupted", "hung", "paused")
STATUSES = {RUNNING, DONE, FAILED, PREEMPTED, NONFINITE, PROFILED, INTERRUPTED, HUNG, PAUSED}

# run.json's "format": the marker that says a folder is a run of ours and may be written into; a newer version
# is refused (this code cannot know what that runner keeps in the folder)
RUN_VERSION = 1
RUN_FORMAT = f"runner-run/{RUN_VERSION}"
FORMAT_RE = re.compile(r"runner-run/([0-9]+)")
# what an earlier version's run.json held (no "format" yet); still recognised as ours
_LEGACY_RUN_KEYS = {"status", "pid", "host", "updated"}


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write JSON through the one atomic writer (temporary file, fsync, rename)."""
    atomic_write(path, json.dumps(obj, indent=2) + "\n")


def write_status(output_dir: str | os.PathLike, status: str, **extra) -> None:
    """OUTPUT_DIR/run.json: the status the sweep summary reads, and the marker that the folder is our run."""
    obj = {"format": RUN_FORMAT, "status": status, "pid": os.getpid(), "host": socket.gethostname(),
           "updated": time.time(), **extra}
    write_json_atomic(Path(output_dir) / RUN_JSON, obj)


def write_results(output_dir: str | os.PathLike, results: dict) -> None:
    """OUTPUT_DIR/results.json, written once when the run is done."""
    write_json_atomic(Path(output_dir) / RESULTS, results)


def read_json(path: Path) -> dict | None:
    """A JSON file's object, or None when missing or unreadable."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def is_done(results: dict | None) -> bool:
    """True for the results.json of a finished run."""
    return bool(results) and results.get("status") == DONE


def is_our_run(out: Path) -> bool:
    """True when `out` holds our marker: a run.json we wrote (or a bare run.lock left by a start-up)."""
    obj = read_json(out / RUN_JSON)
    if obj is not None:
        return obj.get("format") == RUN_FORMAT or (_LEGACY_RUN_KEYS <= set(obj) and obj["status"] in STATUSES)
    try:
        entries = [p.name for p in out.iterdir()]
        lock_text = (out / LOCK).read_text(errors="replace") if entries == [LOCK] else ""
    except OSError:
        return False
    return is_holder_text(lock_text)  # another job is starting in it
