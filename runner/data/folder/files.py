"""Image files to classify (tools/predict.py): the arguments expanded (a folder to its images, recursively), and a
Dataset whose DataLoader workers decode them, handing an unreadable file back as its one-line reason instead."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset

from runner.data.folder.decode import DECODE_ERRORS, open_image
from runner.data.folder.scan import image_files
from runner.errors import UserError


def expand_images(paths: list[str]) -> list[str]:
    """Each argument in order: a folder becomes its image files (recursively, by name, hidden entries skipped),
    anything else stays as given (a file that cannot be read is said when it is read)."""
    out: list[str] = []
    for path in paths:
        out += image_files(Path(path)) if os.path.isdir(path) else [path]
    return out


def read_image(path: str, transform: Callable) -> torch.Tensor:
    """One image file through the eval transform; UserError naming the file when it cannot be read."""
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise UserError(f"image {path} is a broken symbolic link (to {os.readlink(p)}, which does not exist)")
    if not p.is_file():
        raise UserError(f"image {path} does not exist")
    try:
        return transform(open_image(path))
    except DECODE_ERRORS as e:
        raise UserError(f"image {path} cannot be read as an image ({type(e).__name__}: {e})") from None


class ImageFiles(Dataset):
    """(index, image tensor or None, why it could not be read or '') of each path, in order."""

    def __init__(self, paths: list[str], transform: Callable):
        self.paths, self.transform = list(paths), transform

    def __len__(self) -> int:
        """Files to read."""
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None, str]:
        """The i-th file decoded, or its reason."""
        try:
            return i, read_image(self.paths[i], self.transform), ""
        except UserError as e:  # listed and skipped: the other images are still classified
            return i, None, str(e)


def collate_files(batch: list[tuple[int, torch.Tensor | None, str]]
                  ) -> tuple[list[int], torch.Tensor | None, list[tuple[int, str]]]:
    """(indices of the readable files, their images stacked or None, (index, reason) of each unreadable one)."""
    good = [(i, x) for i, x, _ in batch if x is not None]
    bad = [(i, why) for i, x, why in batch if x is None]
    return [i for i, _ in good], torch.stack([x for _, x in good]) if good else None, bad
