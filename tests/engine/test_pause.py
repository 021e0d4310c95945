"""--pause-after-epoch: a run stops cleanly after an epoch (run.json paused, exit 0, no results.json) and the same
command with a later epoch, or without the flag, resumes it; the run paused twice ends bit-identical to the run
trained straight through (what a search's rungs rely on)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.test_resume import BASE, assert_same_run
from tests.utils import ROOT, TRAIN, env, read_jsonl

ARGS = [*BASE, "TRAIN.EPOCHS", "3"]


def _train(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """tools/train.py with the shared arguments into `out`."""
    return subprocess.run([sys.executable, TRAIN, *ARGS, "OUTPUT_DIR", str(out), *extra], capture_output=True,
                          text=True, cwd=ROOT, env=env(), timeout=600)


def _status(out: Path) -> dict:
    """run.json."""
    return json.loads((out / "run.json").read_text())


@pytest.mark.slow
def test_paused_twice_then_finished_equals_a_straight_run(tmp_path):
    ref, out = tmp_path / "ref", tmp_path / "paused"
    assert _train(ref).returncode == 0
    first = _train(out, "--pause-after-epoch", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    assert _status(out)["status"] == "paused" and not (out / "results.json").exists()
    assert "paused after epoch 1" in first.stdout + first.stderr
    rows = len(read_jsonl(out / "metrics.jsonl"))
    again = _train(out, "--pause-after-epoch", "1")  # the same rung asked again: nothing to train
    assert again.returncode == 0 and _status(out)["status"] == "paused", again.stderr[-2000:]
    assert len(read_jsonl(out / "metrics.jsonl")) == rows
    assert _train(out, "--pause-after-epoch", "2").returncode == 0
    assert _status(out)["status"] == "paused" and max(r["epoch"] for r in read_jsonl(out / "metrics.jsonl")) == 2
    last = _train(out)
    assert last.returncode == 0, last.stderr[-2000:]
    assert _status(out)["status"] == "done"
    assert "pause_after" not in (out / "config.yaml").read_text().lower()  # not part of the run's config
    assert_same_run(out, ref)
    done = _train(out, "--pause-after-epoch", "1")
    assert done.returncode == 0 and "already done" in done.stdout, done.stdout


@pytest.mark.slow
def test_a_pause_at_or_past_the_last_epoch_trains_to_the_end(tmp_path):
    out = tmp_path / "run"
    r = _train(out, "--pause-after-epoch", "3")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _status(out)["status"] == "done" and (out / "results.json").exists()


def test_a_pause_that_is_no_epoch_is_one_line(tmp_path, in_process):
    for bad in ("0", "-1", "x", "1.5"):
        r = in_process("train.py", [*ARGS, "OUTPUT_DIR", str(tmp_path / "run"), "--pause-after-epoch", bad])
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "--pause-after-epoch" in r.stderr and not (tmp_path / "run").exists()
