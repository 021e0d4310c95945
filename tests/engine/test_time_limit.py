"""TRAIN.TIME_LIMIT: a run that needs longer saves and exits 75 before the limit; the same command continues it,
and the result equals a run left alone (deterministic kernels on CPU)."""
from __future__ import annotations

import json
import time

import pytest

from tests.utils import ROOT, TINY, read_jsonl, run_tool

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
# 176 steps, ~25 s on 2 shared cores with the start-up: longer than the limit; a single process
ARGS = ["--cfg", DIGITS, *TINY, "TRAIN.EPOCHS", "8", "LOG.PERIOD", "1", "CUDNN.DETERMINISTIC", "True",
        "LOG.TENSORBOARD", "False"]
LIMIT = 20
STEPS = 8 * 22


def _losses(out) -> dict[int, float]:
    """step -> train/loss of a run's metrics.jsonl."""
    return {row["step"]: row["train/loss"] for row in read_jsonl(out / "metrics.jsonl") if "train/loss" in row}


@pytest.mark.slow
def test_time_limit_stops_in_time_and_the_rerun_equals_a_run_left_alone(tmp_path):
    whole = run_tool("train.py", [*ARGS, "OUTPUT_DIR", str(tmp_path / "whole")])
    assert whole.returncode == 0, whole.stderr[-3000:]
    out = tmp_path / "limited"
    cmd = [*ARGS, "TRAIN.TIME_LIMIT", str(LIMIT), "OUTPUT_DIR", str(out)]
    t0 = time.monotonic()
    first = run_tool("train.py", cmd)
    elapsed = time.monotonic() - t0
    assert first.returncode == 75, first.stderr[-3000:]
    assert elapsed < LIMIT, elapsed
    assert "TRAIN.TIME_LIMIT 20 s is near" in first.stderr + first.stdout
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "preempted" and 0 < status["step"] < STEPS, status
    assert any((out / "checkpoints").glob("*.pth"))
    for _ in range(3):  # each rerun gets a new budget
        again = run_tool("train.py", cmd)
        if again.returncode == 0:
            break
        assert again.returncode == 75, again.stderr[-3000:]
    assert again.returncode == 0, again.stderr[-3000:]
    assert _losses(out) == _losses(tmp_path / "whole")
    res = [json.loads((d / "results.json").read_text()) for d in (out, tmp_path / "whole")]
    assert res[0]["val/top1"] == res[1]["val/top1"] and res[0]["step"] == res[1]["step"] == STEPS
