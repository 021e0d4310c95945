"""TRAIN.TIME_LIMIT: a run that needs longer saves and exits 75 before the limit; the same command continues it,
and the result equals a run left alone (deterministic kernels on CPU)."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.utils import ROOT, TINY, read_jsonl, run_tool

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
# 352 steps in one process; the limit is set from the whole run's own time, so a faster runner still meets it
# (a fixed 20 s limit stopped failing once 176 steps took 12.9 s: CI 2026-11-26)
EPOCHS = 16
ARGS = ["--cfg", DIGITS, *TINY, "TRAIN.EPOCHS", str(EPOCHS), "LOG.PERIOD", "1", "CUDNN.DETERMINISTIC", "True",
        "LOG.TENSORBOARD", "False"]
STEPS = EPOCHS * 22
MIN_LIMIT = 8  # start-up (a few s on 2 cores), some steps and a save must fit


def _losses(out) -> dict[int, float]:
    """step -> train/loss of a run's metrics.jsonl."""
    return {row["step"]: row["train/loss"] for row in read_jsonl(out / "metrics.jsonl") if "train/loss" in row}


@pytest.mark.slow
def test_time_limit_stops_in_time_and_the_rerun_equals_a_run_left_alone(tmp_path):
    t0 = time.monotonic()
    whole = run_tool("train.py", [*ARGS, "OUTPUT_DIR", str(tmp_path / "whole")])
    whole_s = time.monotonic() - t0
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert whole_s > 1.5 * MIN_LIMIT, f"the whole run took {whole_s:.1f} s: too fast to test a limit; raise EPOCHS"
    limit = max(MIN_LIMIT, int(whole_s * 0.6))
    out = tmp_path / "limited"
    cmd = [*ARGS, "TRAIN.TIME_LIMIT", str(limit), "OUTPUT_DIR", str(out)]
    t0 = time.monotonic()
    first = run_tool("train.py", cmd)
    elapsed = time.monotonic() - t0
    assert first.returncode == 75, first.stderr[-3000:]
    assert elapsed < limit, (elapsed, limit)
    assert f"TRAIN.TIME_LIMIT {limit} s is near" in first.stderr + first.stdout
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "preempted" and 0 < status["step"] < STEPS, status
    assert any((out / "checkpoints").glob("*.pth"))
    # each rerun gets a new budget, none may run over it (a pending evaluation included) and each goes on from
    # where the last stopped; how many it takes depends on the start-up's share of the budget (7 on a quiet
    # 2-core box, more than 9 under CI's own load: 11 s budgets, each stopping 6 s early for the save and exit)
    for _ in range(30):
        t0 = time.monotonic()
        again = run_tool("train.py", cmd)
        assert time.monotonic() - t0 < limit, again.stdout[-3000:]
        if again.returncode == 0:
            break
        assert again.returncode == 75, again.stderr[-3000:]
        step, status = status["step"], json.loads((out / "run.json").read_text())
        assert status["step"] > step, (status, step)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _losses(out) == _losses(tmp_path / "whole")
    res = [json.loads((d / "results.json").read_text()) for d in (out, tmp_path / "whole")]
    assert res[0]["val/top1"] == res[1]["val/top1"] and res[0]["step"] == res[1]["step"] == STEPS


def _limit(seconds: float, started_ago: float):
    """A TimeLimit whose job started `started_ago` seconds ago, single process."""
    from runner.engine.signals import DutiesStart, StopFlag, TimeLimit

    return TimeLimit(seconds, StopFlag(None), DutiesStart(), started=time.time() - started_ago, lag=0)


def _at_epoch_end(**kw):
    """The loop's state a hook reads: resumed right after an epoch's last step (its epoch end pending)."""
    from types import SimpleNamespace

    state = {"end_of_epoch": True, "steps_per_epoch": 10, "batch_in_epoch": 10, "step": 10, "total_steps": 100,
             "stepper": SimpleNamespace(accum=1), **kw}
    return SimpleNamespace(**state)


def test_measured_times_carry_to_the_next_job_and_budget_a_pending_evaluation():
    from runner.errors import UserError

    job1 = _limit(60, 5)
    job1.steps.append(0.2)
    job1.duties, job1.epoch_end = 1.5, 20.0
    saved = job1.state_dict()
    job2 = _limit(30, 12)  # 18 s left: less than the 20 s evaluation and save the last job measured
    job2.load_state_dict(saved)
    assert job2.epoch_end == 20.0 and job2.duties == 1.5 and max(job2.steps) == 0.2
    with pytest.raises(UserError) as refused:
        job2.before_train(_at_epoch_end())
    assert "pending evaluation and save took" in str(refused.value) and "raise TRAIN.TIME_LIMIT" in str(refused.value)
    job3 = _limit(60, 12)  # 48 s left: the evaluation fits
    job3.load_state_dict(saved)
    job3.before_train(_at_epoch_end())
    assert job3.need(_at_epoch_end(batch_in_epoch=9)) >= 20.0  # the next epoch end is budgeted from the start


@pytest.mark.slow
def test_a_slow_evaluation_is_budgeted_and_no_job_runs_over_its_limit(tmp_path):
    """Every evaluation takes 4 s more (injected): each rerun of a 15 s job stays under 15 s until the run is done."""
    import sys

    from tests.utils import env

    out = tmp_path / "slow_eval"
    script = str(ROOT / "tests" / "engine" / "crash_rank.py")
    cmd = [sys.executable, script, "--cfg", DIGITS, *TINY, "TRAIN.EPOCHS", "3", "LOG.TENSORBOARD", "False",
           "TRAIN.TIME_LIMIT", "15", "OUTPUT_DIR", str(out)]
    jobs = []
    for _ in range(12):
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env=env(CRASH_RANK="0", CRASH_AT="eval", CRASH_HOW="slow", CRASH_SLEEP="4"))
        jobs.append(round(time.monotonic() - t0, 1))
        assert jobs[-1] < 15, (jobs, proc.stdout[-2000:])
        if proc.returncode == 0:
            break
        assert proc.returncode == 75, proc.stderr[-3000:]
    assert proc.returncode == 0, jobs
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "done" and results["step"] == 3 * 22, results
    assert [r["epoch"] for r in read_jsonl(out / "metrics.jsonl") if "val/top1" in r] == [1, 2, 3]
