"""FLOPs, parameters and activation memory measured on real modules."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from torch import nn

from runner.bench.flops import forward_flops, model_stats, saved_activation_bytes, train_flops

ROOT = Path(__file__).resolve().parents[2]


def test_linear_counts_are_exact():
    lin = nn.Linear(10, 5)
    x = torch.randn(1, 10)
    assert forward_flops(lin, x) == 2 * 10 * 5
    # backward adds the weight gradient only: the input does not require grad
    assert train_flops(lin, x) == 2 * (2 * 10 * 5)
    # the input is saved for the weight gradient; the weight itself is a parameter, not an activation
    assert saved_activation_bytes(lin, x) == 10 * 4


def test_resnet_stats_scale_with_pixels_and_leave_model_untouched():
    torch.manual_seed(0)
    model = timm.create_model("resnet10t", num_classes=10).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    small = model_stats(model, 32, 3)
    big = model_stats(model, 64, 3)
    assert small["params"] == small["trainable_params"] == sum(p.numel() for p in model.parameters())
    assert 0 < small["gflops_per_img"] < small["train_gflops_per_img"] < 3 * small["gflops_per_img"]
    assert big["gflops_per_img"] / small["gflops_per_img"] == pytest.approx(4.0, rel=0.02)
    assert big["act_mb_per_img"] / small["act_mb_per_img"] == pytest.approx(4.0, rel=0.2)
    # measuring ran training-mode BatchNorm and a backward pass; none of it may stick
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_frozen_parameters_are_not_trainable():
    model = timm.create_model("resnet10t", num_classes=10)
    for p in model.fc.parameters():
        p.requires_grad_(False)
    stats = model_stats(model, 32, 3)
    assert stats["params"] - stats["trainable_params"] == sum(p.numel() for p in model.fc.parameters())


def test_in_chans_changes_the_stem_only():
    gray = model_stats(timm.create_model("resnet10t", num_classes=10, in_chans=1), 32, 1)
    rgb = model_stats(timm.create_model("resnet10t", num_classes=10, in_chans=3), 32, 3)
    assert 0 < rgb["gflops_per_img"] - gray["gflops_per_img"] < 0.1 * rgb["gflops_per_img"]


def _flops_tool(*args: str) -> subprocess.CompletedProcess:
    """Run tools/flops.py with this interpreter."""
    return subprocess.run([sys.executable, str(ROOT / "tools" / "flops.py"), *args],
                          capture_output=True, text=True, timeout=300)


def test_flops_tool_measures_the_configured_model(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("MODEL:\n  NAME: resnet10t\n  NUM_CLASSES: 7\nDATA:\n  IMG_SIZE: 32\n")
    result = _flops_tool("--cfg", str(cfg), "MODEL.IN_CHANS", "1", "DATA.MEAN", "[0.5]", "DATA.STD", "[0.5]")
    assert result.returncode == 0, result.stderr
    *table, last = result.stdout.strip().splitlines()
    stats = json.loads(last)
    expected = model_stats(timm.create_model("resnet10t", num_classes=7, in_chans=1), 32, 1)
    assert stats["model"] == "resnet10t" and stats["img_size"] == 32 and stats["in_chans"] == 1
    assert stats["params"] == expected["params"]
    assert stats["gflops_per_img"] == pytest.approx(expected["gflops_per_img"])
    assert any(line.startswith("forward") and "GFLOPs / image" in line for line in table)


def test_flops_tool_bad_model_name_is_one_line_exit_2(tmp_path, in_process):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("MODEL:\n  NAME: resnet10x\n")
    result = in_process("flops.py", ["--cfg", str(cfg)])  # tests/test_compat.py: its exit 2 through the command line
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "resnet10x" in result.stderr
    assert "Traceback" not in result.stderr
