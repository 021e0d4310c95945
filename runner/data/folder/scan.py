"""Image folders (DATA.ROOT/{train,val}/<class>/...): scanned and checked before step 1, decoded fast,
robust to files that go bad.

The bad-file budget (DATA.BAD_FILE_BUDGET, default 0.01) is judged per split: a split stops the run when
more than that share of its image files is unreadable, counting the files the scan rejected plus the
distinct files that failed to decode during training (those are skipped: the next image is used instead).
"""
from __future__ import annotations

import json
import logging
import os
import random
import struct
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.transforms.functional as TF
import torchvision.transforms.v2.functional as F2
from PIL import Image, UnidentifiedImageError
from timm.data import create_transform
from timm.data.transforms import MaybeToTensor, RandomResizedCropAndInterpolation
from torch.utils.data import Dataset
from torchvision import transforms
from torchvision.transforms import InterpolationMode

from runner.errors import UserError
from runner.fsutil import atomic_write

logger = logging.getLogger("runner")

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
SPLITS = ("train", "val")
MAX_WARNINGS = 20  # bad files named one by one in the log; the rest are counted
# Errors that mean "this file cannot be decoded"; anything else is a bug and propagates.
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error,
                 Image.DecompressionBombError)
CHECK_TOOL = "tools/check_data.py --cfg <same config>"


# ---------------------------------------------------------------------------------------------------------
# Scan and check
# ---------------------------------------------------------------------------------------------------------
@dataclass
class FolderIndex:
    """What a scan found: classes, (path, class index) samples per split, bad files and counts."""

    root: str
    classes: list[str]
    train: list[tuple[str, int]]
    val: list[tuple[str, int]]
    bad: list[tuple[str, str]] = field(default_factory=list)  # (path, reason), rejected by the check
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> class -> usable files
    bad_counts: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> class -> bad files
    problems: list[str] = field(default_factory=list)  # structural problems (filled when not strict)
    notes: list[str] = field(default_factory=list)  # odd but usable (a file under two classes through links)
    checked: bool = False  # whether every file was opened and checked

    def samples(self, split: str) -> list[tuple[str, int]]:
        """The usable (path, class index) pairs of one split."""
        return self.train if split == "train" else self.val

    def n_bad(self, split: str) -> int:
        """Bad files the check found in one split."""
        return sum(self.bad_counts.get(split, {}).values())

    def n_files(self, split: str) -> int:
        """All image files of one split, usable and bad."""
        return len(self.samples(split)) + self.n_bad(split)


def _is_hidden(name: str) -> bool:
    """Hidden entries (.ipynb_checkpoints, .DS_Store, ._foo.jpg) are never data."""
    return name.startswith(".")


def _walk_class(class_dir: Path) -> dict[str, str]:
    """{real path: path as found} of the image files under one class folder, recursively, hidden entries skipped.

    Symbolic links are followed, but each real folder is entered once (a link to itself or to a parent, or one
    folder linked twice, cannot loop or count twice), and each real file counts once per class folder, under
    the first path found (folders in name order, depth first).
    """
    found: dict[str, str] = {}
    seen: set[tuple[int, int]] = set()
    stack = [str(class_dir)]
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:  # unreadable or vanished: as os.walk, skip it (the split's checks report what is left)
            continue
        real_folder = os.path.realpath(folder)
        subfolders = []
        for e in entries:
            if _is_hidden(e.name):
                continue
            if _entry_is_dir(e):
                subfolders.append(e.path)
            elif e.name.lower().endswith(IMG_EXTENSIONS):
                real = os.path.realpath(e.path) if e.is_symlink() else os.path.join(real_folder, e.name)
                found.setdefault(real, e.path)
        stack.extend(reversed(subfolders))
    return found


