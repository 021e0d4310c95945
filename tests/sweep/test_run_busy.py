"""Two tools/sweeps/run.sh on one grid (issue 46, item 11.2): a point the other one trains is busy, said and
skipped, not a failure; both end 0. Each point's train.py is held stopped (SIGSTOP) while the other launcher
reaches it, so the order of events is fixed, not left to timing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runner.rundir.layout import LOCK
from runner.rundir.lock import is_locked
from tests.sweep.test_launchers import TINY, grid_file
from tests.utils import ROOT, wait_until

A, B = "lr=0.1,model.name=test_resnet", "lr=0.05,model.name=test_resnet"


def start(path: Path, out: Path) -> subprocess.Popen:
    """tools/sweeps/run.sh on `path` in the background (CPU, one point at a time), its output into out.{out,err}."""
    env = dict(os.environ, NUM_GPUS="0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHON=sys.executable)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    with open(f"{out}.out", "w") as o, open(f"{out}.err", "w") as e:
        return subprocess.Popen(["bash", str(ROOT / "tools" / "sweeps" / "run.sh"), str(path), *TINY], cwd=ROOT,
                                env=env, stdout=o, stderr=e, start_new_session=True)


def holder(folder: Path, proc: subprocess.Popen) -> int:
    """The pid of the train.py that holds `folder`'s run lock, once one does (waiting on `proc`)."""
    def held() -> bool:
        text = (folder / LOCK).read_text() if (folder / LOCK).exists() else ""
        return text.startswith("pid ") and is_locked(folder)

    wait_until(held, proc, f"{folder} is locked by a run", timeout=180)
    return int((folder / LOCK).read_text().split()[1])


def said(out: Path, text: str, proc: subprocess.Popen) -> None:
    """Wait until the launcher's stdout holds `text`."""
    wait_until(lambda: text in Path(f"{out}.out").read_text(), proc, f"{text!r} in {out}.out", timeout=180)


def finish(proc: subprocess.Popen, out: Path) -> tuple[str, str]:
    """Wait for the launcher; (stdout, stderr), asserting it exited 0."""
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text, err = Path(f"{out}.out").read_text(), Path(f"{out}.err").read_text()
    assert proc.returncode == 0, text + err
    return text, err


@pytest.mark.slow
def test_two_launchers_on_one_grid_skip_each_others_point_as_busy(tmp_path):
    path = grid_file(tmp_path, lrs=("0.1", "0.05"), models=("test_resnet",))
    root, first, second = tmp_path / "runs", tmp_path / "first", tmp_path / "second"
    one = start(path, first)
    pids = []
    try:
        pids.append(holder(root / A, one))  # the first launcher trains A, held still meanwhile
        os.kill(pids[-1], signal.SIGSTOP)
        two = start(path, second)
        said(second, f"sweep: {A} is busy", two)  # refused by A's lock: busy, on to B
        pids.append(holder(root / B, two))
        os.kill(pids[-1], signal.SIGSTOP)
        os.kill(pids[0], signal.SIGCONT)  # A ends; the first launcher then finds B held by the second
        text, err = finish(one, first)
        os.kill(pids[1], signal.SIGCONT)
        text2, err2 = finish(two, second)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert f"sweep: {A} finished" in text and f"sweep: {B} is busy" in text, text
    assert f"sweep: {B} finished" in text2 and f"sweep: {A} is busy" in text2, text2
    for out in (text + err, text2 + err2):
        assert "failed" not in out, out
        assert "1 point(s) busy, skipped" in out, out
    assert all((root / p / "results.json").exists() for p in (A, B))
