"""tools/benchmark.py --loader: the real tool, the run's real train loader, on a JPEG folder and on the digits.
A benchmark is not a test: the figures are checked for presence and sign, never for speed."""
from __future__ import annotations

import math
import re

import pytest

from runner.bench.loader import default_counts, per_worker_rate
from tests.bench.test_benchmark import check_record, last_json, run
from tests.data.fixtures import export_digits_jpegs

SMALL = ["DEVICE", "cpu", "MODEL.NAME", "test_resnet", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "16",
         "--steps", "2", "--warmup", "1", "--infer-batches", "1", "--loader-batches", "3", "--loader-warmup", "1"]
LOADER_KEYS = {"loader", "loader_cores", "loader_need_img_per_s", "loader_per_worker_img_per_s",
               "loader_workers_needed", "loader_config_workers", "loader_config_img_per_s", "loader_data_bound"}


def check_loader(rec: dict, workers: list[int]) -> None:
    """The loader keys are there, one row per worker count, every rate finite and positive."""
    assert LOADER_KEYS <= set(rec), LOADER_KEYS - set(rec)
    assert [r["workers"] for r in rec["loader"]] == workers
    for row in rec["loader"]:
        for key in ("img_per_s", "img_per_s_per_worker", "images", "seconds"):
            assert math.isfinite(row[key]) and row[key] > 0, (row, key)
    for key in ("loader_need_img_per_s", "loader_per_worker_img_per_s", "loader_config_img_per_s", "loader_cores"):
        assert rec[key] > 0, key
    assert isinstance(rec["loader_data_bound"], bool)


def verdict(stdout: str) -> str:
    """The one verdict line."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("verdict:")]
    assert len(lines) == 1, stdout
    return lines[0]


def test_loader_on_a_jpeg_folder(tmp_path):
    root = export_digits_jpegs(tmp_path / "jpegs", size=16, per_class=20)
    out = tmp_path / "out"
    res = run("tools/benchmark.py", [*SMALL, "DATA.NAME", "folder", "DATA.ROOT", str(root), "DATA.NUM_WORKERS", "1",
                                     "--loader-workers", "0,1", "OUTPUT_DIR", str(out)])
    assert res.returncode == 0, res.stderr
    rec = last_json(res.stdout)
    check_record(rec)
    check_loader(rec, [0, 1])
    assert rec["loader_config_workers"] == 1 and rec["loader_workers_needed"] >= 1
    assert "loader img/s" in res.stdout and "img/s/worker" in res.stdout  # the table above the verdict
    line = verdict(res.stdout)
    assert re.search(r"about \d+ workers?", line), line
    assert re.search(r"(not )?data-bound at DATA.NUM_WORKERS 1", line), line
    assert not out.exists()


def test_loader_on_in_memory_digits(tmp_path):
    out = tmp_path / "out"
    res = run("tools/benchmark.py", [*SMALL, "DATA.NAME", "digits", "--loader-workers", "0,1", "OUTPUT_DIR", str(out)])
    assert res.returncode == 0, res.stderr
    rec = last_json(res.stdout)
    check_loader(rec, [0])  # in memory: read in the training process, whatever the worker count
    assert rec["loader_in_process"] and rec["loader_workers_needed"] == 0
    assert "0 workers needed" in verdict(res.stdout)
    assert not out.exists()


@pytest.mark.parametrize("args, words", [
    (["--loader-workers", "0,x"], "--loader-workers: 'x'"),
    (["--loader-workers", "0,,1"], "empty item"),
    (["--loader", "--loader-batches", "0"], "--loader-batches 0"),
    (["--loader", "--batch-sizes", "4,8"], "one config"),
])
def test_loader_bad_arguments(args, words):
    res = run("tools/benchmark.py", ["DEVICE", "cpu", "DATA.NAME", "synthetic", *args])
    assert res.returncode == 2
    assert words in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("cores, counts", [(1, [0, 1]), (2, [0, 1, 2]), (6, [0, 1, 2, 4, 6]), (8, [0, 1, 2, 4, 8])])
def test_default_counts_reach_the_cores(cores, counts):
    assert default_counts(cores) == counts


def test_per_worker_rate_takes_the_most_workers_that_fit():
    rows = [{"workers": w, "img_per_s_per_worker": 100.0 / (w or 1)} for w in (0, 1, 2, 4)]
    assert per_worker_rate(rows, 2)["workers"] == 2
    assert per_worker_rate(rows[:1], 2)["workers"] == 0  # only the in-process row
    assert per_worker_rate([rows[0], rows[3]], 2)["workers"] == 4  # none fits: the fewest above the cores
