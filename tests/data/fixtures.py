"""Test data written to disk: scikit-learn's digits as an image folder of JPEGs (the writer is the library's)."""
from __future__ import annotations

from runner.data.memory import export_digits_jpegs

__all__ = ["export_digits_jpegs"]
