"""In-memory data sets (DATA.NAME digits, synthetic: their source modules are runner/data/digits.py and
synthetic.py): whole tensors built once, plus their one augmentation, a seeded random shift that runs on the device."""
from __future__ import annotations

import importlib.util
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("runner")

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # train images, targets, val images, targets


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: 1,797 8x8 images (values 0..16) and their labels, from the file it ships.

    Read directly instead of through sklearn.datasets.load_digits: importing scikit-learn (and scipy with
    it) costs about 1.4 s of start-up on a 2-core CPU, for a 60 kB table.
    """
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is not None and path.is_file():
        table = np.loadtxt(path, delimiter=",", dtype=np.float32)
        return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits  # a layout we do not know: the slow, sure way

    digits = load_digits()
    return digits.images.astype(np.float32), digits.target.astype(np.int64)


def stratified_split(y: np.ndarray, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed train/val split of indices: ceil(fraction x n) for val, each class by its share."""
    n = len(y)
    n_val = math.ceil(val_fraction * n)
    classes, counts = np.unique(y, return_counts=True)
    quota = counts * n_val / n
    take = np.floor(quota).astype(np.int64)
    take[np.argsort(take - quota, kind="stable")[: n_val - take.sum()]] += 1  # largest remainders first
    rng = np.random.RandomState(seed)
    parts = [rng.permutation(np.flatnonzero(y == c))[:k] for c, k in zip(classes, take, strict=True)]
    val = np.sort(np.concatenate(parts))
    return np.setdiff1d(np.arange(n), val), val


def _normalize(x: torch.Tensor, cfg: Any) -> torch.Tensor:
    """Scale [0, 1] images with DATA.MEAN/STD ("auto" resolved), adapting the statistics to MODEL.IN_CHANS."""
    from runner.weights.preprocess import resolve

    cfg = resolve(cfg)
    c = cfg.MODEL.IN_CHANS
    mean, std = list(cfg.DATA.MEAN), list(cfg.DATA.STD)
    if len(mean) != c:
        mean, std = [sum(mean) / len(mean)] * c, [sum(std) / len(std)] * c
    mean_t = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, c, 1, 1)
    std_t = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, c, 1, 1)
    return (x - mean_t) / std_t


def load_digits_tensors(cfg: Any) -> Tensors:
    """scikit-learn's 8x8 digits, split with a fixed seed, resized to DATA.IMG_SIZE, normalized."""
    images, labels = read_digits()
    x = torch.from_numpy(images).unsqueeze(1) / 16.0
    y = torch.from_numpy(labels)
    # The split never depends on SEED, so val/top1 of different seeds is measured on the same images.
    tr, va = stratified_split(labels, cfg.DATA.VAL_FRACTION)
    size = cfg.DATA.IMG_SIZE
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp_(0, 1)
    x = _normalize(x.expand(-1, cfg.MODEL.IN_CHANS, -1, -1), cfg)
    tr, va = torch.from_numpy(tr), torch.from_numpy(va)
    return x[tr].contiguous(), y[tr], x[va].contiguous(), y[va]


def synthetic_tensors(cfg: Any, device: torch.device) -> Tensors:
    """Random images and labels made directly on the device (benchmarks, smoke tests)."""
    g = torch.Generator(device=device).manual_seed(cfg.SEED)
    n, c, s, k = cfg.DATA.SYNTHETIC_SIZE, cfg.MODEL.IN_CHANS, cfg.DATA.IMG_SIZE, cfg.MODEL.NUM_CLASSES
    n_val = max(cfg.DATA.BATCH_SIZE, n // 4)
    x = torch.randn(n + n_val, c, s, s, device=device, generator=g)
    y = torch.randint(0, k, (n + n_val,), device=device, generator=g)
    return x[:n], y[:n], x[n:], y[n:]


def warn_ignored_augment(cfg: Any) -> None:
    """In-memory data (digits, synthetic) only shifts (AUG.SHIFT): say so when image-folder augmentation is set."""
    ignored = [f"{key} {value!r}" for key, value in (("AUG.AUTO_AUGMENT", cfg.AUG.AUTO_AUGMENT),
                                                     ("AUG.REPROB", cfg.AUG.REPROB)) if value]
    if ignored:
        log.warning("DATA.NAME %s ignores %s: those act in the image-folder transforms only (in-memory data "
                    "takes AUG.SHIFT and AUG.MIXUP/CUTMIX)", cfg.DATA.NAME, ", ".join(ignored))


def random_shift(x: torch.Tensor, pad: int, seed: int) -> torch.Tensor:
    """Translate each image by up to `pad` pixels (edge-replicated), on x's device, seeded per batch."""
    b, _, h, w = x.shape
    g = torch.Generator(device=x.device).manual_seed(seed)
    padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    dy = torch.randint(0, 2 * pad + 1, (b, 1), device=x.device, generator=g)
    dx = torch.randint(0, 2 * pad + 1, (b, 1), device=x.device, generator=g)
    rows = (torch.arange(h, device=x.device)[None] + dy)[:, None, :, None].expand(-1, x.shape[1], -1, w + 2 * pad)
    x = padded.gather(2, rows)
    cols = (torch.arange(w, device=x.device)[None] + dx)[:, None, None, :].expand(-1, x.shape[1], h, -1)
    return x.gather(3, cols)


def export_digits_jpegs(root: str | Path, size: int = 224, per_class: int | None = None,
                        val_fraction: float = 0.2, seed: int = 0, quality: int = 90) -> Path:
    """Write scikit-learn's digits as RGB JPEGs under root/{train,val}/<digit>/, with a fixed seeded split.

    An image folder for DATA.NAME folder, the benchmarks and the tests.

    `per_class` keeps that many images of each digit (before the split); None keeps all 1,797, split exactly
    as DATA.NAME digits splits them (the same 360 val images), so both data paths are measured alike.
    """
    from PIL import Image

    root = Path(root)
    images, labels = read_digits()
    rng = np.random.default_rng(seed)
    in_memory_val = set(stratified_split(labels, val_fraction)[1].tolist()) if per_class is None else set()
    for label in range(10):
        idx = rng.permutation(np.flatnonzero(labels == label))[:per_class]
        n_val = max(1, int(round(len(idx) * val_fraction)))
        val = [i for i in idx if i in in_memory_val] if per_class is None else idx[:n_val]
        train = [i for i in idx if i not in in_memory_val] if per_class is None else idx[n_val:]
        for split, part in (("val", val), ("train", train)):
            out = root / split / str(label)
            out.mkdir(parents=True, exist_ok=True)
            for i in part:
                pixels = (images[i] * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
                img = Image.fromarray(pixels, "L").resize((size, size), Image.BILINEAR).convert("RGB")
                img.save(out / f"{i:04d}.jpg", quality=quality)
    return root
