"""The README's sweep example, run as printed (only smaller images, two points at a time and its own folder):
every point learns."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.utils import ROOT

CHANCE = 10.0  # ten digit classes


def readme_sweep() -> list[str]:
    """The argv of the README's `tools/sweeps/run.sh ...` line (its comment dropped)."""
    found = re.search(r"^(tools/sweeps/run\.sh .*)$", (ROOT / "README.md").read_text(), re.MULTILINE)
    assert found, "the README shows no tools/sweeps/run.sh example"
    return shlex.split(found.group(1), comments=True)


@pytest.mark.slow
def test_readme_sweep_example_beats_chance_at_every_point(tmp_path):
    argv = readme_sweep()
    # from tmp_path: the file's default root, output/sweeps/<file name>, is taken from the current folder
    argv = [str(ROOT / argv[0]), str(ROOT / argv[1]), *argv[2:]]
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", JOBS="2",
               NUM_GPUS="0")
    # tiny: 16 px instead of the config's 24, 2 epochs instead of the README's 4 (its LRs, models and batch stay)
    tiny = ["DATA.IMG_SIZE", "16", "TRAIN.EPOCHS", "2", "DATA.NUM_WORKERS", "0", "LOG.TENSORBOARD", "false"]
    r = subprocess.run(["bash", *argv, *tiny], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    root = tmp_path / "output" / "sweeps" / "lr_x_model"
    points = sorted(p.parent.name for p in root.glob("*/results.json"))
    want = sorted(f"lr={lr},model.name={m}" for lr in ("0.008", "0.004", "0.002") for m in ("test_resnet", "resnet10t"))
    assert points == want
    top1 = {p: json.loads((root / p / "results.json").read_text())["val/top1"] for p in points}
    assert all(v > 6 * CHANCE for v in top1.values()), top1  # the file's LRs fit AdamW
