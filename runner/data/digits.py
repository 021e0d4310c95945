"""DATA.NAME digits: scikit-learn's 8x8 digits (1,797 images of 10 classes), resized and kept in memory.

A source module (runner/data/sources.py): torch only inside `build`.
"""
from __future__ import annotations

import math
from typing import Any

# runner/data/memory.read_digits: 1,797 images of 10 classes, split by DATA.VAL_FRACTION as stratified_split cuts
# it (ceil(fraction x n) for val); tests/test_preflight.py checks both against the data
DIGITS_SAMPLES, DIGITS_CLASSES = 1797, 10


def known_split(cfg: Any) -> tuple[int, int]:
    """(training samples, classes), known without loading."""
    return DIGITS_SAMPLES - math.ceil(cfg.DATA.VAL_FRACTION * DIGITS_SAMPLES), DIGITS_CLASSES


def build(cfg: Any, dist: Any) -> Any:
    """The digits as tensors on the training device, checked against MODEL.NUM_CLASSES first."""
    from runner.data.build import in_memory_bundle
    from runner.data.classes import check_classes
    from runner.data.memory import load_digits_tensors

    names = [str(i) for i in range(DIGITS_CLASSES)]
    check_classes(cfg, names, "DATA.NAME digits")
    return in_memory_bundle(cfg, dist, load_digits_tensors(cfg), names)
