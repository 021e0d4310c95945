"""Image folders (DATA.ROOT/{train,val}/<class>/...): scanned and checked before step 1, and the bad-file budget.

The bad-file budget (DATA.BAD_FILE_BUDGET, default 0.01) is judged per split: a split stops the run when
more than that share of its image files is unreadable, counting the files the scan rejected plus the
distinct files that failed to decode during training (those are skipped: the next image is used instead).
"""
from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from runner.errors import UserError

logger = logging.getLogger("runner")

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
SPLITS = ("train", "val")
MAX_WARNINGS = 20  # bad files named one by one in the log; the rest are counted
CHECK_TOOL = "tools/check_data.py --cfg <same config>"


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


# Files checked in one thread while each takes less than this. Cached small files are checked in ~30 us, mostly
# Python holding the GIL: 8 threads took 3.4x as long as one (1,797 digits JPEGs: 0.19 s against 0.056 s, 2
# cores). Files that make the check wait (a cold disk, a network filesystem) or decode (no cheap check) release
# the GIL, and there a pool wins.
SERIAL_BELOW_S = 150e-6
SERIAL_CHUNK = 256


def _check_all(paths: list[str]) -> list[str | None]:
    """check_file over many paths: chunk by chunk in this thread while files check quickly, then on a thread
    pool once a chunk is slow (file reads and JPEG/PNG decoding release the GIL)."""
    out: list[str | None] = []
    while len(out) < len(paths):
        chunk = paths[len(out):len(out) + SERIAL_CHUNK]
        t0 = time.perf_counter()
        out += [check_file(p) for p in chunk]
        if time.perf_counter() - t0 > SERIAL_BELOW_S * len(chunk):
            break
    rest = paths[len(out):]
    if rest:
        workers = min(32, 4 * (os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            out += pool.map(check_file, rest, chunksize=64)
    return out


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


def scan_split(cfg: Any, split: str, classes: list[str]) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    """(usable (path, class index) pairs, (path, reason) of bad files) of a held-out split DATA.ROOT/<split>/ whose
    class folders are among the training `classes` (a class may be missing there, not new)."""
    split_dir = Path(cfg.DATA.ROOT).expanduser() / split
    if not split_dir.is_dir():
        raise UserError(f"missing split folder {split_dir}: expected DATA.ROOT/{split}/<class>/<images>")
    dirs = class_dirs(split_dir)
    unknown = [d.name for d in dirs if d.name not in classes]
    if unknown:
        raise UserError(f"class folders in {split_dir} the training split does not have: {', '.join(unknown[:5])}"
                        f"{' ...' if len(unknown) > 5 else ''} (the model has no output for them)")
    to_idx = {c: i for i, c in enumerate(classes)}
    flat = [(p, to_idx[d.name]) for d in dirs for p in sorted(_walk_class(d).values())]
    if not flat:
        raise UserError(f"empty split {split_dir}: no class folder with images ({'/'.join(IMG_EXTENSIONS)}) inside")
    reasons = _check_all([p for p, _ in flat]) if cfg.DATA.CHECK else [None] * len(flat)
    good = [pair for pair, reason in zip(flat, reasons, strict=True) if reason is None]
    bad = [(pair[0], reason) for pair, reason in zip(flat, reasons, strict=True) if reason is not None]
    return good, bad


def image_files(folder: Path) -> list[str]:
    """The image files under `folder`, recursively, sorted by path (links followed once, hidden entries skipped)."""
    return sorted(_walk_class(folder).values())
