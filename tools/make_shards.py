#!/usr/bin/env python
"""Pack an image folder (SRC/train/<class>/..., SRC/val/<class>/...) into webdataset tar shards for DATA.NAME shards.

    python tools/make_shards.py SRC DST [--shard-size 1000] [--seed 0] [--class-order]

Writes DST/train/train-000000.tar ..., DST/val/val-000000.tar ... (and DST/test/... when SRC has a test/ split of
the same class folders, for DATA.TEST_SPLIT test), each split's index.json (shard names and
sample counts, so a run knows its steps per epoch before step 1) and DST/class_map.json. Each sample is KEY.jpg
(the file's own bytes, not re-encoded; .png etc. keep their extension) and KEY.cls (the class index). Samples are
mixed across classes with a seeded permutation (--class-order keeps them class by class: the worst case for a
streaming shuffle). The same folder and settings give the same bytes. A class folder is walked as DATA.NAME folder
walks it (runner/data/folder/scan.py's own walk): images in its sub-folders are packed too, hidden entries skipped.

Shards are made to be published, so only what SRC holds goes in: a symbolic link whose target is outside SRC stops
the tool before anything is written (skipping it would publish a data set that silently lacks those samples; copy
what belongs in SRC, or remove the link). A file that is not a decodable image (the check tools/check_data.py
makes) is left out and named on stderr, one line each ("skipped PATH: REASON"), as training would skip it.

exit codes: 0 written (files left out are named); 2 bad arguments (missing SRC split or class, DST not empty, shard
size below 1, a link out of SRC, a split with no decodable image).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runner.data.folder.scan import IMG_EXTENSIONS, class_dirs, image_files
from runner.data.shards.index import CLASS_MAP
from runner.errors import UserError, argument_error, cli

SPLITS = ("train", "val")
OPTIONAL_SPLITS = ("test",)  # packed too when SRC has it: a held-out split for DATA.TEST_SPLIT


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """SRC, DST and the shard settings."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.error = argument_error  # one line, exit 2
    p.add_argument("src", help="image folder: SRC/train/<class>/*, SRC/val/<class>/*")
    p.add_argument("dst", help="output folder (created; must be empty)")
    p.add_argument("--shard-size", type=int, default=1000, help="samples per shard (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the permutation that mixes classes")
    p.add_argument("--class-order", action="store_true", help="keep samples class by class (no mixing)")
    return p.parse_args(argv)


def list_split(src: Path, split: str, classes: list[str]) -> list[tuple[Path, int]]:
    """(file, class index) of one split, class by class: the files DATA.NAME folder trains on (its own recursive
    walk of a class folder, sub-folders included, hidden entries skipped), sorted by path."""
    out = []
    for i, name in enumerate(classes):
        folder = src / split / name
        if not folder.is_dir():
            raise UserError(f"{folder} is missing: every class of {src / 'train'} needs a folder in {split}/ too")
        out += [(Path(f), i) for f in image_files(folder)]  # the folder source's own walk: sub-folders too
    if not out:
        raise UserError(f"{src / split} holds no image files ({', '.join(IMG_EXTENSIONS)})")
    return out


def outside_links(src: Path, samples: list[tuple[Path, int]]) -> list[tuple[Path, Path]]:
    """(file, where it really is) of the files that resolve outside SRC (through a link to them or a folder)."""
    top = src.resolve()
    real = [(path, path.resolve()) for path, _ in samples]
    return [(path, target) for path, target in real if not target.is_relative_to(top)]


def refuse_outside_links(src: Path, splits: dict[str, list[tuple[Path, int]]]) -> None:
    """One line naming the first file linked from outside SRC, and how many there are."""
    found = [pair for samples in splits.values() for pair in outside_links(src, samples)]
    if found:
        path, target = found[0]
        raise UserError(f"{path} links to {target}, outside SRC {src}: shards are made to be published, so only files "
                        f"under SRC are packed ({len(found)} such file(s)); copy the ones that belong in the data "
                        "set into SRC, or remove the links")


