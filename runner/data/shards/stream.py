"""Reading shards: tar members through webdataset (tar iteration, grouping by key, gopen for paths, http(s) and
pipe:), retried on fetch failures; per-stream block readers; the train and val loaders.

A rank's loader workers each own a disjoint set of the rank's streams (train) or shards (val), so every byte
is read by one worker of one rank. Each worker yields one part of every micro-batch (the samples of its
streams, with their places in the batch); torch's DataLoader returns parts in strict worker rotation, so the
main process joins exactly one micro-batch from each round of parts, whatever the worker count.
"""
from __future__ import annotations

import io
import logging
import random
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from runner.data.folder import DECODE_ERRORS
from runner.data.loaders import epoch_seed, iter_workers, rank_sequence, train_batches
from runner.data.shards.index import Fault, Patience, ShardPipe, ShardSplit, gopen_url, ride_out
from runner.data.shards.order import EpochPlan
from runner.distributed import Dist
from runner.errors import UserError

log = logging.getLogger("runner")

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
Sample = dict[str, Any]  # webdataset's grouped sample: __key__, and bytes per extension


def seed_sample(seed: int) -> None:
    """Seed python's, numpy's and torch's CPU generators, which the transforms draw from: as the folder path's
    seed_generators, without torch.manual_seed's visit to every device type (a formatted stack each, ~1 ms)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


# ---------------------------------------------------------------------------------------------------------
# Members of one shard
# ---------------------------------------------------------------------------------------------------------
def _members(url: str, stall_s: float) -> Iterator[Sample]:
    """The samples of one shard, in order, through webdataset's tar iteration and grouping by key; the stream is
    closed (its command reaped) when the shard ends, fails, or the caller closes this generator."""
    from webdataset.tariterators import group_by_keys, tar_file_iterator

    stream = gopen_url(url, stall_s)
    try:
        files = ({**f, "__url__": url} for f in tar_file_iterator(stream))
        yield from group_by_keys(files)
        failure = stream.failure() if isinstance(stream, ShardPipe) else None  # a tar can end before the bytes do
        if failure is not None:
            raise failure
    finally:
        stream.close()


def read_shard(url: str, first: int, end: int, patience: Patience, count: int | None = None) -> Iterator[Sample]:
    """Samples first..end-1 of the shard at `url`; a failed fetch is retried from the next sample not yet
    yielded. A transient fault lasting DATA.RETRY_S is DataUnavailable (exit 75); UserError naming the shard when
    it is damaged, missing, keeps failing otherwise, or is shorter than its index says, or (read up to `count`,
    the index's sample count) longer."""
    whole = count is not None and end >= count  # read to where the index says the shard ends: it must end there
    if end <= first and not whole:
        return
    done, tries, attempt, since = first, 0, 0, None
    while True:
        try:
            with closing(_members(url, patience.stall_s)) as members:
                for i, sample in enumerate(members):
                    if i < done:
                        continue
                    last = i + 1 >= end
                    # to end this sample webdataset has read the next one's first member: the look costs one sample
                    if i >= end or (last and whole and next(members, None) is not None):
                        raise UserError(f"shard {url} holds more than the {end} samples its index gives: rewritten "
                                        "since the index was made, or the index was edited; the rest would never "
                                        "be trained on (tools/make_shards.py writes both)")
                    done, since, attempt = i + 1, None, 0  # progress: a later fault starts a new outage
                    if last:
                        members.close()  # the rest is another stream's: release the reader before waiting here
                        yield sample
                        return
                    yield sample
            if done >= end:  # an empty shard, as its index says
                return
            raise UserError(f"shard {url} holds {done} samples, fewer than the {end} its index gives: truncated "
                            "or rewritten since the index was made (tools/make_shards.py writes both)")
        except tarfile.TarError as e:  # a damaged tar reads the same every time: no retry
            raise UserError(f"shard {url} is truncated or not a tar file ({e}) after sample {done}") from None
        except FileNotFoundError:
            raise UserError(f"shard {url} does not exist") from None
        except Fault as e:
            if not e.transient:
                tries += 1
                if tries >= patience.retries:
                    raise UserError(f"shard {url} cannot be read after {tries} tries ({e.reason})") from None
                time.sleep(0.2 * 2**tries)
                continue
            since = ride_out(f"shard {url}", e.reason, patience, since, attempt)
            attempt += 1
        except (OSError, ValueError, EOFError) as e:
            tries += 1
            if tries >= patience.retries:
                reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                raise UserError(f"shard {url} cannot be read after {tries} tries ({reason})") from None
            time.sleep(0.2 * 2**tries)


# ---------------------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------------------
class Decoder:
    """A grouped sample to (transformed image, target); bad images counted in shared memory against the budget."""

    def __init__(self, transform: Callable, num_classes: int, total: int, budget: float, split: str):
        self.transform, self.num_classes, self.total = transform, num_classes, total
        self.budget, self.split = budget, split
        self.failed = torch.zeros(1, dtype=torch.int64).share_memory_()  # all workers add to it
        self.warned: set[str] = set()

    def target(self, sample: Sample) -> int:
        """The class index from the sample's .cls member; UserError naming shard and key when unusable."""
        where = f"{sample['__key__']} in shard {sample['__url__']}"
        if "cls" not in sample:
            raise UserError(f"sample {where} has no .cls member (its class index); every sample needs one")
        try:
            label = int(sample["cls"].decode().strip())
        except (UnicodeDecodeError, ValueError):
            raise UserError(f"sample {where}: .cls holds {sample['cls'][:20]!r}, not a class index") from None
        if not 0 <= label < self.num_classes:
            raise UserError(f"sample {where}: class {label} is outside the class map's 0..{self.num_classes - 1}")
        return label

    def image(self, sample: Sample) -> torch.Tensor | None:
        """The transformed image, or None (counted, named once) when it cannot be decoded."""
        ext = next((e for e in IMAGE_EXTS if e in sample), None)
        try:
            if ext is None:
                raise ValueError(f"no image member ({'/'.join(IMAGE_EXTS)})")
            return self.transform(Image.open(io.BytesIO(sample[ext])))
        except DECODE_ERRORS as e:
            self._failure(sample, e)
            return None

    def _failure(self, sample: Sample, err: Exception) -> None:
        """Count a bad image, warn about it, stop past DATA.BAD_FILE_BUDGET."""
        where = f"{sample['__key__']} in shard {sample['__url__']}"
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        self.failed += 1  # shared by the workers; two racing increments may count one (the budget is a share)
        n_bad = int(self.failed)
        if n_bad > self.budget * self.total:
            raise UserError(f"{n_bad} of {self.total} {self.split} samples are unreadable, over DATA.BAD_FILE_BUDGET "
                            f"{self.budget:.2%}; last: {where} ({reason})")
        if where not in self.warned:
            self.warned.add(where)
            log.warning("skipping sample %s: cannot decode it (%s)", where, reason)


# ---------------------------------------------------------------------------------------------------------
# Training: streams read in shuffled blocks
# ---------------------------------------------------------------------------------------------------------
class StreamReader:
    """One stream of an epoch, read forward block by block; blocks below the current step are dropped."""

    def __init__(self, plan: EpochPlan, k: int, shards: ShardSplit, patience: Patience):
        self.plan, self.k, self.shards, self.patience = plan, k, shards, patience
        self.blocks: dict[int, tuple[list[Sample], list[int]]] = {}
        self.source: Iterator[Sample] | None = None
        self.next_block = -1

    def _read_from(self, b: int) -> Iterator[Sample]:
        """The stream's samples from the start of block b to its end (skipping within the first shard only)."""
        start, _ = self.plan.block_range(self.k, b)
        stop = (self.k + 1) * self.plan.stream_len
        for shard, first, end in self.plan.pieces(start, stop):
            yield from read_shard(self.shards.urls[shard], first, end, self.patience, self.shards.counts[shard])

    def block(self, b: int) -> tuple[list[Sample], list[int]]:
        """Block b's samples (in stored order) and its shuffle."""
        if b not in self.blocks:
            if self.source is None or b != self.next_block:
                self.close()
                self.source = self._read_from(b)
            start, stop = self.plan.block_range(self.k, b)
            samples = [next(self.source) for _ in range(stop - start)]
            self.blocks[b] = samples, self.plan.block_order(self.k, b)
            self.next_block = b + 1
        return self.blocks[b]

    def close(self) -> None:
        """Close the shard being read (its reader process ends now, not when the garbage collector gets to it)."""
        if self.source is not None:
            self.source.close()
            self.source = None

    def drop_below(self, b: int) -> None:
        """Forget blocks before b: no later position needs them."""
        for old in [x for x in self.blocks if x < b]:
            del self.blocks[old]


def _close(readers: dict[int, StreamReader]) -> None:
    """Close every stream's reader."""
    for r in readers.values():
        r.close()


def _already_batched(part: Any) -> Any:
    """DataLoader collate for parts already batched by the worker."""
    return part


class TrainParts(IterableDataset):
    """Each worker's part of every micro-batch of this rank, from the position set by set_epoch."""

    reader: type[StreamReader] = StreamReader  # what reads a stream's blocks (a parquet reader for hf streaming)

    def __init__(self, shards: ShardSplit, decoder: Decoder, dist: Dist, *, seed: int, batch_size: int,
                 accum: int, streams: int, window: int, patience: Patience):
        self.shards, self.decoder, self.dist, self.seed = shards, decoder, dist, seed
        self.batch_size, self.accum, self.patience = batch_size, accum, patience
        self.streams, self.window = streams, window
        self.epoch, self.start = 0, 0

    def num_batches(self) -> int:
        """This rank's micro-batches in a whole epoch."""
        n = self.shards.total // self.streams * self.streams
        return train_batches(n, self.batch_size, self.dist, self.accum)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
        """(places in the micro-batch, images, targets) of this worker's streams, one part per micro-batch."""
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info else (0, 1)
        plan = EpochPlan(self.shards.counts, self.streams, self.window, self.seed, self.epoch)
        positions = rank_sequence(torch.arange(len(plan)), self.batch_size, self.dist, self.accum)
        world = self.dist.world_size
        step_span = self.batch_size * world * self.accum
        readers: dict[int, StreamReader] = {}
        try:
            for m in range(self.start, self.num_batches()):
                pos = positions[m * self.batch_size:(m + 1) * self.batch_size]
                mine = ((pos % self.streams) // world) % nw == w
                floor = (m // self.accum) * step_span // self.streams // self.window  # first block of this step
                for r in readers.values():
                    r.drop_below(floor)
                places = mine.nonzero().flatten()
                items = [self._sample(readers, plan, int(p)) for p in pos[places].tolist()]
                images = torch.stack([x for x, _ in items]) if items else None
                if m == self.num_batches() - 1:  # the consumer stops at the last part without asking for more
                    _close(readers)
                yield places, images, torch.tensor([y for _, y in items], dtype=torch.int64)
        finally:  # an early stop (generator close), an error, or a worker's exit
            _close(readers)

    def _sample(self, readers: dict[int, StreamReader], plan: EpochPlan, p: int) -> tuple[torch.Tensor, int]:
        """Global position p decoded and transformed, its random transforms seeded by (SEED, epoch, p); a bad
        image gives the block's next one (deterministic)."""
        k, b, o = plan.where(p)
        if k not in readers:
            readers[k] = self.reader(plan, k, self.shards, self.patience)
        samples, order = readers[k].block(b)
        for step in range(len(order)):
            sample = samples[order[(o + step) % len(order)]]
            seed_sample(epoch_seed(self.seed, self.epoch, 1 + p))
            image = self.decoder.image(sample)
            if image is not None:
                return image, self.decoder.target(sample)
        raise UserError(f"no image of a {len(order)}-sample block of the train shards could be decoded")


# ---------------------------------------------------------------------------------------------------------
# Evaluation: each rank its shards, each worker its share of them, every sample once
# ---------------------------------------------------------------------------------------------------------
class ValParts(IterableDataset):
    """Batches of this rank's val shards (shards r, r + world, ...), each worker reading its own of them."""

    def __init__(self, shards: ShardSplit, decoder: Decoder, dist: Dist, batch_size: int, patience: Patience):
        self.shards, self.decoder, self.dist, self.batch_size = shards, decoder, dist, batch_size
        self.patience = patience

    def mine(self, w: int, nw: int) -> list[int]:
        """The shards worker w of nw reads on this rank."""
        return list(range(self.dist.rank, len(self.shards.urls), self.dist.world_size))[w::nw]

    def read(self, s: int) -> Iterator[dict]:
        """Every sample of shard s."""
        return read_shard(self.shards.urls[s], 0, self.shards.counts[s], self.patience, self.shards.counts[s])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(images, targets) batches of this worker's shards."""
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info else (0, 1)
        images, targets = [], []
        for s in self.mine(w, nw):
            for sample in self.read(s):
                image = self.decoder.image(sample)
                if image is None:
                    continue
                images.append(image)
                targets.append(self.decoder.target(sample))
                if len(images) == self.batch_size:
                    yield torch.stack(images), torch.tensor(targets)
                    images, targets = [], []
        if images:
            yield torch.stack(images), torch.tensor(targets)


# ---------------------------------------------------------------------------------------------------------
# The loader the engine iterates
# ---------------------------------------------------------------------------------------------------------
class ShardLoader:
    """A ResumableLoader over shards (host batches; runner.data.loaders.ToDevice moves them)."""

    def __init__(self, parts: TrainParts | ValParts, workers: int, prefetch: int, options: dict | None = None):
        """`options`: the DataLoader's worker arguments (runner.data.loaders.worker_options)."""
        self.parts, self.workers, self.prefetch = parts, workers, prefetch
        self.options = options or {}

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Fix the order for `epoch` and skip the batches already consumed (workers start afresh each pass)."""
        if isinstance(self.parts, TrainParts):
            self.parts.epoch, self.parts.start = epoch, start_batch

    def __len__(self) -> int:
        """Batches in a whole epoch on this rank."""
        if isinstance(self.parts, TrainParts):
            return self.parts.num_batches()
        nw, b = max(1, self.workers), self.parts.batch_size
        return sum(-(-sum(self.parts.shards.counts[s] for s in self.parts.mine(w, nw)) // b) for w in range(nw))

    def _loader(self) -> DataLoader:
        """A DataLoader over the parts; not persistent, so each pass's workers get the current position."""
        return DataLoader(self.parts, batch_size=None, collate_fn=_already_batched, num_workers=self.workers,
                          prefetch_factor=self.prefetch if self.workers else None, **self.options)

    def _parts(self) -> Iterator:
        """The parts: the dataset's own generator without workers (closable), else a DataLoader's iterator."""
        return iter(self.parts) if self.workers == 0 else iter_workers(self._loader())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Training: one part per worker joined into each micro-batch; evaluation: the workers' batches. Stopped
        early, the readers are closed and the workers shut down at once (not by the garbage collector)."""
        parts = self._parts()
        try:
            if isinstance(self.parts, ValParts):
                yield from parts
                return
            for _ in range(self.parts.start, self.parts.num_batches()):
                got = [next(parts) for _ in range(max(1, self.workers))]
                places = torch.cat([p for p, _, _ in got])
                order = places.argsort()
                images = torch.cat([x for _, x, _ in got if x is not None])[order]
                yield images, torch.cat([y for _, _, y in got])[order]
        finally:
            stop = getattr(parts, "close", None) or getattr(parts, "_shutdown_workers", None)
            if stop is not None:
                stop()
