"""Shared test setup (the runner is installed by requirements.txt; pytest's pythonpath makes `tests` importable)."""

from tests.slurm_cluster import slurm_cluster  # noqa: F401  (the session's SLURM for tests/test_slurm.py)
