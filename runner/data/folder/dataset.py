"""Image-folder datasets: timm's transforms built from cfg.AUG (with the fast first steps of decode.py), and a
Dataset that skips files that go bad during training, within DATA.BAD_FILE_BUDGET."""
from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from timm.data import auto_augment, create_transform
from torch.utils.data import Dataset
from torchvision import transforms

from runner.data.classes import check_classes
from runner.data.folder.decode import DECODE_ERRORS, open_image, speed_up
from runner.data.folder.scan import (
    CHECK_TOOL,
    MAX_WARNINGS,
    SPLITS,
    FolderIndex,
    check_budget,
    class_dirs,
    scan_folder,
    scan_split,
)
from runner.errors import UserError

logger = logging.getLogger("runner")


# ---------------------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------------------
# timm's AUG.AUTO_AUGMENT grammar: a policy, then dash-separated <key><number> sections (t<name> for rand)
AA_SECTIONS = {"rand": {"m": int, "n": int, "mstd": float, "mmax": int, "inc": int, "p": float},
               "augmix": {"m": int, "w": int, "d": int, "a": float, "b": int, "mstd": float},
               "auto": {"mstd": float}}
AA_POLICIES = ("original", "originalr", "v0", "v0r", "3a")  # timm's AutoAugment policies
AA_RAND_SETS = ("weights", "3a", "3aw")  # rand-t<name>
AA_SYNTAX = ("timm's syntax: rand[-m<int>][-n<int>][-mstd<float>][-mmax<int>][-inc<0|1>][-p<float>]"
             f"[-t<{'|'.join(AA_RAND_SETS)}>] (e.g. rand-m9-mstd0.5-inc1), augmix[-m<int>][-w<int>][-d<int>]"
             f"[-a<float>][-b<0|1>][-mstd<float>], or {'|'.join(AA_POLICIES)}[-mstd<float>]; '' for none")


def check_auto_augment(value: str) -> None:
    """Refuse an AUG.AUTO_AUGMENT string timm would reject with an assert or, worse, silently half-ignore
    (timm skips any section without a number: rand-mX is RandAugment at the default magnitude)."""
    policy, *sections = value.split("-")
    kind = policy if policy in ("rand", "augmix") else "auto" if policy in AA_POLICIES else None
    if kind is None:
        raise UserError(f"AUG.AUTO_AUGMENT {value!r}: unknown policy {policy!r}; {AA_SYNTAX}")
    for sec in sections:
        if kind == "rand" and sec[:1] == "t" and sec[1:] in AA_RAND_SETS:
            continue
        key = sec.rstrip("0123456789.")
        kinds = AA_SECTIONS[kind]
        try:
            ok = key in kinds and sec != key and kinds[key](sec[len(key):]) is not None
        except ValueError:
            ok = False
        if not ok:
            raise UserError(f"AUG.AUTO_AUGMENT {value!r}: section {sec!r} is not one {policy} takes; {AA_SYNTAX}")


def eval_interpolation(cfg: Any) -> str:
    """AUG.INTERPOLATION for the eval resize; 'random' (a training augmentation) evaluates with bilinear."""
    return "bilinear" if cfg.AUG.INTERPOLATION == "random" else cfg.AUG.INTERPOLATION


def timm_transform(cfg: Any, is_training: bool) -> transforms.Compose:
    """timm's create_transform with every setting taken from cfg.DATA and cfg.AUG ("auto" ones resolved)."""
    from runner.weights.preprocess import resolve

    cfg = resolve(cfg)
    size = (cfg.MODEL.IN_CHANS, cfg.DATA.IMG_SIZE, cfg.DATA.IMG_SIZE)
    common = dict(interpolation=cfg.AUG.INTERPOLATION, mean=tuple(cfg.DATA.MEAN), std=tuple(cfg.DATA.STD))
    if not is_training:
        common["interpolation"] = eval_interpolation(cfg)  # timm's eval resize has no 'random' (a KeyError)
        side = cfg.EVAL.IMG_SIZE or cfg.DATA.IMG_SIZE
        return create_transform((cfg.MODEL.IN_CHANS, side, side), is_training=False,
                                crop_pct=cfg.EVAL.CROP_PCT or cfg.AUG.CROP_PCT, **common)
    if cfg.AUG.AUTO_AUGMENT:
        check_auto_augment(cfg.AUG.AUTO_AUGMENT)
    return _black_at_zero_bits(create_transform(
        size, is_training=True, scale=tuple(cfg.AUG.SCALE), ratio=tuple(cfg.AUG.RATIO), hflip=cfg.AUG.HFLIP,
        color_jitter=cfg.AUG.COLOR_JITTER or None, auto_augment=cfg.AUG.AUTO_AUGMENT or None,
        re_prob=cfg.AUG.REPROB, re_mode=cfg.AUG.REMODE, **common))


