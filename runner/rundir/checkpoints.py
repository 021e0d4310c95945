"""Finding checkpoints in OUTPUT_DIR/checkpoints/ by name (torch-free): the step files, last.pth, any at all.

What a checkpoint holds, saving and loading it stay in runner/checkpoint.py.
"""
from __future__ import annotations

import os
from pathlib import Path

from runner.rundir.layout import LAST, STEP_RE, checkpoints


def step_files(directory: Path) -> list[tuple[int, Path]]:
    """The step checkpoints in `directory`, newest (highest step) first; ordered by name, never mtime."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := STEP_RE.match(p.name))]
    return sorted(found, reverse=True)


def candidates(output_dir: str | os.PathLike) -> list[Path]:
    """The checkpoints a resume tries, in order: last.pth (when present), then the step files, newest first."""
    d = checkpoints(output_dir)
    found = [d / LAST] if (d / LAST).exists() else []
    return found + [p for _, p in step_files(d)]


def has_checkpoints(output_dir: str | os.PathLike) -> bool:
    """True when OUTPUT_DIR/checkpoints holds any .pth file (whole or not)."""
    d = checkpoints(output_dir)
    return d.is_dir() and any(p.suffix == ".pth" for p in d.iterdir())
