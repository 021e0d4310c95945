"""The run lock (runner/lock.py): one job per OUTPUT_DIR, its holder named in one format."""
from __future__ import annotations

import pytest

from runner.errors import UserError
from runner.lock import RunLock, holder_text, is_holder_text, is_locked, refuse_if_locked
from runner.runstate import is_our_run


def test_second_holder_is_refused_naming_the_first(tmp_path):
    first = RunLock(tmp_path / "run")
    first.acquire()
    try:
        assert is_locked(tmp_path / "run")
        text = (tmp_path / "run" / "run.lock").read_text()
        assert text == holder_text() and is_holder_text(text)
        for refused in (RunLock(tmp_path / "run").acquire, lambda: refuse_if_locked(tmp_path / "run")):
            with pytest.raises(UserError, match=rf"is in use by a running job \({text}\); wait for it"):
                refused()
    finally:
        first.release()
    assert not is_locked(tmp_path / "run")
    refuse_if_locked(tmp_path / "run")  # free again


def test_a_bare_lock_of_ours_marks_the_folder(tmp_path):
    lock = RunLock(tmp_path)
    lock.acquire()
    lock.release()
    assert is_our_run(tmp_path)  # a start-up that stopped before run.json: still ours
    for other in ("not ours\n", "pid x on host", ""):
        (tmp_path / "run.lock").write_text(other)
        assert not is_holder_text(other) and not is_our_run(tmp_path)
