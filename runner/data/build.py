"""build_data(cfg, dist): the train and val loaders of a run, and the class names, from cfg.DATA.NAME's source
(runner/data/sources.py), plus what the in-memory sources share."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from runner.data.loaders import DeviceLoader, ResumableLoader, ToDevice
from runner.data.memory import Tensors, warn_ignored_augment
from runner.data.sources import source
from runner.distributed import Dist

log = logging.getLogger("runner")


@dataclass
class DataBundle:
    """What the engine needs from the data: two loaders and the class names."""

    train: ResumableLoader
    val: ResumableLoader
    class_names: list[str] = field(default_factory=list)
    test: ResumableLoader | None = None  # DATA.TEST_SPLIT's loader, evaluated once at the run's end


def eval_batch_size(cfg: Any) -> int:
    """DATA.EVAL_BATCH_SIZE, or twice the training batch when 0."""
    return cfg.DATA.EVAL_BATCH_SIZE or 2 * cfg.DATA.BATCH_SIZE


def resize_for_eval(images: torch.Tensor, cfg: Any) -> torch.Tensor:
    """In-memory val images at EVAL.IMG_SIZE when that differs from DATA.IMG_SIZE (resized whole, no crop).

    Bilinear, as digits are resized from 8 px; it commutes with the per-channel normalization already applied.
    """
    size = cfg.EVAL.IMG_SIZE or cfg.DATA.IMG_SIZE
    if size == images.shape[-1]:
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False).contiguous()


def in_memory_bundle(cfg: Any, dist: Dist, tensors: Tensors, names: list[str]) -> DataBundle:
    """Loaders over tensors kept on the training device (or on the host when DATA.ON_DEVICE is off)."""
    xt, yt, xv, yv = tensors
    xv = resize_for_eval(xv, cfg)
    dev = dist.device if cfg.DATA.ON_DEVICE else torch.device("cpu")
    xt, yt, xv, yv = (t.to(dev) for t in (xt, yt, xv, yv))
    common = dict(dist=dist, seed=cfg.SEED, channels_last=cfg.MODEL.CHANNELS_LAST)
    train = DeviceLoader(xt, yt, cfg.DATA.BATCH_SIZE, train=True, shift=cfg.AUG.SHIFT,
                         accum=cfg.TRAIN.ACCUM_STEPS, repeats=cfg.DATA.REPEATED_AUG, **common)
    val = DeviceLoader(xv, yv, eval_batch_size(cfg), train=False, **common)
    if dev != dist.device:  # the copy keeps the memory format asked for (it made channels_last batches NCHW)
        train, val = (ToDevice(loader, dist.device, cfg.MODEL.CHANNELS_LAST) for loader in (train, val))
    return DataBundle(train, val, names)


def _log_eval_size(cfg: Any) -> None:
    """Say when evaluation runs at another size or crop than training, and when a crop has no effect."""
    if cfg.EVAL.IMG_SIZE and cfg.EVAL.IMG_SIZE != cfg.DATA.IMG_SIZE:
        log.info("evaluating at %d px (EVAL.IMG_SIZE), training at %d px", cfg.EVAL.IMG_SIZE, cfg.DATA.IMG_SIZE)
    from runner.weights.preprocess import is_weights_value

    # the weights' own crop (what auto gave) is no choice to warn about
    if cfg.EVAL.CROP_PCT and not source(cfg.DATA.NAME).files and not is_weights_value(cfg, "EVAL.CROP_PCT"):
        log.warning("DATA.NAME %s ignores EVAL.CROP_PCT: in-memory images are resized whole, never cropped",
                    cfg.DATA.NAME)


def warn_ignored_shift(cfg: Any) -> None:
    """Image files ignore AUG.SHIFT (often inherited from an in-memory digits config): say so once."""
    if cfg.AUG.SHIFT:
        log.warning("DATA.NAME %s ignores AUG.SHIFT %d: it shifts in-memory images only (image files are moved "
                    "by the random crop, AUG.SCALE and AUG.RATIO); set AUG.SHIFT 0", cfg.DATA.NAME, cfg.AUG.SHIFT)


def build_data(cfg: Any, dist: Dist) -> DataBundle:
    """The train and val loaders of cfg.DATA.NAME's source (DATA.MEAN and the other "auto" keys resolved, where
    the caller has not: runner.weights.preprocess)."""
    from runner.weights.preprocess import resolve

    t0 = time.perf_counter()
    cfg = resolve(cfg)
    src = source(cfg.DATA.NAME)
    if not src.files:  # image files are decoded through timm's transforms: AUG.* and EVAL.CROP_PCT apply
        warn_ignored_augment(cfg)
    else:
        warn_ignored_shift(cfg)
    bundle = src.build(cfg, dist)
    if cfg.DATA.TEST_SPLIT:  # built now: a missing or broken test split is said before training, not after it
        bundle.test = src.build_split(cfg, dist, cfg.DATA.TEST_SPLIT)
    if cfg.DATA.IMG_SIZE_SCHEDULE:  # the source said it can (sources.check_config)
        from runner.data.resize import ResizedLoader

        bundle.train = ResizedLoader(bundle.train, cfg)
    _log_eval_size(cfg)
    log.debug("data ready in %.2fs", time.perf_counter() - t0)
    return bundle