def posterize(img: Image.Image, bits_to_keep: int, **kwargs: Any) -> Image.Image:
    """timm's posterize, where keeping 0 bits gives black as older Pillow did: Pillow 13 raises a ValueError,
    which FolderDataset would count as an unreadable file (about 3% of images under 'v0')."""
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return auto_augment.posterize(img, bits_to_keep, **kwargs)


def _black_at_zero_bits(transform: transforms.Compose) -> transforms.Compose:
    """Swap our posterize into every AutoAugment, RandAugment and AugMix op of `transform` that uses timm's."""
    for step in transform.transforms:
        ops = list(getattr(step, "ops", [])) + [op for sub in getattr(step, "policy", []) for op in sub]
        for op in ops:
            if getattr(op, "aug_fn", None) is auto_augment.posterize:
                op.aug_fn = posterize
    return transform


def image_mode(cfg: Any) -> str:
    """PIL mode the model's input channels need: L for 1, RGB for 3; image files give no other count."""
    if cfg.MODEL.IN_CHANS not in (1, 3):
        raise UserError(f"MODEL.IN_CHANS {cfg.MODEL.IN_CHANS}: image files are read as grayscale (1 channel) or "
                        "RGB (3 channels); set MODEL.IN_CHANS 3 (or 1, with one DATA.MEAN and DATA.STD value)")
    return "L" if cfg.MODEL.IN_CHANS == 1 else "RGB"


def build_transform(cfg: Any, is_training: bool) -> transforms.Compose:
    """The train or eval transform for images opened with open_image (PIL, not yet decoded)."""
    return speed_up(timm_transform(cfg, is_training), image_mode(cfg))


# ---------------------------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------------------------
def seed_generators(seed: int) -> None:
    """Seed python's, numpy's and torch's generators, which timm's and torchvision's transforms draw from."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # the CPU generator itself: the same draws as torch.manual_seed, which also visits every device type's
    # generator hooks (most of a small image's loading time: see docs/PERFORMANCE.md, shards against folders)
    torch.default_generator.manual_seed(seed)


class FolderDataset(Dataset):
    """(path, class index) samples decoded through `transform`, giving (CHW float tensor, int target).

    A file that fails to decode is skipped with one warning naming it, and the next sample is returned
    instead (deterministic). Distinct failures are counted in shared memory, so every DataLoader worker sees
    the total; once `known_bad` (files the scan rejected) plus those pass `budget` of the split, UserError
    is raised. `opener` and `describe` let another source (runner/data/indexed.py) use keys other than paths:
    opener(key) gives the PIL image (lazily opened where it can), describe(key) names it in messages.
    """

    takes_seeds = True  # the sampler may hand (index, seed) pairs: see __getitem__

    def __init__(self, samples: Sequence[tuple[Any, int]], transform: Callable, budget: float = 0.01,
                 known_bad: int = 0, split: str = "train", opener: Callable[[Any], Image.Image] = open_image,
                 describe: Callable[[Any], str] = str, hint: str = f"{CHECK_TOOL} lists them all"):
        if not samples:
            raise UserError(f"the {split} split has no usable images")
        self.samples = list(samples)
        self.transform = transform
        self.budget = budget
        self.known_bad = known_bad
        self.split = split
        self.opener, self.describe, self.hint = opener, describe, hint
        self.failed = torch.zeros(len(self.samples), dtype=torch.uint8).share_memory_()

    def __len__(self) -> int:
        """Samples in the split."""
        return len(self.samples)

    def __getitem__(self, index: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        """The transformed image and target at `index`, or at the next index that decodes; `(index, seed)` seeds
        the random transforms first (training: the same crops for the same sample in the same epoch, whichever
        worker, process or resume draws them)."""
        if isinstance(index, tuple):
            index, seed = index
            seed_generators(seed)
        n = len(self.samples)
        for k in range(n):
            key, target = self.samples[(index + k) % n]
            try:
                return self.transform(self.opener(key)), target
            except DECODE_ERRORS as e:
                self._record_failure((index + k) % n, self.describe(key), e)
        raise UserError(f"no image of the {self.split} split could be decoded")

    def failures(self) -> int:
        """Distinct files that failed to decode so far (all workers together)."""
        return int(self.failed.sum())

    def _record_failure(self, i: int, path: str, err: Exception) -> None:
        """Count a failed file once, warn about it once, stop when the split's budget is passed."""
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if self.failed[i] == 0:
            self.failed[i] = 1
            logger.warning("skipping %s: cannot decode it (%s); using the next image instead", path, reason)
        n_all = len(self.samples) + self.known_bad
        n_bad = self.known_bad + self.failures()
        if n_bad > self.budget * n_all:
            share = n_bad / n_all
            raise UserError(f"{n_bad} of {n_all} {self.split} image files are unreadable ({share:.2%}), "
                            f"over DATA.BAD_FILE_BUDGET {self.budget:.2%}; last: {path} ({reason}); {self.hint}")


