"""The README's first run (configs/digits/resnet18.yaml): its augmentations suit digits on both data paths."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runner.config import load_config
from runner.data.loaders import DeviceLoader
from runner.data.memory import load_digits_tensors, random_shift
from runner.distributed import Dist
from tests.data.fixtures import export_digits_jpegs
from tests.utils import ROOT, run_tool

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")


def test_in_memory_augmentation_is_seeded_per_batch_so_resume_is_exact():
    """The digits loader's augmented batches are a pure function of (SEED, epoch, batch): a run resumed at
    batch k sees exactly the batches the uninterrupted run saw from k on, and batches differ from each other."""
    cfg, _ = load_config(["--cfg", DIGITS, "DATA.IMG_SIZE", "16"], check_paths=False)
    xt, yt, _, _ = load_digits_tensors(cfg)
    dist = Dist(0, 1, 0, torch.device("cpu"))

    def batches(seed: int, epoch: int, start: int) -> list[torch.Tensor]:
        loader = DeviceLoader(xt, yt, cfg.DATA.BATCH_SIZE, dist, train=True, seed=seed, shift=cfg.AUG.SHIFT)
        loader.set_epoch(epoch, start)
        return [x for x, _ in loader]

    full, resumed = batches(0, 3, 0), batches(0, 3, 5)
    assert cfg.AUG.SHIFT > 0 and len(resumed) == len(full) - 5
    assert all(torch.equal(a, b) for a, b in zip(full[5:], resumed, strict=True))
    assert not torch.equal(full[0], batches(0, 4, 0)[0]) and not torch.equal(full[0], batches(1, 3, 0)[0])
    x = xt[:64]
    assert torch.equal(random_shift(x, 2, 7), random_shift(x.clone(), 2, 7))
    assert not torch.equal(random_shift(x, 2, 7), random_shift(x, 2, 8))


@pytest.mark.slow
def test_digits_config_trains_a_folder_export_of_the_digits(tmp_path: Path):
    """The same digits written as JPEGs train well with the config's folder augmentations.

    With ImageNet's defaults (random-resized crops down to 8% of the image, horizontal flips, colour jitter,
    a center crop of 87.5% at eval) the same short run ends far lower: a mirrored 2 is no digit, and an 8%
    crop of an 8x8 digit is a blur.
    """
    root = export_digits_jpegs(tmp_path / "jpegs", size=16)
    out = tmp_path / "run"
    proc = run_tool("train.py", ["--cfg", DIGITS, "DATA.NAME", "folder", "DATA.ROOT", str(root),
                                 "MODEL.IN_CHANS", "3", "DATA.IMG_SIZE", "16", "TRAIN.EPOCHS", "2",
                                 "DATA.NUM_WORKERS", "0", "OUTPUT_DIR", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    top1 = json.loads((out / "results.json").read_text())["val/top1"]
    # measured 2026-11-23 on a 2-core AMD EPYC: 94.72 with the config (test_resnet, AdamW), 70.56 with the
    # ImageNet defaults above; the whole config (16 epochs, 32 px) on the export ends at 99.17
    assert top1 >= 90.0, f"val/top1 {top1:.2f} after 2 epochs on the folder export (the config's folder augmentations)"
