"""A profiled window of real training steps writes a trace TensorBoard and Perfetto can open."""
from __future__ import annotations

import json
import subprocess
import sys

import timm
import torch
import torch.nn.functional as F
from yacs.config import CfgNode as CN

from runner.profiler import TRACE_SUFFIX, NullProfiler, build_profiler
from tests.utils import ROOT

MATMUL_OR_CONV = ("aten::convolution", "aten::conv2d", "aten::mm", "aten::addmm")


def _cfg(enabled: bool = True, wait: int = 1, warmup: int = 1, active: int = 2) -> CN:
    """A frozen config holding only what the profiler reads."""
    cfg = CN()
    cfg.PROFILE = CN({"ENABLED": enabled, "WAIT": wait, "WARMUP": warmup, "ACTIVE": active,
                      "ONLY": False, "ROW_LIMIT": 8})
    cfg.freeze()
    return cfg


def _train(prof, steps: int) -> list[bool]:
    """Run tiny resnet10t training steps, calling prof.step() after each; returns prof.done per step."""
    torch.manual_seed(0)
    model = timm.create_model("resnet10t", num_classes=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    done = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step()
        done.append(prof.done)
    return done


def test_profiled_steps_write_a_trace_with_conv_ops_and_a_summary(tmp_path):
    logged = []
    with build_profiler(_cfg(), tmp_path, torch.device("cpu"), log=logged.append) as prof:
        done = _train(prof, 5)
    # wait 1 + warmup 1 + active 2: the window closes with the 4th step
    assert done == [False, False, False, True, True]
    traces = list((tmp_path / "profile").glob(f"*{TRACE_SUFFIX}"))
    assert traces == [prof.trace_path]
    trace = json.loads(prof.trace_path.read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert names & set(MATMUL_OR_CONV)
    # exactly the two active steps were recorded
    assert {n for n in names if str(n).startswith("ProfilerStep#")} == {"ProfilerStep#2", "ProfilerStep#3"}
    assert "aten::convolution_backward" in prof.summary and "Self CPU" in prof.summary
    assert len(logged) == 1 and str(prof.trace_path) in logged[0] and prof.summary in logged[0]


def test_run_ending_inside_the_window_still_saves_what_was_recorded(tmp_path):
    prof = build_profiler(_cfg(active=3), tmp_path, torch.device("cpu"))
    assert _train(prof, 3) == [False, False, False]
    prof.close()
    assert prof.done and prof.trace_path.is_file()
    json.loads(prof.trace_path.read_text())


def test_run_ending_before_recording_writes_nothing_and_says_so(tmp_path):
    logged = []
    prof = build_profiler(_cfg(wait=2), tmp_path, torch.device("cpu"), log=logged.append)
    _train(prof, 2)
    prof.close()
    assert not prof.done and prof.trace_path is None
    assert not (tmp_path / "profile").exists()
    assert len(logged) == 1 and "no trace written" in logged[0]


def test_disabled_profiler_is_a_no_op(tmp_path):
    with build_profiler(_cfg(enabled=False), tmp_path, torch.device("cpu")) as prof:
        assert isinstance(prof, NullProfiler)
        assert _train(prof, 2) == [False, False]
    assert prof.summary == "" and not (tmp_path / "profile").exists()


def test_train_tool_writes_env_report_and_profile(tmp_path):
    out = tmp_path / "run"
    overrides = ("MODEL.NAME resnet10t DATA.NAME synthetic DATA.IMG_SIZE 16 DATA.BATCH_SIZE 4 "
                 "DATA.SYNTHETIC_SIZE 32 DATA.NUM_WORKERS 0 TRAIN.EPOCHS 1 TRAIN.MAX_STEPS 4 "
                 "LOG.TENSORBOARD False "
                 "PROFILE.ENABLED True PROFILE.WAIT 1 PROFILE.WARMUP 1 PROFILE.ACTIVE 2")
    cmd = [sys.executable, str(ROOT / "tools" / "train.py"), *overrides.split(), "OUTPUT_DIR", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    env = (out / "env.txt").read_text()
    assert torch.__version__ in env and "GPUs: none visible" in env
    traces = list((out / "profile").glob(f"*{TRACE_SUFFIX}"))
    assert len(traces) == 1
    names = {event.get("name") for event in json.loads(traces[0].read_text())["traceEvents"]}
    assert names & set(MATMUL_OR_CONV)
    log_text = (out / "log.txt").read_text()
    assert "profiler: trace written to" in log_text and "Self CPU" in log_text
    # PROFILE.ONLY is off: the run goes on to the end
    assert json.loads((out / "results.json").read_text())["step"] == 4
