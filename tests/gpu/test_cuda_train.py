"""CUDA paths of a run, through the real tools: bf16 and fp16 autocast, the GradScaler, channels_last, memory
scalars, the profiler, tools/eval.py and tools/predict.py on the GPU.

Skipped without CUDA; RUNNER_GPU_TESTS_ON_CPU=1 dry-runs it on the CPU (see tests/gpu/common.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
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
    skip_without_device,
    train,
    train_rows,
    val_top1,
)
from tests.utils import run_tool

skip_without_device()
pytestmark = pytest.mark.gpu

BF16 = ["AMP.ENABLED", "true", "AMP.DTYPE", "bfloat16", "MODEL.CHANNELS_LAST", "true"]
FP16 = ["AMP.ENABLED", "true", "AMP.DTYPE", "float16"]
INIT_SCALE = 65536.0  # torch.amp.GradScaler's default init_scale


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory) -> Path:
    """One epoch in bf16 and channels_last, profiling steps 2-3; the run's folder."""
    out = tmp_path_factory.mktemp("bf16") / "run"
    ok(train(out, *BF16, "PROFILE.ENABLED", "true", "PROFILE.WAIT", "1", "PROFILE.WARMUP", "1",
             "PROFILE.ACTIVE", "2"))
    return out


def test_bf16_channels_last_trains(bf16_run: Path):
    rows = train_rows(bf16_run)
    assert rows and all(math.isfinite(r["train/loss"]) for r in rows)
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]
    assert val_top1(bf16_run) > 50  # one epoch of digits; chance is 10
    assert env_line(bf16_run, "CUDA available") == ("yes" if ON_GPU else "no")


@needs_cuda
def test_memory_scalars_in_metrics_and_tensorboard(bf16_run: Path):
    rows = train_rows(bf16_run)
    for r in rows:
        assert 0 < r["train/mem_alloc_mb"] <= r["train/mem_reserved_mb"], r
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(str(bf16_run))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"train/mem_alloc_mb", "train/mem_reserved_mb"} <= set(tags), tags
    assert len(acc.Scalars("train/mem_alloc_mb")) == len(rows)


def test_profiler_trace(bf16_run: Path):
    traces = list((bf16_run / "profile").glob("*.pt.trace.json"))
    assert len(traces) == 1, traces
    events = json.loads(traces[0].read_text())["traceEvents"]
    cats = {e.get("cat") for e in events}
    assert "cpu_op" in cats
    if ON_GPU:  # the CUDA activity was recorded: kernels and their launches
        assert "kernel" in cats and "cuda_runtime" in cats, sorted(c for c in cats if c)


def test_eval_tool_on_device(bf16_run: Path):
    res = run_tool("eval.py", ["--cfg", str(bf16_run / "config.yaml"), "MODEL.CHECKPOINT",
                               str(bf16_run / "checkpoints" / "last.pth")])
    ok(res)
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["val/count"] == 360
    # the same weights, data and autocast as the run's last evaluation: at most one image apart (kernel choice)
    assert abs(got["val/top1"] - val_top1(bf16_run)) <= 100 / 360 + 1e-6


def test_predict_tool_on_device(bf16_run: Path, tmp_path: Path):
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    paths = []
    for i in range(3):
        p = tmp_path / f"digit{i}_{digits.target[i]}.png"
        Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8)).resize((24, 24)).save(p)
        paths.append(str(p))
    common = ["--cfg", str(bf16_run / "config.yaml"), "MODEL.CHECKPOINT", str(bf16_run / "checkpoints" / "last.pth")]
    probs = {}
    for dev in (DEVICE, "cpu"):
        res = ok(run_tool("predict.py", [*common, "DEVICE", dev, "--json", *paths]))
        preds = json.loads(res.stdout.splitlines()[-1])["predictions"]
        probs[dev] = [[t["prob"] for t in sorted(p["top"], key=lambda t: t["index"])] for p in preds]
    # the GPU's answer is the CPU's (TF32 and kernel choice move the last digits only)
    np.testing.assert_allclose(probs[DEVICE], probs["cpu"], atol=2e-2)


def test_fp16_scaler_skips_overflow_and_resumes(tmp_path: Path):
    """A first loss scale of 2**24 overflows fp16 gradients: the scaler skips those steps and halves its scale.

    The logits' gradient alone reaches 2**24 * 0.9 / 64 (the batch) > 65504, fp16's largest. On an H200
    (2026-11-26) every one of 6 steps from 2**24 overflowed (scale 2**18 after them) and none from 2**16, so by
    step 10 the scale has come down to where steps pass. Inputs 1000x too large (this test's first form) overflow
    nothing: BatchNorm after the first convolution cancels their scale in backward as in forward.
    """
    out = tmp_path / "run"
    huge = [*FP16, "AMP.INIT_SCALE", str(2.0**24), "CHECKPOINT.PERIOD", "5"]
    ok(train(out, *huge, "TRAIN.MAX_STEPS", "10"))
    first = checkpoint(out)
    assert first["step"] == 10
    # the run is finished at its MAX_STEPS: going on is an extension (the GPU run of 2026-11-26 was refused without)
    res = ok(train(out, *huge, "TRAIN.MAX_STEPS", "12", "TRAIN.EXTEND", "True"))
    assert "resumed from" in res.stdout + res.stderr
    second = checkpoint(out)
    assert second["step"] == 12
    if not ON_GPU:  # the runner scales fp16 only on CUDA (autocast on the CPU needs no scaler)
        assert not first["scaler"] and not second["scaler"]
        return
    s0, s1 = first["scaler"], second["scaler"]
    assert s0["scale"] < 2.0**24, s0  # at least one step was skipped
    assert s0["_growth_tracker"] >= 1, s0  # and the last step was not: the run learns
    if s1["scale"] == s0["scale"]:  # no skip since: the count of good steps went on from the saved one
        assert s1["_growth_tracker"] == s0["_growth_tracker"] + 2, (s0, s1)
    else:  # a new scaler would have started again at 2**24
        assert s1["scale"] < s0["scale"], (s0, s1)


def test_fp16_nan_exits_3(tmp_path: Path):
    """A learning rate of 1e10 makes the weights overflow fp16 after one step: a real NaN loss, exit 3."""
    res = train(tmp_path / "run", *FP16, "TRAIN.LR", "1e10", "TRAIN.MAX_STEPS", "6")
    assert res.returncode == 3, f"exit {res.returncode}\n{res.stderr[-3000:]}"
    assert "non-finite" in res.stderr
    assert "Traceback" not in res.stderr


def test_host_loader_keeps_channels_last():
    """DATA.ON_DEVICE false: batches cross from the host and still arrive channels_last on the device."""
    from runner.config import load_config
    from runner.data import build_data
    from runner.distributed import Dist

    cfg, _ = load_config([*TINY, "DATA.ON_DEVICE", "false", "MODEL.CHANNELS_LAST", "true"])
    data = build_data(cfg, Dist(0, 1, 0, torch.device(DEVICE)))
    for loader in (data.train, data.val):
        loader.set_epoch(0, 0)
        x, y = next(iter(loader))
        assert x.device.type == DEVICE and y.device.type == DEVICE
        assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
