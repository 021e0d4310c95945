"""Files a run writes: one atomic write (temporary name, fsync, rename, cleanup) for every file we replace.

Light on purpose (no torch import): tools/train.py uses it before anything heavy is imported.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from runner.errors import UserError

TMP_RE = re.compile(r"^\..+\.tmp\.(\d+)$")  # what temp_name gives: .<name>.tmp.<pid>


def temp_name(path: Path) -> Path:
    """The temporary file beside `path` that this process writes before renaming it onto `path`."""
    return path.with_name(f".{path.name}.tmp.{os.getpid()}")


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (POSIX); harmless where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: bytes | str | Callable[[BinaryIO], None],
                 intact: str = "") -> None:
    """Replace `path` with `data` (or what the callable writes) so a reader sees the old file or the new one.

    The temporary file is always removed; a full disk becomes a one-line UserError that says what is left whole
    (`intact`, a clause; by default "the previous <name> is intact").
    """
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())

    _replace_via_temp(Path(path), write, intact)


def atomic_link(src: Path, dst: Path) -> None:
    """Point `dst` at the file `src` atomically (hard link, or a streamed copy where links are unsupported)."""
    def link(tmp: Path) -> None:
        tmp.unlink(missing_ok=True)  # a temporary file of a killed process that had our pid
        try:
            os.link(src, tmp)
        except OSError as e:
            raise _NoLink from e

    try:
        _replace_via_temp(dst, link)
    except _NoLink:
        with open(src, "rb") as f:
            atomic_write(dst, lambda out: shutil.copyfileobj(f, out))


class _NoLink(Exception):
    """The file system refused a hard link: atomic_link copies instead."""


def _replace_via_temp(path: Path, make: Callable[[Path], None], intact: str = "") -> None:
    """The one rename scheme: `make` the temporary file, rename it onto `path`, fsync the folder; never leave it.

    A full disk (seen by the error or by the free space left) becomes the one-line UserError of atomic_write.
    """
    tmp = temp_name(path)
    try:
        make(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        full = out_of_space(e) or disk_full(path.parent)  # asked before the temporary file frees its space
        tmp.unlink(missing_ok=True)
        if full and not isinstance(e, (KeyboardInterrupt, _NoLink)):
            raise UserError(f"no space left on device while writing {path.name} in {path.parent}; "
                            f"{intact or f'the previous {path.name} is intact'}: free some space and run the "
                            "same command again") from None
        raise
    fsync_dir(path.parent)


def disk_full(folder: Path) -> bool:
    """True when the file system of `folder` has (almost) no space left for us."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 1 << 20


def out_of_space(e: BaseException) -> bool:
    """True for a full disk or quota, also when torch.save reports it as a RuntimeError.

    torch.save into a file object reports a short write as "unexpected pos ...": disk_full tells that case.
    """
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    text = str(e)
    return isinstance(e, RuntimeError) and ("No space left on device" in text or "file write failed" in text)


def remove_stale_temps(directory: Path) -> None:
    """Delete the temporary files of writes that were killed midway (the run lock makes us the only writer)."""
    for p in directory.iterdir():
        m = TMP_RE.match(p.name)
        if m and int(m.group(1)) != os.getpid():
            p.unlink(missing_ok=True)
