"""Loaders that resume at (epoch, position): the contract (ResumableLoader), the in-memory DeviceLoader, and
the host-side pieces for image folders (ShardSampler, a DataLoader, ToDevice).

Training order: one global sequence per epoch, a function of (SEED, epoch) alone (`global_order`); each
optimizer step takes its next global batch (DATA.BATCH_SIZE x processes x TRAIN.ACCUM_STEPS), cut into
processes x accumulation chunks of DATA.BATCH_SIZE (`rank_sequence`). Any layout of the same global batch (2
processes, or 1 process accumulating 2 micro-batches) trains on the same chunks, so a run resumed on another
number of processes continues at the exact next sample. Evaluation shards every sample exactly once.
"""
from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from runner.data.memory import random_shift
from runner.data.workerstart import STOP_SIGNALS, cpu_share, quiet_exit, start_server, stop_signals_held
from runner.distributed import Dist

Batch = tuple[torch.Tensor, torch.Tensor]

log = logging.getLogger("runner")


@runtime_checkable
class ResumableLoader(Protocol):
    """What the engine iterates: batches of (images, targets) already on the training device.

    - `set_epoch(epoch, start_batch)` fixes the order of `epoch` and the position to start from. Training
      batches are chunks of one global order that depends on (SEED, epoch, DATA.REPEATED_AUG) only, never on
      what ran before in the process nor on the number of processes (see `rank_sequence`), so a run stopped
      and resumed, on the same or another layout of the same global batch, sees the same samples.
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


def global_order(n: int, seed: int, epoch: int, repeats: int = 1) -> torch.Tensor:
    """The epoch's training sequence: every sample `repeats` times (DATA.REPEATED_AUG), its copies adjacent, in
    an order that depends on (seed, epoch) only."""
    order = epoch_permutation(n, seed, epoch, shuffle=True)
    return order.repeat_interleave(repeats) if repeats > 1 else order


def rank_sequence(order: torch.Tensor, batch: int, dist: Dist, accum: int = 1) -> torch.Tensor:
    """This rank's samples of `order`, in the order it trains on them (whole global batches only).

    Global batch s (`batch x world x accum` samples) is cut into world x accum strided chunks: chunk c takes
    every (world x accum)-th sample from its c-th, so a sample's adjacent copies land in different chunks, and
    micro-step a of rank r trains on chunk a x world + r. Two layouts with the same world x accum therefore
    train on the same chunks in every step.
    """
    world = dist.world_size
    steps = len(order) // (batch * world * accum)
    chunks = order[: steps * batch * world * accum].view(steps, batch, accum, world)[:, :, :, dist.rank]
    return chunks.permute(0, 2, 1).reshape(-1)


def chunk_id(micro_batch: int, dist: Dist, accum: int) -> int:
    """The global index of this rank's `micro_batch`-th chunk of the epoch (the same in every layout)."""
    step, a = divmod(micro_batch, accum)
    return (step * accum + a) * dist.world_size + dist.rank


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


def train_batches(n: int, batch: int, dist: Dist, accum: int) -> int:
    """This rank's training batches in an epoch of `n` samples (copies counted): whole global batches only."""
    return n // (batch * dist.world_size * accum) * accum


