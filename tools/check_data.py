#!/usr/bin/env python
"""Check every split a run reads (train, val, and DATA.TEST_SPLIT when set) before training: an image-folder
dataset (DATA.ROOT/<split>/<class>/...), shards (DATA.NAME shards: every sample of every shard read, decoded and its
.cls checked), a Hugging Face or a torchvision dataset (DATA.NAME hf | torchvision: every image opened).

    python tools/check_data.py --cfg configs/my_folder.yaml [KEY VALUE ...]

Opens every image file (the same scan training runs, with the file check forced on), prints the images per
class in each split, every structural problem and every bad file with its reason, all at once.

exit codes: 0 clean; 1 bad files found (listed; training skips them while their share stays within
DATA.BAD_FILE_BUDGET); 2 structural problems (missing root or split folder, DATA.TEST_SPLIT's included, empty split,
empty class, class folders that differ between train and val, a test class folder train lacks, fewer
MODEL.NUM_CLASSES than classes) or bad arguments.
"""
from __future__ import annotations

import sys
import time

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

from runner.data.sources import source
from runner.errors import DataUnavailable, UserError, cli
from runner.preflight import config_command

SPLITS = ("train", "val")  # as in runner.data.folder, which is imported only once the arguments are good


def run_splits(cfg) -> tuple[str, ...]:
    """The splits a run reads: train, val and DATA.TEST_SPLIT when set."""
    return SPLITS + ((cfg.DATA.TEST_SPLIT,) if cfg.DATA.TEST_SPLIT else ())


def n_usable(index, split: str) -> int:
    """Usable images of one split (the test split's too, which FolderIndex.samples does not hold)."""
    return sum(index.counts.get(split, {}).values())


def print_counts(index, splits: tuple[str, ...] = SPLITS) -> None:
    """A table: one row per class, usable (and bad) images per split."""
    width = max([len(c) for c in index.classes] + [5])
    print(f"{'class':<{width}}  " + "  ".join(f"{s:>14}" for s in splits))
    for c in index.classes:
        cells = []
        for s in splits:
            good, bad = index.counts.get(s, {}).get(c), index.bad_counts.get(s, {}).get(c, 0)
            cells.append("-" if good is None else f"{good}" + (f" (+{bad} bad)" if bad else ""))
        print(f"{c:<{width}}  " + "  ".join(f"{x:>14}" for x in cells))
    totals = [f"{n_usable(index, s)}" + (f" (+{index.n_bad(s)} bad)" if index.n_bad(s) else "") for s in splits]
    print(f"{'total':<{width}}  " + "  ".join(f"{x:>14}" for x in totals))


def scan_test_split(cfg, index) -> None:
    """Scan DATA.TEST_SPLIT as the run does (every file checked; classes those of train) into `index`: its counts
    per class, its bad files, and what the run would refuse as a structural problem."""
    from pathlib import Path

    from runner.data.folder.scan import class_dirs, scan_split

    split, train = cfg.DATA.TEST_SPLIT, Path(index.root) / "train"
    classes = [d.name for d in class_dirs(train)] if train.is_dir() else index.classes
    checked = cfg.clone()
    checked.defrost()
    checked.DATA.CHECK = True  # every file opened, as for train and val
    checked.freeze()
    try:
        good, bad = scan_split(checked, split, classes)
    except UserError as e:  # missing, empty, or a class folder train lacks
        index.problems.append(str(e))
        return
    present = [d.name for d in class_dirs(Path(index.root) / split)]  # a class may have no folder here ("-")
    index.counts[split] = dict.fromkeys(present, 0)
    index.bad_counts[split] = dict.fromkeys(present, 0)
    for _, label in good:
        index.counts[split][classes[label]] += 1
    for path, reason in bad:
        index.bad.append((path, reason))
        index.bad_counts[split][Path(path).relative_to(Path(index.root) / split).parts[0]] += 1


