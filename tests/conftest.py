"""Shared test setup (the runner is installed by requirements.txt; pytest's pythonpath makes `tests` importable).

The test process is an entry point like tools/*.py: runner.startup.prepare() runs before any test imports torch.
"""
import signal

import pytest

from runner.startup import prepare

prepare()

from tests.slurm_cluster import slurm_cluster  # noqa: F401  (the session's SLURM for tests/test_slurm.py)


@pytest.fixture
def signal_handlers():
    """SIGTERM, SIGUSR1 and SIGINT given back after the test (a run's Preemption or a search worker takes them)."""
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    yield
    for s, handler in old.items():
        signal.signal(s, handler)
