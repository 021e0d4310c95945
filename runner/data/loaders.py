"""Datasets and loaders: in-memory datasets on the device (digits, synthetic) and image folders.

Every loader yields (images, targets) already on the training device, knows its length in batches for
this rank, and takes `set_epoch(epoch, start_batch)`, so the data order is a pure function of
(seed, epoch) and a resumed run continues at the exact next batch.
"""
from __future__ import annotations

import importlib.util
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from runner.distributed import Dist
from runner.errors import UserError

log = logging.getLogger("runner")


def epoch_seed(seed: int, epoch: int, salt: int = 0) -> int:
    """A stable 63-bit seed derived from (seed, epoch, salt)."""
    return (seed * 1_000_003 + epoch * 7_919 + salt * 104_729 + 12_345) % (2**63 - 1)


def epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The order of all n samples in one epoch, identical on every rank."""
    if not shuffle:
        return torch.arange(n)
    g = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(n, generator=g)


def shard(order: torch.Tensor, dist: Dist, drop_last: bool) -> torch.Tensor:
    """This rank's share: strided, so the ranks' batches at one step form the global batch.

    Training truncates to an equal share per rank; evaluation keeps every sample exactly once
    (ranks may then differ by one sample, which is fine because eval does no collective per batch).
    """
    if drop_last:
        order = order[: len(order) // dist.world_size * dist.world_size]
    return order[dist.rank :: dist.world_size]


@dataclass
class DataBundle:
    """What the engine needs from the data: two loaders and the class names."""

    train: object
    val: object
    class_names: list[str] = field(default_factory=list)


class DeviceLoader:
    """Batches from tensors that live on the device: no DataLoader, no host copies, no workers."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, batch_size: int, dist: Dist, *,
                 train: bool, seed: int, shift: int = 0, channels_last: bool = False):
        self.images, self.targets = images, targets
        self.batch_size, self.dist, self.train, self.seed = batch_size, dist, train, seed
        self.shift = shift if train else 0
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.epoch, self.start_batch = 0, 0
        self.num_samples = len(images)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Fix the order for `epoch` and skip the batches already consumed."""
        self.epoch, self.start_batch = epoch, start_batch

    def __len__(self) -> int:
        """Batches in a whole epoch on this rank."""
        n = len(shard(torch.empty(self.num_samples), self.dist, self.train))
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self):
        idx = shard(epoch_permutation(self.num_samples, self.seed, self.epoch, self.train), self.dist, self.train)
        idx = idx.to(self.images.device)
        for b in range(self.start_batch, len(self)):
            sel = idx[b * self.batch_size : (b + 1) * self.batch_size]
            x = self.images.index_select(0, sel)
            if self.shift:
                x = random_shift(x, self.shift, epoch_seed(self.seed, self.epoch, b + 1 + self.dist.rank * 65_537))
            yield x.contiguous(memory_format=self.memory_format), self.targets.index_select(0, sel)


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


def _normalize(x: torch.Tensor, cfg) -> torch.Tensor:
    """Scale [0, 1] images with DATA.MEAN/STD, adapting the statistics to MODEL.IN_CHANS."""
    c = cfg.MODEL.IN_CHANS
    mean, std = list(cfg.DATA.MEAN), list(cfg.DATA.STD)
    if len(mean) != c:
        mean, std = [sum(mean) / len(mean)] * c, [sum(std) / len(std)] * c
    mean_t = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, c, 1, 1)
    std_t = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, c, 1, 1)
    return (x - mean_t) / std_t


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


def load_digits_tensors(cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
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


def synthetic_tensors(cfg, device: torch.device):
    """Random images and labels made directly on the device (benchmarks, smoke tests)."""
    g = torch.Generator(device=device).manual_seed(cfg.SEED)
    n, c, s, k = cfg.DATA.SYNTHETIC_SIZE, cfg.MODEL.IN_CHANS, cfg.DATA.IMG_SIZE, cfg.MODEL.NUM_CLASSES
    n_val = max(cfg.DATA.BATCH_SIZE, n // 4)
    x = torch.randn(n + n_val, c, s, s, device=device, generator=g)
    y = torch.randint(0, k, (n + n_val,), device=device, generator=g)
    return x[:n], y[:n], x[n:], y[n:]


def eval_batch_size(cfg) -> int:
    """DATA.EVAL_BATCH_SIZE, or twice the training batch when 0."""
    return cfg.DATA.EVAL_BATCH_SIZE or 2 * cfg.DATA.BATCH_SIZE


def _in_memory(cfg, dist: Dist) -> DataBundle:
    """Loaders over tensors kept on the training device (or on the host when DATA.ON_DEVICE is off)."""
    if cfg.DATA.NAME == "digits":
        names = [str(i) for i in range(10)]
        check_classes(cfg, names, "DATA.NAME digits")
        xt, yt, xv, yv = load_digits_tensors(cfg)
    else:
        xt, yt, xv, yv = synthetic_tensors(cfg, dist.device)
        names = [str(i) for i in range(cfg.MODEL.NUM_CLASSES)]
    dev = dist.device if cfg.DATA.ON_DEVICE else torch.device("cpu")
    xt, yt, xv, yv = (t.to(dev) for t in (xt, yt, xv, yv))
    common = dict(dist=dist, seed=cfg.SEED, channels_last=cfg.MODEL.CHANNELS_LAST)
    train = DeviceLoader(xt, yt, cfg.DATA.BATCH_SIZE, train=True, shift=cfg.AUG.SHIFT, **common)
    val = DeviceLoader(xv, yv, eval_batch_size(cfg), train=False, **common)
    if dev != dist.device:
        train, val = ToDevice(train, dist.device), ToDevice(val, dist.device)
    return DataBundle(train, val, names)


class ShardSampler(torch.utils.data.Sampler):
    """Sampler with the same (seed, epoch) order and sharding as DeviceLoader, resumable mid-epoch."""

    def __init__(self, n: int, dist: Dist, *, train: bool, seed: int, batch_size: int):
        self.n, self.dist, self.train, self.seed, self.batch_size = n, dist, train, seed, batch_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Fix the order for `epoch` and skip the samples of batches already consumed."""
        self.epoch, self.start = epoch, start_batch * self.batch_size

    def _indices(self) -> torch.Tensor:
        idx = shard(epoch_permutation(self.n, self.seed, self.epoch, self.train), self.dist, self.train)
        if self.train:
            idx = idx[: len(idx) // self.batch_size * self.batch_size]
        return idx

    @property
    def num_batches(self) -> int:
        """Batches in a whole epoch on this rank."""
        n = len(self._indices())
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self):
        return iter(self._indices()[self.start :].tolist())

    def __len__(self) -> int:
        return max(0, len(self._indices()) - self.start)


