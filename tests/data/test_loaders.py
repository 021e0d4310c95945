"""The loaders' resume contract (ResumableLoader), and the memory format and copies of the device paths."""
from __future__ import annotations

import pytest
import torch

from runner.config import get_default_config
from runner.data import build_data
from runner.data.loaders import DeviceLoader, ResumableLoader, ToDevice, host_loader, to_device_async
from runner.distributed import Dist
from tests.utils import merge_pairs

CPU = Dist(0, 1, 0, torch.device("cpu"))


def small_cfg(*pairs):
    """Default config, 8 px digits, with KEY VALUE overrides."""
    cfg = get_default_config()
    merge_pairs(cfg, ["DATA.NAME", "digits", "DATA.IMG_SIZE", 8, "DATA.BATCH_SIZE", 32, "DATA.NUM_WORKERS", 0,
                         *pairs])
    cfg.freeze()
    return cfg


def make_loader(kind: str, dist: Dist = CPU) -> ResumableLoader:
    """One loader of each kind over the same 200 small images (seed 3)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 3, 8, 8, generator=g), torch.randint(0, 10, (200,), generator=g)
    if kind == "device":
        return DeviceLoader(x, y, 32, dist, train=True, seed=3, shift=2)
    if kind == "device eval":
        return DeviceLoader(x, y, 48, dist, train=False, seed=3)
    if kind == "host copy":
        return ToDevice(DeviceLoader(x, y, 32, dist, train=True, seed=3, shift=2), dist.device)
    return host_loader(torch.utils.data.TensorDataset(x, y), small_cfg("SEED", 3), dist, batch_size=32, train=True)


def batches(loader: ResumableLoader, epoch: int, start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Everything the loader yields for (epoch, start)."""
    loader.set_epoch(epoch, start)
    return list(loader)


@pytest.mark.parametrize("kind", ["device", "device eval", "host copy", "dataloader"])
@pytest.mark.parametrize("dist", [CPU, Dist(1, 2, 0, torch.device("cpu"))], ids=["1 rank", "rank 1 of 2"])
def test_a_loader_resumed_at_k_yields_what_the_uninterrupted_one_yields_from_k(kind: str, dist: Dist):
    full = batches(make_loader(kind, dist), 2, 0)
    assert isinstance(make_loader(kind, dist), ResumableLoader)
    assert len(make_loader(kind, dist)) == len(full) >= 3
    for k in (1, len(full) - 1, len(full)):
        resumed = batches(make_loader(kind, dist), 2, k)  # a fresh loader: a new process after a restart
        assert len(resumed) == len(full) - k
        for (xa, ya), (xb, yb) in zip(full[k:], resumed, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    loader = make_loader(kind, dist)
    assert len(batches(loader, 2, 1)) == len(full) - 1 == len(list(loader))  # set_epoch holds until the next call
    if kind != "device eval":
        assert not torch.equal(batches(loader, 3, 0)[0][1], full[0][1])  # another epoch, another order


def test_host_side_in_memory_data_stays_channels_last_through_the_device_copy():
    """DATA.ON_DEVICE false wraps the loaders in a device copy, which kept NCHW whatever MODEL.CHANNELS_LAST
    asked; the meta device stands in for a GPU (strides and devices, no data)."""
    dist = Dist(0, 1, 0, torch.device("meta"))
    for channels_last in (True, False):
        data = build_data(small_cfg("DATA.ON_DEVICE", False, "MODEL.CHANNELS_LAST", channels_last), dist)
        for loader in (data.train, data.val):
            assert isinstance(loader, ToDevice)
            loader.set_epoch(0, 0)
            x, y = next(iter(loader))
            assert x.device.type == y.device.type == "meta" and x.shape[1:] == (3, 8, 8)
            assert x.is_contiguous(memory_format=torch.channels_last) == channels_last
            assert x.is_contiguous() != channels_last


def test_the_epoch_order_reaches_a_gpu_through_pinned_memory_without_a_sync(monkeypatch):
    copies = []

    class Pinned:
        """Stands in for a pinned host tensor: records the copy asked of it."""

        def to(self, device, non_blocking=False):
            copies.append((device, non_blocking))
            return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: Pinned())
    order = torch.randperm(10)[::2]  # a strided view, as a rank's shard is
    assert isinstance(to_device_async(order, torch.device("cuda", 0)), Pinned)
    assert copies == [(torch.device("cuda", 0), True)]
    assert to_device_async(order, torch.device("cpu")) is order  # the CPU path copies nothing