def _entry_is_dir(entry: os.DirEntry) -> bool:
    """Whether a directory entry is a folder, following links; False for a broken link."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def class_dirs(split_dir: Path) -> list[Path]:
    """Non-hidden sub-folders of a split folder, sorted by name."""
    dirs = [p for p in split_dir.iterdir() if p.is_dir() and not _is_hidden(p.name)]
    return sorted(dirs, key=lambda p: p.name)


def _jpeg_has_end(path: str, size: int) -> bool:
    """Whether a JPEG ends with its end-of-image marker (trailing zero padding allowed)."""
    with open(path, "rb") as f:
        f.seek(max(0, size - 1024))
        return f.read().rstrip(b"\x00\r\n\t ").endswith(b"\xff\xd9")


def check_file(path: str) -> str | None:
    """Why `path` is not a usable image, or None when it is; cheap for good JPEG and PNG files."""
    try:
        size = os.path.getsize(path)
        if size == 0:
            return "empty file (0 bytes)"
        with Image.open(path) as im:
            if im.width == 0 or im.height == 0:
                return "image has zero width or height"
            if im.format == "PNG":
                im.verify()  # walks every chunk and checks its CRC, without decompressing
            elif im.format != "JPEG" or not _jpeg_has_end(path, size):
                im.load()  # no cheap check: decode (for a JPEG, tells trailing junk from truncation)
    except UnidentifiedImageError:
        return "not an image (the content is no known image format)"
    except Exception as e:  # noqa: BLE001 - any failure makes the file unusable; the reason is reported
        text = str(e).split("\n")[0]
        if "truncated" in text:
            return f"truncated image ({text})"
        return f"unreadable: {type(e).__name__}: {text}"
    return None


def _structure(root: Path) -> tuple[dict[str, dict[str, list[str]]], list[str], list[str]]:
    """List split/class/files under root; describe every structural problem, and note what is odd but usable."""
    problems: list[str] = []
    notes: list[str] = []
    listing: dict[str, dict[str, list[str]]] = {}
    with ThreadPoolExecutor(max_workers=16) as pool:
        for split in SPLITS:
            split_dir = root / split
            if not split_dir.is_dir():
                problems.append(f"missing split folder {split_dir}: "
                                f"expected DATA.ROOT/{split}/<class>/<images>")
                continue
            dirs = class_dirs(split_dir)
            walks = dict(zip([d.name for d in dirs], pool.map(_walk_class, dirs), strict=True))
            listing[split] = {c: sorted(found.values()) for c, found in walks.items()}
            notes += _shared_files(split_dir, walks)
            if not any(listing[split].values()):
                loose = [f.name for f in split_dir.iterdir() if f.is_file() and f.name.lower().endswith(IMG_EXTENSIONS)]
                where = (f"its {len(loose)} images lie directly in it; move them into {split_dir}/<class>/"
                         if loose else f"no class folder with images ({'/'.join(IMG_EXTENSIONS)}) inside")
                problems.append(f"empty split {split_dir}: {where}")
                continue
            empty = [c for c, files in listing[split].items() if not files]
            if empty:
                problems.append(f"empty class folder{'s' if len(empty) > 1 else ''} in {split_dir}: "
                                f"{', '.join(empty)} (no {'/'.join(IMG_EXTENSIONS)} files; "
                                "remove or fill them)")
    if len(listing) == 2 and all(listing.values()):
        only_train = sorted(set(listing["train"]) - set(listing["val"]))
        only_val = sorted(set(listing["val"]) - set(listing["train"]))
        if only_train or only_val:
            problems.append("class folders differ between train and val: "
                            f"only in train: {', '.join(only_train) or '-'}; "
                            f"only in val: {', '.join(only_val) or '-'}")
    return listing, problems, notes


def _shared_files(split_dir: Path, walks: dict[str, dict[str, str]]) -> list[str]:
    """A note when one real file is under two class folders (through links): it is kept in each, as
    torchvision's ImageFolder does, since a link into another class is how an image is put in two classes."""
    owners: dict[str, list[str]] = {}
    for c, found in walks.items():
        for real in found:
            owners.setdefault(real, []).append(c)
    shared = {real: cs for real, cs in owners.items() if len(cs) > 1}
    if not shared:
        return []
    real, cs = min(shared.items())
    return [f"{len(shared)} files in {split_dir} are under more than one class folder through symbolic links "
            f"(e.g. {real} in {' and '.join(cs)}): each is a sample of every class it is under"]


