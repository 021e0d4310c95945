"""The search tests' stand-in trainer."""
from pathlib import Path

import pytest

from runner.sweep import worker

FAKE = Path(__file__).resolve().parent / "fake_train.py"


@pytest.fixture
def fake(monkeypatch, signal_handlers):
    """tools/train.py replaced by tests/sweep/fake_train.py (no torch, so the warm server imports nothing); the
    worker's signal handlers restored."""
    monkeypatch.setattr(worker, "TRAIN_PY", FAKE)
    monkeypatch.setattr(worker, "WARM_PRELOAD", [])
    return monkeypatch