class ToDevice:
    """Wraps a host-side iterable of batches: pinned memory, non_blocking copies, channels_last."""

    def __init__(self, loader, device: torch.device, channels_last: bool = False):
        self.loader, self.device = loader, device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Forward to the sampler or inner loader that owns the order."""
        getattr(self.loader, "sampler", self.loader).set_epoch(epoch, start_batch)

    def __len__(self) -> int:
        """Batches in a whole epoch, whatever the resume position."""
        sampler = getattr(self.loader, "sampler", None)
        return sampler.num_batches if isinstance(sampler, ShardSampler) else len(self.loader)

    def __iter__(self):
        for x, y in self.loader:
            x = x.to(self.device, non_blocking=True).contiguous(memory_format=self.memory_format)
            yield x, y.to(self.device, non_blocking=True)


def default_workers(cfg, dist: Dist) -> int:
    """DATA.NUM_WORKERS, or when -1: the CPUs this process may use, shared among local ranks."""
    if cfg.DATA.NUM_WORKERS >= 0:
        return cfg.DATA.NUM_WORKERS
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, min(8, cpus // local - 1)) if cpus // local > 1 else 0


def _seed_worker(worker_id: int) -> None:
    """Seed numpy and random in each worker from torch's per-worker seed; leave Ctrl-C to the main process."""
    import random
    import signal

    # a terminal's Ctrl-C reaches the workers too: they must live on while the main process saves and exits
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    import numpy as np

    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)


def _host_loader(dataset, cfg, dist: Dist, *, train: bool) -> ToDevice:
    """A DataLoader with a resumable shard sampler, seeded workers, pinned memory and prefetch."""
    bs = cfg.DATA.BATCH_SIZE if train else eval_batch_size(cfg)
    sampler = ShardSampler(len(dataset), dist, train=train, seed=cfg.SEED, batch_size=bs)
    workers = default_workers(cfg, dist)
    g = torch.Generator().manual_seed(cfg.SEED + dist.rank)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=bs, sampler=sampler, num_workers=workers, drop_last=train,
        pin_memory=cfg.DATA.PIN_MEMORY and dist.device.type == "cuda",
        persistent_workers=workers > 0, prefetch_factor=cfg.DATA.PREFETCH_FACTOR if workers else None,
        worker_init_fn=_seed_worker, generator=g,
    )
    return ToDevice(loader, dist.device, cfg.MODEL.CHANNELS_LAST)


def _folder(cfg, dist: Dist) -> DataBundle:
    """Image folders through runner.folder (scan, budget, timm transforms) and host DataLoaders."""
    from runner import folder

    train_ds, val_ds, names = folder.build_folder_datasets(cfg)
    return DataBundle(_host_loader(train_ds, cfg, dist, train=True),
                      _host_loader(val_ds, cfg, dist, train=False), list(names))


def check_classes(cfg, class_names: list[str], where: str) -> None:
    """Refuse fewer MODEL.NUM_CLASSES outputs than the data has classes (targets would index past the
    classifier: a crash in the loss, or silently wrong top-k); more outputs train, with a warning."""
    n, k = len(class_names), cfg.MODEL.NUM_CLASSES
    if k < n:
        raise UserError(f"{where} has {n} classes but MODEL.NUM_CLASSES is {k}: set MODEL.NUM_CLASSES {n}")
    if k > n:
        log.warning("%s has %d classes but MODEL.NUM_CLASSES is %d: outputs %d..%d never get a target "
                    "(set MODEL.NUM_CLASSES %d unless that is meant)", where, n, k, n, k - 1, n)


def warn_ignored_augment(cfg) -> None:
    """In-memory data (digits, synthetic) only shifts (AUG.SHIFT): say so when image-folder augmentation is set."""
    ignored = [f"{key} {value!r}" for key, value in (("AUG.AUTO_AUGMENT", cfg.AUG.AUTO_AUGMENT),
                                                     ("AUG.REPROB", cfg.AUG.REPROB)) if value]
    if ignored:
        log.warning("DATA.NAME %s ignores %s: those act in the image-folder transforms only (in-memory data "
                    "takes AUG.SHIFT and AUG.MIXUP/CUTMIX)", cfg.DATA.NAME, ", ".join(ignored))


def build_data(cfg, dist: Dist) -> DataBundle:
    """The train and val loaders for cfg.DATA.NAME."""
    t0 = time.perf_counter()
    if cfg.DATA.NAME != "folder":
        warn_ignored_augment(cfg)
    bundle = _folder(cfg, dist) if cfg.DATA.NAME == "folder" else _in_memory(cfg, dist)
    log.debug("data ready in %.2fs", time.perf_counter() - t0)
    return bundle
