"""torch.compile, cuDNN determinism and benchmark, TF32, and torchrun with NCCL, on the GPU through the real tools.

Skipped without CUDA; RUNNER_GPU_TESTS_ON_CPU=1 dry-runs it on the CPU (see tests/gpu/common.py).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.gpu.common import (
    DEVICE,
    ON_GPU,
    TINY,
    checkpoint,
    env_line,
    needs_cuda,
    ok,
    same_tensors,
    skip_without_device,
    train,
    train_rows,
)
from tests.utils import ROOT, TRAIN, env, torchrun

skip_without_device()
pytestmark = pytest.mark.gpu

COMPILE = ["MODEL.COMPILE", "true"]
# every source of run state a resume restores on the GPU: dropout and drop-path (the device's RNG), bf16, EMA
EXACT = ["CUDNN.DETERMINISTIC", "true", "AMP.ENABLED", "true", "MODEL.CHANNELS_LAST", "true",
         "MODEL.DROP_RATE", "0.2", "MODEL.DROP_PATH_RATE", "0.1", "TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "0.9",
         "CHECKPOINT.PERIOD", "4"]


def plain_keys(state: dict) -> None:
    """A checkpoint's weights (and EMA) carry the bare module's names: no torch.compile or DDP prefix."""
    keys = {"model": list(state["model"]),  # timm's ModelEmaV3 keeps its copy as .module: one prefix of its own
            "ema": [k.removeprefix("module.") for k in state.get("ema") or {}]}
    for part, names in keys.items():
        bad = [k for k in names if "_orig_mod." in k or k.startswith("module.")]
        assert not bad, f"{part}: {bad[:3]}"


def test_compile_trains_and_evaluates_compiled(tmp_path: Path):
    """Training and the run's evaluation both go through the compiled model; the checkpoint holds plain keys."""
    out = tmp_path / "run"
    # dynamo logs a recompile when the compiled forward meets model.eval(): the evaluation used it
    res = ok(train(out, *COMPILE, "TRAIN.EMA", "true", "TRAIN.MAX_STEPS", "4", TORCH_LOGS="recompiles"))
    state = checkpoint(out)
    assert state["step"] == 4
    plain_keys(state)
    logged = res.stdout + res.stderr
    # (the guard that fails is grad_mode under no_grad, or the modules' training flag)
    assert re.search(r"Recompiling function(.*\n){1,8}?.*(grad_mode|training)", logged), (
        "no recompile for eval mode: the evaluation did not run the compiled model\n" + logged[-3000:])


def test_compile_resumes_from_eager_and_back(tmp_path: Path):
    """An eager checkpoint continues compiled, and that one eager again: MODEL.COMPILE changes no number."""
    out = tmp_path / "run"
    ok(train(out, "CHECKPOINT.PERIOD", "3", "TRAIN.MAX_STEPS", "3"))
    for compiled, steps in ((True, 6), (False, 9)):
        res = train(out, "MODEL.COMPILE", str(compiled).lower(), "CHECKPOINT.PERIOD", "3", "TRAIN.MAX_STEPS",
                    str(steps), "TRAIN.EXTEND", "true")  # a run that reached its MAX_STEPS is finished: extended
        assert res.returncode == 0, f"MODEL.COMPILE {compiled} did not resume: exit {res.returncode}\n{res.stderr}"
        assert "resumed from" in res.stdout + res.stderr
        state = checkpoint(out)
        assert state["step"] == steps
        plain_keys(state)
    assert [r["step"] for r in train_rows(out)] == [2, 3, 4, 6, 8, 9]  # LOG.PERIOD 2 and each stop


