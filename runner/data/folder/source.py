"""DATA.NAME folder: image files under DATA.ROOT/{train,val}/<class>/ (the scan, decode and dataset of this
package) through host DataLoaders.

A source module (runner/data/sources.py): torch, torchvision and timm's transforms only inside `build`.
"""
from __future__ import annotations

import os
from pathlib import Path
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


def known_split(cfg: Any) -> None:
    """None: only the scan in `build` counts the usable images. Before that, and before torch loads, the mistakes
    that the names of the split and class folders show alone (no file opened, one folder listed per split) are
    said in the scan's words: a split folder missing or without class folders, class folders that differ between
    train and val, fewer MODEL.NUM_CLASSES than class folders."""
    from runner.data.classes import check_classes
    from runner.data.folder.scan import CHECK_TOOL
    from runner.errors import UserError

    root = Path(cfg.DATA.ROOT).expanduser()
    classes, problems = _class_folders(root)
    if problems:
        more = f" (and more; {CHECK_TOOL} lists every problem)" if len(problems) > 1 else ""
        raise UserError(problems[0] + more)
    if cfg.MODEL.NUM_CLASSES < len(classes):  # more outputs than classes is a warning, said once by the scan
        check_classes(cfg, classes, f"DATA.ROOT {root}")
    return None


def _class_folders(root: Path) -> tuple[list[str], list[str]]:
    """(the class folder names of both splits, the problems their listing shows) of an image-folder tree."""
    from runner.data.folder.scan import IMG_EXTENSIONS, SPLITS, class_dirs

    found: dict[str, set[str]] = {}
    problems = []
    for split in SPLITS:
        split_dir = root / split
        if not split_dir.is_dir():
            problems.append(f"missing split folder {split_dir}: expected DATA.ROOT/{split}/<class>/<images>")
            continue
        found[split] = {d.name for d in class_dirs(split_dir)}
        if not found[split]:
            loose = [f for f in split_dir.iterdir() if f.is_file() and f.name.lower().endswith(IMG_EXTENSIONS)]
            where = (f"its {len(loose)} images lie directly in it; move them into {split_dir}/<class>/" if loose
                     else f"no class folder with images ({'/'.join(IMG_EXTENSIONS)}) inside")
            problems.append(f"empty split {split_dir}: {where}")
    if len(found) == 2 and all(found.values()) and found["train"] != found["val"]:
        only_train, only_val = sorted(found["train"] - found["val"]), sorted(found["val"] - found["train"])
        problems.append("class folders differ between train and val: "
                        f"only in train: {', '.join(only_train) or '-'}; only in val: {', '.join(only_val) or '-'}")
    return sorted(set().union(*found.values())), problems


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
