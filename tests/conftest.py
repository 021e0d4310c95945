"""Shared test setup (the runner is installed by requirements.txt; pytest's pythonpath makes `tests` importable).

The test process is an entry point like tools/*.py: runner.startup.prepare() runs before any test imports torch.
"""
from runner.startup import prepare

prepare()

from tests.slurm_cluster import slurm_cluster  # noqa: F401  (the session's SLURM for tests/test_slurm.py)
