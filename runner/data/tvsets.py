"""DATA.NAME torchvision: a classic set of torchvision.datasets (DATA.SET) in its own on-disk layout under
DATA.ROOT, downloaded there with DATA.DOWNLOAD true (by rank 0, the others waiting: indexed.local_first), read
through runner/data/indexed.py (the image folders' transforms and loaders).

`SETS` is the one table: DATA.SET -> the torchvision class, how each split is asked for (train=True/False or
split=...), and the file or folder whose absence means the set is not there (checked before the claim, without
torch). Grayscale sets give mode L images: the transforms' first step converts them to MODEL.IN_CHANS's mode
(L for 1, RGB for 3), as it converts image files.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from runner.errors import UserError


@dataclass(frozen=True)
class TvSet:
    """One set: its torchvision class, each split's constructor arguments, what DATA.ROOT holds once it is there."""

    cls: str  # the class in torchvision.datasets
    splits: dict[str, dict[str, Any]]  # train, val and any held-out split -> the constructor's split arguments
    marker: str  # a path under DATA.ROOT that torchvision's own existence check also needs
    extra: dict[str, Any] = field(default_factory=dict)  # other constructor arguments


_TRAIN_FLAG = {"train": {"train": True}, "val": {"train": False}}
_TEST_SPLIT = {"train": {"split": "train"}, "val": {"split": "test"}}
SETS = {
    "cifar10": TvSet("CIFAR10", _TRAIN_FLAG, "cifar-10-batches-py"),
    "cifar100": TvSet("CIFAR100", _TRAIN_FLAG, "cifar-100-python"),
    "mnist": TvSet("MNIST", _TRAIN_FLAG, "MNIST/raw/train-images-idx3-ubyte"),
    "fashion-mnist": TvSet("FashionMNIST", _TRAIN_FLAG, "FashionMNIST/raw/train-images-idx3-ubyte"),
    "kmnist": TvSet("KMNIST", _TRAIN_FLAG, "KMNIST/raw/train-images-idx3-ubyte"),
    "svhn": TvSet("SVHN", _TEST_SPLIT, "train_32x32.mat"),
    "stl10": TvSet("STL10", _TEST_SPLIT, "stl10_binary"),
    "flowers102": TvSet("Flowers102", {"train": {"split": "train"}, "val": {"split": "val"},
                                       "test": {"split": "test"}}, "flowers-102"),
    "oxford-pets": TvSet("OxfordIIITPet", {"train": {"split": "trainval"}, "val": {"split": "test"}},
                         "oxford-iiit-pet", {"target_types": "category"}),
    "food101": TvSet("Food101", _TEST_SPLIT, "food-101"),
}
LABEL_ATTRIBUTES = ("targets", "labels", "_labels")  # where the sets keep every label, read without images


def _key(name: str) -> str:
    """A set's name compared without case or punctuation (CIFAR-10, cifar10, FashionMNIST, fashion_mnist)."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find_set(name: str) -> str | None:
    """The table's name for DATA.SET `name` (or its torchvision class name), None when unknown."""
    for known, entry in SETS.items():
        if _key(name) in (_key(known), _key(entry.cls)):
            return known
    return None


def check(cfg: Any, fail: Any, check_files: bool, world: int) -> None:
    """A known DATA.SET, a DATA.ROOT, a DATA.TEST_SPLIT the set has; with files checked and no DATA.DOWNLOAD,
    the set's files under DATA.ROOT."""
    d = cfg.DATA
    name = find_set(d.SET)
    if name is None:
        fail("DATA.SET", f"DATA.SET {d.SET!r}: DATA.NAME torchvision reads one of {'|'.join(SETS)}")
    if not d.ROOT:
        fail("DATA.NAME", f"DATA.NAME torchvision needs DATA.ROOT, the folder that holds (or, with DATA.DOWNLOAD "
                          f"true, will hold) {name}")
    held_out = [s for s in SETS[name].splits if s not in ("train", "val")]
    if d.TEST_SPLIT and d.TEST_SPLIT not in held_out:
        fail("DATA.TEST_SPLIT", f"DATA.TEST_SPLIT {d.TEST_SPLIT!r}: {name} has no such held-out split "
                                f"({'|'.join(held_out) or 'none: its test split is the val split'})")
    if check_files and not d.DOWNLOAD and not os.path.exists(os.path.join(d.ROOT, SETS[name].marker)):
        fail("DATA.ROOT", _missing(name, d.ROOT))


