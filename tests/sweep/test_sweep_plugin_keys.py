"""A sweep over a knob that a user's component declares (runner.keys): the base config's IMPORTS are imported
before the sweep's keys are checked, so the knob is a key there, and a truly unknown key is still one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.config.test_component_keys import plugin
from tests.utils import assert_user_error

ROOT = Path(__file__).resolve().parents[2]


def sweep(args: list[str]) -> subprocess.CompletedProcess:
    """`python -m runner.sweep ARGS`, in a fresh interpreter (no module imported by an earlier test)."""
    return subprocess.run([sys.executable, "-m", "runner.sweep", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)


def test_a_sweep_file_grid_over_a_declared_knob(tmp_path: Path) -> None:
    config = plugin(tmp_path, "TRAIN:\n  SCHEDULER: halving\n")
    good = tmp_path / "good.yaml"
    good.write_text(f"cfg: {config.name}\nset: {{TRAIN.HALVING_EVERY: 2}}\ngrid:\n  TRAIN.HALVING_RATE: [0.5, 0.25]\n")
    r = sweep(["points", "--no-paths", str(good)])
    assert r.returncode == 0, r.stderr
    assert "halving_rate=0.5" in r.stdout and "halving_rate=0.25" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"cfg: {config.name}\ngrid:\n  TRAIN.HALVING_RATTE: [0.5, 0.25]\n")
    assert_user_error(sweep(["points", str(bad)]),
                      "bad.yaml:3: grid: unknown config key TRAIN.HALVING_RATTE; did you mean TRAIN.HALVING_RATE")


def test_a_command_line_grid_over_a_declared_knob(tmp_path: Path) -> None:
    config = plugin(tmp_path, "TRAIN:\n  SCHEDULER: halving\n")
    r = sweep(["grid", "--root", str(tmp_path / "r"), "--cfg", str(config), "--grid", "DATA.CUT_FRACTION", "0.5,1",
               "TRAIN.HALVING_EVERY", "2"])
    assert r.returncode == 0, r.stderr
    assert "  DATA.CUT_FRACTION:\n    - 0.5\n    - 1\n" in (tmp_path / "r" / "sweep.yaml").read_text()
    bad = sweep(["grid", "--root", str(tmp_path / "q"), "--cfg", str(config), "--grid", "DATA.CUT_FRACTON", "0.5,1"])
    assert_user_error(bad, "--grid DATA.CUT_FRACTON: unknown config key; did you mean DATA.CUT_FRACTION")
    assert not (tmp_path / "q").exists()