class DeviceLoader:
    """Batches from tensors that live on the device: no DataLoader, no host copies, no workers."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, batch_size: int, dist: Dist, *,
                 train: bool, seed: int, shift: int = 0, channels_last: bool = False, accum: int = 1,
                 repeats: int = 1):
        """`accum` and `repeats` (TRAIN.ACCUM_STEPS, DATA.REPEATED_AUG) shape the training order only."""
        self.images, self.targets = images, targets
        self.batch_size, self.dist, self.train, self.seed = batch_size, dist, train, seed
        self.accum, self.repeats = accum, repeats
        self.shift = shift if train else 0
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.epoch, self.start_batch = 0, 0
        self.num_samples = len(images)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Fix the order for `epoch` and skip the batches already consumed."""
        self.epoch, self.start_batch = epoch, start_batch

    def __len__(self) -> int:
        """Batches in a whole epoch on this rank."""
        if self.train:
            return train_batches(self.num_samples * self.repeats, self.batch_size, self.dist, self.accum)
        return -(-len(shard(torch.empty(self.num_samples), self.dist, False)) // self.batch_size)

    def _indices(self) -> torch.Tensor:
        """This rank's samples of the epoch, in order (drawn on the CPU: the same whatever the device)."""
        if self.train:
            order = global_order(self.num_samples, self.seed, self.epoch, self.repeats)
            return rank_sequence(order, self.batch_size, self.dist, self.accum)
        return shard(torch.arange(self.num_samples), self.dist, False)

    def __iter__(self) -> Iterator[Batch]:
        """This rank's batches of the epoch from the start position, shifted (training) and in memory_format."""
        idx = to_device_async(self._indices(), self.images.device)
        for b in range(self.start_batch, len(self)):
            sel = idx[b * self.batch_size : (b + 1) * self.batch_size]
            x = self.images.index_select(0, sel)
            if self.shift:  # seeded by the chunk: the same shifts for the same samples in any layout
                x = random_shift(x, self.shift, epoch_seed(self.seed, self.epoch, 1 + chunk_id(b, self.dist,
                                                                                               self.accum)))
            yield x.contiguous(memory_format=self.memory_format), self.targets.index_select(0, sel)


class ShardSampler(torch.utils.data.Sampler):
    """Sampler with the same (seed, epoch) order and sharding as DeviceLoader, resumable mid-epoch."""

    def __init__(self, n: int, dist: Dist, *, train: bool, seed: int, batch_size: int, accum: int = 1,
                 repeats: int = 1, seeded: bool = False):
        """`seeded`: training yields (index, seed) pairs, for a dataset that seeds its transforms with them."""
        self.n, self.dist, self.train, self.seed, self.batch_size = n, dist, train, seed, batch_size
        self.accum, self.repeats, self.seeded = accum, repeats, seeded
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Fix the order for `epoch` and skip the samples of batches already consumed."""
        self.epoch, self.start = epoch, start_batch * self.batch_size

    def _indices(self) -> torch.Tensor:
        """This rank's samples of the epoch, whole global batches only when training."""
        if self.train:
            order = global_order(self.n, self.seed, self.epoch, self.repeats)
            return rank_sequence(order, self.batch_size, self.dist, self.accum)
        return shard(torch.arange(self.n), self.dist, False)

    @property
    def num_batches(self) -> int:
        """Batches in a whole epoch on this rank."""
        n = len(self._indices())
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[int] | Iterator[tuple[int, int]]:
        """Sample indices from the start position; when training a `seeded` sampler, (index, seed of its random
        transforms), the seed a function of (SEED, epoch, the sample's position in the global order)."""
        if not (self.train and self.seeded):
            return iter(self._indices()[self.start :].tolist())
        positions = rank_sequence(torch.arange(self.n * self.repeats), self.batch_size, self.dist, self.accum)
        positions = positions[self.start :]
        order = global_order(self.n, self.seed, self.epoch, self.repeats)
        samples, where = order[positions].tolist(), positions.tolist()
        return ((i, epoch_seed(self.seed, self.epoch, 1 + p)) for i, p in zip(samples, where, strict=True))

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
        """The inner batches, copied to the device in memory_format; the inner iterator starts now (its workers
        begin loading), not at the first batch asked for."""
        return self._to_device(iter_workers(self.loader))

    def _to_device(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """Each batch on the device."""
        for x, y in batches:
            x = x.to(self.device, non_blocking=True).contiguous(memory_format=self.memory_format)
            yield x, y.to(self.device, non_blocking=True)


def worker_cap(share: int) -> int:
    """The most workers a rank starts: beyond 4 per CPU (at least 8) they only add processes and memory."""
    return max(8, 4 * share)


def default_workers(cfg: Any, dist: Dist) -> int:
    """DATA.NUM_WORKERS (at most worker_cap of this rank's CPUs), or when -1: the CPUs this process may use,
    shared among local ranks."""
    share, auto = cpu_share()
    return min(cfg.DATA.NUM_WORKERS, worker_cap(share)) if cfg.DATA.NUM_WORKERS >= 0 else auto


def warn_many_workers(cfg: Any) -> None:
    """One warning when DATA.NUM_WORKERS exceeds the CPUs this rank has (each worker is a process)."""
    share, auto = cpu_share()
    n, cap = cfg.DATA.NUM_WORKERS, worker_cap(share)
    if n > cap:  # a thousand workers take minutes to start and can run the machine out of memory
        log.warning("DATA.NUM_WORKERS %d is far more than the %d CPU%s this process has: starting %d (4 per CPU, "
                    "at least 8); the default (-1) would take %d", n, share, "s" if share != 1 else "", cap, auto)
    elif n > share:
        log.warning("DATA.NUM_WORKERS %d is more than the %d CPU%s this process has: each worker is a process "
                    "per rank, so they compete for the same cores; the default (-1) would take %d",
                    n, share, "s" if share != 1 else "", auto)


def _seed_worker(worker_id: int, logs: tuple[str | None, int] | None = None) -> None:
    """In each worker: leave the stop signals to the main process, log as it does (`logs`: its setup_logging
    arguments; a worker that was not forked from it starts without handlers), then seed numpy and random from
    torch's per-worker seed."""
    # without sigtimedwait (macOS) SIGTERM keeps torch's handler: the worker dies of one sent to the whole job
    held = [signal.SIGTERM] if hasattr(signal, "sigtimedwait") else []
    quiet = [sig for sig in STOP_SIGNALS if sig not in held]
    for sig in quiet:
        signal.signal(sig, signal.SIG_IGN)  # also drops one that came while blocked (see iter_workers)
    signal.pthread_sigmask(signal.SIG_BLOCK, held)  # every thread of the worker inherits it
    signal.pthread_sigmask(signal.SIG_UNBLOCK, quiet)
    threading.Thread(target=_watch_owner, args=(multiprocessing.parent_process(),), name="runner-worker-owner",
                     daemon=True).start()
    _die_with_parent()
    if logs is not None:
        from runner.sinks import setup_logging

        setup_logging(*logs)
    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)


def _watch_owner(owner) -> None:
    """In a worker: a SIGTERM from the main process (DataLoader's shutdown, multiprocessing's exit) or the main
    process's death ends the worker at once; a SIGTERM sent to the whole job is the main process's to answer, and
    the worker serves it meanwhile. (torch's own check watches the worker's parent, which under a fork server is
    the server: a worker of a SIGKILLed run would wait forever, and keep the server alive.)"""
    while True:
        info = signal.sigtimedwait([signal.SIGTERM], 1.0) if hasattr(signal, "sigtimedwait") else time.sleep(1.0)
        if (info is not None and info.si_pid == owner.pid) or not owner.is_alive():
            os._exit(0)


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when its parent ends (a worker that ignores SIGTERM must not outlive the run)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        pass


def worker_options(cfg: Any, dataset: Any) -> dict:
    """DataLoader arguments for worker processes: how they start (DATA.WORKER_START) and their set-up. A fork
    server starts now, importing the dataset's module while the run builds its model, not at the first batch."""
    ctx = multiprocessing.get_context(cfg.DATA.WORKER_START)
    if cfg.DATA.WORKER_START == "forkserver":  # started already by tools/train.py (start_early), or now
        start_server(["torch", type(dataset).__module__])
    if cfg.DATA.WORKER_START != "fork":  # its queues' semaphores are named: see quiet_exit
        quiet_exit()
    from runner.sinks import logging_setup

    return {"multiprocessing_context": ctx, "worker_init_fn": functools.partial(_seed_worker, logs=logging_setup())}


def iter_workers(loader: Iterable) -> Iterator:
    """iter(loader), with the stop signals held back while it starts worker processes: a worker never dies of
    one before it has set itself to ignore it. Without workers nothing starts, and nothing is held back."""
    if not getattr(loader, "num_workers", 0):
        return iter(loader)
    with stop_signals_held():
        return iter(loader)


def host_loader(dataset: torch.utils.data.Dataset, cfg: Any, dist: Dist, *, batch_size: int,
                train: bool) -> ToDevice:
    """A DataLoader with a resumable shard sampler, seeded workers, pinned memory and prefetch."""
    sampler = ShardSampler(len(dataset), dist, train=train, seed=cfg.SEED, batch_size=batch_size,
                           accum=cfg.TRAIN.ACCUM_STEPS, repeats=cfg.DATA.REPEATED_AUG,
                           seeded=getattr(dataset, "takes_seeds", False))
    workers = default_workers(cfg, dist)
    if train and dist.is_main:
        warn_many_workers(cfg)
    g = torch.Generator().manual_seed(cfg.SEED + dist.rank)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, drop_last=train,
        pin_memory=cfg.DATA.PIN_MEMORY and dist.device.type == "cuda",
        persistent_workers=workers > 0, prefetch_factor=cfg.DATA.PREFETCH_FACTOR if workers else None,
        generator=g, **(worker_options(cfg, dataset) if workers else {}),
    )
    return ToDevice(loader, dist.device, cfg.MODEL.CHANNELS_LAST)
