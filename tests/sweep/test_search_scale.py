"""benchmarks/search_scale.py: a small run of many real search workers (forked, one SIGKILL storm) passes its own
checker, and the checker catches a planted violation in a real Optuna journal."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from runner.sweep import worker
from runner.sweep.study import distributions, open_study, trial_handle
from tests.sweep.test_search import fake_search
from tests.utils import ROOT


def bench():
    """The benchmark as a module."""
    spec = importlib.util.spec_from_file_location("search_scale", ROOT / "benchmarks" / "search_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_eight_workers_and_a_kill_leave_a_correct_study(tmp_path, signal_handlers):
    scale = bench()
    args = scale.parse(["--workers", "8", "--trials", "9", "--epochs", "3", "--epoch-s", "0.05", "0.15",
                        "--poll-s", "0.1", "--storms", "1", "--storm-window", "0.5", "--deadline-s", "180"])
    row = scale.run(8, args, tmp_path)
    assert row["violations"] == [], row
    assert row["killed"] == 1 and row["trials"] == 9, row
    assert row["segments"] >= 9 + 3, row  # every trial to epoch 1, the top third promoted to 3
    assert row["latency_s"]["take"]["n"] >= row["segments"] and row["journal_bytes"] > 0, row


def test_the_checker_finds_a_rung_reported_without_the_one_below(tmp_path, signal_handlers):
    search = fake_search(tmp_path)  # rungs 1, 3; 4 trials
    with worker.locked(search.root):
        study = open_study(search)
    trial = study.ask(distributions(search))
    worker.mark(study, trial.number, {"epoch": 1, "worker": "h:1", "since": 0})
    trial_handle(study, study.get_trials()[0]).report(80.0, step=3)  # epoch 3 with no value at epoch 1
    found = bench().check(Path(search.root), search.rungs, search.eta, search.maximize, 4)
    assert "trial 0: a value at epoch 3 without one at epoch 1" in found
    assert "no trial COMPLETE" in found
