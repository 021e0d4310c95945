"""The logged curve after a resume: kills at steps that are not multiples of LOG.PERIOD, the real tools/train.py.

A metric window (the losses summed since the last logged step) cut by a checkpoint must be logged, once resumed,
as the run left alone logs it: every metrics.jsonl value but timings, exactly.
"""
from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from runner.process.threads import MARKER
from tests.engine.test_elastic import ELASTIC, accum_for
from tests.engine.test_elastic import argv as elastic_argv
from tests.engine.test_resume import BASE, RESUMED, Launch, assert_checkpoints_load, assert_same_run
from tests.utils import TRAIN, read_jsonl

LOG_PERIOD = 4  # checkpoints every 3 steps (BASE): most land inside a window
WINDOWED = [*BASE, "LOG.PERIOD", str(LOG_PERIOD)]
# what differs from run to run however exact the resume: time, throughput, memory
# the tests' OMP_NUM_THREADS 1 as the user's own: a run started while the cores are crowded must not choose
# another count than the one it is compared with (the count changes the float sums)
PINNED = {MARKER: ""}
TIMINGS = ("time", "wall_s", "train/img_per_s", "train/data_wait_frac", "train/mem_alloc_mb", "train/mem_reserved_mb")


def logged_rows(out: Path) -> list[dict]:
    """Every metrics.jsonl line without its timings."""
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in read_jsonl(out / "metrics.jsonl")]


@pytest.mark.slow
def test_a_run_resumed_inside_a_metric_window_logs_the_same_curve(tmp_path):
    """SIGKILL after the checkpoints of steps 6 or 9 and 30 or 33, a SIGTERM's save at whatever step it lands:
    every logged row equals the run left alone's (the first window after each resume included)."""
    ref, out = tmp_path / "ref", tmp_path / "run"
    ref_run = Launch([sys.executable, TRAIN, *WINDOWED, "OUTPUT_DIR", str(ref)], tmp_path, "ref", **PINNED)
    argv = [sys.executable, TRAIN, *WINDOWED, "OUTPUT_DIR", str(out)]
    resumed = []
    for i, (sig, target) in enumerate([(signal.SIGKILL, 8), (signal.SIGTERM, 16), (signal.SIGKILL, 32)]):
        run = Launch(argv, tmp_path, f"run{i}", **PINNED)
        if i:
            resumed.append(int(run.wait_for(RESUMED).group(4)))
        run.wait_step(target)
        run.p.send_signal(sig)
        run.finish(timeout=60)
        assert_checkpoints_load(out)
    final = Launch(argv, tmp_path, "final", **PINNED)
    assert final.finish() == 0, final.stdout[-3000:] + final.stderr
    resumed.append(int(RESUMED.search(final.stdout).group(4)))
    assert ref_run.finish() == 0, ref_run.stdout[-3000:] + ref_run.stderr
    assert any(step % LOG_PERIOD for step in resumed), f"no resume inside a window: {resumed}"
    rows, ref_rows = logged_rows(out), logged_rows(ref)
    assert len(ref_rows) > 2 * 22 // LOG_PERIOD and all("train/loss" in r or "val/top1" in r for r in ref_rows)
    for got, want in zip(rows, ref_rows, strict=True):
        assert got == want, f"resumed at steps {resumed}"
    assert_same_run(out, ref)  # and the checkpoint, results and TensorBoard's scalars


@pytest.mark.slow
def test_two_processes_resumed_inside_windows_on_two_then_one_log_the_same_curve(tmp_path):
    """Two processes killed after the checkpoint of step 8 (every 4 steps; LOG.PERIOD 3) resume on two: rows
    identical; killed after step 16's and resumed on one accumulating two: the rest equal up to the order of float
    sums (the saved windows of two ranks are one process's)."""
    period = ["LOG.PERIOD", "3"]
    ref = tmp_path / "ref"
    ref_run = Launch(elastic_argv(ref, 2, *ELASTIC, *period), tmp_path, "ref", **PINNED)
    out, resumed = tmp_path / "run", []
    for i, (procs, target) in enumerate([(2, 9), (2, 17), (1, 0)]):
        run = Launch(elastic_argv(out, procs, *ELASTIC, *period, *accum_for(procs)), tmp_path, f"run{i}", **PINNED)
        if i:
            resumed.append(int(run.wait_for(RESUMED).group(4)))
        if target:
            run.wait_step(target)
            run.kill_all()
    assert run.finish() == 0, run.stderr[-3000:]
    assert ref_run.finish() == 0, ref_run.stderr[-3000:]
    assert resumed[0] % 3 and resumed[1] % 3, f"a resume at a logged step: {resumed}"  # 8 and 16 unless raced
    rows, ref_rows = logged_rows(out), logged_rows(ref)
    assert [r["step"] for r in rows] == [r["step"] for r in ref_rows]
    exact = [r for r in ref_rows if r["step"] <= resumed[1]]
    assert rows[:len(exact)] == exact  # the same two processes: exactly
    for got, want in zip(rows[len(exact):], ref_rows[len(exact):], strict=True):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5), f"resumed at steps {resumed}"
