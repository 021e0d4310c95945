"""Mistakes knowable before OUTPUT_DIR is claimed: said first, in one line, with nothing written or locked.

Light on purpose (no torch import): tools/train.py asks before anything heavy, on every rank (under torchrun the
number of processes is in the environment). The in-memory data sets' sizes are known without loading them;
image folders and shards are checked where they are read (runner/data, and shards' index in validation).
"""
from __future__ import annotations

import math
import os
from typing import Any

from runner.errors import UserError

# scikit-learn's digits (runner/data/memory.read_digits): 1,797 images of 10 classes, split by DATA.VAL_FRACTION
# as stratified_split cuts it (ceil(fraction x n) for val); tests/test_preflight.py checks both against the data
DIGITS_SAMPLES, DIGITS_CLASSES = 1797, 10


def world_size(env: dict[str, str] | None = None) -> int:
    """The job's processes: torchrun's WORLD_SIZE, 1 without it."""
    value = (os.environ if env is None else env).get("WORLD_SIZE", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def train_split(cfg: Any) -> tuple[int, int] | None:
    """(training samples, classes) of DATA.NAME digits or synthetic, known without loading; None for files."""
    if cfg.DATA.NAME == "digits":
        return DIGITS_SAMPLES - math.ceil(cfg.DATA.VAL_FRACTION * DIGITS_SAMPLES), DIGITS_CLASSES
    if cfg.DATA.NAME == "synthetic":
        return cfg.DATA.SYNTHETIC_SIZE, cfg.MODEL.NUM_CLASSES
    return None


def check_before_claim(cfg: Any, world: int) -> None:
    """Refuse too few MODEL.NUM_CLASSES, or a global batch larger than the training split, in one line."""
    split = train_split(cfg)
    if split is None:
        return
    samples, classes = split
    if cfg.MODEL.NUM_CLASSES < classes:  # the words of runner.data.classes.check_classes, which says it later
        raise UserError(f"DATA.NAME {cfg.DATA.NAME} has {classes} classes but MODEL.NUM_CLASSES is "
                        f"{cfg.MODEL.NUM_CLASSES}: set MODEL.NUM_CLASSES {classes}")
    _check_global_batch(cfg, world, samples)


def _check_global_batch(cfg: Any, world: int, samples: int) -> None:
    """An epoch trains whole global batches only: one larger than the split would train no step at all."""
    batch, accum, repeats = cfg.DATA.BATCH_SIZE, cfg.TRAIN.ACCUM_STEPS, cfg.DATA.REPEATED_AUG
    total = batch * world * accum
    if total <= samples * repeats:
        return
    split = f"{samples} samples" + (f" x DATA.REPEATED_AUG {repeats}" if repeats > 1 else "")
    most = samples * repeats // (world * accum)
    fix = f"DATA.BATCH_SIZE {most} or less" if most >= 1 else "fewer processes or a lower TRAIN.ACCUM_STEPS"
    raise UserError(f"the global batch (DATA.BATCH_SIZE {batch} x {world} process{'es' if world > 1 else ''} x "
                    f"TRAIN.ACCUM_STEPS {accum} = {total}) is larger than the training split of DATA.NAME "
                    f"{cfg.DATA.NAME} ({split}), so an epoch would train no step: use {fix}")
