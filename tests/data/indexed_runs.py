"""The runs tests/data/test_hf.py and tests/data/test_torchvision_source.py make over their own data (the real
tools/train.py and torchrun, gloo on CPU): a reference run, one stopped mid-epoch and resumed bit-identical, and
one killed on 2 processes and resumed on 1 (the same global batch), as the folder and shards tests do."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import torch

from runner.process.threads import MARKER
from tests.engine.test_resume import Launch, assert_same_run, train_rows
from tests.utils import ROOT, TRAIN, torchrun

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
# Every random part a folder run has: crops, RandAugment, random erasing, dropout, mixup; EMA; a checkpoint every
# 3 steps (a SIGKILL loses at most 2); loader workers. No warm-up and a mild RandAugment: the 12 steps learn
# (val/top1 24-44 against chance's 10, where rand-m9 with a warm-up stayed near 11)
RUN = ["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "16",
       "TRAIN.EPOCHS", "1", "TRAIN.WARMUP_EPOCHS", "0", "LOG.PERIOD", "1", "LOG.PROGRESS", "plain", "AUG.SHIFT", "0",
       "AUG.AUTO_AUGMENT", "rand-m5-n1", "AUG.REPROB", "0.25", "MODEL.DROP_RATE", "0.2", "AUG.MIXUP", "0.2",
       "TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "0.9", "CHECKPOINT.PERIOD", "3", "DATA.NUM_WORKERS", "2"]
TRAIN_SAMPLES = 400
STEPS = TRAIN_SAMPLES // 32  # global batches of 32: 16 x 2 processes, or 16 x 2 accumulated micro-batches


def one_thread(env: dict[str, str]) -> dict[str, str]:
    """`env` with OMP_NUM_THREADS=1 as the user's own: every run then computes with one thread. (tests.utils.env
    sets 1, but where the test process itself chose 1 at its start, its marker says that 1 is the runner's, and
    each run chooses again by the load at its start: 2 threads in one run, 1 in another, other float sums.)"""
    return {**env, "OMP_NUM_THREADS": "1", MARKER: ""}


def run_argv(data: list[str], out: Path, procs: int) -> list[str]:
    """RUN over `data` (DATA.* arguments) in `out` on `procs` processes, the global batch kept at 32."""
    cmd = [TRAIN, *RUN, *data, "TRAIN.ACCUM_STEPS", str(2 // procs), "OUTPUT_DIR", str(out)]
    return torchrun(["--standalone", f"--nproc_per_node={procs}", *cmd]) if procs > 1 else [sys.executable, *cmd]


def losses(out: Path) -> list[float]:
    """Every step's training loss."""
    rows = train_rows(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return [r["train/loss"] for r in rows]


def reference(data: list[str], logs: Path, **env: str) -> Path:
    """The uninterrupted 1-process run (2 micro-batches a step); its folder. Its stderr holds nothing."""
    run = Launch(run_argv(data, logs / "ref", 1), logs, "ref", **one_thread(env))
    assert run.finish() == 0, run.stderr[-3000:]
    assert run.stderr == ""
    return logs / "ref"


def stopped_and_resumed(data: list[str], ref: Path, tmp_path: Path, **env: str) -> None:
    """SIGTERM mid-epoch (saved, exit 75), the same command again: every step, checkpoint and result as `ref`'s."""
    out = tmp_path / "out"
    first = Launch(run_argv(data, out, 1), tmp_path, "first", **one_thread(env))
    first.wait_step(5)
    first.p.send_signal(signal.SIGTERM)
    assert first.finish(60) == 75, first.stderr[-3000:]
    saved = torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)["step"]
    assert 5 <= saved < STEPS, saved  # mid-epoch: the epoch has STEPS steps
    second = Launch(run_argv(data, out, 1), tmp_path, "second", **one_thread(env))
    assert second.finish() == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout and second.stderr == ""
    assert_same_run(out, ref)


def two_killed_then_one(data: list[str], ref: Path, tmp_path: Path, **env: str) -> None:
    """2 processes SIGKILLed mid-epoch, resumed on 1 accumulating 2: the reference's losses (up to the order of
    sums) and its evaluations."""
    out = tmp_path / "run"
    first = Launch(run_argv(data, out, 2), tmp_path, "first", **one_thread(env))
    first.wait_step(7)
    first.kill_all()  # every process, as a node failure would: the run continues from its last periodic checkpoint
    saved = torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)["step"]
    assert 3 <= saved < STEPS, saved
    second = Launch(run_argv(data, out, 1), tmp_path, "second", **one_thread(env))
    assert second.finish() == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    assert losses(out) == pytest.approx(losses(ref), rel=1e-4, abs=1e-5)
    res, ref_res = (json.loads((d / "results.json").read_text()) for d in (out, ref))
    assert res["val/top1"] == ref_res["val/top1"] and res["val_ema/top1"] == ref_res["val_ema/top1"]
