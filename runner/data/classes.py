"""Class names: the check against MODEL.NUM_CLASSES that every data set passes, and OUTPUT_DIR/class_map.json."""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.fsutil import atomic_write
from runner.rundir.layout import CLASS_MAP

log = logging.getLogger("runner")


def check_classes(cfg: Any, class_names: Sequence[str], where: str) -> None:
    """Refuse fewer MODEL.NUM_CLASSES outputs than the data has classes (targets would index past the
    classifier: a crash in the loss, or silently wrong top-k); more outputs train, with a warning."""
    n, k = len(class_names), cfg.MODEL.NUM_CLASSES
    if k < n:
        raise UserError(f"{where} has {n} classes but MODEL.NUM_CLASSES is {k}: set MODEL.NUM_CLASSES {n}")
    if k > n:
        log.warning("%s has %d classes but MODEL.NUM_CLASSES is %d: outputs %d..%d never get a target "
                    "(set MODEL.NUM_CLASSES %d unless that is meant)", where, n, k, n, k - 1, n)


def write_class_map(output_dir: str | Path, classes: Sequence[str]) -> Path:
    """Write OUTPUT_DIR/class_map.json ({"0": "cat", ...}) atomically; return its path."""
    path = Path(output_dir) / CLASS_MAP
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({str(i): c for i, c in enumerate(classes)}, indent=1) + "\n")
    return path


def read_class_map(path: str | Path) -> list[str]:
    """Class names by index from a class_map.json written by write_class_map."""
    try:
        raw = json.loads(Path(path).read_text())
        names = [raw[str(i)] for i in range(len(raw))]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a readable class map ({{\"0\": \"name\", ...}}): {e}") from None
    return [str(n) for n in names]
