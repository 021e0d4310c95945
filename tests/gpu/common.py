"""What the GPU suite shares: the device it runs on, the tiny run every test starts from, reading results back.

The suite runs where CUDA is available. RUNNER_GPU_TESTS_ON_CPU=1 runs it on the CPU instead (DEVICE cpu), as
a dry run of the tests' own logic: the tests that only mean something on a GPU skip themselves there.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.utils import read_jsonl, run_tool

ON_CPU = os.environ.get("RUNNER_GPU_TESTS_ON_CPU") == "1"
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA and not ON_CPU else "cpu"
ON_GPU = DEVICE == "cuda"

needs_cuda = pytest.mark.skipif(not ON_GPU, reason="means something only on a CUDA device")

# digits at 24 px through timm's tiny resnet10t: a step is milliseconds on a GPU, an epoch 22 steps of 64.
TINY = ["DATA.NAME", "digits", "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "24", "DATA.BATCH_SIZE", "64",
        "TRAIN.EPOCHS", "1", "TRAIN.LR", "0.05", "LOG.PERIOD", "2", "LOG.PROGRESS", "plain",
        "DATA.NUM_WORKERS", "0", "DEVICE", DEVICE]
STEPS_PER_EPOCH = 1437 // 64


def skip_without_device() -> None:
    """Skip the calling module unless CUDA is there or the CPU dry run was asked for."""
    if not (CUDA or ON_CPU):
        pytest.skip("no CUDA device (RUNNER_GPU_TESTS_ON_CPU=1 dry-runs this suite on the CPU)",
                    allow_module_level=True)


def train(out: Path, *overrides: str, timeout: float = 300, **env_extra: str) -> subprocess.CompletedProcess:
    """tools/train.py on the tiny run into `out` with `overrides` after it."""
    from tests.utils import env

    return run_tool("train.py", [*TINY, "OUTPUT_DIR", str(out), *overrides], timeout=timeout,
                    env=env(**env_extra))


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """Assert exit 0, showing the end of stderr when not."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def checkpoint(out: Path, name: str = "last.pth") -> dict:
    """A checkpoint of the run in `out`, on the CPU."""
    return torch.load(out / "checkpoints" / name, map_location="cpu", weights_only=True)


def train_rows(out: Path) -> list[dict]:
    """The metrics.jsonl lines that hold training scalars."""
    return [r for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]


def val_top1(out: Path) -> float:
    """The last val/top1 the run logged."""
    return [r for r in read_jsonl(out / "metrics.jsonl") if "val/top1" in r][-1]["val/top1"]


def same_tensors(a: dict, b: dict) -> list[str]:
    """The keys whose tensors differ (bit for bit) between two state dicts; [] when identical."""
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def env_line(out: Path, key: str) -> str:
    """The value of one row of the run's env.txt ('TF32 matmul / cuDNN' -> 'on / off')."""
    for line in (out / "env.txt").read_text().splitlines():
        if line.startswith(key):
            return line[len(key):].strip()
    raise AssertionError(f"no '{key}' row in {out / 'env.txt'}")
