#!/usr/bin/env python
"""Write a synthetic photo-like JPEG image folder (ImageFolder layout) in parallel, for timing the data path.

    python benchmarks/make_jpegs.py --root DIR [--images 6000] [--classes 100] [--val-fraction 0.05]
        [--width 500] [--height 375] [--workers N]

Each image: a smooth random colour field (a few-pixel grid upsampled bicubically) with shapes and grain, at
ImageNet's typical sizes (sides drawn within +-20% of --width x --height, portrait one time in four), saved at
JPEG quality 90: about ImageNet's 110 KB per file at 500x375. Prints one JSON line (files, bytes, seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A smooth colour field with a few shapes and pixel grain: decodes and compresses like a photo."""
    field = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    draw = ImageDraw.Draw(field)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = int(rng.integers(0, width - 2)), int(rng.integers(0, height - 2))
        x1, y1 = x0 + int(rng.integers(1, width // 2)), y0 + int(rng.integers(1, height // 2))
        draw.ellipse((x0, y0, x1, y1), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    grain = rng.normal(0, 16, (height, width, 3))
    return Image.fromarray(np.clip(np.asarray(field, dtype=np.float32) + grain, 0, 255).astype(np.uint8))


def write_chunk(task: tuple[str, int, int, int, int, int]) -> int:
    """Write images [start, stop) of one split into root/<split>/c<class>/; returns the bytes written."""
    folder, start, stop, classes, width, height = task
    rng = np.random.default_rng(start + 7919 * len(folder))
    total = 0
    for i in range(start, stop):
        w, h = (int(s * rng.uniform(0.8, 1.2)) for s in (width, height))
        if rng.random() < 0.25:
            w, h = h, w
        path = Path(folder) / f"c{i % classes:04d}" / f"{i:07d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        photo(rng, w, h).save(path, quality=90)
        total += path.stat().st_size
    return total


def main(argv: list[str] | None = None) -> dict:
    """Write the folder (train and val splits) and print the JSON summary."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True)
    p.add_argument("--images", type=int, default=6000, help="training images (val adds --val-fraction of it)")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    n_val = max(args.classes, int(args.images * args.val_fraction))
    chunk = max(16, args.images // (4 * args.workers))
    tasks = [(str(Path(args.root) / split), s, min(s + chunk, n), args.classes, args.width, args.height)
             for split, n in (("train", args.images), ("val", n_val)) for s in range(0, n, chunk)]
    with ProcessPoolExecutor(args.workers) as pool:
        total = sum(pool.map(write_chunk, tasks))
    out = {"root": args.root, "train_files": args.images, "val_files": n_val, "classes": args.classes,
           "mean_kb": total / (args.images + n_val) / 1024, "seconds": time.perf_counter() - t0,
           "workers": args.workers}
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
