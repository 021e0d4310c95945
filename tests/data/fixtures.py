"""Test data written to disk: scikit-learn's digits as an image folder of JPEGs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from runner.data.memory import read_digits, stratified_split


def export_digits_jpegs(root: str | Path, size: int = 224, per_class: int | None = None,
                        val_fraction: float = 0.2, seed: int = 0, quality: int = 90) -> Path:
    """Write scikit-learn's digits as RGB JPEGs under root/{train,val}/<digit>/, with a fixed seeded split.

    `per_class` keeps that many images of each digit (before the split); None keeps all 1,797, split exactly
    as DATA.NAME digits splits them (the same 360 val images), so both data paths are measured alike.
    """
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
