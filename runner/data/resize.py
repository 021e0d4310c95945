"""Progressive resizing (DATA.IMG_SIZE_SCHEDULE): the training batches of each epoch at that epoch's size.

The size is a function of the config and the epoch only (runner.config.schema.train_img_size), taken when the
loop sets the epoch, so a resume at (epoch, position), another number of processes or a longer run train the
epochs they share at the same sizes. Every batch is resized on the device, as Composer does, after the source
made it at DATA.IMG_SIZE: one place for every source whose batches are images (a source that yields something
else says `resizes=False` in runner/data/sources.py and refuses the key). Evaluation is not resized.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from runner.config.derived import train_img_size

log = logging.getLogger("runner")


def resize_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """Square images resized to `size` (bilinear; antialiased when shrinking), in their memory format."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    channels_last = images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last)
    out = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False,
                        antialias=size < images.shape[-1])
    return out.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


class ResizedLoader:
    """A training loader whose batches are at the size DATA.IMG_SIZE_SCHEDULE gives the epoch set last."""

    def __init__(self, loader: Any, cfg: Any):
        self.loader, self.cfg = loader, cfg
        self.img_size: int | None = None  # set by set_epoch, said at the first (a start or a resume) and each change

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """The inner loader's order and position, and the epoch's size (said when it changes)."""
        self.loader.set_epoch(epoch, start_batch)
        size = train_img_size(self.cfg, epoch)
        if size != self.img_size:
            log.info("epoch %d trains at %d px (DATA.IMG_SIZE_SCHEDULE)", epoch + 1, size)
        self.img_size = size

    def __len__(self) -> int:
        """The inner loader's batches per epoch."""
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The inner batches, images at the epoch's size."""
        size = self.img_size if self.img_size is not None else train_img_size(self.cfg, 0)  # never set: epoch 0
        for images, targets in self.loader:
            yield resize_batch(images, size), targets

    def __getattr__(self, name: str) -> Any:
        """Anything else the inner loader has (its sampler, dataset, close)."""
        if name == "loader":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
