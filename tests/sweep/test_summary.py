"""tools/summarize.py over hand-made run folders: statuses, override columns, sort, markdown and CSV."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.config import get_default_config
from runner.rundir.lock import RunLock
from runner.sweep.summary import summarize
from tests.utils import assert_user_error, merge_pairs

ROOT = Path(__file__).resolve().parents[2]
OLD = time.time() - 3600  # an hour ago: long past the "recently active" window


def make_run(folder: Path, overrides: dict | None = None, results: dict | None = None,
             metrics: list | None = None, state: dict | None = None, checkpoint: bool = False,
             old: bool = True) -> Path:
    """A run folder as the engine leaves it: config.yaml, then whatever else is given."""
    folder.mkdir(parents=True)
    cfg = get_default_config()
    cfg.OUTPUT_DIR = str(folder)
    merge_pairs(cfg, [x for pair in (overrides or {}).items() for x in pair])
    (folder / "config.yaml").write_text(cfg.dump())
    if results is not None:
        (folder / "results.json").write_text(json.dumps(results, indent=2))
    if metrics is not None:
        (folder / "metrics.jsonl").write_text("".join(m if isinstance(m, str) else json.dumps(m) + "\n"
                                                      for m in metrics))
    if state is not None:
        (folder / "run.json").write_text(json.dumps({"pid": 1, "host": os.uname().nodename, **state}))
    if checkpoint:
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "last.pth").write_bytes(b"\0" * 64)
    if old:
        for path in [folder, *folder.rglob("*")]:
            os.utime(path, (OLD, OLD))
    return folder


def done(top1: float, **extra) -> dict:
    """A results.json of a finished run."""
    return {"status": "done", "val/top1": top1, "val/top5": 99.0, "best/val/top1": top1 + 1,
            "best/val/top5": 99.5, "epoch": 3, "step": 30, "wall_s": 12.5, "train/img_per_s": 900.0, **extra}


def summarize_cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    """tools/summarize.py in a subprocess."""
    return subprocess.run([sys.executable, str(ROOT / "tools" / "summarize.py"), str(root), *args],
                          capture_output=True, text=True, timeout=60)


def csv_rows(root: Path, *args: str) -> list[dict]:
    """The CSV summary as dicts, in output order."""
    out = summarize_cli(root, "--format", "csv", *args)
    assert out.returncode == 0, out.stderr
    return list(csv.DictReader(io.StringIO(out.stdout)))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A root with a finished, a killed, a broken-metrics, a broken-config, a failed and a preempted run."""
    root = tmp_path / "sweep"
    make_run(root / "lr0.1_resnet10t", {"TRAIN.LR": 0.1, "MODEL.NAME": "resnet10t"}, results=done(80.0),
             state={"status": "done"}, checkpoint=True)
    make_run(root / "lr0.05_resnet10t", {"TRAIN.LR": 0.05, "MODEL.NAME": "resnet10t"}, results=done(85.0),
             state={"status": "done"})
    # killed with SIGKILL: run.json still says running, nobody holds the lock, checkpoints exist
    make_run(root / "group" / "deeper" / "killed", {"TRAIN.LR": 0.2},
             metrics=[{"step": 5, "epoch": 1, "train/img_per_s": 100.0},
                      {"step": 10, "epoch": 1, "val/top1": 40.0, "val/top5": 90.0},
                      {"step": 20, "epoch": 2, "val/top1": 30.0, "val/top5": 95.0},
                      '{"step": 25, "epoch": 3, "train/lo'],  # a write cut short by the kill
             state={"status": "running"}, checkpoint=True)
    make_run(root / "brokenmetrics", {"TRAIN.LR": 0.3},
             metrics=[{"step": 10, "epoch": 1, "val/top1": 20.0}, "garbage {\n", "[1, 2]\n",
                      {"step": 20, "epoch": 2, "val/top1": 25.0}])
    bad = make_run(root / "brokenconfig", checkpoint=True)
    (bad / "config.yaml").write_text("TRAIN: {LR: [0.1,\n")
    os.utime(bad / "config.yaml", (OLD, OLD))
    make_run(root / "failed", {"TRAIN.LR": 9.0},
             state={"status": "failed", "error": "RuntimeError: out of memory"})
    make_run(root / "preempted", {"TRAIN.LR": 0.01}, state={"status": "preempted", "step": 7},
             checkpoint=True)
    return root