def test_deterministic_resume_is_bit_identical(tmp_path: Path):
    """CUDNN.DETERMINISTIC: 8 steps in one go, and 4 + 4 with a restart, end with the same bits."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    ok(train(whole, *EXACT, "TRAIN.MAX_STEPS", "8"))
    ok(train(split, *EXACT, "TRAIN.MAX_STEPS", "4"))
    res = ok(train(split, *EXACT, "TRAIN.MAX_STEPS", "8", "TRAIN.EXTEND", "true"))  # the 4-step run is finished
    assert "resumed from" in res.stdout + res.stderr
    a, b = checkpoint(whole), checkpoint(split)
    assert a["step"] == b["step"] == 8
    assert same_tensors(a["model"], b["model"]) == []
    assert same_tensors(a["ema"], b["ema"]) == []
    losses = {r["step"]: r["train/loss"] for r in train_rows(whole)}
    assert all(losses[r["step"]] == r["train/loss"] for r in train_rows(split)), (train_rows(whole),
                                                                                 train_rows(split))


@pytest.mark.parametrize("benchmark,tf32", [(True, True), (False, False)])
def test_backend_flags_set_by_the_run(benchmark: bool, tf32: bool):
    """CUDNN.BENCHMARK and CUDNN.TF32 reach torch.backends in a built run, which then trains."""
    from runner.config import load_config
    from runner.engine import build_trainer

    saved = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    cfg, _ = load_config([*TINY, "CUDNN.BENCHMARK", str(benchmark).lower(), "CUDNN.TF32", str(tf32).lower(),
                          "TRAIN.MAX_STEPS", "2"])
    trainer = build_trainer(cfg, hooks=[])
    try:
        assert torch.backends.cudnn.benchmark is benchmark
        if ON_GPU:  # TF32 is a CUDA switch; the run leaves it alone on the CPU
            assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
        trainer.train()
        assert trainer.step == 2
    finally:
        trainer.close()
        torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@needs_cuda
def test_tf32_off_in_env_txt(tmp_path: Path):
    """A run with CUDNN.TF32 false says so in env.txt, which is written after the backends are set."""
    off, on = tmp_path / "off", tmp_path / "on"
    ok(train(off, "CUDNN.TF32", "false", "TRAIN.MAX_STEPS", "2"))
    ok(train(on, "TRAIN.MAX_STEPS", "2"))
    assert env_line(off, "TF32 matmul / cuDNN") == "off / off"
    assert env_line(on, "TF32 matmul / cuDNN") == "on / on"


def launch(nproc: int, out: Path, *overrides: str) -> subprocess.CompletedProcess:
    """tools/train.py under torchrun --standalone with `nproc` processes."""
    argv = torchrun(["--standalone", f"--nproc_per_node={nproc}", TRAIN, *TINY, "OUTPUT_DIR", str(out), *overrides])
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env())


def test_torchrun_one_process(tmp_path: Path):
    """torchrun with one process: NCCL on the GPU (gloo on the CPU dry run), DDP, a finished run."""
    out = tmp_path / "run"
    ok(launch(1, out, "DIST.BACKEND", "nccl" if ON_GPU else "gloo", "TRAIN.MAX_STEPS", "4"))
    assert checkpoint(out)["step"] == 4
    assert train_rows(out)


@needs_cuda
def test_two_processes_on_one_gpu(tmp_path: Path):
    """Two ranks with one GPU visible: refused in one line (NCCL cannot share one GPU between two ranks)."""
    if torch.cuda.device_count() >= 2:
        res = launch(2, tmp_path / "run", "DIST.BACKEND", "nccl", "TRAIN.MAX_STEPS", "4")
        ok(res)
        return
    res = launch(2, tmp_path / "run", "DIST.BACKEND", "nccl", "TRAIN.MAX_STEPS", "4")
    assert res.returncode != 0
    assert "LOCAL_RANK 1 but only 1 CUDA devices are visible" in res.stderr, res.stderr[-3000:]
    pytest.skip("2 NCCL processes need 2 GPUs: NCCL refuses two ranks on one device ('Duplicate GPU detected') "
                "and the runner gives rank r the device cuda:r; the refusal on one GPU was checked")


def test_device_is_what_was_asked():
    assert DEVICE == ("cuda" if ON_GPU else "cpu")
