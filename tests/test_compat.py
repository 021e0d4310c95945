"""A torchvision built for another torch: one line and exit 2 from the tools, instead of a traceback twice.

The venv stays whole: a fake `torchvision` package first on PYTHONPATH fails at import exactly as a mismatched
build does (torchvision registers its C++ operators with torch as it is imported).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.utils import ROOT, assert_user_error, env, run_tool

DIGITS = str(ROOT / "configs" / "digits" / "test_resnet.yaml")
MESSAGE = "operator torchvision::nms does not exist"


@pytest.fixture
def mismatched(tmp_path: Path) -> dict:
    """The test environment with a torchvision whose import raises torch's RuntimeError for a mismatched build."""
    fake = tmp_path / "fake" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise RuntimeError({MESSAGE!r})\n")
    return env(PYTHONPATH=os.pathsep.join(p for p in (str(fake.parent), os.environ.get("PYTHONPATH")) if p))


def expect_line(proc) -> None:
    """The one line: both versions, torch's message, the command that repairs it."""
    line = assert_user_error(proc, f"torch {torch.__version__} and torchvision ", " do not match",
                             f"(importing torchvision failed: {MESSAGE})",
                             "pip install --force-reinstall torch torchvision")
    assert line.startswith("error: ") and "Traceback" not in proc.stdout


def test_train_says_torch_and_torchvision_do_not_match_before_the_claim(mismatched: dict, tmp_path: Path):
    out = tmp_path / "run"
    expect_line(run_tool("train.py", ["--cfg", DIGITS, "OUTPUT_DIR", str(out)], env=mismatched, timeout=120))
    assert not out.exists()  # refused before the folder was claimed: no run.json 'failed' with a traceback


def test_other_tools_say_it_in_the_same_line(mismatched: dict):
    expect_line(run_tool("flops.py", ["--cfg", DIGITS], env=mismatched, timeout=120))


def test_another_runtime_error_at_import_is_not_taken_for_a_mismatch(tmp_path: Path):
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise RuntimeError('something else')\n")
    proc = run_tool("flops.py", ["--cfg", DIGITS], env=env(PYTHONPATH=str(tmp_path)), timeout=120)
    assert proc.returncode == 1 and "RuntimeError: something else" in proc.stderr