def by_run(rows: list[dict]) -> dict[str, dict]:
    """Rows keyed by run folder."""
    return {row["run"]: row for row in rows}


def test_statuses_and_values(sweep: Path) -> None:
    rows = by_run(csv_rows(sweep))
    assert set(rows) == {"lr0.1_resnet10t", "lr0.05_resnet10t", "group/deeper/killed", "brokenmetrics",
                         "brokenconfig", "failed", "preempted"}
    assert {k: r["status"] for k, r in rows.items()} == {
        "lr0.1_resnet10t": "done", "lr0.05_resnet10t": "done", "group/deeper/killed": "interrupted",
        "brokenmetrics": "interrupted", "brokenconfig": "interrupted", "failed": "failed",
        "preempted": "interrupted"}
    finished = rows["lr0.05_resnet10t"]
    assert (float(finished["val/top1"]), float(finished["best/val/top1"])) == (85.0, 86.0)
    assert (finished["epoch"], finished["wall_s"], finished["train/img_per_s"]) == ("3", "12.5", "900.0")
    killed = rows["group/deeper/killed"]
    # final is the last evaluation, best the highest top-1 with the top-5 of that same evaluation (90, not the
    # higher 95 of a later one), as results.json has it; the cut-off last line is tolerated and noted
    assert (float(killed["val/top1"]), float(killed["best/val/top1"]), float(killed["best/val/top5"])) == (
        30.0, 40.0, 90.0)
    assert killed["epoch"] == "2" and float(killed["train/img_per_s"]) == 100.0
    assert "killed" in killed["note"] and "partial last line" in killed["note"]
    broken = rows["brokenmetrics"]
    assert float(broken["val/top1"]) == 25.0 and "2 unreadable line(s)" in broken["note"]
    assert "line 2, 3" in broken["note"]
    assert "config.yaml unreadable" in rows["brokenconfig"]["note"]
    assert "out of memory" in rows["failed"]["note"]
    assert "preempted" in rows["preempted"]["note"]


def test_override_columns(sweep: Path) -> None:
    rows = csv_rows(sweep)
    columns = list(rows[0])
    # only keys that differ from the defaults in some run; OUTPUT_DIR differs everywhere and is left out
    assert [c for c in columns if c.isupper()] == ["MODEL.NAME", "TRAIN.LR"]
    assert columns[:3] == ["run", "MODEL.NAME", "TRAIN.LR"] and columns[-1] == "best"
    lrs = by_run(rows)
    assert lrs["lr0.05_resnet10t"]["TRAIN.LR"] == "0.05" and lrs["lr0.05_resnet10t"]["MODEL.NAME"] == "resnet10t"
    assert lrs["failed"]["MODEL.NAME"] == "resnet18"  # a column shows every run's value, defaults too
    assert lrs["brokenconfig"]["MODEL.NAME"] == ""  # unknown: its config.yaml cannot be read


def test_sort_and_best(sweep: Path) -> None:
    order = [r["run"] for r in csv_rows(sweep)]
    assert order[:4] == ["lr0.05_resnet10t", "lr0.1_resnet10t", "group/deeper/killed", "brokenmetrics"]
    best = [r["run"] for r in csv_rows(sweep) if r["best"] == "1"]
    assert best == ["lr0.05_resnet10t"]
    ascending = [r["run"] for r in csv_rows(sweep, "--asc")]
    assert ascending[:4] == ["brokenmetrics", "group/deeper/killed", "lr0.1_resnet10t", "lr0.05_resnet10t"]
    assert set(ascending[4:]) == {"brokenconfig", "failed", "preempted"}  # runs without a value stay last
    by_lr = [r["TRAIN.LR"] for r in csv_rows(sweep, "--sort", "TRAIN.LR", "--asc")]
    assert by_lr == ["0.01", "0.05", "0.1", "0.2", "0.3", "9.0", ""]


def test_markdown_marks_best_row(sweep: Path) -> None:
    out = summarize_cli(sweep)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("|")]
    assert len(lines) == 2 + 7  # header, separator, one row per run
    assert lines[2].startswith("| * | **lr0.05_resnet10t** |")
    assert sum(line.startswith("| * ") for line in lines) == 1


