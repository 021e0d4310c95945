"""DATA.NAME folder: image files under DATA.ROOT/{train,val}/<class>/ (the scan, decode and dataset of this
package) through host DataLoaders.

A source module (runner/data/sources.py): torch, torchvision and timm's transforms only inside `build`.
"""
from __future__ import annotations

import os
from typing import Any


def check(cfg: Any, fail: Any, check_files: bool, world: int) -> None:
    """A DATA.ROOT, and (with files checked) a folder there and at DATA.TEST_SPLIT; the scan checks the trees."""
    if not cfg.DATA.ROOT:
        fail("DATA.NAME", "DATA.NAME folder needs DATA.ROOT, the folder that holds the class folders")
    if check_files and not os.path.isdir(cfg.DATA.ROOT):
        fail("DATA.ROOT", f"DATA.ROOT {cfg.DATA.ROOT!r} is not a folder")
    test = os.path.join(cfg.DATA.ROOT, cfg.DATA.TEST_SPLIT)
    if check_files and cfg.DATA.TEST_SPLIT and not os.path.isdir(test):
        fail("DATA.TEST_SPLIT", f"DATA.TEST_SPLIT {cfg.DATA.TEST_SPLIT!r}: {test} is not a folder (expected "
                                f"DATA.ROOT/{cfg.DATA.TEST_SPLIT}/<class>/<images>)")


def build(cfg: Any, dist: Any) -> Any:
    """Scan (and budget), timm's transforms, and a train and a val DataLoader."""
    from runner.data.build import DataBundle, eval_batch_size
    from runner.data.folder.dataset import build_folder_datasets
    from runner.data.loaders import host_loader

    train_ds, val_ds, names = build_folder_datasets(cfg)
    return DataBundle(host_loader(train_ds, cfg, dist, batch_size=cfg.DATA.BATCH_SIZE, train=True),
                      host_loader(val_ds, cfg, dist, batch_size=eval_batch_size(cfg), train=False), list(names))


def build_split(cfg: Any, dist: Any, split: str) -> Any:
    """An evaluation DataLoader over DATA.ROOT/<split>/ (the test split), classes indexed as training's."""
    from runner.data.build import eval_batch_size
    from runner.data.folder.dataset import build_split_dataset
    from runner.data.loaders import host_loader

    return host_loader(build_split_dataset(cfg, split), cfg, dist, batch_size=eval_batch_size(cfg), train=False)
