"""The example sweep scripts end to end: a 2x2 sweep on digits, re-runs that train nothing, a redone point.

The 2x2 sweep runs once per module (two points at a time: per_gpu.sh with JOBS=2 on the CPU); the tests
after it re-run lr_x_model.sh and per_gpu.sh on the same root. Every point pays Python, torch and timm
start-up, so the points are as small as still gives val/top1: 16 px, batch 16, two steps, 10% val split.
"""
from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LRS, MODELS = ("0.1", "0.05"), ("test_resnet", "test_efficientnet")
POINTS = [f"lr{lr}_{m}" for lr in LRS for m in MODELS]
TINY = ["TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "2", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "16",
        "DATA.VAL_FRACTION", "0.1", "DATA.NUM_WORKERS", "0", "LOG.PERIOD", "1"]


def sweep(script: str, root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run tools/sweeps/<script> on root with this interpreter; one CPU thread per point."""
    full_env = dict(os.environ, SWEEP_ROOT=str(root), PYTHON=sys.executable, LRS=" ".join(LRS),
                    MODELS=" ".join(MODELS), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env.update(env)
    return subprocess.run(["bash", str(ROOT / "tools" / "sweeps" / script), *TINY, *args], capture_output=True,
                          text=True, timeout=600, env=full_env, cwd=ROOT)


def summary_rows(root: Path) -> list[dict]:
    """tools/summarize.py's CSV, one dict per run."""
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "summarize.py"), str(root), "--format", "csv"],
                         capture_output=True, text=True, timeout=60, check=True)
    return list(csv.DictReader(io.StringIO(out.stdout)))


