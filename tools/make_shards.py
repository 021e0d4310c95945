#!/usr/bin/env python
"""Pack an image folder (SRC/train/<class>/..., SRC/val/<class>/...) into webdataset tar shards for DATA.NAME shards.

    python tools/make_shards.py SRC DST [--shard-size 1000] [--seed 0] [--class-order]

Writes DST/train/train-000000.tar ..., DST/val/val-000000.tar ..., each split's index.json (shard names and
sample counts, so a run knows its steps per epoch before step 1) and DST/class_map.json. Each sample is KEY.jpg
(the file's own bytes, not re-encoded; .png etc. keep their extension) and KEY.cls (the class index). Samples are
mixed across classes with a seeded permutation (--class-order keeps them class by class: the worst case for a
streaming shuffle). The same folder and settings give the same bytes.

exit codes: 0 written; 2 bad arguments (missing SRC split or class, DST not empty, shard size below 1).
"""
from __future__ import annotations

import argparse
import io
import json
import random
import re
import sys
import tarfile
from pathlib import Path

from runner.errors import UserError, argument_error, cli

SPLITS = ("train", "val")
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")  # as runner.data.folder reads


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
    """(file, class index) of one split, class by class, files sorted."""
    out = []
    for i, name in enumerate(classes):
        folder = src / split / name
        if not folder.is_dir():
            raise UserError(f"{folder} is missing: every class of {src / 'train'} needs a folder in {split}/ too")
        files = sorted(f for f in folder.iterdir() if f.suffix.lower() in IMG_EXTENSIONS and f.is_file())
        out += [(f, i) for f in files]
    if not out:
        raise UserError(f"{src / split} holds no image files ({', '.join(IMG_EXTENSIONS)})")
    return out


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
    """Check SRC and DST, then write both splits' shards, indexes and the class map."""
    args = parse_args(argv)
    src, dst = Path(args.src), Path(args.dst)
    if args.shard_size < 1:
        raise UserError(f"--shard-size {args.shard_size}: a shard holds at least 1 sample")
    if not (src / "train").is_dir() or not (src / "val").is_dir():
        raise UserError(f"{src} needs train/ and val/ folders of class folders (SRC/train/<class>/*.jpg)")
    if dst.exists() and any(dst.iterdir()):
        raise UserError(f"{dst} is not empty: give a new folder (shards are never overwritten)")
    classes = sorted(d.name for d in (src / "train").iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise UserError(f"{src / 'train'} has no class folders")
    splits = {split: list_split(src, split, classes) for split in SPLITS}  # all checked before writing
    for split, samples in splits.items():
        if not args.class_order:
            random.Random(f"{args.seed}-{split}").shuffle(samples)
        rows = write_split(samples, classes, dst / split, split, args.shard_size)
        (dst / split / "index.json").write_text(json.dumps({"shards": rows}) + "\n")
        print(f"{split}: {len(samples)} samples in {len(rows)} shards under {dst / split}")
    (dst / "class_map.json").write_text(json.dumps({str(i): c for i, c in enumerate(classes)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
