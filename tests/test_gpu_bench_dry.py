"""benchmarks/gpu.sh --dry-run: the GPU speed table's whole pipeline on the CPU, and the JSON it writes."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.utils import ROOT, env


@pytest.mark.slow
def test_gpu_bench_dry_run_writes_every_figure(tmp_path: Path):
    res = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--dry-run"], capture_output=True, text=True,
                         timeout=240, cwd=ROOT, env=env(OUT=str(tmp_path), MODELS="resnet10t", WORKERS="2"))
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_bench.json").read_text())
    e = report["environment"]
    assert {"device_name", "torch", "cuda", "cudnn", "commit", "date"} <= e.keys() and e["commit"] != "unknown"
    rows = {r["who"]: r for r in report["models"]}
    assert rows.keys() == {"runner", "raw"}
    for r in rows.values():
        assert r["model"] == "resnet10t" and r["compile"] is False and r["precision"] == "bf16"
        assert r["train_img_per_s"] > 0 and r["step_ms"] > 0 and r["peak_mem_mb"] > 0 and r["infer_img_per_s"] > 0
    assert rows["raw"]["vs_raw"] == 1.0
    assert rows["runner"]["vs_raw"] == pytest.approx(rows["runner"]["train_img_per_s"] / rows["raw"]["train_img_per_s"])
    [data] = report["data"]
    assert data["workers"] == 2 and data["loader_img_per_s"] > 0 and data["e2e_img_per_s"] > 0
    assert data["vs_synthetic"] == pytest.approx(data["e2e_img_per_s"] / data["synthetic_img_per_s"])
    assert report["jpegs"]["train_files"] == 48
    md = (tmp_path / "gpu_bench.md").read_text()
    assert "| resnet10t 32px b8 bf16 | eager | runner |" in md and "| 2 |" in md
