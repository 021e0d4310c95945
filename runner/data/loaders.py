"""Loaders that resume at (epoch, position): the contract (ResumableLoader), the in-memory DeviceLoader, and
the host-side pieces for image folders (ShardSampler, a DataLoader, ToDevice).

The data order is a pure function of (SEED, epoch, rank, world size), so a resumed run continues at the
exact next batch.
"""
from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from runner.data.memory import random_shift
from runner.distributed import Dist

Batch = tuple[torch.Tensor, torch.Tensor]


@runtime_checkable
class ResumableLoader(Protocol):
    """What the engine iterates: batches of (images, targets) already on the training device.

    - `set_epoch(epoch, start_batch)` fixes the order of `epoch` and the position to start from. The order
      depends on (SEED, epoch, rank, world size) only, never on what ran before in the process, so a run
      stopped and resumed sees the same order.
    - The position `start_batch` counts this rank's batches of the epoch already consumed (the engine's
      `batch_in_epoch`: micro-batches, not optimizer steps, under gradient accumulation). Iteration then
      yields batches start_batch .. len(loader) - 1: exactly what an uninterrupted iteration yields from
      there (in-memory loaders: the same tensors, their AUG.SHIFT seeded per batch; image folders: the same
      samples, whose random transforms draw from per-worker generators).
    - `len(loader)` is the batches of a whole epoch on this rank, whatever the position.
    - Callers: the engine before each training epoch (the checkpoint's position on the epoch it resumes
      in, 0 otherwise), and evaluation with (0, 0) before each pass. A call holds until the next one:
      iterating again repeats the same batches.
    """

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Fix the order for `epoch` and skip the batches already consumed."""

    def __len__(self) -> int:
        """Batches in a whole epoch on this rank."""

    def __iter__(self) -> Iterator[Batch]:
        """(images, targets) from the position set by set_epoch to the epoch's end."""


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


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` (on the host) on `device`; to a GPU through pinned memory and a non-blocking copy, so no host sync."""
    if device.type == "cuda":
        return t.contiguous().pin_memory().to(device, non_blocking=True)  # a strided view would copy via pageable
    return t.to(device)


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

    def __iter__(self) -> Iterator[Batch]:
        """This rank's batches of the epoch from the start position, shifted (training) and in memory_format."""
        # the order is drawn on the CPU by the seeded generator, so it is the same whatever the device
        order = epoch_permutation(self.num_samples, self.seed, self.epoch, self.train)
        idx = to_device_async(shard(order, self.dist, self.train), self.images.device)
        for b in range(self.start_batch, len(self)):
            sel = idx[b * self.batch_size : (b + 1) * self.batch_size]
            x = self.images.index_select(0, sel)
            if self.shift:
                x = random_shift(x, self.shift, epoch_seed(self.seed, self.epoch, b + 1 + self.dist.rank * 65_537))
            yield x.contiguous(memory_format=self.memory_format), self.targets.index_select(0, sel)


class ShardSampler(torch.utils.data.Sampler):
    """Sampler with the same (seed, epoch) order and sharding as DeviceLoader, resumable mid-epoch."""

    def __init__(self, n: int, dist: Dist, *, train: bool, seed: int, batch_size: int):
        self.n, self.dist, self.train, self.seed, self.batch_size = n, dist, train, seed, batch_size
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Fix the order for `epoch` and skip the samples of batches already consumed."""
        self.epoch, self.start = epoch, start_batch * self.batch_size

    def _indices(self) -> torch.Tensor:
        """This rank's samples of the epoch, whole batches only when training."""
        idx = shard(epoch_permutation(self.n, self.seed, self.epoch, self.train), self.dist, self.train)
        if self.train:
            idx = idx[: len(idx) // self.batch_size * self.batch_size]
        return idx

    @property
    def num_batches(self) -> int:
        """Batches in a whole epoch on this rank."""
        n = len(self._indices())
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[int]:
        """Sample indices from the start position."""
        return iter(self._indices()[self.start :].tolist())

    def __len__(self) -> int:
        """Samples left from the start position."""
        return max(0, len(self._indices()) - self.start)


class ToDevice:
    """Wraps a host-side iterable of batches: pinned memory, non_blocking copies, channels_last."""

    def __init__(self, loader: Iterable[Batch], device: torch.device, channels_last: bool = False):
        self.loader, self.device = loader, device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Forward to the sampler or inner loader that owns the order."""
        getattr(self.loader, "sampler", self.loader).set_epoch(epoch, start_batch)

    def __len__(self) -> int:
        """Batches in a whole epoch, whatever the resume position."""
        sampler = getattr(self.loader, "sampler", None)
        return sampler.num_batches if isinstance(sampler, ShardSampler) else len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        """The inner batches, copied to the device in memory_format."""
        for x, y in self.loader:
            x = x.to(self.device, non_blocking=True).contiguous(memory_format=self.memory_format)
            yield x, y.to(self.device, non_blocking=True)


def default_workers(cfg: Any, dist: Dist) -> int:
    """DATA.NUM_WORKERS, or when -1: the CPUs this process may use, shared among local ranks."""
    if cfg.DATA.NUM_WORKERS >= 0:
        return cfg.DATA.NUM_WORKERS
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, min(8, cpus // local - 1)) if cpus // local > 1 else 0


def _seed_worker(worker_id: int) -> None:
    """Seed numpy and random in each worker from torch's per-worker seed; leave Ctrl-C to the main process."""
    # a terminal's Ctrl-C reaches the workers too: they must live on while the main process saves and exits
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)


def host_loader(dataset: torch.utils.data.Dataset, cfg: Any, dist: Dist, *, batch_size: int,
                train: bool) -> ToDevice:
    """A DataLoader with a resumable shard sampler, seeded workers, pinned memory and prefetch."""
    sampler = ShardSampler(len(dataset), dist, train=train, seed=cfg.SEED, batch_size=batch_size)
    workers = default_workers(cfg, dist)
    g = torch.Generator().manual_seed(cfg.SEED + dist.rank)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, drop_last=train,
        pin_memory=cfg.DATA.PIN_MEMORY and dist.device.type == "cuda",
        persistent_workers=workers > 0, prefetch_factor=cfg.DATA.PREFETCH_FACTOR if workers else None,
        worker_init_fn=_seed_worker, generator=g,
    )
    return ToDevice(loader, dist.device, cfg.MODEL.CHANNELS_LAST)
