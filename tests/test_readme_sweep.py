"""The README's sweep example, run as printed (only smaller images and its own SWEEP_ROOT): every point learns."""
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


def readme_sweep() -> tuple[dict[str, str], list[str]]:
    """(environment assignments, argv) of the README's `... tools/sweeps/lr_x_model.sh ...` line."""
    found = re.search(r"^(.*tools/sweeps/lr_x_model\.sh.*)$", (ROOT / "README.md").read_text(), re.MULTILINE)
    assert found, "the README shows no lr_x_model.sh example"
    words = shlex.split(found.group(1))
    assigns = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
    return assigns, [w for w in words if not re.match(r"^[A-Z_]+=", w)]


@pytest.mark.slow
def test_readme_sweep_example_beats_chance_at_every_point(tmp_path):
    assigns, argv = readme_sweep()
    root = tmp_path / "lr_x_model"
    env = dict(os.environ, **assigns, SWEEP_ROOT=str(root), PYTHON=sys.executable, OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    # tiny: 16 px instead of the config's 24, 2 epochs instead of the README's 4 (its LRs, models and batch stay)
    tiny = ["DATA.IMG_SIZE", "16", "TRAIN.EPOCHS", "2", "DATA.NUM_WORKERS", "0", "LOG.TENSORBOARD", "false"]
    r = subprocess.run(["bash", *argv, *tiny], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    points = sorted(p.parent.name for p in root.glob("*/results.json"))
    want = sorted(f"lr{lr}_{m}" for lr in assigns["LRS"].split() for m in assigns["MODELS"].split())
    assert points == want and len(want) >= 4
    top1 = {p: json.loads((root / p / "results.json").read_text())["val/top1"] for p in points}
    assert all(v > 6 * CHANCE for v in top1.values()), top1  # measured 84-96: the README's LRs fit AdamW
