"""Mistakes knowable before OUTPUT_DIR is claimed: said first, in one line, with nothing written or locked.

Light on purpose (no torch import): tools/train.py asks before anything heavy, on every rank (under torchrun the
number of processes is in the environment). Here the config meets its data source (runner/data/sources.py): the
name and the source's own rules (a folder's DATA.ROOT, shards' index), then, for a source whose size is known
without loading it (digits, synthetic), MODEL.NUM_CLASSES and the global batch. `load_config` and
`config_command` are runner.config's with the source's rules added: the tools' opening.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from runner.data import sources
from runner.errors import UserError


def world_size(env: dict[str, str] | None = None) -> int:
    """The job's processes: torchrun's WORLD_SIZE, 1 without it."""
    value = (os.environ if env is None else env).get("WORLD_SIZE", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def load_config(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None,
                check_paths: bool = True) -> tuple[Any, Any]:
    """runner.config.load_config, then DATA.NAME and its source's rules (files only when they are checked)."""
    from runner.config import load_config as load

    cfg, info = load(argv, parser, check_paths=check_paths)
    sources.check_config(cfg, info.provenance, check_files=check_paths and not info.showing, world=world_size())
    return cfg, info


def config_command(argv: list[str] | None, parser: argparse.ArgumentParser | str,
                   check_paths: bool = True, resolve_auto: bool = True) -> tuple[Any, Any] | None:
    """Every tool's opening (runner.config.config_command) with the data source's rules checked too.

    `resolve_auto`: DATA.MEAN and the other "auto" keys take their values now (runner.weights.preprocess);
    tools/train.py resolves them later, in build_trainer, where a resume takes its stored values instead.
    """
    from runner.config import build_parser, handle_info_flags

    if isinstance(parser, str):
        parser = build_parser(description=parser, formatter_class=argparse.RawDescriptionHelpFormatter)
    cfg, info = load_config(argv, parser, check_paths=check_paths)
    if handle_info_flags(cfg, info):
        return None
    if resolve_auto:
        from runner.weights.preprocess import resolve

        cfg = resolve(cfg)
    return cfg, info


def train_split(cfg: Any) -> tuple[int, int] | None:
    """(training samples, classes) of DATA.NAME's source when known without loading (digits, synthetic); else None."""
    return sources.source(cfg.DATA.NAME).known_split(cfg)


def check_before_claim(cfg: Any, world: int, provenance: dict[str, str] | None = None) -> None:
    """The data source's rules, then too few MODEL.NUM_CLASSES or a global batch larger than the training split."""
    sources.check_config(cfg, provenance, world=world)
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