def _missing(name: str, root: str) -> str:
    """The one line for a set whose files are not under DATA.ROOT."""
    return (f"DATA.SET {name}: not found in DATA.ROOT {root} (no {SETS[name].marker}); set DATA.DOWNLOAD true to "
            "download it there")


def build(cfg: Any, dist: Any) -> Any:
    """The set's train and val splits (downloaded first by rank 0 with DATA.DOWNLOAD), and their loaders."""
    from runner.data import indexed

    name = find_set(cfg.DATA.SET)
    train, val = indexed.local_first(dist, lambda first: (_rows(cfg, name, "train", first),
                                                          _rows(cfg, name, "val", first)))
    return indexed.bundle(cfg, dist, train, val, _class_names(train.opener.data, train), _where(cfg, name))


def build_split(cfg: Any, dist: Any, split: str) -> Any:
    """An evaluation loader over a held-out split of the set (flowers102's test)."""
    from runner.data import indexed

    name = find_set(cfg.DATA.SET)
    if split not in SETS[name].splits or split in ("train", "val"):
        raise UserError(f"DATA.SET {name} has no held-out split {split!r}")
    rows = indexed.local_first(dist, lambda first: _rows(cfg, name, split, first))
    train = _open(cfg, name, "train", download=False)
    return indexed.eval_loader(cfg, dist, rows, len(_class_names(train, None)), _where(cfg, name))


def _where(cfg: Any, name: str) -> str:
    """The set, as messages name it."""
    return f"DATA.SET {name} in {cfg.DATA.ROOT}"


def _open(cfg: Any, name: str, split: str, download: bool) -> Any:
    """torchvision's dataset object for one split (no transform: it gives PIL images); missing or broken files,
    or a download that fails, in one line."""
    import torchvision.datasets

    entry = SETS[name]
    cls = getattr(torchvision.datasets, entry.cls)
    try:
        return cls(os.path.expanduser(cfg.DATA.ROOT), **entry.splits[split], **entry.extra, download=download)
    except RuntimeError as e:  # torchvision's "Dataset not found or corrupted"
        if not download:
            raise UserError(f"{_missing(name, cfg.DATA.ROOT)} ({_one_line(e)})") from None
        raise UserError(f"DATA.SET {name}: the download into {cfg.DATA.ROOT} failed: {_one_line(e)}") from None
    except OSError as e:  # a download's network or disk error (URLError is an OSError)
        raise UserError(f"DATA.SET {name}: reading or downloading into {cfg.DATA.ROOT} failed: {_one_line(e)}"
                        ) from None


def _one_line(err: Exception) -> str:
    """An error's text on one line, cut short (torchvision's download errors list every mirror on its own line)."""
    return " ".join(str(err).split())[:300] or type(err).__name__


def _rows(cfg: Any, name: str, split: str, first: bool) -> Any:
    """Rows of one split: the labels read once, each image taken from the set by index; downloaded first (with
    DATA.DOWNLOAD) by the `first` process of the node only."""
    from runner.data.indexed import Rows

    data = _open(cfg, name, split, download=cfg.DATA.DOWNLOAD and first)
    reader = SetImages(data, f"{name} {split}")
    return Rows(split, list(enumerate(labels_of(data))), reader, reader.describe)


def labels_of(data: Any) -> list[int]:
    """Every label of a torchvision set, from the attribute it keeps them in (no image read)."""
    for attribute in LABEL_ATTRIBUTES:
        labels = getattr(data, attribute, None)
        if labels is not None:
            return [int(t) for t in (labels.tolist() if hasattr(labels, "tolist") else labels)]
    return [int(data[i][1]) for i in range(len(data))]


def _class_names(data: Any, rows: Any) -> list[str]:
    """The set's class names, or the label indices as names (SVHN has none)."""
    names = getattr(data, "classes", None)
    if names:
        return [str(c) for c in names]
    labels = [label for _, label in rows.samples] if rows is not None else labels_of(data)
    return [str(i) for i in range(max(labels) + 1)]


class SetImages:
    """The image of one sample of a torchvision set (a PIL image: in memory, or opened from its file)."""

    def __init__(self, data: Any, split: str):
        self.data, self.split = data, split

    def __call__(self, index: int) -> Any:
        """The sample's PIL image."""
        return self.data[index][0]

    def describe(self, index: int) -> str:
        """The sample as messages name it."""
        return f"{self.split} sample {index}"
