"""DATA.NUM_WORKERS above the CPUs a rank has is taken, with one warning naming the default."""
from __future__ import annotations

import logging
import os

from runner.config import load_config
from runner.data.loaders import default_workers, warn_many_workers
from runner.distributed import Dist


def test_more_workers_than_cpus_warns_once_with_the_default(caplog, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cpus = len(os.sched_getaffinity(0))
    many, _ = load_config(["DATA.NUM_WORKERS", str(cpus + 1)], check_paths=False)
    auto, _ = load_config([], check_paths=False)
    dist = Dist(0, 1, 0, None)
    with caplog.at_level(logging.WARNING, logger="runner"):
        warn_many_workers(many)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert f"DATA.NUM_WORKERS {cpus + 1} is more than the {cpus} CPU" in lines[0]
    assert f"the default (-1) would take {default_workers(auto, dist)}" in lines[0]
    assert default_workers(many, dist) == cpus + 1  # taken as given
    caplog.clear()
    fits, _ = load_config(["DATA.NUM_WORKERS", str(cpus)], check_paths=False)
    with caplog.at_level(logging.WARNING, logger="runner"):
        warn_many_workers(fits)
        warn_many_workers(auto)
    assert not caplog.records


def test_far_too_many_workers_are_capped_with_one_warning(caplog, monkeypatch):
    """200 workers on a few CPUs would take minutes to start and can exhaust memory: 4 per CPU (at least 8)."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cpus = len(os.sched_getaffinity(0))
    cap = max(8, 4 * cpus)
    absurd, _ = load_config(["DATA.NUM_WORKERS", str(cap + 1)], check_paths=False)
    with caplog.at_level(logging.WARNING, logger="runner"):
        warn_many_workers(absurd)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and f"DATA.NUM_WORKERS {cap + 1} is far more than the {cpus} CPU" in lines[0], lines
    assert f"starting {cap}" in lines[0]
    assert default_workers(absurd, Dist(0, 1, 0, None)) == cap
    at_cap, _ = load_config(["DATA.NUM_WORKERS", str(cap)], check_paths=False)
    assert default_workers(at_cap, Dist(0, 1, 0, None)) == cap
