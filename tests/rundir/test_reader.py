"""The run folder's one reader (runner/rundir/reader.py) and `python -m runner.rundir state DIR` for shell scripts."""
from __future__ import annotations

import json
import subprocess
import sys

from runner.rundir import reader
from runner.rundir.layout import CONFIG, METRICS, RESULTS, RUN_JSON
from runner.rundir.lock import RunLock
from runner.rundir.marker import DONE, FAILED, PREEMPTED, RUNNING, write_results, write_status
from tests.utils import ROOT


def test_state_words(tmp_path):
    assert reader.state(tmp_path / "nosuch") == "missing"
    assert reader.state(tmp_path) == "missing"  # an empty folder holds no run
    (tmp_path / CONFIG).write_text("SEED: 0\n")
    write_status(tmp_path, PREEMPTED, step=3)
    assert reader.state(tmp_path) == "interrupted"
    write_status(tmp_path, FAILED, error="boom")
    assert reader.state(tmp_path) == "failed"
    write_status(tmp_path, RUNNING)
    assert reader.state(tmp_path) == "interrupted"  # no process holds the lock: killed
    lock = RunLock(tmp_path)
    lock.acquire()
    try:
        assert reader.state(tmp_path) == "running"
    finally:
        lock.release()
    write_results(tmp_path, {"status": DONE, "step": 5})
    write_status(tmp_path, DONE)
    assert reader.state(tmp_path) == "done" and reader.finished(tmp_path)
    assert reader.results(tmp_path)["step"] == 5 and reader.status(tmp_path)["status"] == DONE


def test_metrics_rows_and_unreadable_files(tmp_path):
    (tmp_path / METRICS).write_text('{"step": 1, "epoch": 0, "loss": 2.0}\n{"step": 2, "ep')
    found = reader.read_metrics(tmp_path)
    assert [r["step"] for r in found.rows] == [1] and found.bad == [2] and found.lines == 2
    assert reader.read_metrics(tmp_path / "nosuch") is None
    (tmp_path / RESULTS).write_text("[1]")
    assert reader.read_object(tmp_path, RESULTS) == (None, "not a JSON object")
    assert reader.read_object(tmp_path, RUN_JSON) == (None, "")


def test_stored_config_falls_back_to_the_claim(tmp_path):
    assert reader.stored_config(tmp_path) is None
    write_status(tmp_path, RUNNING, config="SEED: 1\n")
    assert reader.stored_config(tmp_path) == "SEED: 1\n"
    (tmp_path / CONFIG).write_text("SEED: 2\n")
    assert reader.stored_config(tmp_path) == "SEED: 2\n"


def test_the_shell_entry_point_prints_one_word_per_folder(tmp_path):
    done = tmp_path / "done"
    done.mkdir()
    (done / RESULTS).write_text(json.dumps({"status": DONE}))
    proc = subprocess.run([sys.executable, "-m", "runner.rundir", "state", str(done), str(tmp_path / "nosuch")],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["done", "missing"], proc
    usage = subprocess.run([sys.executable, "-m", "runner.rundir"], capture_output=True, text=True, cwd=ROOT,
                           timeout=60)
    assert usage.returncode == 2 and "usage: python -m runner.rundir state DIR" in usage.stderr
    probe = "import sys, runner.rundir.__main__, runner.rundir.rules; print('torch' in sys.modules)"
    light = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert light.stdout.strip() == "False"  # the done path and the shell's check import no torch