def decodable(split: str, src: Path, samples: list[tuple[Path, int]]) -> tuple[list, list[str]]:
    """The samples whose file is a decodable image, and a 'skipped PATH: REASON' line for each other one."""
    from runner.data.folder import check_file  # tools/check_data.py's check; imports torch: after argument checks

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        reasons = list(pool.map(lambda sample: check_file(str(sample[0])), samples))
    kept = [sample for sample, reason in zip(samples, reasons, strict=True) if reason is None]
    if not kept:
        raise UserError(f"{src / split} holds no decodable image: all {len(samples)} image files are unreadable "
                        "(tools/check_data.py lists why)")
    return kept, [f"skipped {path}: {reason}" for (path, _), reason in zip(samples, reasons, strict=True) if reason]


def sample_key(n: int, path: Path, class_name: str) -> str:
    """A tar key without dots (webdataset splits the extension at the first dot) that still names the file."""
    return f"{n:07d}_" + re.sub(r"[^A-Za-z0-9_-]", "_", f"{class_name}_{path.stem}")


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """One member with fixed metadata, so the same input gives the same bytes."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


def write_split(samples: list[tuple[Path, int]], classes: list[str], out: Path, split: str,
                shard_size: int) -> list[list]:
    """Shards of `shard_size` samples; returns the index rows [name, count]."""
    out.mkdir(parents=True)
    rows = []
    for s in range(0, len(samples), shard_size):
        name = f"{split}-{s // shard_size:06d}.tar"
        part = samples[s:s + shard_size]
        with tarfile.open(out / name, "w", format=tarfile.USTAR_FORMAT) as tar:
            for n, (path, label) in enumerate(part, start=s):
                key = sample_key(n, path, classes[label])
                ext = "jpg" if path.suffix.lower() == ".jpeg" else path.suffix.lower()[1:]
                add_member(tar, f"{key}.{ext}", path.read_bytes())
                add_member(tar, f"{key}.cls", str(label).encode())
        rows.append([name, len(part)])
    return rows


@cli
def main(argv: list[str] | None = None) -> int:
    """Check SRC and DST, then write each split's shards and index, and the class map."""
    args = parse_args(argv)
    src, dst = Path(args.src), Path(args.dst)
    if args.shard_size < 1:
        raise UserError(f"--shard-size {args.shard_size}: a shard holds at least 1 sample")
    if not (src / "train").is_dir() or not (src / "val").is_dir():
        raise UserError(f"{src} needs train/ and val/ folders of class folders (SRC/train/<class>/*.jpg)")
    if dst.exists() and any(dst.iterdir()):
        raise UserError(f"{dst} is not empty: give a new folder (shards are never overwritten)")
    classes = [d.name for d in class_dirs(src / "train")]
    if not classes:
        raise UserError(f"{src / 'train'} has no class folders")
    present = SPLITS + tuple(split for split in OPTIONAL_SPLITS if (src / split).is_dir())
    splits = {split: list_split(src, split, classes) for split in present}  # all checked before writing
    refuse_outside_links(src, splits)
    checked = {split: decodable(split, src, samples) for split, samples in splits.items()}
    for split, (samples, skipped) in checked.items():
        for line in skipped:
            print(line, file=sys.stderr)
        if not args.class_order:
            random.Random(f"{args.seed}-{split}").shuffle(samples)
        rows = write_split(samples, classes, dst / split, split, args.shard_size)
        (dst / split / "index.json").write_text(json.dumps({"shards": rows}) + "\n")
        print(f"{split}: {len(samples)} samples in {len(rows)} shards under {dst / split}"
              + (f" ({len(skipped)} files skipped: not decodable images)" if skipped else ""))
    (dst / CLASS_MAP).write_text(json.dumps({str(i): c for i, c in enumerate(classes)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