def test_markdown_folds_keys_shared_by_every_run(tmp_path: Path) -> None:
    for lr in (0.1, 0.2):
        make_run(tmp_path / f"lr{lr}", {"TRAIN.LR": lr, "TRAIN.EPOCHS": 1}, results=done(50.0 + lr))
    out = summarize_cli(tmp_path)
    assert out.stdout.splitlines()[0] == "Same in every run: TRAIN.EPOCHS=1"
    header = next(line for line in out.stdout.splitlines() if line.startswith("|"))
    assert "TRAIN.LR" in header and "TRAIN.EPOCHS" not in header
    assert "TRAIN.EPOCHS" in csv_rows(tmp_path)[0]  # CSV keeps every column


def test_running_run(tmp_path: Path) -> None:
    live = make_run(tmp_path / "live", state={"status": "running"}, metrics=[{"step": 1, "epoch": 1}])
    lock = RunLock(str(live))
    lock.acquire()  # a real flock, as the training process holds it
    try:
        assert by_run(csv_rows(tmp_path))["live"]["status"] == "running"
    finally:
        lock.release()
    assert by_run(csv_rows(tmp_path))["live"]["status"] == "interrupted"
    # without run.json (another tool's run): a file written within the window counts as running
    fresh = make_run(tmp_path / "fresh", metrics=[{"step": 1, "epoch": 1}], old=False)
    assert by_run(csv_rows(tmp_path))["fresh"]["status"] == "running"
    os.utime(fresh / "metrics.jsonl", (OLD, OLD))
    assert by_run(csv_rows(tmp_path))["fresh"]["status"] == "interrupted"


def test_folder_that_stopped_during_setup(tmp_path: Path) -> None:
    (tmp_path / "bad_model").mkdir()
    (tmp_path / "bad_model" / "run.lock").write_text("pid 1 on host")
    row = by_run(csv_rows(tmp_path))["bad_model"]
    assert row["status"] == "failed" and "during setup" in row["note"]


def test_user_mistakes_exit_2(tmp_path: Path) -> None:
    make_run(tmp_path / "a", results=done(1.0))
    out = summarize_cli(tmp_path, "--sort", "val/top9")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "columns: run" in out.stderr
    assert_user_error(summarize_cli(tmp_path / "nope"), "ROOT ", "nope does not exist")
    (tmp_path / "a.txt").write_text("notes")
    assert_user_error(summarize_cli(tmp_path / "a.txt"), "a.txt is a file, not a folder", f"(e.g. {tmp_path})")
    empty = tmp_path / "empty"
    empty.mkdir()
    out = summarize_cli(empty)
    assert out.returncode == 0 and out.stdout == "" and "no runs" in out.stderr


def test_skips_checkpoint_and_profile_folders(tmp_path: Path) -> None:
    run = make_run(tmp_path / "a", results=done(1.0), checkpoint=True)
    for sub in ("checkpoints", "profile"):
        (run / sub).mkdir(exist_ok=True)
        (run / sub / "config.yaml").write_text("TRAIN: {LR: 1.0}\n")
    assert [r["run"] for r in csv_rows(tmp_path)] == ["a"]


