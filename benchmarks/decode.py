"""Decoding throughput of folder datasets: images/s per core, plain PIL ImageFolder against runner.data.folder.

    python -m benchmarks.decode [--root DIR] [--images 600] [--repeats 3] [--parts transforms,decode,loader]

(run from the repository root, as a module; it needs the installed runner, not tests/)

Data (written under --root on the first run): scikit-learn's digits exported as 224 px JPEGs (1,797 files) and
scikit-learn's two sample photos (640x427 JPEGs) copied 64 times each. Every pipeline runs in this one process
with one torch thread, over the same files; images/s/core is images / CPU seconds of this process (best of
--repeats), so other load on a shared machine barely moves it. Same timm transform everywhere (cfg defaults).
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torchvision
from PIL import Image
from torch.utils.data import DataLoader, RandomSampler

from runner.config import get_default_config
from runner.data.folder import (
    FolderDataset,
    build_transform,
    open_image,
    scan_folder,
    speed_up,
    timm_transform,
)
from runner.data.memory import export_digits_jpegs

# (data set, output size) cases: the digits config size, the ImageNet size, and a low-resolution size
CASES = [("digits", 32), ("digits", 224), ("photos", 224), ("photos", 128)]


def make_data(root: Path) -> dict[str, Path]:
    """Write the benchmark folders once; return the folder of each data set."""
    digits, photos = root / "digits", root / "photos"
    if not (digits / "val").is_dir():
        export_digits_jpegs(digits, size=224)
    if not (photos / "val").is_dir():
        from sklearn.datasets import load_sample_images

        for src in load_sample_images().filenames:
            for split in ("train", "val"):
                out = photos / split / Path(src).stem
                out.mkdir(parents=True, exist_ok=True)
                for k in range(64):
                    shutil.copyfile(src, out / f"{k:03d}.jpg")
    return {"digits": digits, "photos": photos}


def config(root: Path, size: int):
    """Default config for a folder data set at one output size."""
    cfg = get_default_config()
    cfg.DATA.NAME, cfg.DATA.ROOT, cfg.DATA.IMG_SIZE = "folder", str(root), size
    cfg.freeze()
    return cfg


def pipelines(cfg, train: bool) -> dict:
    """name -> function(path) -> tensor, from the baseline to ours, one change at a time."""
    base = timm_transform(cfg, train)
    pil_loader = torchvision.datasets.folder.pil_loader

    def ours(**kw):
        t = speed_up(base, "RGB", **kw)
        return lambda p: t(open_image(p))

    return {
        "baseline: ImageFolder pil_loader + timm": lambda p: base(pil_loader(p)),
        "convert only if needed": ours(reduced_decode=False, fused_tensor=False),
        "+ fused to-tensor/normalize": ours(reduced_decode=False),
        "+ reduced JPEG decode (PIL resize)": ours(tensor_resize=False),
        "+ torch uint8 resize (ours)": ours(),
    }


def rates(fns: dict, paths: list[str], n: int, repeats: int) -> dict[str, float]:
    """Best images per CPU second of each fn over n images, the fns interleaved within each repeat so that
    a shared machine's load changes hit them alike."""
    for fn in fns.values():
        for p in paths[:20]:
            fn(p)  # warm-up: page cache, lazy imports
    best = dict.fromkeys(fns, 0.0)
    for r in range(repeats):
        for name, fn in fns.items():
            random.seed(r)  # the same random crops for every pipeline
            torch.manual_seed(r)
            t0 = time.process_time()
            for i in range(n):
                fn(paths[(i * 7 + r) % len(paths)])
            best[name] = max(best[name], n / (time.process_time() - t0))
    return best