def class_count_problems(index, cfg) -> list[str]:
    """MODEL.NUM_CLASSES against the classes found: fewer outputs is a problem (training refuses it), more a note."""
    n, k = len(index.classes), cfg.MODEL.NUM_CLASSES
    if not n or k == n:
        return []
    if k > n:
        print(f"\nnote: MODEL.NUM_CLASSES is {k} but DATA.ROOT has {n} classes: outputs {n}..{k - 1} never get "
              "a target (training warns about it)")
        return []
    return [f"DATA.ROOT {index.root} has {n} classes but MODEL.NUM_CLASSES is {k}: set MODEL.NUM_CLASSES {n}"]


def read_split_shards(cfg, split: str, n_classes: int, counts: dict, bad: list, problems: list) -> int:
    """Read every sample of a split's shards: images decoded, labels checked; returns the samples read."""
    import io

    from PIL import Image

    from runner.data.folder import DECODE_ERRORS
    from runner.data.shards import read_index
    from runner.data.shards.stream import IMAGE_EXTS, Patience, read_shard

    shards, n = read_index(cfg, split), 0
    for url, count in zip(shards.urls, shards.counts, strict=True):
        try:
            for sample in read_shard(url, 0, count, Patience(cfg.DATA.SHARD_RETRIES, cfg.DATA.RETRY_S), count):
                n += 1
                where = f"{url} {sample['__key__']}"
                try:
                    label = int(sample["cls"])
                    assert 0 <= label < n_classes
                    counts[split][label] = counts[split].get(label, 0) + 1
                except (KeyError, ValueError, AssertionError):
                    problems.append(f"{where}: no .cls or a class index outside 0..{n_classes - 1}")
                ext = next((e for e in IMAGE_EXTS if e in sample), None)
                try:
                    Image.open(io.BytesIO(sample[ext] if ext else b"")).load()
                except DECODE_ERRORS as e:
                    bad.append((where, f"{type(e).__name__}: {e}"))
        except (UserError, DataUnavailable) as e:
            problems.append(str(e))
    return n


def print_index_counts(classes: list[str], counts: dict[str, dict[int, int]], cell: int) -> None:
    """A table: one row per class, the samples of each split (counts by class index), columns `cell` wide."""
    width = max([len(c) for c in classes] + [5])
    print(f"{'class':<{width}}  " + "  ".join(f"{s:>{cell}}" for s in counts))
    for i, c in enumerate(classes):
        print(f"{c:<{width}}  " + "  ".join(f"{counts[s].get(i, 0):>{cell}}" for s in counts))


def check_shards(cfg) -> int:
    """DATA.NAME shards: every sample of every shard read and decoded; the same report and exit codes."""
    from runner.data.shards import read_classes

    t0 = time.perf_counter()
    classes = read_classes(cfg)
    splits = run_splits(cfg)
    counts: dict = {s: {} for s in splits}
    bad: list = []
    problems: list = []
    n = sum(read_split_shards(cfg, s, len(classes), counts, bad, problems) for s in splits)
    print(f"DATA.ROOT {cfg.DATA.ROOT}: {len(classes)} classes, {n} samples read in {time.perf_counter() - t0:.1f}s\n")
    print_index_counts(classes, counts, 8)
    if bad:
        print(f"\n{len(bad)} bad samples:")
        for where, reason in bad:
            print(f"  {where}: {reason}")
    if problems:
        print(f"\n{len(problems)} structural problem(s):")
        for p in problems:
            print(f"  {p}")
        print(f"error: {problems[0]}", file=sys.stderr)
        return 2
    if not bad:
        print("\nall samples are readable images with a class")
    return 1 if bad else 0


