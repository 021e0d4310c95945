"""Shared test setup (the runner is installed by requirements.txt; pytest's pythonpath makes `tests` importable)."""
