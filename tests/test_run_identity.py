"""A run's identity includes how long it runs: an epochs ablation on the default OUTPUT_DIR is one run per value."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.utils import ROOT, TRAIN, env

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
# tiny: 16 px, batches of 128 (11 full steps an epoch), the default OUTPUT_DIR (no OUTPUT_DIR given)
TINY = ["--cfg", DIGITS, "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "128", "DATA.NUM_WORKERS", "0",
        "LOG.PROGRESS", "plain", "LOG.TENSORBOARD", "false"]


def train(cwd, *args: str) -> subprocess.CompletedProcess:
    """tools/train.py in `cwd`, so that its default output/ folder lands there."""
    return subprocess.run([sys.executable, TRAIN, *TINY, *args], capture_output=True, text=True, cwd=cwd,
                          env=env(), timeout=300)


@pytest.mark.slow
def test_epochs_ablation_gives_one_result_per_value(tmp_path):
    """TRAIN.EPOCHS 1, 2, 3 on the default OUTPUT_DIR: three folders, three results of their own length."""
    for epochs in (1, 2, 3):
        r = train(tmp_path, "TRAIN.EPOCHS", str(epochs))
        assert r.returncode == 0 and r.stderr == "", r.stdout[-2000:] + r.stderr
    folders = sorted(p.parent for p in (tmp_path / "output").rglob("results.json"))
    assert [f.name.rsplit("-", 1)[-1] for f in folders] == ["epochs=1", "epochs=2", "epochs=3"]
    results = [json.loads((f / "results.json").read_text()) for f in folders]
    assert [(r["epochs"], r["epoch"], r["step"]) for r in results] == [(1, 1, 11), (2, 2, 22), (3, 3, 33)]
    assert all("extended_from" not in r for r in results)
    # the same value again answers from its own folder; nothing is rewritten
    before = (folders[1] / "results.json").read_bytes()
    r = train(tmp_path, "TRAIN.EPOCHS", "2")
    assert r.returncode == 0 and "already done" in r.stdout and "it ran 2 epochs, 22 steps" in r.stdout
    assert (folders[1] / "results.json").read_bytes() == before