def check_rows(cfg) -> int:
    """DATA.NAME hf or torchvision: every image of every split the run reads opened and decoded, counted per class
    (the source's own checks, labels and MODEL.NUM_CLASSES first, as training makes them)."""
    import torch

    from runner.distributed import Dist

    plain = cfg.clone()
    plain.defrost()
    plain.DATA.NUM_WORKERS = 0  # the datasets are read here, in this process
    plain.freeze()
    src, alone = source(cfg.DATA.NAME), Dist(0, 1, 0, torch.device("cpu"))
    bundle = src.build(plain, alone)
    splits = {"train": bundle.train, "val": bundle.val}
    if cfg.DATA.TEST_SPLIT:
        splits[cfg.DATA.TEST_SPLIT] = src.build_split(plain, alone, cfg.DATA.TEST_SPLIT)
    names, bad = bundle.class_names, []
    t0 = time.perf_counter()
    counts = {split: _decode_all(loader.loader.dataset, bad) for split, loader in splits.items()}
    total = sum(sum(c.values()) for c in counts.values())
    print(f"DATA.NAME {cfg.DATA.NAME} {cfg.DATA.ROOT}: {len(names)} classes, {total} images checked in "
          f"{time.perf_counter() - t0:.1f}s\n")
    print_index_counts(names, counts, 10)
    if bad:
        print(f"\n{len(bad)} bad images:")
        for what, reason in bad:
            print(f"  {what}: {reason}")
        return 1
    print("\nall images are readable")
    return 0


def _decode_all(dataset, bad: list) -> dict[int, int]:
    """Open and decode every sample of a dataset (FolderDataset over rows); the readable ones per class index."""
    counts: dict[int, int] = {}
    for row, label in dataset.samples:
        try:
            dataset.opener(row).convert("RGB")
        except Exception as e:  # noqa: BLE001 - PIL raises many types for a damaged image
            bad.append((dataset.describe(row), f"{type(e).__name__}: {e}"))
            continue
        counts[label] = counts.get(label, 0) + 1
    return counts


@cli
def main(argv: list[str] | None = None) -> int:
    """Scan DATA.ROOT with every file checked; report; exit 0 clean, 1 bad files, 2 structural problems."""
    loaded = config_command(argv, __doc__)
    if loaded is None:
        return 0
    cfg, _ = loaded
    files = source(cfg.DATA.NAME).files  # what DATA.ROOT holds: image folders, shards, or nothing
    if files == "shards":
        return check_shards(cfg)
    if files in ("hf", "torchvision"):
        return check_rows(cfg)
    if files != "folder" and not cfg.DATA.ROOT:  # a config for in-memory data with a DATA.ROOT: read as folders
        raise UserError(f"tools/check_data.py checks image folders; this config reads DATA.NAME {cfg.DATA.NAME}, "
                        "which has no files to check (give DATA.NAME folder DATA.ROOT <folder> to check one)")
    from runner.data.folder import build_transform, scan_folder

    for training in (True, False):  # AUG.AUTO_AUGMENT, MODEL.IN_CHANS: refused here as training would refuse them
        build_transform(cfg, training)
    t0 = time.perf_counter()
    index = scan_folder(cfg, check=True, strict=False)
    splits = run_splits(cfg)
    if cfg.DATA.TEST_SPLIT:
        scan_test_split(cfg, index)
    n_files = sum(n_usable(index, s) + index.n_bad(s) for s in splits)
    print(f"DATA.ROOT {index.root}: {len(index.classes)} classes, {n_files} image files checked "
          f"in {time.perf_counter() - t0:.1f}s\n")
    print_counts(index, splits)
    for split in splits:
        n_bad, n_all = index.n_bad(split), n_usable(index, split) + index.n_bad(split)
        if n_bad:
            verdict = "over" if n_bad / n_all > cfg.DATA.BAD_FILE_BUDGET else "within"
            print(f"\n{split}: {n_bad} of {n_all} files bad ({n_bad / n_all:.2%}), {verdict} "
                  f"DATA.BAD_FILE_BUDGET {cfg.DATA.BAD_FILE_BUDGET:.2%}")
    problems = index.problems + class_count_problems(index, cfg)
    for note in index.notes:
        print(f"\nnote: {note}")
    if index.bad:
        print(f"\n{len(index.bad)} bad files:")
        for path, reason in index.bad:
            print(f"  {path}: {reason}")
    if problems:
        print(f"\n{len(problems)} structural problem(s):")
        for p in problems:
            print(f"  {p}")
        print(f"error: {problems[0]}", file=sys.stderr)
        return 2
    if not index.bad:
        print("\nall files are readable images")
    return 1 if index.bad else 0


if __name__ == "__main__":
    main()
