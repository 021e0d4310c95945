"""One atomic write for every file a run replaces (runner/fsutil.py): old or new file, never a half one, no
temporary file left, a full disk in one line; links for last.pth/best.pth the same way."""
from __future__ import annotations

import errno
import os

import pytest

from runner.errors import UserError
from runner.fsutil import TMP_RE, atomic_link, atomic_write, remove_stale_temps, temp_name


def test_atomic_write_keeps_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "results.json"
    atomic_write(path, "old\n")

    def fails(f):
        f.write(b"half")
        raise RuntimeError("killed midway")

    with pytest.raises(RuntimeError):
        atomic_write(path, fails)
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_full_disk_is_one_line_naming_what_is_intact(tmp_path):
    path = tmp_path / "step_00000004.pth"

    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(UserError) as e:
        atomic_write(path, full, intact="the previous checkpoint (step 3) is intact")
    assert str(e.value).startswith(f"no space left on device while writing {path.name} in {tmp_path}; "
                                   "the previous checkpoint (step 3) is intact")
    assert list(tmp_path.iterdir()) == []


def test_atomic_link_links_and_replaces(tmp_path):
    src, dst = tmp_path / "step_00000002.pth", tmp_path / "last.pth"
    src.write_bytes(b"new")
    dst.write_bytes(b"old")
    atomic_link(src, dst)
    assert dst.read_bytes() == b"new" and os.path.samefile(src, dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pth", "step_00000002.pth"]


def test_atomic_link_copies_where_links_are_refused(tmp_path, monkeypatch):
    src, dst = tmp_path / "step_00000002.pth", tmp_path / "last.pth"
    src.write_bytes(b"new" * 1000)
    temp_name(dst).write_bytes(b"stale")  # a killed process with our pid left its temporary file

    def refuse(a, b):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", refuse)
    atomic_link(src, dst)
    assert dst.read_bytes() == src.read_bytes() and not os.path.samefile(src, dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pth", "step_00000002.pth"]


def test_remove_stale_temps_spares_our_own(tmp_path):
    ours, theirs = temp_name(tmp_path / "a.pth"), tmp_path / ".a.pth.tmp.999999999"
    for p in (ours, theirs, tmp_path / "a.pth"):
        p.write_bytes(b"x")
    assert TMP_RE.match(theirs.name)
    remove_stale_temps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours.name, "a.pth"])