def test_light_and_fast(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", "import sys, runner.sweep.summary; print('torch' in sys.modules)"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    for i in range(300):
        make_run(tmp_path / f"p{i:03d}", {"TRAIN.LR": 0.001 * (i + 1)}, results=done(float(i % 97)), old=False)
    t0 = time.perf_counter()
    rows = summarize(tmp_path)
    elapsed = time.perf_counter() - t0
    assert len(rows) == 300
    assert elapsed < 1.5, f"summarizing 300 runs took {elapsed:.2f}s"


def test_markdown_row_stays_one_line(tmp_path: Path) -> None:
    # a run.json error written by another tool may span lines; a markdown row must not
    make_run(tmp_path / "a", {"TRAIN.LR": 0.2}, state={"status": "failed", "error": "boom\n  at line 2 | x"})
    make_run(tmp_path / "b", results=done(1.0))
    out = summarize_cli(tmp_path)
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 2
    assert "boom   at line 2 \\| x" in out.stdout


@pytest.mark.parametrize("args, fragment", [([], "required: root"), (["x", "--format", "xml"], "invalid choice")])
def test_summarize_argument_mistakes_are_one_line(args, fragment):
    from tests.utils import assert_user_error, run_tool

    assert_user_error(run_tool("summarize.py", args), fragment)  # argparse's usage made it three lines


def test_an_unfinished_runs_best_follows_its_best_metric(tmp_path: Path) -> None:
    """As results.json will say: best/* are the values of the evaluation with the lowest val/loss, where the run's
    CHECKPOINT.BEST_METRIC is val/loss (BEST_MODE auto: min)."""
    rows = [{"step": 5, "epoch": 1, "val/top1": 50.0, "val/top5": 80.0, "val/loss": 0.9},
            {"step": 10, "epoch": 1, "val/top1": 40.0, "val/top5": 85.0, "val/loss": 0.7},
            {"step": 15, "epoch": 2, "val/top1": 45.0, "val/top5": 90.0, "val/loss": 0.8}]
    make_run(tmp_path / "run", {"CHECKPOINT.BEST_METRIC": "val/loss"}, metrics=rows, state={"status": "running"})
    (row,) = summarize(tmp_path)
    assert (row["best/val/top1"], row["best/val/top5"], row["val/top1"]) == (40.0, 85.0, 45.0)


def test_csv_cells_that_a_spreadsheet_would_run_start_with_a_quote(tmp_path: Path) -> None:
    """OWASP's rule for CSV injection: text starting with = + - @ TAB CR is quoted; numbers stay numbers."""
    from runner.csvsafe import safe_cell

    assert [safe_cell(v) for v in ("=1+1", "+SUM(1,2)", "-cmd", "@x", "\tx", "\rx", "a=b", "", -1.5, -2, None)] == [
        "'=1+1", "'+SUM(1,2)", "'-cmd", "'@x", "'\tx", "'\rx", "a=b", "", -1.5, -2, None]
    make_run(tmp_path / '=HYPERLINK("x")', results=done(-3.0), state={"status": "done"})
    make_run(tmp_path / "+SUM(1,2)", {"TRAIN.LR": 0.2}, state={"status": "failed", "error": "@boom"})
    rows = by_run(csv_rows(tmp_path))
    assert set(rows) == {"'=HYPERLINK(\"x\")", "'+SUM(1,2)"}
    assert rows["'=HYPERLINK(\"x\")"]["val/top1"] == "-3.0"  # a negative number is no formula: as it was
    assert rows["'+SUM(1,2)"]["note"].startswith("'@boom"), rows


def test_non_finite_values_never_win(tmp_path: Path) -> None:
    """results.json's Infinity and NaN (json reads them back as floats) and a NaN evaluation in metrics.jsonl: never
    the best run, never a run's best evaluation; in the CSV they are text, -inf quoted like any formula."""
    make_run(tmp_path / "inf", results=done(50.0, **{"best/val/top1": float("inf")}))
    make_run(tmp_path / "nan", results=done(50.0, **{"best/val/top1": float("nan")}))
    make_run(tmp_path / "neg", results=done(float("-inf"), **{"best/val/top1": 10.0}))
    make_run(tmp_path / "running", metrics=[{"step": 5, "epoch": 1, "val/top1": float("nan")},
                                            {"step": 10, "epoch": 2, "val/top1": 40.0}])
    rows = by_run(csv_rows(tmp_path))
    assert [k for k, r in rows.items() if r["best"] == "1"] == ["running"]
    assert float(rows["running"]["best/val/top1"]) == 40.0  # the NaN evaluation was no best
    assert rows["neg"]["val/top1"] == "'-inf" and rows["inf"]["best/val/top1"] == "inf"
    order = [r["run"] for r in csv_rows(tmp_path)]
    assert order[:2] == ["running", "neg"] and set(order[2:]) == {"inf", "nan"}  # finite values first


def test_a_tie_goes_to_the_first_folder_whatever_the_order(tmp_path: Path) -> None:
    """Equal best/val/top1: the star goes to the folder whose name comes first, numbers compared as numbers
    (run_2 before run_10), in every order the table is printed in."""
    for name, wall in (("run_10", 1.0), ("run_2", 2.0), ("run_3", 3.0)):
        make_run(tmp_path / name, results=done(70.0 if name != "run_3" else 60.0, wall_s=wall))
    for args in ((), ("--asc",), ("--sort", "wall_s"), ("--sort", "wall_s", "--asc"), ("--sort", "run")):
        assert [r["run"] for r in csv_rows(tmp_path, *args) if r["best"] == "1"] == ["run_2"], args