def build_folder_datasets(cfg: Any, index: FolderIndex | None = None
                          ) -> tuple[FolderDataset, FolderDataset, list[str]]:
    """Train and val datasets for DATA.NAME folder: scan (unless given), budget check, timm transforms."""
    if index is None:
        index = scan_folder(cfg)
    log_found(index)
    check_budget(index, cfg)
    check_classes(cfg, index.classes, f"DATA.ROOT {index.root}")
    for note in index.notes:
        logger.warning("%s", note)
    datasets = [FolderDataset(index.samples(split), build_transform(cfg, split == "train"),
                              budget=cfg.DATA.BAD_FILE_BUDGET, known_bad=index.n_bad(split), split=split)
                for split in SPLITS]
    return datasets[0], datasets[1], list(index.classes)


def build_split_dataset(cfg: Any, split: str) -> FolderDataset:
    """An evaluation dataset over the held-out DATA.ROOT/<split>/ (DATA.TEST_SPLIT, tools/eval.py --split), its
    classes indexed as training's; bad files skipped within DATA.BAD_FILE_BUDGET, as the val split's."""
    from pathlib import Path

    classes = [d.name for d in class_dirs(Path(cfg.DATA.ROOT).expanduser() / "train")]
    good, bad = scan_split(cfg, split, classes)
    n_all, budget = len(good) + len(bad), cfg.DATA.BAD_FILE_BUDGET
    if len(bad) > budget * n_all:
        raise UserError(f"{len(bad)} of {n_all} {split} image files are unreadable, over DATA.BAD_FILE_BUDGET "
                        f"{budget:.2%}; first: {bad[0][0]} ({bad[0][1]}); {CHECK_TOOL} lists the train and val ones")
    for path, reason in bad[:MAX_WARNINGS]:
        logger.warning("skipping bad image %s: %s", path, reason)
    logger.info("%s: %d images in %d classes (%d skipped)", split, len(good), len({t for _, t in good}), len(bad))
    return FolderDataset(good, build_transform(cfg, is_training=False), budget=budget, known_bad=len(bad),
                         split=split)


def log_found(index: FolderIndex) -> None:
    """One line per split of what the scan found: the first sign of a wrong DATA.ROOT or a half-copied tree."""
    for split in SPLITS:
        skipped = f"{index.n_bad(split)} skipped" if index.checked else "not checked: DATA.CHECK false"
        logger.info("%s: %d images in %d classes (%s)", split, len(index.samples(split)),
                    len(index.counts.get(split, {})), skipped)