def scan_folder(cfg: Any, check: bool | None = None, strict: bool = True) -> FolderIndex:
    """Scan DATA.ROOT; with the check on (default DATA.CHECK), open every file and set the bad ones aside.

    Structural problems raise UserError (the first, one line) when `strict`, else land in `index.problems`.
    """
    check = cfg.DATA.CHECK if check is None else check
    if not cfg.DATA.ROOT:
        raise UserError("DATA.ROOT is empty: DATA.NAME folder needs DATA.ROOT set to a folder holding "
                        "train/<class>/ and val/<class>/ image folders")
    root = Path(cfg.DATA.ROOT).expanduser()
    if not root.is_dir():
        raise UserError(f"DATA.ROOT {root} is not a folder: it should hold train/<class>/ and val/<class>/")
    listing, problems, notes = _structure(root)
    if problems and strict:
        more = f" (and {len(problems) - 1} more problems; {CHECK_TOOL} lists them all)"
        more = more if len(problems) > 1 else ""
        raise UserError(problems[0] + more)
    classes = sorted(set(listing.get("train", {})) | set(listing.get("val", {})))
    to_idx = {c: i for i, c in enumerate(classes)}
    index = FolderIndex(root=str(root), classes=classes, train=[], val=[], problems=problems, notes=notes,
                        checked=check)
    flat = [(split, c, p) for split, by_class in listing.items()
            for c, files in by_class.items() for p in files]
    reasons = _check_all([p for _, _, p in flat]) if check else [None] * len(flat)
    for split in SPLITS:
        index.counts[split] = {c: 0 for c in listing.get(split, {})}
        index.bad_counts[split] = {c: 0 for c in listing.get(split, {})}
    for (split, c, path), reason in zip(flat, reasons, strict=True):
        if reason is None:
            index.samples(split).append((path, to_idx[c]))
            index.counts[split][c] += 1
        else:
            index.bad.append((path, reason))
            index.bad_counts[split][c] += 1
    return index


def _check_all(paths: list[str]) -> list[str | None]:
    """check_file over many paths on a thread pool (file reads and JPEG/PNG decoding release the GIL)."""
    workers = min(32, 4 * (os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(check_file, paths, chunksize=64))


def check_budget(index: FolderIndex, cfg: Any) -> None:
    """Raise UserError when a split's share of bad files passes DATA.BAD_FILE_BUDGET; else warn about each."""
    budget = cfg.DATA.BAD_FILE_BUDGET
    for split in SPLITS:
        n_bad, n_all = index.n_bad(split), index.n_files(split)
        if n_all and n_bad / n_all > budget:
            raise UserError(f"{n_bad} of {n_all} {split} image files are unreadable ({n_bad / n_all:.2%}), "
                            f"over DATA.BAD_FILE_BUDGET {budget:.2%}; {CHECK_TOOL} lists them with the "
                            "reasons (fix or delete them, or raise DATA.BAD_FILE_BUDGET)")
    for path, reason in index.bad[:MAX_WARNINGS]:
        logger.warning("skipping bad image %s: %s", path, reason)
    if len(index.bad) > MAX_WARNINGS:
        logger.warning("... and %d more bad images skipped (%s lists them all)",
                       len(index.bad) - MAX_WARNINGS, CHECK_TOOL)


# ---------------------------------------------------------------------------------------------------------
# Decoding: timm's transforms, with a faster first step (reduced JPEG decode, torch's uint8 resize)
# ---------------------------------------------------------------------------------------------------------
# A JPEG is decoded reduced only down to twice the size the resize needs (as PIL's thumbnail does): reducing
# further loses detail (libjpeg's scaled decode upsamples chroma coarsely), measured in docs/PERFORMANCE.md
DRAFT_GAP = 2.0
# torch's antialiased uint8 resize matches PIL's within one level for these; it pays for its two copies
# (PIL -> tensor -> PIL) only on large regions, so smaller ones stay with PIL's resize (crossover measured)
TORCH_RESIZE_MIN_PIXELS = 300 * 300
TENSOR_INTERP = {InterpolationMode.BILINEAR, InterpolationMode.BICUBIC, InterpolationMode.NEAREST,
                 InterpolationMode.NEAREST_EXACT}


def to_mode(img: Image.Image, mode: str = "RGB") -> Image.Image:
    """Decode `img` and convert it to `mode` only when it is not already in it (a convert always copies)."""
    if img.mode == mode:
        img.load()
        return img
    if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit or float grayscale: scale to 8 bits
        arr = np.asarray(img, dtype=np.float32)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr * (255.0 / top), 0, 255).astype(np.uint8), "L")
    elif img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # PIL asks for this step for palette images with transparency
    return img.convert(mode)


