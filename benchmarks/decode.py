"""Decoding throughput of folder datasets: images/s per core, plain PIL ImageFolder against runner.data.folder.

    python -m benchmarks.decode [--root DIR] [--images 600] [--repeats 3]
        [--parts transforms,decode,quality,loader]

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

import numpy as np

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

import torch
import torchvision
from PIL import Image
from torch.utils.data import DataLoader, RandomSampler
from torchvision import transforms
from torchvision.datasets.folder import pil_loader
from torchvision.transforms import InterpolationMode

from runner.config import get_default_config
from runner.data.folder import (
    FolderDataset,
    build_transform,
    open_image,
    scan_folder,
    speed_up,
    timm_transform,
)
from runner.data.folder.decode import dct_factor, simplejpeg
from runner.data.memory import export_digits_jpegs

# (data set, output size) cases: the digits config size, the ImageNet size, and a low-resolution size
CASES = [("digits", 32), ("digits", 224), ("photos", 224), ("photos", 128), ("photos500", 224), ("photos500", 128)]


def make_data(root: Path) -> dict[str, Path]:
    """Write the benchmark folders once; return the folder of each data set."""
    digits, photos, photos500 = root / "digits", root / "photos", root / "photos500"
    if not (digits / "val").is_dir():
        export_digits_jpegs(digits, size=224)
    if not (photos500 / "val").is_dir():
        from sklearn.datasets import load_sample_images

        for src in load_sample_images().filenames:
            # the photo as it ships (640x427) and as a 500x375 JPEG (quality 90, 4:2:0, ImageNet's typical size)
            small = root / f"{Path(src).stem}-500.jpg"
            Image.open(src).convert("RGB").resize((500, 375), Image.LANCZOS).save(small, quality=90)
            for folder, file in ((photos, src), (photos500, small)):
                for split in ("train", "val"):
                    out = folder / split / Path(src).stem
                    out.mkdir(parents=True, exist_ok=True)
                    for k in range(64):
                        shutil.copyfile(file, out / f"{k:03d}.jpg")
    return {"digits": digits, "photos": photos, "photos500": photos500}


def config(root: Path, size: int):
    """Default config for a folder data set at one output size."""
    cfg = get_default_config()
    cfg.DATA.NAME, cfg.DATA.ROOT, cfg.DATA.IMG_SIZE = "folder", str(root), size
    cfg.freeze()
    return cfg


def pipelines(cfg, train: bool) -> dict:
    """name -> function(path) -> tensor, from the baseline to ours, one change at a time."""
    base = timm_transform(cfg, train)

    def ours(**kw):
        t = speed_up(base, "RGB", **kw)
        return lambda p: t(open_image(p))

    return {
        "baseline: ImageFolder pil_loader + timm": lambda p: base(pil_loader(p)),
        "convert only if needed": ours(reduced_decode=False, fused_tensor=False),
        "+ fused to-tensor/normalize": ours(reduced_decode=False),
        "+ reduced JPEG decode (PIL resize)": ours(tensor_resize=False, jpeg_lib=False),
        "+ torch uint8 resize": ours(jpeg_lib=False, tensors=False),
        "+ simplejpeg decode": ours(tensors=False),
        "+ flips and jitter on the tensor (ours)": ours(),
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

    def sj(p, factor=1):
        with open(p, "rb") as f:
            return simplejpeg.decode_jpeg(f.read(), "RGB", min_factor=factor)

    fns = {"PIL decode": pil_full, "PIL decode, reduced (draft)": pil_draft,
           "PIL decode + numpy array (what torch's resize needs)": lambda p: np.asarray(pil_full(p)),
           "torchvision.io.decode_jpeg (CPU)": tv}
    if simplejpeg is not None:
        size0 = Image.open(paths[0]).size
        fns["simplejpeg (numpy array)"] = sj
        fns["simplejpeg, reduced (same scale as draft)"] = lambda p: sj(p, dct_factor(min(size0) * 7 / 8 / size))
    return rates(fns, paths, n, repeats)


def quality(cfg, paths: list[str], crops: int = 50) -> dict[str, tuple[float, ...]]:
    """Mean absolute difference (0-255 levels) from a Lanczos resize of the fully decoded image, per image:
    train (the random resized crop's output, the same crops for every pipeline) and eval (the whole transform)."""
    out = {}
    for train in (True, False):
        base = timm_transform(cfg, train)
        step = (lambda t: t.transforms[0]) if train else (lambda t: t)
        full, pil = step(base), step(speed_up(base, jpeg_lib=False, tensors=False))
        sj = step(speed_up(base, tensors=False))  # the crop step's PIL output: what the reference compares
        fns = {"baseline": lambda p, t=full: t(pil_loader(p)),
               "ours, PIL decode": lambda p, t=pil: t(open_image(p)),
               "ours, simplejpeg decode": lambda p, t=sj: t(open_image(p))}
        for name, fn in fns.items():
            split = "train" if train else "eval"
            out[f"{name}, {split}"] = tuple(levels_off(fn, p, base, train, crops) for p in paths)
    return out


def levels_off_timm(cfg, paths: list[str], draws: int = 50) -> list[tuple[float, float]]:
    """Per image, the mean and largest difference (0-255 levels) between our whole train transform and timm's own,
    each run with the same seeds (the same crop, flip and jitter draws)."""
    base = timm_transform(cfg, True)
    ours = speed_up(base)
    std = torch.as_tensor(base.transforms[-1].std).view(-1, 1, 1)
    out = []
    for path in paths:
        diffs = []
        for k in range(draws):
            got = []
            for fn, opener in ((base, pil_loader), (ours, open_image)):
                random.seed(k)
                torch.manual_seed(k)
                got.append(fn(opener(path)))
            diffs.append((got[0] - got[1]).abs() * std * 255)
        levels = torch.stack(diffs)
        out.append((float(levels.mean()), float(levels.max())))
    return out


def levels_off(fn, path: str, base: transforms.Compose, train: bool, crops: int) -> float:
    """Mean levels of fn(path) off the Lanczos reference (train: averaged over `crops` seeded random crops)."""
    full = pil_loader(path)
    if not train:
        ref = transforms.Compose([transforms.Resize(base.transforms[0].size, InterpolationMode.LANCZOS),
                                  *base.transforms[1:]])(full)
        std = torch.as_tensor(base.transforms[-1].std).view(-1, 1, 1)
        return float(((fn(path) - ref).abs() * std * 255).mean())
    rrc, diffs = base.transforms[0], []
    for k in range(crops):
        random.seed(k)
        got = fn(path)
        random.seed(k)  # the same draws again: the crop that fn took
        top, left, h, w = rrc.get_params(full, rrc.scale, rrc.ratio)
        ref = full.resize(got.size, Image.LANCZOS, box=(left, top, left + w, top + h))
        diffs.append(float(np.abs(np.asarray(got, np.float32) - np.asarray(ref, np.float32)).mean()))
    return sum(diffs) / len(diffs)


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
    print("|---|---|" + "---:|" * 8)
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
    ap.add_argument("--parts", default="transforms,decode,quality",
                    help="comma-separated: transforms (pipelines per core), decode (decode only), quality (levels "
                         "off a Lanczos reference), loader (DataLoader wall images/s per worker count and prefetch)")
    ap.add_argument("--gpu", action="store_true", help="also time nvJPEG decoding on CUDA")
    args = ap.parse_args()
    torch.set_num_threads(1)
    roots = make_data(Path(args.root))
    files = {k: sorted(str(p) for p in (v / "train").rglob("*.jpg")) for k, v in roots.items()}
    sj = simplejpeg.__version__ if simplejpeg is not None else "not installed"
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, Pillow {Image.__version__}, "
          f"simplejpeg {sj}, {os.cpu_count()} CPUs; images/s per core (images / CPU s, best of {args.repeats})\n")
    if "transforms" in args.parts:
        transform_table(roots, files, args.images, args.repeats)
    if "decode" in args.parts:
        print("\n| decode only (no transform) | digits 224 px, draft for 32 | photos 640x427, draft for 64 |")
        print("|---|---:|---:|")
        dig = decode_only(files["digits"], args.images, args.repeats, 32)
        pho = decode_only(files["photos"], args.images, args.repeats, 64)
        for (k, a), b in zip(dig.items(), pho.values(), strict=True):
            print(f"| {k} | {a:,.0f} | {b:,.0f} |")
    if "quality" in args.parts:
        print("\n| levels off a Lanczos reference (china, flower) | photos -> 128 | photos -> 224 |\n|---|---:|---:|")
        photos = [str(next((roots["photos"] / "train" / c).glob("*.jpg"))) for c in ("china", "flower")]
        got = [quality(config(roots["photos"], size), photos) for size in (128, 224)]
        for k in got[0]:
            print(f"| {k} | " + " | ".join("/".join(f"{v:.2f}" for v in g[k]) for g in got) + " |")
        print("\n| ours against timm's own train transform, same draws (china, flower) | mean levels | largest |")
        print("|---|---:|---:|")
        for name, size in [("photos", 128), ("photos", 224), ("photos500", 224)]:
            pics = [str(next((roots[name] / "train" / c).glob("*.jpg"))) for c in ("china", "flower")]
            got = levels_off_timm(config(roots[name], size), pics)
            print(f"| {name} -> {size} | " + "/".join(f"{m:.3f}" for m, _ in got) + " | "
                  + "/".join(f"{x:.0f}" for _, x in got) + " |")
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
