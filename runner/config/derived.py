"""What a config value means at run time, read by the parts that use it (torch-free, no config import):
TRAIN.TIME_LIMIT in seconds, the training image size of an epoch, the direction of CHECKPOINT.BEST_METRIC.

validation.py checks with these as well (a TIME_LIMIT that parses).
"""
from __future__ import annotations

import math
from typing import Any


def parse_time_limit(text: str) -> float | None:
    """TRAIN.TIME_LIMIT in seconds (0.0 for "" or 0: none); None when it is not seconds or [D-][H:]MM:SS."""
    text = str(text).strip()
    if not text:
        return 0.0
    days = 0
    if "-" in text and ":" in text:  # SLURM's D-HH:MM:SS
        head, text = text.split("-", 1)
        days = int(head) if head.isdigit() else -1
    parts = text.split(":")
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        return None
    if days < 0 or len(nums) > 3 or any(n < 0 or n != n for n in nums) or (len(nums) > 1 and nums[-1] >= 60) \
            or (len(nums) == 3 and nums[1] >= 60):  # H:MM:SS; a bare MM:SS may count 90 minutes, as SLURM's
        return None
    seconds = days * 86400 + sum(n * 60**i for i, n in enumerate(reversed(nums)))
    return seconds


def train_img_size(cfg: Any, epoch: int) -> int:
    """The training image size of (0-based) `epoch`: DATA.IMG_SIZE_SCHEDULE's, DATA.IMG_SIZE without one.

    Starts below 1 are fractions of TRAIN.EPOCHS (epoch floor(f x EPOCHS) on, so they follow an extended run),
    whole starts are epochs; a pure function of the config and the epoch, so a resume, another number of
    processes or a longer run find the same size for the epochs they share.
    """
    size = cfg.DATA.IMG_SIZE
    pairs = list(cfg.DATA.IMG_SIZE_SCHEDULE)
    fractions = bool(pairs) and max(p[0] for p in pairs) < 1
    for start, side in pairs:
        first = math.floor(start * cfg.TRAIN.EPOCHS + 1e-9) if fractions else int(start)
        if epoch >= first:
            size = int(side)
    return size


def best_mode(metric: str, mode: str) -> str:
    """CHECKPOINT.BEST_MODE for `metric`: max or min; auto: min for a loss, max otherwise (as timm's train.py)."""
    if mode != "auto":
        return mode
    return "min" if metric.rsplit("/", 1)[-1] == "loss" else "max"
