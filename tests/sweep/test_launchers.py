"""tools/sweeps/run.sh with sweep files end to end: a 2x2 grid two points at a time, one table sorted by the metric,
re-runs that train nothing, a redone point, a failed and a stopped point; mistakes refused before anything runs; a
tiny search with two workers; optuna-dashboard serving a finished study's journal.

Every point pays Python, torch and timm start-up, so the points are as small as still gives val/top1: 16 px, batch
16, two steps, 10% val split.
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.sweep.test_search import fake_search
from tests.test_sweep_trust import run_sh as sweep_run_sh
from tests.utils import ROOT, assert_user_error

DIGITS = ROOT / "configs" / "digits" / "test_resnet.yaml"
LRS, MODELS = ("0.1", "0.05"), ("test_resnet", "test_efficientnet")
POINTS = [f"lr={lr},model.name={m}" for lr in LRS for m in MODELS]
TINY = ["TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "2", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "16",
        "DATA.VAL_FRACTION", "0.1", "DATA.NUM_WORKERS", "0", "LOG.PERIOD", "1"]


def sweep_file(folder: Path, body: str, name: str = "s.yaml") -> Path:
    """A sweep file on the digits config (`body`: its other sections), its points under folder/runs."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"cfg: {DIGITS}\nroot: runs\n{body}")
    return path


def grid_file(folder: Path, lrs=LRS, models=MODELS) -> Path:
    """The LR x model grid."""
    return sweep_file(folder, f"grid:\n  TRAIN.LR: [{', '.join(lrs)}]\n  MODEL.NAME: [{', '.join(models)}]\n")


def run_sh(*args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """tools/sweeps/run.sh from the project root with this interpreter (test_sweep_trust's runner: CPU, one thread
    per point, killed whole on a timeout)."""
    return sweep_run_sh(ROOT, *args, timeout=timeout, **{"PYTHON": sys.executable, **env})


def summary_rows(root: Path) -> list[dict]:
    """tools/summarize.py's CSV, one dict per run."""
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "summarize.py"), str(root), "--format", "csv"],
                         capture_output=True, text=True, timeout=60, check=True)
    return list(csv.DictReader(io.StringIO(out.stdout)))


def table_lines(text: str) -> list[list[str]]:
    """The cells of every markdown table row in `text` (header and rule included)."""
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("|")]


