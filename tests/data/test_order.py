"""The training order: one global sequence per (seed, epoch), the same samples in every step whatever the number
of processes, and DATA.REPEATED_AUG's copies."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from runner.data.loaders import DeviceLoader, ShardSampler, global_order
from runner.distributed import Dist

CPU = torch.device("cpu")
B = 4  # DATA.BATCH_SIZE
LAYOUTS = [(1, 12), (2, 6), (3, 4), (4, 3)]  # (processes, TRAIN.ACCUM_STEPS): a global batch of 48 each


def loaders(n: int, world: int, accum: int, repeats: int = 1, epoch: int = 0, start: int = 0) -> list[DeviceLoader]:
    """One training DeviceLoader per rank over images that are their own indices."""
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1)
    out = []
    for rank in range(world):
        loader = DeviceLoader(x, torch.arange(n), B, Dist(rank, world, rank, CPU), train=True, seed=7, accum=accum,
                              repeats=repeats)
        loader.set_epoch(epoch, start)
        out.append(loader)
    return out


def steps(n: int, world: int, accum: int, **kw) -> list[list[int]]:
    """Every optimizer step's samples, chunk by chunk in the order chunk a x world + rank."""
    per_rank = [[y.tolist() for _, y in loader] for loader in loaders(n, world, accum, **kw)]
    n_steps = len(per_rank[0]) // accum
    return [sum((per_rank[r][s * accum + a] for a in range(accum) for r in range(world)), [])
            for s in range(n_steps)]


@pytest.mark.parametrize("epoch", [0, 3])
def test_every_layout_of_one_global_batch_trains_on_the_same_samples(epoch):
    n = 200  # 4 whole global batches of 48, and 8 samples left out of the epoch
    seen = {layout: steps(n, *layout, epoch=epoch) for layout in LAYOUTS}
    assert len({str(v) for v in seen.values()}) == 1, "the layouts differ"
    order = global_order(n, 7, epoch).tolist()
    first = seen[LAYOUTS[0]]
    assert len(first) == n // 48 and sorted(sum(first, [])) == sorted(order[: 4 * 48])
    for s, chunks in enumerate(first):  # step s trains on global batch s of the order
        assert sorted(chunks) == sorted(order[s * 48:(s + 1) * 48])


@pytest.mark.parametrize("world, accum", LAYOUTS)
def test_a_start_mid_epoch_continues_the_same_sequence(world, accum):
    whole = loaders(200, world, accum, epoch=1)
    for start in (accum, 2 * accum + 0, 3 * accum):
        for rank, loader in enumerate(loaders(200, world, accum, epoch=1, start=start)):
            tail = [y.tolist() for _, y in loader]
            assert tail == [y.tolist() for _, y in whole[rank]][start:]


def test_sampler_and_device_loader_agree():
    for world, accum in LAYOUTS:
        for rank, loader in enumerate(loaders(200, world, accum, epoch=2)):
            sampler = ShardSampler(200, Dist(rank, world, rank, CPU), train=True, seed=7, batch_size=B, accum=accum)
            sampler.set_epoch(2, accum)
            assert list(sampler) == torch.cat([y for _, y in loader]).tolist()[accum * B:]
            assert sampler.num_batches == len(loader)


@pytest.mark.parametrize("world, accum", [(1, 1), (2, 1), (1, 3), (2, 3), (3, 1)])
def test_repeated_augmentation_counts_each_sample_r_times(world, accum):
    n, repeats = 96, 3  # 288 copies: whole global batches for every layout here
    per_rank = [[y.tolist() for _, y in loader] for loader in loaders(n, world, accum, repeats=repeats)]
    counts = Counter(sum((sum(batches, []) for batches in per_rank), []))
    assert set(counts) == set(range(n)) and set(counts.values()) == {repeats}
    if B * world * accum % repeats:  # a global batch of 4 or 8 cannot hold whole groups of 3 copies
        return
    for chunks in steps(n, world, accum, repeats=repeats):  # a sample's copies share a global batch ...
        assert set(Counter(chunks).values()) == {repeats}
        for b in range(0, len(chunks), B):  # ... each copy in another chunk (another rank or micro-step)
            assert len(set(chunks[b:b + B])) == B


def test_repeated_augmentation_gives_copies_other_shifts():
    n = 24
    x = torch.arange(n * 64, dtype=torch.float32).view(n, 1, 8, 8)
    loader = DeviceLoader(x, torch.arange(n), 8, Dist(0, 1, 0, CPU), train=True, seed=1, shift=2, repeats=3)
    loader.set_epoch(0)
    images = {}
    for xb, yb in loader:
        for img, label in zip(xb, yb.tolist(), strict=True):
            images.setdefault(label, []).append(img)
    assert all(len(v) == 3 for v in images.values())
    differ = sum(not torch.equal(v[0], v[1]) or not torch.equal(v[1], v[2]) for v in images.values())
    assert differ >= n // 2  # most samples' copies are shifted differently (a shift of 0 twice can happen)