def decode_only(paths: list[str], n: int, repeats: int, size: int) -> dict[str, float]:
    """Raw decode rates to RGB: PIL whole, PIL at the DCT scale the eval resize allows (with the folder decode's
    gap of 2), torchvision.io."""
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    def pil_full(p):
        return Image.open(p).convert("RGB")

    def pil_draft(p):
        im = Image.open(p)
        im.draft("RGB", (2 * size * 8 // 7, 2 * size * 8 // 7))
        return im.convert("RGB")

    def tv(p):
        return decode_jpeg(read_file(p), mode=ImageReadMode.RGB)

    return rates({"PIL decode": pil_full, "PIL decode, reduced (draft)": pil_draft,
                  "torchvision.io.decode_jpeg (CPU)": tv}, paths, n, repeats)


def loader_rates(cfg, workers: list[int], prefetch: list[int], n_batches: int) -> list[tuple]:
    """Wall images/s of a DataLoader over the train set (batch 64) per worker count and prefetch factor."""
    index = scan_folder(cfg, check=False)
    ds = FolderDataset(index.train, build_transform(cfg, True))
    out = []
    for w in workers:
        for pf in prefetch if w else [None]:
            sampler = RandomSampler(ds, replacement=True, num_samples=64 * (n_batches + 1))
            dl = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=w, prefetch_factor=pf)
            it = iter(dl)
            next(it)  # workers started and warm
            t0 = time.perf_counter()
            for _ in range(n_batches):
                next(it)
            out.append((w, pf or 0, 64 * n_batches / (time.perf_counter() - t0)))
            del it
    return out


def gpu_decode(paths: list[str], batch: int = 64, rounds: int = 10) -> float:
    """Images/s of torchvision.io.decode_jpeg on CUDA (nvJPEG), batched, files already read into memory."""
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    data = [read_file(p) for p in paths[:batch]]
    decode_jpeg(data, device="cuda", mode=ImageReadMode.RGB)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(rounds):
        decode_jpeg(data, device="cuda", mode=ImageReadMode.RGB)
    torch.cuda.synchronize()
    return batch * rounds / (time.perf_counter() - t0)


def transform_table(roots: dict, files: dict, n: int, repeats: int) -> None:
    """Print images/s/core of every pipeline for every case."""
    names = " | ".join(pipelines(config(roots["digits"], 32), True))
    print(f"| data -> size | split | {names} | speed-up |")
    print("|---|---|" + "---:|" * 6)
    for name, size in CASES:
        cfg = config(roots[name], size)
        for train in (True, False):
            got = list(rates(pipelines(cfg, train), files[name], n, repeats).values())
            cells = " | ".join(f"{r:,.0f}" for r in got)
            split = "train" if train else "eval"
            print(f"| {name} -> {size} | {split} | {cells} | {got[-1] / got[0]:.2f}x |", flush=True)


def main() -> None:
    """Run every case and print markdown tables."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "runner-decode-bench"))
    ap.add_argument("--images", type=int, default=600, help="images per timed pass")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parts", default="transforms,decode",
                    help="comma-separated: transforms (pipelines per core), decode (decode only), loader "
                         "(DataLoader wall images/s per worker count and prefetch factor)")
    ap.add_argument("--gpu", action="store_true", help="also time nvJPEG decoding on CUDA")
    args = ap.parse_args()
    torch.set_num_threads(1)
    roots = make_data(Path(args.root))
    files = {k: sorted(str(p) for p in (v / "train").rglob("*.jpg")) for k, v in roots.items()}
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, Pillow {Image.__version__}, "
          f"{os.cpu_count()} CPUs; images/s per core (images / CPU s, best of {args.repeats})\n")
    if "transforms" in args.parts:
        transform_table(roots, files, args.images, args.repeats)
    if "decode" in args.parts:
        print("\n| decode only (no transform) | digits 224 px, draft for 32 | photos 640x427, draft for 64 |")
        print("|---|---:|---:|")
        dig = decode_only(files["digits"], args.images, args.repeats, 32)
        pho = decode_only(files["photos"], args.images, args.repeats, 64)
        for (k, a), b in zip(dig.items(), pho.values(), strict=True):
            print(f"| {k} | {a:,.0f} | {b:,.0f} |")
    if args.gpu and torch.cuda.is_available():
        print(f"\nnvJPEG on {torch.cuda.get_device_name()}: digits {gpu_decode(files['digits']):,.0f} img/s, "
              f"photos {gpu_decode(files['photos']):,.0f} img/s (batched 64, decode only)")
    if "loader" in args.parts:
        torch.set_num_threads(os.cpu_count() or 1)
        for name, size in [("digits", 32), ("photos", 224)]:
            print(f"\nDataLoader, {name} -> {size} train, batch 64, wall images/s (ours):")
            print("| workers | prefetch | images/s |\n|---:|---:|---:|")
            workers = sorted({0, 1, 2, os.cpu_count() or 1})
            for w, pf, r in loader_rates(config(roots[name], size), workers, [2, 4], 20):
                print(f"| {w} | {pf or '-'} | {r:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
