"""Shared test setup: make the repository root importable however pytest is started."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `pytest` (unlike `python -m pytest`) does not put the cwd on sys.path
