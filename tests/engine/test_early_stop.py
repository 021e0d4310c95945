"""Best by val/loss, early stopping and evaluation every N steps with the real tools/train.py on the digits: a run
killed and resumed evaluates at the same steps and stops at the same step as the run left alone, bit-identical; a
re-run of the stopped run is done and rewrites nothing; the keys' mistakes are one line."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch

from tests.engine.test_resume import BASE, DIGITS, RESUMED, STEP_LINE, Launch, assert_same_run, val_rows
from tests.utils import TRAIN, assert_user_error, run_tool

# Evaluations at steps 8 and 16, the epoch's end (22) and 24. EARLY_STOP_MIN_DELTA 1000 is more than val/loss can
# improve by: the first evaluation is the reference and the run stops at the fourth (patience 3), mid-epoch 2,
# whatever the values, while best.pth follows the lowest val/loss of the four.
EARLY = [*BASE, "CHECKPOINT.BEST_METRIC", "val/loss", "EVAL.PERIOD_STEPS", "8", "TRAIN.EARLY_STOP_PATIENCE", "3",
         "TRAIN.EARLY_STOP_MIN_DELTA", "1000"]
EVAL_STEPS, STOP = [8, 16, 22, 24], 24


@pytest.fixture(scope="module")
def early(tmp_path_factory):
    """(the run left alone, the same command SIGKILLed after steps 11 and 19 and resumed, its launches)."""
    ref, out = tmp_path_factory.mktemp("reference"), tmp_path_factory.mktemp("interrupted")
    logs = tmp_path_factory.mktemp("logs")
    launches = [Launch([sys.executable, TRAIN, *EARLY, "OUTPUT_DIR", str(ref)], logs, "reference")]
    try:
        for i, target in enumerate([11, 19]):  # after CHECKPOINT.PERIOD 3's save at 9, and the evaluation's at 16
            run = Launch([sys.executable, TRAIN, *EARLY, "OUTPUT_DIR", str(out)], logs, f"run{i}")
            launches.append(run)
            run.wait_step(target)
            run.p.send_signal(signal.SIGKILL)
            assert run.finish(60) == -signal.SIGKILL, run.stderr
        launches.append(Launch([sys.executable, TRAIN, *EARLY, "OUTPUT_DIR", str(out)], logs, "final"))
        for run in (launches[0], launches[-1]):
            assert run.finish() == 0, run.stdout[-3000:] + run.stderr
    finally:
        for run in launches:
            if run.p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.p.pid, signal.SIGKILL)
    return ref, out, launches


def results(out: Path) -> dict:
    """results.json."""
    return json.loads((out / "results.json").read_text())


def files(out: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of a run folder: its bytes and modification time."""
    return {str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


@pytest.mark.slow
def test_killed_and_resumed_stops_at_the_same_step(early):
    """Same evaluations, same stop, same weights, metrics, event files and results as the run left alone."""
    ref, out, launches = early
    assert all(RESUMED.search(run.stdout) for run in launches[2:])  # each later launch resumed
    assert [r["step"] for r in val_rows(ref)] == EVAL_STEPS
    assert_same_run(out, ref)
    got, want = results(out), results(ref)
    assert got["early_stop"] == want["early_stop"] and got["step"] == STOP
    assert {k: v for k, v in got.items() if k.startswith("best/")} == {k: v for k, v in want.items()
                                                                       if k.startswith("best/")}


@pytest.mark.slow
def test_results_say_the_best_by_val_loss_and_why_the_run_stopped(early):
    ref = early[0]
    res, rows = results(ref), val_rows(ref)
    assert res["status"] == "done" and res["step"] == STOP and res["epoch"] == 1  # one whole epoch, then 2 steps
    low = min(rows, key=lambda r: r["val/loss"])
    assert (res["best/metric"], res["best/mode"], res["best/value"], res["best/step"]) == (
        "val/loss", "min", low["val/loss"], low["step"])
    assert res["best/val/top1"] == low["val/top1"] and res["best/epoch"] == low["epoch"]
    best = torch.load(ref / "checkpoints" / "best.pth", map_location="cpu", weights_only=True)
    assert best["step"] == low["step"]
    stop = res["early_stop"]
    assert {k: stop[k] for k in ("step", "epoch", "metric", "mode", "patience", "min_delta", "best_step")} == {
        "step": STOP, "epoch": 2, "metric": "val/loss", "mode": "min", "patience": 3, "min_delta": 1000.0,
        "best_step": 8}
    assert stop["evaluations_without_improvement"] == 3 and "TRAIN.EARLY_STOP_PATIENCE 3" in stop["reason"]
    assert [r["epoch"] for r in rows] == [1, 1, 1, 2]  # the step evaluations carry the epoch in progress
    assert json.loads((ref / "run.json").read_text())["status"] == "done"


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["TRAIN.EPOCHS", "3"]])
def test_a_rerun_of_the_stopped_run_is_done(early, extra):
    """The same command (or one asking for more epochs) prints done, trains nothing and rewrites nothing."""
    ref = early[0]
    before = files(ref)
    r = run_tool("train.py", [*EARLY, *extra, "OUTPUT_DIR", str(ref)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert f"already done (val/top1 {results(ref)['val/top1']:.2f}; it stopped early at step {STOP}" in r.stdout
    assert not STEP_LINE.search(r.stdout) and files(ref) == before


@pytest.mark.slow
def test_killed_after_the_stops_checkpoint_the_rerun_only_writes_the_results(early, tmp_path):
    ref = early[0]
    out = tmp_path / "run"
    shutil.copytree(ref, out, ignore=lambda d, names: [n for n in names if n in ("results.json", "run.lock")])
    metrics = (out / "metrics.jsonl").read_bytes()
    r = run_tool("train.py", [*EARLY, "OUTPUT_DIR", str(out)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert RESUMED.search(r.stdout).group(4) == str(STOP) and not STEP_LINE.search(r.stdout)
    assert (out / "metrics.jsonl").read_bytes() == metrics
    got, want = results(out), results(ref)
    assert {k: v for k, v in got.items() if k != "wall_s"} == {k: v for k, v in want.items() if k != "wall_s"}


@pytest.mark.parametrize("args, words", [
    (["CHECKPOINT.BEST_METRIC", "val/acc"], "CHECKPOINT.BEST_METRIC must be a metric the run logs at evaluation"),
    (["CHECKPOINT.BEST_METRIC", "val_ema/top1"], "CHECKPOINT.BEST_METRIC val_ema/top1 needs TRAIN.EMA true"),
    (["CHECKPOINT.BEST_MODE", "maximum"], "CHECKPOINT.BEST_MODE must be one of auto|max|min, got 'maximum'"),
    (["TRAIN.EARLY_STOP_PATIENCE", "-1"], "TRAIN.EARLY_STOP_PATIENCE must be >= 0, got -1"),
    (["TRAIN.EARLY_STOP_MIN_DELTA", "-0.5"], "TRAIN.EARLY_STOP_MIN_DELTA must be >= 0, got -0.5"),
    (["TRAIN.EARLY_STOP_MIN_DELTA", "0.1"], "TRAIN.EARLY_STOP_MIN_DELTA (0.1) needs TRAIN.EARLY_STOP_PATIENCE > 0"),
    (["EVAL.PERIOD_STEPS", "-5"], "EVAL.PERIOD_STEPS must be >= 0, got -5"),
])
def test_mistakes_are_one_line_and_write_nothing(tmp_path, args, words, in_process):
    r = in_process("train.py", ["--cfg", DIGITS, *args, "OUTPUT_DIR", str(tmp_path / "run")])
    line = assert_user_error(r, words)
    assert re.search(r"\(command line\)", line) and not (tmp_path / "run").exists()
