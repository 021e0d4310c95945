"""The training order of shards, a function of (SEED, epoch, DATA.SHARD_STREAMS, DATA.SHARD_WINDOW) only.

The epoch's shards are permuted and laid end to end; that sequence is cut into SHARD_STREAMS equal contiguous
streams (the last few samples that do not fill them wait for the next epoch's permutation); each stream is
shuffled within consecutive blocks of SHARD_WINDOW samples. Global position p takes sample p // S of stream
p % S. runner.data.loaders.rank_sequence then cuts global batches into chunks as for every source: rank r only
ever meets the streams k = r (mod world size), so with S divisible by the world size each rank reads only its
streams, whatever the number of processes, workers or accumulation steps.
"""
from __future__ import annotations

import torch

from runner.data.loaders import epoch_seed

SALT_SHARDS = 1 << 40  # epoch_seed salts apart from the per-sample ones (1 + position)
SALT_BLOCKS = 1 << 41


class EpochPlan:
    """Where each position of one epoch's training order is: (stream, block, offset) and the virtual index
    (position in the permuted shards laid end to end), and which shard and member that is."""

    def __init__(self, counts: list[int], streams: int, window: int, seed: int, epoch: int):
        g = torch.Generator().manual_seed(epoch_seed(seed, epoch, SALT_SHARDS))
        self.perm = torch.randperm(len(counts), generator=g).tolist()  # the epoch's shard order
        ordered = torch.tensor([counts[i] for i in self.perm], dtype=torch.int64)
        self.starts = torch.cat([torch.zeros(1, dtype=torch.int64), ordered.cumsum(0)])  # virtual starts
        self.streams, self.window, self.seed, self.epoch = streams, window, seed, epoch
        self.stream_len = int(self.starts[-1]) // streams

    def __len__(self) -> int:
        """Positions in the epoch (every stream's samples)."""
        return self.stream_len * self.streams

    def where(self, p: int) -> tuple[int, int, int]:
        """(stream, block, place in the block's shuffled order) of global position p."""
        k, i = p % self.streams, p // self.streams
        return k, *divmod(i, self.window)

    def block_range(self, k: int, b: int) -> tuple[int, int]:
        """Virtual [start, stop) of block b of stream k."""
        base = k * self.stream_len
        return base + b * self.window, base + min((b + 1) * self.window, self.stream_len)

    def block_order(self, k: int, b: int) -> list[int]:
        """The shuffle of block b of stream k: offsets in the block, in the order the stream yields them."""
        start, stop = self.block_range(k, b)
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch, SALT_BLOCKS + k * 1_000_003 + b))
        return torch.randperm(stop - start, generator=g).tolist()

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """The virtual range [start, stop) as (shard, first member, end member) pieces, in order."""
        out = []
        v = start
        while v < stop:
            j = int(torch.searchsorted(self.starts, torch.tensor(v), right=True)) - 1
            end = min(int(self.starts[j + 1]), stop)
            out.append((self.perm[j], v - int(self.starts[j]), end - int(self.starts[j])))
            v = end
        return out