def snapshot(folder: Path) -> dict[str, int]:
    """Modification time (ns) of every file under a folder."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """The 2x2 grid, run once: two points at a time on the CPU; (file, root, the run)."""
    path = grid_file(tmp_path_factory.mktemp("launch"))
    t0 = time.perf_counter()
    out = run_sh(str(path), *TINY, JOBS="2")
    print(f"2x2 sweep: {time.perf_counter() - t0:.1f}s")
    assert out.returncode == 0, out.stdout + out.stderr
    return path, path.parent / "runs", out


@pytest.mark.slow
def test_grid_gives_four_done_points_and_one_table_sorted_by_the_metric(swept) -> None:
    _, root, out = swept
    rows = {r["run"]: r for r in summary_rows(root)}
    assert sorted(rows) == sorted(POINTS)
    for name, row in rows.items():
        lr, model = (part.split("=")[1] for part in name.split(","))
        assert (row["status"], row["TRAIN.LR"], row["MODEL.NAME"]) == ("done", lr, model)
    assert "2 point(s) at a time" in out.stdout
    lines = table_lines(out.stdout)
    assert sum(cells[1] == "run" for cells in lines) == 1  # one table
    header, body = lines[0], lines[2:]
    assert len(body) == 4 and sum(cells[0] == "*" for cells in body) == 1
    best = [float(cells[header.index("best/val/top1")]) for cells in body]
    assert best == sorted(best, reverse=True)  # sorted by the metric, best first
    assert all(list((root / p).glob("events.out.tfevents.*")) for p in POINTS)  # tensorboard --logdir ROOT


@pytest.mark.slow
def test_rerun_trains_nothing(swept) -> None:
    path, root, _ = swept
    before = snapshot(root)
    t0 = time.perf_counter()
    out = run_sh(str(path), *TINY)
    elapsed = time.perf_counter() - t0
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("(done)") == 4 and "sweep: start" not in out.stdout
    assert elapsed < 10, f"a re-run of a finished sweep took {elapsed:.1f}s"
    out = run_sh(str(path), *TINY, SWEEP_RECHECK="1")  # train.py itself says done, without training
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("already done") == 4
    assert {k: v for k, v in snapshot(root).items() if not k.startswith("logs/")} == \
        {k: v for k, v in before.items() if not k.startswith("logs/")}


@pytest.mark.slow
def test_deleted_point_is_redone_alone_and_a_failed_point_does_not_stop_the_sweep(swept) -> None:
    path, root, _ = swept
    redo, others = POINTS[1], [p for p in POINTS if p != POINTS[1]]
    before = {p: snapshot(root / p) for p in others}
    shutil.rmtree(root / redo)
    out = run_sh(str(path), *TINY)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"sweep: start {redo}" in out.stdout and out.stdout.count("sweep: start") == 1
    assert {p: snapshot(root / p) for p in others} == before
    # a model timm does not have is found only when the point builds it (exit 2): the others still get their turn
    bad = grid_file(path.parent, lrs=("0.1",), models=("no_such_model", "test_resnet"))
    out = run_sh(str(bad), *TINY)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.count("(done)") == 1
    assert "1 point(s) failed" in out.stderr and "lr=0.1,model.name=no_such_model (exit code 2)" in out.stderr


@pytest.mark.slow
def test_every_point_has_the_same_hparams_columns(swept) -> None:
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import plugin_data_pb2

    _, root, _ = swept
    mux = EventMultiplexer().AddRunsFromDirectory(str(root))
    mux.Reload()
    content = mux.PluginRunToTagToContent("hparams")
    columns = {}
    for point in POINTS:
        data = plugin_data_pb2.HParamsPluginData.FromString(content[point]["_hparams_/session_start_info"])
        columns[point] = sorted(data.session_start_info.hparams)
    assert all(c == columns[POINTS[0]] for c in columns.values())
    assert columns[POINTS[0]] == sorted(["TRAIN.LR", "MODEL.NAME", "TRAIN.EPOCHS", "TRAIN.MAX_STEPS",
                                         "DATA.IMG_SIZE", "DATA.BATCH_SIZE", "DATA.VAL_FRACTION"])


@pytest.mark.slow
def test_a_stopped_point_is_reported_as_stopped_and_continued(tmp_path: Path) -> None:
    path = grid_file(tmp_path, lrs=("0.1",), models=("test_resnet",))
    name = "lr=0.1,model.name=test_resnet"
    out = run_sh(str(path), *TINY, "TRAIN.TIME_LIMIT", "1")
    assert out.returncode == 75, out.stdout + out.stderr
    assert "failed" not in out.stdout + out.stderr
    assert f"sweep: {name} stopped with exit code 75" in out.stderr
    out = run_sh(str(path), *TINY)  # TRAIN.TIME_LIMIT is resume-safe
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed from" in out.stdout and f"sweep: {name} finished" in out.stdout


# ---------------------------------------------------------------------------------------------------------------
# Mistakes: one line, exit 2, before anything runs
# ---------------------------------------------------------------------------------------------------------------
def test_a_misspelt_key_in_the_file_is_refused_before_anything_runs(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, "set: {TRAIN.EPOCS: 3}\ngrid: {TRAIN.LR: [0.1, 0.05]}\n")
    line = assert_user_error(run_sh(str(path), timeout=60), "TRAIN.EPOCS", f"{path}:3")
    assert "TRAIN.EPOCHS" in line  # the suggestion
    assert not (tmp_path / "runs").exists()


def test_two_points_sharing_a_folder_are_refused(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, "grid:\n  MODEL.NAME: ['hf-hub:timm/test_resnet', 'hf-hub:timm_test_resnet']\n")
    line = assert_user_error(run_sh(str(path), timeout=60), "one folder", "model.name=hf-hub:timm_test_resnet")
    assert "hf-hub:timm/test_resnet" in line and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("body, args, env, fragment", [
    ("grid: {TRAIN.LR: [0.1]}\n", ["TRAIN.LR", "0.2"], {}, "TRAIN.LR is set per point"),
    ("grid: {TRAIN.LR: [0.1]}\n", ["TRAIN.EPOCHS"], {}, "TRAIN.EPOCHS has no value"),
    ("grid: {TRAIN.LR: [0.1]}\n", [], {"JOBS": "0"}, "JOBS=0 is not a whole number of at least 1"),
    ("grid: {TRAIN.LR: [0.1]}\n", [], {"NPROC": "0"}, "NPROC=0 is not a whole number of at least 1"),
    ("search: {trials: 2, asha: {eta: 1}, space: {TRAIN.LR: {log: [0.001, 0.1]}}}\n", [], {}, "eta must be"),
    ("search: {trials: 2, space: {TRAIN.LR: {log: [0.001, 0.1]}}}\n", [], {"SWEEP_ROOT": "x"}, "SWEEP_ROOT"),
    ("search: {trials: 2, space: {TRAIN.LR: {log: [0.001, 0.1]}}}\n", [], {"NPROC": "0"}, "NPROC=0 is not a whole"),
])
def test_launcher_mistakes(tmp_path: Path, body: str, args: list[str], env: dict, fragment: str) -> None:
    out = run_sh(str(sweep_file(tmp_path, body)), *args, timeout=60, **env)
    assert_user_error(out, fragment)
    assert "start" not in out.stdout and not (tmp_path / "runs").exists()


def test_no_file_is_one_line() -> None:
    assert_user_error(run_sh(timeout=60), "no sweep file given")
    assert_user_error(run_sh("nope.yaml", timeout=60), "nope.yaml not found")


# ---------------------------------------------------------------------------------------------------------------
# Search
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_search_with_two_workers_finishes_and_prints_the_table(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, "set: {TRAIN.EPOCHS: 2, DATA.IMG_SIZE: 16, DATA.BATCH_SIZE: 128, DATA.NUM_WORKERS: 0}\n"
                      "search:\n  trials: 3\n  seed: 0\n  asha: {eta: 2, min_epochs: 1}\n"
                      "  space: {TRAIN.LR: {log: [1.0e-4, 1.0e-1]}}\n")
    root = tmp_path / "runs"
    out = run_sh(str(path), "LOG.PERIOD", "5", JOBS="2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 worker(s) at a time" in out.stdout and out.stdout.count("finished") == 2
    assert "3 of 3 trials" in out.stdout and f"--cfg {root}/trial_" in out.stdout
    assert (root / "report.html").is_file() and (root / "logs" / "worker_1.log").is_file()
    done = [d for d in root.glob("trial_*") if (d / "results.json").exists()]
    assert len(done) >= 1 and len(list(root.glob("trial_*"))) == 3
    before = snapshot(root)
    again = run_sh(str(path), "LOG.PERIOD", "5")  # a finished study trains nothing and prints the table again
    assert again.returncode == 0, again.stdout + again.stderr
    assert "search: trial" not in again.stdout and "3 of 3 trials" in again.stdout
    assert {k: v for k, v in snapshot(root).items() if k.startswith("trial_")} == \
        {k: v for k, v in before.items() if k.startswith("trial_")}


# ---------------------------------------------------------------------------------------------------------------
# optuna-dashboard (an optional install: pip install optuna-dashboard)
# ---------------------------------------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 60) -> object:
    """GET url as JSON, retrying until the server answers (or the timeout passes)."""
    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.3)


def test_optuna_dashboard_serves_the_study_journal(tmp_path: Path, fake) -> None:  # noqa: F811
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is an optional install (pip install "
                                                   "optuna-dashboard, or the extra .[dashboard])")
    from runner.sweep import worker

    search = fake_search(tmp_path)  # a real study, trained by tests/sweep/fake_train.py (no torch)
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    journal = Path(search.root) / "study.journal"
    port = free_port()
    program = shutil.which("optuna-dashboard", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    assert program, "optuna_dashboard imports but its optuna-dashboard command is not on PATH"
    with open(tmp_path / "dashboard.log", "w") as log:  # its own process; stopped below by its pid
        proc = subprocess.Popen([program, str(journal), "--host", "127.0.0.1", "--port", str(port), "--quiet"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        studies = get_json(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
        assert [s["study_name"] for s in studies] == ["s"]
        study = get_json(f"http://127.0.0.1:{port}/api/studies/{studies[0]['study_id']}")
        trials = study["trials"]
        assert len(trials) == 4
        steps = sorted(sorted(v["step"] for v in t["intermediate_values"]) for t in trials)
        assert steps == [[1], [1], [1], [1, 3]]  # the rung values: each trial at epoch 1, the promoted one at 3
        # the others wait at their rung (Running to Optuna): raising `trials` could still promote them
        assert sorted(t["state"] for t in trials) == ["Complete", "Running", "Running", "Running"]
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
