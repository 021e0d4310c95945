"""DATA.NAME synthetic: random images and labels made on the device (benchmarks, smoke tests).

A source module (runner/data/sources.py): torch only inside `build`.
"""
from __future__ import annotations

from typing import Any


def known_split(cfg: Any) -> tuple[int, int]:
    """(training samples, classes): DATA.SYNTHETIC_SIZE images of MODEL.NUM_CLASSES classes."""
    return cfg.DATA.SYNTHETIC_SIZE, cfg.MODEL.NUM_CLASSES


def build(cfg: Any, dist: Any) -> Any:
    """Seeded random tensors (runner/data/memory.synthetic_tensors) behind in-memory loaders."""
    from runner.data.build import in_memory_bundle
    from runner.data.memory import synthetic_tensors

    names = [str(i) for i in range(cfg.MODEL.NUM_CLASSES)]
    return in_memory_bundle(cfg, dist, synthetic_tensors(cfg, dist.device), names)
