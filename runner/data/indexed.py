"""What DATA.NAME hf and torchvision share: a set indexable by row, each row an (image, label), read through the
image folders' timm transforms, bad-image budget and resumable host loaders (runner/data/folder/dataset.py,
runner/data/loaders.py), and one download per node.

A source builds one `Rows` per split (the (row, label) samples and how a row becomes a PIL image); `bundle` does
the rest. The order, mid-epoch and elastic resume are the folder's: ShardSampler's layout-free global order from
(SEED, epoch), each training sample's random transforms seeded by its place in it. torch only inside functions.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runner.errors import UserError

log = logging.getLogger("runner")

# what a run-time decode failure says to do: check_data.py reads image folders and shards only
HINT = "the warnings above name each one"


@dataclass(frozen=True)
class Rows:
    """One split: (row, class index) samples, `opener(row)` the row's PIL image, `describe(row)` its name."""

    split: str
    samples: list[tuple[Any, int]]
    opener: Callable[[Any], Any]
    describe: Callable[[Any], str]


def check_labels(rows: Rows, classes: int, where: str) -> None:
    """Every label a class index below `classes`; the first one that is not, in one line (unlabelled test rows
    of Hub sets hold -1)."""
    for row, label in rows.samples:
        if not 0 <= label < classes:
            raise UserError(f"{where}: {rows.describe(row)} has label {label}, not a class index 0..{classes - 1} "
                            f"(an unlabelled split?); name a labelled split for {rows.split}")


def dataset(cfg: Any, rows: Rows, training: bool) -> Any:
    """A FolderDataset over `rows`: timm's transforms from cfg.AUG, bad images skipped within DATA.BAD_FILE_BUDGET."""
    from runner.data.folder.dataset import FolderDataset, build_transform

    return FolderDataset(rows.samples, build_transform(cfg, training), budget=cfg.DATA.BAD_FILE_BUDGET,
                         split=rows.split, opener=rows.opener, describe=rows.describe, hint=HINT)


def bundle(cfg: Any, dist: Any, train: Rows, val: Rows, names: Sequence[str], where: str) -> Any:
    """The run's DataBundle: class names checked against MODEL.NUM_CLASSES, a train and a val DataLoader."""
    from runner.data.build import DataBundle, eval_batch_size
    from runner.data.classes import check_classes
    from runner.data.loaders import host_loader

    check_classes(cfg, names, where)
    for rows in (train, val):
        check_labels(rows, len(names), where)
        log.info("%s: %d images in %d classes (%s)", rows.split, len(rows.samples),
                 len({label for _, label in rows.samples}), where)
    return DataBundle(host_loader(dataset(cfg, train, True), cfg, dist, batch_size=cfg.DATA.BATCH_SIZE, train=True),
                      host_loader(dataset(cfg, val, False), cfg, dist, batch_size=eval_batch_size(cfg), train=False),
                      list(names))


def eval_loader(cfg: Any, dist: Any, rows: Rows, classes: int, where: str) -> Any:
    """An evaluation DataLoader over `rows` (DATA.TEST_SPLIT, tools/eval.py --split)."""
    from runner.data.build import eval_batch_size
    from runner.data.loaders import host_loader

    check_labels(rows, classes, where)
    log.info("%s: %d images (%s)", rows.split, len(rows.samples), where)
    return host_loader(dataset(cfg, rows, False), cfg, dist, batch_size=eval_batch_size(cfg), train=False)


def local_first(dist: Any, load: Callable[[bool], Any]) -> Any:
    """Each process's load(first), one stage at a time with a barrier after each: rank 0 (first=True), then the
    other nodes' local rank 0 (first=True: a DATA.ROOT shared between nodes is complete by then, so nothing is
    downloaded twice; a node-local one is downloaded once on each node), then the rest (first=False), reading what
    their node's first process left. A failure is raised after the last barrier, so no rank waits for a failed one;
    the later stages then fail alike (the same data is missing)."""
    from runner.distributed import barrier

    value, error = None, None
    stages = (dist.rank == 0, dist.local_rank == 0 and dist.rank > 0, dist.local_rank > 0)
    for stage, mine in enumerate(stages):
        if mine:
            try:
                value = load(stage < 2)
            except Exception as e:  # noqa: BLE001 - raised below, after the barriers the other ranks wait at
                error = e
        barrier()
    if error is not None:
        raise error
    return value
