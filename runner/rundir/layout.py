"""The run folder's layout: every file and folder name a run writes, defined once (torch-free).

Tools, the summary, the trackers and the sweep scripts name these constants (or read through
`runner.rundir.reader`), never a string literal of their own.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

RUN_JSON = "run.json"  # the marker (whose folder, which format) and the run's status
RESULTS = "results.json"  # written once, when the run is done
METRICS = "metrics.jsonl"  # one JSON object per logged step or evaluation
LOG = "log.txt"  # the console's lines, and tracebacks
CONFIG = "config.yaml"  # the frozen config the run trains with
ENV = "env.txt"  # versions, devices, environment
CLASS_MAP = "class_map.json"  # {"0": "cat", ...} for folder and shard data
TRACKERS = "trackers.json"  # the trackers' own run ids, so a resumed run continues the same tracker run
LOCK = "run.lock"  # held while a job owns the folder
CHECKPOINTS = "checkpoints"  # step_N.pth, last.pth, best.pth
LAST = "last.pth"
BEST = "best.pth"
HANG = "hang"  # each live rank's stacks when a job hung
PROFILE = "profile"  # PROFILE.* traces
KEPT_RESULTS_GLOB = "results-step*.json"  # a finished run's results.json, kept when the run is trained on

# checkpoints/step_<8 digits>.pth: ordered by name (the step), never by modification time
STEP_RE = re.compile(r"^step_(\d+)\.pth$")


def step_name(step: int) -> str:
    """The file name of the checkpoint saved after `step`."""
    return f"step_{step:08d}.pth"


def kept_results_name(step: int) -> str:
    """The name a finished run's results.json keeps when the run is trained on (TRAIN.EXTEND)."""
    return f"results-step{step}.json"


def path(out: str | os.PathLike, name: str) -> Path:
    """OUTPUT_DIR/name."""
    return Path(out) / name


def checkpoints(out: str | os.PathLike) -> Path:
    """OUTPUT_DIR/checkpoints."""
    return Path(out) / CHECKPOINTS


def confusion_name(split: str) -> str:
    """The file name of best.pth's confusion matrix on `split` (confusion_val.png, confusion_test.png)."""
    return f"confusion_{split}.png"
