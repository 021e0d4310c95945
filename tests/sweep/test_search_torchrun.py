"""A search whose trials run under torchrun (`--nproc 2`, gloo on the CPU): paused, promoted and resumed as with one
process, and its best trial equals its config trained straight under torchrun with the same process count, by the
command the table prints."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from optuna.trial import TrialState

from runner.sweep.search import load_search
from runner.sweep.study import open_study
from tests.engine.test_resume import _steady, assert_same
from tests.utils import env

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs/digits/test_resnet.yaml"


def two_process_search(tmp_path: Path, settings: str, lr: str, timeout: int) -> tuple[Path, Path, str]:
    """A search of 2 trials (seed 5, ASHA eta 2 from epoch 1, TRAIN.LR log `lr`) on the digits for 2 epochs, each
    trial under torchrun with 2 processes, `settings` added to its `set:`; the sweep file, the folder of its one
    trial trained to the end (paused after epoch 1, then promoted) and that trial's log."""
    path = tmp_path / "s.yaml"
    path.write_text(
        f"cfg: {DIGITS}\nroot: {tmp_path / 'out'}\n"
        "set: {TRAIN.EPOCHS: 2, DATA.IMG_SIZE: 16, LOG.PERIOD: 5, DATA.NUM_WORKERS: 0, LOG.PROGRESS: plain,\n"
        f"      {settings}}}\n"
        "search:\n  trials: 2\n  seed: 5\n  asha: {eta: 2, min_epochs: 1}\n"
        f"  space:\n    TRAIN.LR: {{log: {lr}}}\n")
    run = subprocess.run([sys.executable, "-m", "runner.sweep", "search", "--no-table", "--nproc", "2", str(path)],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    search = load_search(str(path))
    trials = open_study(search, create=False).get_trials()
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == 1 and sorted(done[0].intermediate_values) == [1, 2], [t.intermediate_values for t in trials]
    log = (Path(search.root) / "logs" / f"trial_{done[0].number}.log").read_text()
    return path, Path(search.trial_dir(done[0].number)), log


def trained_again(path: Path, trial: Path, timeout: int) -> tuple[Path, str]:
    """The command the search's table prints for its best trial (`trial`), run as printed into TRIAL_again; that
    folder and the command."""
    table = subprocess.run([sys.executable, "-m", "runner.sweep", "search", "--table", str(path)], cwd=ROOT,
                           env=env(), capture_output=True, text=True, timeout=120)
    lines = table.stdout.splitlines()
    command = lines[next(i for i, x in enumerate(lines) if x.startswith("best: ")) + 1].strip()
    straight = Path(f"{trial}_again")
    assert command.endswith(f"OUTPUT_DIR {straight}"), table.stdout
    shell = {**env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    again = subprocess.run(["bash", "-c", command], cwd=ROOT, env=shell, capture_output=True, text=True,
                           timeout=timeout)  # as printed: `torchrun` is the venv's
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr
    return straight, command


@pytest.mark.slow
def test_a_two_process_search_equals_its_best_config_trained_straight(tmp_path):
    path, trial, log = two_process_search(tmp_path, "MODEL.NAME: resnet10t, DATA.BATCH_SIZE: 32", "[0.01, 0.2]", 900)
    assert log.count("torch.distributed.run --standalone --nproc_per_node=2") == 2  # paused, then promoted
    assert "resumed from" in log
    straight, command = trained_again(path, trial, 600)
    assert command.startswith("OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 tools/train.py --cfg "), \
        command
    got, want = (torch.load(d / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)
                 for d in (trial, straight))
    assert want["model"] and want["optimizer"]
    assert_same(_steady(got), _steady(want), "last.pth")
