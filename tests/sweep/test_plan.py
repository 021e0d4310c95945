"""`python -m runner.sweep plan`: a search's rungs, trials per rung and epochs, nothing trained; the counts are a
floor of what the study trains (checked on a real journal with tests/sweep/fake_train.py); the worker's progress
line after each segment."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.sweep import worker
from runner.sweep.plan import epochs, reach
from runner.sweep.search import load_search
from tests.sweep.test_search import ROOT, calls, search_file


@pytest.mark.parametrize("scheduler, reached, spent", [("asha", [27, 9, 3], 63), ("hyperband", [14, 12, 8], 86)])
def test_plan_prints_the_rungs_and_epochs_and_writes_nothing(tmp_path, scheduler, reached, spent):
    path = search_file(tmp_path, f"trials: 27\nscheduler: {scheduler}\nasha: {{eta: 3, min_epochs: 1}}\n", epochs=9)
    p = subprocess.run([sys.executable, "-m", "runner.sweep", "plan", str(path)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0 and not p.stderr, p.stderr
    assert f"scheduler {scheduler}, eta 3, rungs at epochs [1, 3, 9]" in p.stdout, p.stdout
    assert f"trials 27: {reached[0]} to epoch 1, {reached[1]} to epoch 3, {reached[2]} to epoch 9" in p.stdout
    assert f"epochs: about {spent} " in p.stdout and "against 243 for the 27 trials" in p.stdout, p.stdout
    assert not (tmp_path / "out").exists()


def test_a_mistake_is_the_searchs_one_line(tmp_path):
    path = search_file(tmp_path, "trials: 2\nasha: {eta: 3, min_epochs: 1}\n", epochs=9)
    p = subprocess.run([sys.executable, "-m", "runner.sweep", "plan", str(path)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "may end with no trial" in p.stderr, p.stderr


@pytest.mark.parametrize("scheduler", ["asha", "hyperband"])
def test_the_plan_is_a_floor_of_what_the_study_trains(tmp_path, fake, scheduler):
    search = load_search(str(search_file(
        tmp_path, f"trials: 9\nseed: 2\nscheduler: {scheduler}\nasha: {{eta: 3, min_epochs: 1}}\n", epochs=9)))
    lines: list[str] = []
    assert worker.run_worker(search, poll_s=0.1, log=lines.append) == 0
    trained = sum(int(r.split("-")[1]) - int(r.split("-")[0]) + 1 for rs in calls(Path(search.root)).values()
                  for r in rs)
    assert trained >= epochs(search, reach(search)), (trained, reach(search))
    progress = [x for x in lines if " trials started, " in x]
    assert len(progress) == sum(len(rs) for rs in calls(Path(search.root)).values())
    assert progress[0].startswith("search: trial 0: val/top1 ") and "(1 of 1 there); 1 of 9 trials started" in \
        progress[0], progress[0]
    from optuna.trial import TrialState

    from runner.sweep.study import open_study

    done = sum(t.state == TrialState.COMPLETE for t in open_study(search, create=False).get_trials())
    assert done >= 1 and progress[-1].endswith(f"9 of 9 trials started, {done} done"), progress[-1]