def draft(img: Image.Image, mode: str, max_factor: float) -> tuple[Image.Image, int]:
    """Decode `img` in `mode`; a JPEG at the largest DCT scale-down (1/2, 1/4, 1/8) not above `max_factor`.

    Returns the decoded image and the scale-down factor used (1 for other formats or when nothing fits).
    """
    factor = next(s for s in (8, 4, 2, 1) if s <= max(max_factor / DRAFT_GAP, 1.0))
    if factor > 1 and img.format == "JPEG":
        img.draft(mode, (img.width // factor, img.height // factor))  # libjpeg then picks exactly `factor`
    else:
        factor = 1
    return to_mode(img, mode), factor


def chw_uint8(img: Image.Image) -> torch.Tensor:
    """A decoded PIL image as a uint8 CHW tensor in channels-last memory (what torch's fast resize wants)."""
    arr = np.array(img, dtype=np.uint8)
    return torch.from_numpy(arr[:, :, None] if arr.ndim == 2 else arr).permute(2, 0, 1)


def to_pil(t: torch.Tensor, mode: str) -> Image.Image:
    """A uint8 CHW tensor back to a PIL image, for timm's PIL-only steps (flip, color jitter, RandAugment)."""
    arr = t.permute(1, 2, 0).contiguous().numpy()
    return Image.fromarray(arr[:, :, 0] if mode == "L" else arr, mode)


class FastRandomResizedCrop(RandomResizedCropAndInterpolation):
    """timm's random resized crop, with the crop picked on the JPEG header, the JPEG decoded at the
    smallest DCT scale that keeps the crop at least as large as the output, and torch resizing the uint8."""

    def __init__(self, base: RandomResizedCropAndInterpolation, mode: str = "RGB",
                 tensor_resize: bool = True):
        self.size, self.scale, self.ratio = base.size, base.scale, base.ratio
        self.interpolation, self.mode, self.tensor_resize = base.interpolation, mode, tensor_resize

    def __call__(self, img: Image.Image) -> Image.Image:
        """Crop and resize `img` (opened, not yet decoded) to self.size."""
        top, left, h, w = self.get_params(img, self.scale, self.ratio)
        out_h, out_w = self.size
        interp = self.interpolation
        if isinstance(interp, (tuple, list)):
            interp = random.choice(interp)
        img, s = draft(img, self.mode, min(w / out_w, h / out_h))
        if not (self.tensor_resize and interp in TENSOR_INTERP and w * h >= TORCH_RESIZE_MIN_PIXELS * s * s):
            box = (left / s, top / s, (left + w) / s, (top + h) / s)
            return img.resize((out_w, out_h), TF.pil_modes_mapping[interp], box=box)
        y0, x0 = top // s, left // s
        crop = chw_uint8(img)[:, y0:max(y0 + 1, (top + h) // s), x0:max(x0 + 1, (left + w) // s)]
        return to_pil(F2.resize(crop, [out_h, out_w], interp, antialias=True), self.mode)


class FastResize:
    """Replaces the eval Resize: decodes a JPEG at the smallest DCT scale that keeps it at least the
    target size, then resizes with torch on uint8; gives a uint8 CHW tensor (CenterCrop and
    ToNormalizedTensor take it)."""

    def __init__(self, base: transforms.Resize, mode: str = "RGB", tensor_resize: bool = True):
        self.size, self.max_size, self.interpolation = base.size, base.max_size, base.interpolation
        self.mode, self.tensor_resize = mode, tensor_resize
        self.min_wh = (self.size, self.size) if isinstance(self.size, int) else (self.size[-1], self.size[0])

    def __call__(self, img: Image.Image) -> torch.Tensor | Image.Image:
        """Decode (reduced when possible) and resize `img`, opened but not yet decoded."""
        img, _ = draft(img, self.mode, min(img.width / self.min_wh[0], img.height / self.min_wh[1]))
        use_torch = self.interpolation in TENSOR_INTERP and img.width * img.height >= TORCH_RESIZE_MIN_PIXELS
        if not (self.tensor_resize and use_torch):
            return TF.resize(img, self.size, self.interpolation, self.max_size)
        size = [self.size] if isinstance(self.size, int) else list(self.size)
        return F2.resize(chw_uint8(img), size, self.interpolation, self.max_size, antialias=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, interpolation={self.interpolation.value})"


class DecodeMode:
    """First step when nothing faster applies: decode and convert to `mode` only if needed."""

    def __init__(self, mode: str = "RGB"):
        self.mode = mode

    def __call__(self, img: Image.Image) -> Image.Image:
        """Decode `img` in self.mode."""
        return to_mode(img, self.mode)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mode={self.mode})"


class ToNormalizedTensor:
    """MaybeToTensor + Normalize in one pass: uint8 image -> float CHW (x / 255 - mean) / std."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1) * 255.0
        self.inv_std = 1.0 / (torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1) * 255.0)

    def __call__(self, pic: Image.Image | torch.Tensor) -> torch.Tensor:
        """The normalized float tensor of a PIL image or a uint8 CHW tensor."""
        t = pic if isinstance(pic, torch.Tensor) else chw_uint8(pic)
        return t.float().contiguous().sub_(self.mean).mul_(self.inv_std)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def speed_up(transform: transforms.Compose, mode: str = "RGB", reduced_decode: bool = True,
             fused_tensor: bool = True, tensor_resize: bool = True) -> transforms.Compose:
    """timm's transform, same steps and sizes, for images opened with open_image: decoding and converting
    only as needed, a reduced JPEG decode, torch's uint8 resize and a fused to-tensor/normalize (each can
    be turned off, for the benchmark)."""
    steps = list(transform.transforms)
    first = steps[0]
    if reduced_decode and type(first) is RandomResizedCropAndInterpolation:
        steps[0] = FastRandomResizedCrop(first, mode, tensor_resize)
    elif reduced_decode and isinstance(first, transforms.Resize):
        steps[0] = FastResize(first, mode, tensor_resize)
    else:
        steps.insert(0, DecodeMode(mode))
    for i in range(len(steps) - 1):
        pair = steps[i:i + 2]
        if fused_tensor and isinstance(pair[0], MaybeToTensor) and isinstance(pair[1], transforms.Normalize):
            steps[i:i + 2] = [ToNormalizedTensor(pair[1].mean, pair[1].std)]
            break
    return transforms.Compose(steps)


# timm's AUG.AUTO_AUGMENT grammar: a policy, then dash-separated <key><number> sections (t<name> for rand)
AA_SECTIONS = {"rand": {"m": int, "n": int, "mstd": float, "mmax": int, "inc": int, "p": float},
               "augmix": {"m": int, "w": int, "d": int, "a": float, "b": int, "mstd": float},
               "auto": {"mstd": float}}
AA_POLICIES = ("original", "originalr", "v0", "v0r", "3a")  # timm's AutoAugment policies
AA_RAND_SETS = ("weights", "3a", "3aw")  # rand-t<name>
AA_SYNTAX = ("timm's syntax: rand[-m<int>][-n<int>][-mstd<float>][-mmax<int>][-inc<0|1>][-p<float>]"
             f"[-t<{'|'.join(AA_RAND_SETS)}>] (e.g. rand-m9-mstd0.5-inc1), augmix[-m<int>][-w<int>][-d<int>]"
             f"[-a<float>][-b<0|1>][-mstd<float>], or {'|'.join(AA_POLICIES)}[-mstd<float>]; '' for none")


def check_auto_augment(value: str) -> None:
    """Refuse an AUG.AUTO_AUGMENT string timm would reject with an assert or, worse, silently half-ignore
    (timm skips any section without a number: rand-mX is RandAugment at the default magnitude)."""
    policy, *sections = value.split("-")
    kind = policy if policy in ("rand", "augmix") else "auto" if policy in AA_POLICIES else None
    if kind is None:
        raise UserError(f"AUG.AUTO_AUGMENT {value!r}: unknown policy {policy!r}; {AA_SYNTAX}")
    for sec in sections:
        if kind == "rand" and sec[:1] == "t" and sec[1:] in AA_RAND_SETS:
            continue
        key = sec.rstrip("0123456789.")
        kinds = AA_SECTIONS[kind]
        try:
            ok = key in kinds and sec != key and kinds[key](sec[len(key):]) is not None
        except ValueError:
            ok = False
        if not ok:
            raise UserError(f"AUG.AUTO_AUGMENT {value!r}: section {sec!r} is not one {policy} takes; {AA_SYNTAX}")


def eval_interpolation(cfg: Any) -> str:
    """AUG.INTERPOLATION for the eval resize; 'random' (a training augmentation) evaluates with bilinear."""
    return "bilinear" if cfg.AUG.INTERPOLATION == "random" else cfg.AUG.INTERPOLATION


def timm_transform(cfg: Any, is_training: bool) -> transforms.Compose:
    """timm's create_transform with every setting taken from cfg.DATA and cfg.AUG."""
    size = (cfg.MODEL.IN_CHANS, cfg.DATA.IMG_SIZE, cfg.DATA.IMG_SIZE)
    common = dict(interpolation=cfg.AUG.INTERPOLATION, mean=tuple(cfg.DATA.MEAN), std=tuple(cfg.DATA.STD))
    if not is_training:
        common["interpolation"] = eval_interpolation(cfg)  # timm's eval resize has no 'random' (a KeyError)
        return create_transform(size, is_training=False, crop_pct=cfg.AUG.CROP_PCT, **common)
    if cfg.AUG.AUTO_AUGMENT:
        check_auto_augment(cfg.AUG.AUTO_AUGMENT)
    return create_transform(size, is_training=True, scale=tuple(cfg.AUG.SCALE), ratio=tuple(cfg.AUG.RATIO),
                            hflip=cfg.AUG.HFLIP, color_jitter=cfg.AUG.COLOR_JITTER or None,
                            auto_augment=cfg.AUG.AUTO_AUGMENT or None, re_prob=cfg.AUG.REPROB,
                            re_mode=cfg.AUG.REMODE, **common)


def image_mode(cfg: Any) -> str:
    """PIL mode the model's input channels need: L for 1, RGB for 3; image files give no other count."""
    if cfg.MODEL.IN_CHANS not in (1, 3):
        raise UserError(f"MODEL.IN_CHANS {cfg.MODEL.IN_CHANS}: image files are read as grayscale (1 channel) or "
                        "RGB (3 channels); set MODEL.IN_CHANS 3 (or 1, with one DATA.MEAN and DATA.STD value)")
    return "L" if cfg.MODEL.IN_CHANS == 1 else "RGB"


def build_transform(cfg: Any, is_training: bool) -> transforms.Compose:
    """The train or eval transform for images opened with open_image (PIL, not yet decoded)."""
    return speed_up(timm_transform(cfg, is_training), image_mode(cfg))


def open_image(path: str) -> Image.Image:
    """Open an image lazily (header only), so the transform can choose a reduced-size decode."""
    return Image.open(path)


# ---------------------------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------------------------
class FolderDataset(Dataset):
    """(path, class index) samples decoded through `transform`, giving (CHW float tensor, int target).

    A file that fails to decode is skipped with one warning naming it, and the next sample is returned
    instead (deterministic). Distinct failures are counted in shared memory, so every DataLoader worker sees
    the total; once `known_bad` (files the scan rejected) plus those pass `budget` of the split, UserError
    is raised.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], transform: Callable, budget: float = 0.01,
                 known_bad: int = 0, split: str = "train"):
        if not samples:
            raise UserError(f"the {split} split has no usable images")
        self.samples = list(samples)
        self.transform = transform
        self.budget = budget
        self.known_bad = known_bad
        self.split = split
        self.failed = torch.zeros(len(self.samples), dtype=torch.uint8).share_memory_()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """The transformed image and target at `index`, or at the next index that decodes."""
        n = len(self.samples)
        for k in range(n):
            path, target = self.samples[(index + k) % n]
            try:
                return self.transform(open_image(path)), target
            except DECODE_ERRORS as e:
                self._record_failure((index + k) % n, path, e)
        raise UserError(f"no image of the {self.split} split could be decoded")

    def failures(self) -> int:
        """Distinct files that failed to decode so far (all workers together)."""
        return int(self.failed.sum())

    def _record_failure(self, i: int, path: str, err: Exception) -> None:
        """Count a failed file once, warn about it once, stop when the split's budget is passed."""
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if self.failed[i] == 0:
            self.failed[i] = 1
            logger.warning("skipping %s: cannot decode it (%s); using the next image instead", path, reason)
        n_all = len(self.samples) + self.known_bad
        n_bad = self.known_bad + self.failures()
        if n_bad > self.budget * n_all:
            share = n_bad / n_all
            raise UserError(f"{n_bad} of {n_all} {self.split} image files are unreadable ({share:.2%}), "
                            f"over DATA.BAD_FILE_BUDGET {self.budget:.2%}; last: {path} ({reason}); "
                            f"{CHECK_TOOL} lists them all")


def build_folder_datasets(cfg: Any, index: FolderIndex | None = None
                          ) -> tuple[FolderDataset, FolderDataset, list[str]]:
    """Train and val datasets for DATA.NAME folder: scan (unless given), budget check, timm transforms."""
    if index is None:
        index = scan_folder(cfg)
    from runner.data import check_classes

    check_budget(index, cfg)
    check_classes(cfg, index.classes, f"DATA.ROOT {index.root}")
    for note in index.notes:
        logger.warning("%s", note)
    datasets = [FolderDataset(index.samples(split), build_transform(cfg, split == "train"),
                              budget=cfg.DATA.BAD_FILE_BUDGET, known_bad=index.n_bad(split), split=split)
                for split in SPLITS]
    return datasets[0], datasets[1], list(index.classes)


# ---------------------------------------------------------------------------------------------------------
# Class map and the digits export
# ---------------------------------------------------------------------------------------------------------
def write_class_map(output_dir: str | Path, classes: Sequence[str]) -> Path:
    """Write OUTPUT_DIR/class_map.json ({"0": "cat", ...}) atomically; return its path."""
    path = Path(output_dir) / "class_map.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({str(i): c for i, c in enumerate(classes)}, indent=1) + "\n")
    return path


def read_class_map(path: str | Path) -> list[str]:
    """Class names by index from a class_map.json written by write_class_map."""
    try:
        raw = json.loads(Path(path).read_text())
        names = [raw[str(i)] for i in range(len(raw))]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a readable class map ({{\"0\": \"name\", ...}}): {e}") from None
    return [str(n) for n in names]


def export_digits_jpegs(root: str | Path, size: int = 224, per_class: int | None = None,
                        val_fraction: float = 0.2, seed: int = 0, quality: int = 90) -> Path:
    """Write scikit-learn's digits as RGB JPEGs under root/{train,val}/<digit>/, with a fixed seeded split.

    `per_class` keeps that many images of each digit (before the split); None keeps all 1,797, split exactly
    as DATA.NAME digits splits them (the same 360 val images), so both data paths are measured alike.
    """
    from runner.data import read_digits, stratified_split

    root = Path(root)
    images, labels = read_digits()
    rng = np.random.default_rng(seed)
    in_memory_val = set(stratified_split(labels, val_fraction)[1].tolist()) if per_class is None else set()
    for label in range(10):
        idx = rng.permutation(np.flatnonzero(labels == label))[:per_class]
        n_val = max(1, int(round(len(idx) * val_fraction)))
        val = [i for i in idx if i in in_memory_val] if per_class is None else idx[:n_val]
        train = [i for i in idx if i not in in_memory_val] if per_class is None else idx[n_val:]
        for split, part in (("val", val), ("train", train)):
            out = root / split / str(label)
            out.mkdir(parents=True, exist_ok=True)
            for i in part:
                pixels = (images[i] * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
                img = Image.fromarray(pixels, "L").resize((size, size), Image.BILINEAR).convert("RGB")
                img.save(out / f"{i:04d}.jpg", quality=quality)
    return root