def snapshot(folder: Path) -> dict[str, int]:
    """Modification time (ns) of every file in a run folder."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def metrics_lines(root: Path) -> dict[str, int]:
    """Number of metrics.jsonl lines per point."""
    return {p: len((root / p / "metrics.jsonl").read_text().splitlines()) for p in POINTS}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """The 2x2 sweep, run once: two points at a time on the CPU."""
    root = tmp_path_factory.mktemp("sweep") / "lr_x_model"
    t0 = time.perf_counter()
    out = sweep("per_gpu.sh", root, JOBS="2", NUM_GPUS="0")
    print(f"2x2 sweep: {time.perf_counter() - t0:.1f}s")
    assert out.returncode == 0, out.stdout + out.stderr
    return root, out


def test_sweep_gives_four_finished_rows(swept) -> None:
    root, out = swept
    rows = {r["run"]: r for r in summary_rows(root)}
    assert sorted(rows) == sorted(POINTS)
    for name, row in rows.items():
        lr, model = name[2:].split("_", 1)
        assert (row["status"], row["TRAIN.LR"], row["MODEL.NAME"]) == ("done", lr, model)
        assert 0.0 <= float(row["val/top1"]) <= 100.0 and float(row["best/val/top1"]) >= float(row["val/top1"])
    # the script ends with the table: one markdown row per point, the best one marked
    table = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 4 and sum(line.startswith("| * ") for line in table) == 1
    assert "2 point(s) at a time" in out.stdout
    # every point writes its own TensorBoard events in its own folder: `tensorboard --logdir ROOT` shows all
    assert all(list((root / p).glob("events.out.tfevents.*")) for p in POINTS)


def test_rerun_trains_nothing(swept) -> None:
    root, _ = swept
    before = {p: snapshot(root / p) for p in POINTS}
    lines = metrics_lines(root)
    t0 = time.perf_counter()
    out = sweep("lr_x_model.sh", root)
    elapsed = time.perf_counter() - t0
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("(done)") == 4 and "sweep: start" not in out.stdout
    assert elapsed < 5, f"a re-run of a finished sweep took {elapsed:.1f}s"
    # SWEEP_RECHECK=1 asks train.py itself; it also says done without training (and without importing torch)
    t0 = time.perf_counter()
    out = sweep("per_gpu.sh", root, SWEEP_RECHECK="1")
    elapsed = time.perf_counter() - t0
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("already done") == 4
    assert elapsed < 15, f"a re-run through train.py took {elapsed:.1f}s"
    assert metrics_lines(root) == lines
    assert {p: snapshot(root / p) for p in POINTS} == before


def test_failed_point_does_not_stop_the_sweep(swept) -> None:
    root, _ = swept
    # a model timm does not have is found only when the point builds it (exit 2); a bad config value such as
    # TRAIN.LR -1 now stops the whole sweep before any point starts (test_sweep_trust.py)
    out = sweep("lr_x_model.sh", root, LRS="0.1", MODELS="no_such_model test_resnet")
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.count("(done)") == 1  # the point after the failed one still gets its turn
    assert "1 point(s) failed" in out.stderr and "lr0.1_no_such_model (exit code 2)" in out.stderr


def test_deleted_point_is_redone_alone(swept) -> None:
    root, _ = swept
    redo, others = POINTS[1], [p for p in POINTS if p != POINTS[1]]
    before = {p: snapshot(root / p) for p in others}
    shutil.rmtree(root / redo)
    out = sweep("lr_x_model.sh", root)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"sweep: start {redo}" in out.stdout and out.stdout.count("sweep: start") == 1
    assert {p: snapshot(root / p) for p in others} == before
    rows = {r["run"]: r for r in summary_rows(root)}
    assert rows[redo]["status"] == "done" and rows[redo]["val/top1"] != ""


def test_every_point_has_the_same_hparams_columns(swept) -> None:
    # TensorBoard's HParams tab takes its columns from one point: all four must list the swept keys, the
    # lr0.1 points too (0.1 is the default LR)
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import plugin_data_pb2

    root, _ = swept
    mux = EventMultiplexer().AddRunsFromDirectory(str(root))
    mux.Reload()
    content = mux.PluginRunToTagToContent("hparams")
    assert sorted(content) == sorted(POINTS)
    columns = {}
    for point in POINTS:
        data = plugin_data_pb2.HParamsPluginData.FromString(content[point]["_hparams_/session_start_info"])
        columns[point] = sorted(data.session_start_info.hparams)
        lr, model = point[2:].split("_", 1)
        assert data.session_start_info.hparams["TRAIN.LR"].number_value == float(lr)
        assert data.session_start_info.hparams["MODEL.NAME"].string_value == model
    assert all(c == columns[POINTS[0]] for c in columns.values())
    # the sweep's keys (TINY's, without the logging ones) and nothing the config file alone sets
    assert columns[POINTS[0]] == sorted(["TRAIN.LR", "MODEL.NAME", "TRAIN.EPOCHS", "TRAIN.MAX_STEPS",
                                         "DATA.IMG_SIZE", "DATA.BATCH_SIZE", "DATA.VAL_FRACTION"])


def test_a_stopped_point_is_reported_as_stopped_not_failed(tmp_path: Path) -> None:
    # a point that saved and exited 75 (TRAIN.TIME_LIMIT here; SIGTERM, a preemption alike) was listed as
    # "failed with exit code 75" and "1 point(s) failed"
    root, name = tmp_path / "sweep", "lr0.1_test_resnet"
    out = sweep("lr_x_model.sh", root, "TRAIN.TIME_LIMIT", "1", LRS="0.1", MODELS="test_resnet")
    assert out.returncode == 75, out.stdout + out.stderr
    assert "failed" not in out.stdout + out.stderr
    assert (f"sweep: {name} stopped with exit code 75 (its state is saved; re-run the same command to "
            "continue it)") in out.stderr
    assert ("sweep: 1 point(s) stopped before their end, state saved (re-run the same command to continue):\n"
            f"  {name}\n") in out.stderr
    out = sweep("lr_x_model.sh", root, LRS="0.1", MODELS="test_resnet")  # TRAIN.TIME_LIMIT is resume-safe
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed from" in out.stdout and f"sweep: {name} finished" in out.stdout
