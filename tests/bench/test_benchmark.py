"""tools/benchmark.py, benchmarks/raw_loop.py, benchmarks/startup.py and runner.bench.step: they run and report
well-formed figures. A benchmark is not a test: no speed is ever asserted."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from runner.bench.step import format_table, peak_tflops, precision_name
from runner.config import load_config
from tests.utils import ROOT

TINY = ["DEVICE", "cpu", "DATA.NAME", "synthetic", "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16",
        "DATA.BATCH_SIZE", "8", "DATA.SYNTHETIC_SIZE", "32", "--steps", "2", "--warmup", "1", "--infer-batches", "1"]
KEYS = {"train_img_per_s", "infer_img_per_s", "step_ms", "data_wait_frac", "peak_mem_mb", "peak_mem_kind",
        "gflops_per_img", "train_gflops_per_img", "mfu", "compile_s", "first_step_s", "threads", "precision"}


def env() -> dict:
    """One torch thread per process (the machine is shared), unbuffered output."""
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def run(script: str, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a script of this repository with this interpreter; text output captured."""
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                          env=env(), cwd=ROOT, timeout=timeout)


def last_json(stdout: str):
    """The last line of a tool's output, parsed."""
    return json.loads(stdout.strip().splitlines()[-1])


def check_record(rec: dict) -> None:
    """The keys are there and the figures are sane in kind (never in speed)."""
    assert KEYS <= set(rec), KEYS - set(rec)
    for key in ("train_img_per_s", "infer_img_per_s", "step_ms", "peak_mem_mb"):
        assert math.isfinite(rec[key]) and rec[key] > 0, key
    assert 0 <= rec["data_wait_frac"] <= 1
    assert rec["train_gflops_per_img"] > 2 * rec["gflops_per_img"] > 0  # backward costs about twice forward
    assert rec["peak_mem_kind"] == "cpu_max_rss"
    assert rec["mfu"] is None and rec["compile_s"] is None  # CPU: no known peak; not compiled


def test_benchmark_tool_prints_json_last_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    res = run("tools/benchmark.py", [*TINY, "OUTPUT_DIR", str(out)])
    assert res.returncode == 0, res.stderr
    rec = last_json(res.stdout)
    check_record(rec)
    assert (rec["model"], rec["img_size"], rec["batch_size"], rec["steps"]) == ("resnet10t", 16, 8, 2)
    assert rec["precision"] == "fp32"
    assert "train img/s" in res.stdout  # the table above the JSON
    assert not out.exists()


def test_benchmark_tool_several_combinations(tmp_path, in_process):
    res = in_process("benchmark.py", [*TINY, "--models", "resnet10t,test_resnet", "--batch-sizes", "4,8",
                                      "OUTPUT_DIR", str(tmp_path / "out")])
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    everything = json.loads(lines[-1])
    assert isinstance(everything, list) and len(everything) == 4
    assert [(r["model"], r["batch_size"]) for r in everything] == [
        ("resnet10t", 4), ("resnet10t", 8), ("test_resnet", 4), ("test_resnet", 8)]
    per_line = [json.loads(ln) for ln in lines if ln.startswith("{")]
    assert per_line == everything
    for rec in everything:
        check_record(rec)


@pytest.mark.parametrize("args, words", [
    (["--batch-sizes", "4,x"], "--batch-sizes"),
    (["--batch-sizes", "4,,8"], "empty item"),
    (["--steps", "0"], "--steps 0"),
    (["--models", "resnet_nope"], "resnet_nope"),
])
def test_benchmark_tool_bad_arguments(args, words, in_process):
    res = in_process("benchmark.py", [*TINY, *args])
    assert res.returncode == 2
    assert words in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_benchmark_tool_bad_arguments_through_the_command_line():
    res = run("tools/benchmark.py", [*TINY, "--batch-sizes", "4,x"])
    assert res.returncode == 2
    assert "--batch-sizes" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_raw_loop_prints_the_same_keys():
    res = run("benchmarks/raw_loop.py", ["--device", "cpu", "--model", "resnet10t", "--img-size", "16",
                                         "--batch-size", "8", "--dataset-size", "32", "--steps", "2",
                                         "--warmup", "1", "--infer-batches", "1", "--nesterov"])
    assert res.returncode == 0, res.stderr
    rec = last_json(res.stdout)
    check_record(rec)
    assert rec["model"] == "resnet10t" and rec["batch_size"] == 8


def test_raw_loop_mfu_with_a_given_peak():
    res = run("benchmarks/raw_loop.py", ["--device", "cpu", "--model", "test_resnet", "--img-size", "16",
                                         "--batch-size", "4", "--dataset-size", "8", "--steps", "1",
                                         "--warmup", "1", "--infer-batches", "1", "--peak-tflops", "1.0"])
    assert res.returncode == 0, res.stderr
    rec = last_json(res.stdout)
    assert rec["mfu"] == pytest.approx(rec["train_img_per_s"] * rec["train_gflops_per_img"] / 1e3)


def test_raw_loop_imports_nothing_from_the_runner():
    text = (ROOT / "benchmarks" / "raw_loop.py").read_text()
    assert "runner" not in [ln.split()[1].split(".")[0] for ln in text.splitlines()
                            if ln.startswith(("import ", "from "))]


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H100 NVL", "tf32", 417.5),
    ("NVIDIA H200", "fp16", 989.4),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156.0),
    ("NVIDIA A10", "bf16", 125.0),
    ("NVIDIA L40S", "fp32", 91.6),
    ("NVIDIA L4", "bf16", 121.0),
    ("Intel(R) Xeon(R) Processor", "fp32", None),
    ("Some Future GPU", "bf16", None),
])
def test_peak_table(name, precision, peak):
    assert peak_tflops(name, precision) == peak


def test_precision_name_follows_the_config():
    import torch

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    cfg, _ = load_config(["AMP.ENABLED", "True"])
    assert precision_name(cfg, cpu) == "bf16"
    cfg, _ = load_config(["AMP.ENABLED", "True", "AMP.DTYPE", "float16"])
    assert precision_name(cfg, cuda) == "fp16"
    cfg, _ = load_config([])
    assert (precision_name(cfg, cpu), precision_name(cfg, cuda)) == ("fp32", "tf32")
    cfg, _ = load_config(["CUDNN.TF32", "False"])
    assert precision_name(cfg, cuda) == "fp32"


def test_format_table_shows_missing_values_as_dash():
    row = {"model": "m", "img_size": 16, "batch_size": 2, "precision": "fp32", "channels_last": False,
           "compile": False, "train_img_per_s": 12.345, "step_ms": 162.0, "data_wait_frac": 0.01,
           "infer_img_per_s": 50.0, "peak_mem_mb": 900.0, "gflops_per_img": 0.01, "achieved_tflops": 0.001,
           "mfu": None, "compile_s": None}
    lines = format_table([row, dict(row, model="longer_model_name")]).splitlines()
    assert len(lines) == 3 and len({len(ln) for ln in lines}) == 1
    assert "12.3" in lines[1] and lines[1].rstrip().endswith("-")


def test_startup_script_reports_phases():
    res = run("benchmarks/startup.py", ["--runs", "1", "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16"],
              timeout=600)
    assert res.returncode == 0, res.stderr + res.stdout
    rec = last_json(res.stdout)
    assert rec["first_step_s"] > rec["phases"]["build data"] > 0
    assert rec["bare_import_s"] > 0 and rec["phases"]["build model"] > 0
    assert "torch" in rec["imports"] and "timm" in rec["imports"]


# The ops that make the host wait for the device (on CUDA): reading a value, or shapes that depend on values.
HOST_READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique_dim",
              "aten::_unique2", "aten::equal", "aten::is_nonzero"}


def _recorder(host_tensors=()):
    """A dispatch mode that records every aten op name it sees, except reads of `host_tensors`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    host = {t.data_ptr() for t in host_tensors}

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name
            if not (name == "aten::_local_scalar_dense" and args[0].data_ptr() in host):
                self.ops.add(name)
            return func(*args, **(kwargs or {}))

    return Record()


@pytest.mark.parametrize("extra", [
    [],
    ["TRAIN.ACCUM_STEPS", "2", "TRAIN.CLIP_GRAD", "1.0", "TRAIN.EMA", "True"],
    ["AUG.MIXUP", "0.2", "AUG.CUTMIX", "1.0", "TRAIN.LABEL_SMOOTHING", "0.1", "AUG.SHIFT", "2"],
    ["AMP.ENABLED", "True", "MODEL.CHANNELS_LAST", "True", "TRAIN.OPTIMIZER", "adamw"],
])
def test_training_steps_never_read_the_device(tmp_path, extra):
    """The fast path: the loop with no hooks (batch fetch, step, optimizer step) never waits on the device."""
    import torch

    from runner.bench.step import train_steps
    from runner.engine import build_trainer

    cfg, _ = load_config(["DEVICE", "cpu", "DATA.NAME", "synthetic", "MODEL.NAME", "resnet10t",
                          "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "4", "DATA.SYNTHETIC_SIZE", "16",
                          "OUTPUT_DIR", str(tmp_path / "out"), *extra])
    trainer = build_trainer(cfg, hooks=[])
    try:
        train_steps(trainer, 1)  # lazy state (optimizer buffers) is created outside the check
        # torch keeps Adam's step counts on the host unless the optimizer is fused or capturable (and on CUDA
        # the runner asks for fused): reading those is no device sync
        optimizer = trainer.stepper.optimizer
        steps = [s["step"] for s in optimizer.state.values() if torch.is_tensor(s.get("step"))]
        rec = _recorder([t for t in steps if not (optimizer.defaults.get("fused")
                                                 or optimizer.defaults.get("capturable"))])
        with rec:
            train_steps(trainer, 3)  # crosses an epoch boundary: 16 images, batch 4, accumulation 1 or 2
        assert trainer.step == 4
    finally:
        trainer.close()
    assert "aten::convolution_backward" in rec.ops  # the recorder saw the backward pass too
    assert not rec.ops & HOST_READS, rec.ops & HOST_READS
    assert not (tmp_path / "out").exists()


def test_the_host_read_check_can_fail():
    import torch

    rec = _recorder()
    with rec:
        torch.ones(3).sum().item()
    assert rec.ops & HOST_READS == {"aten::_local_scalar_dense"}


def test_mfu_is_over_every_device_of_the_job(monkeypatch):
    """8 ranks at one rank's speed: 8x the images and the FLOP/s, the same utilisation (not 8x)."""
    import torch

    from runner.bench import step as bench

    monkeypatch.setattr(bench, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    cfg, _ = load_config(["AMP.ENABLED", "True"])
    stats = {"params": 1e6, "gflops_per_img": 1.0, "train_gflops_per_img": 3.0}
    train = {"images": 1000, "seconds": 1.0, "wait_s": 0.0, "first_step_s": 1.0}
    infer = {"images": 100, "seconds": 1.0, "first_s": 0.1}
    one, eight = (bench.summarize(cfg, torch.device("cuda"), world, 10, 1, train, infer, stats, 1.0, "x")
                  for world in (1, 8))
    assert one["peak_tflops"] == eight["peak_tflops"] == 989.4  # one GPU's
    assert one["mfu"] == pytest.approx(1000 * 3.0 / 1e3 / 989.4)
    assert eight["achieved_tflops"] == pytest.approx(8 * one["achieved_tflops"])
    assert eight["mfu"] == pytest.approx(one["mfu"])
    assert bench.mfu(1.0, None, 8) is None


def test_inference_warmup_covers_cuda_graph_recording():
    """CUDA-graph compile modes run each held batch three times before the timed passes; others once."""
    from contextlib import nullcontext

    import torch

    from runner.bench.step import inference_warmup_rounds, time_inference

    for mode, rounds in [("default", 1), ("reduce-overhead", 3), ("max-autotune", 3),
                         ("max-autotune-no-cudagraphs", 1)]:
        cfg, _ = load_config(["MODEL.COMPILE", "True", "MODEL.COMPILE_MODE", mode])
        assert inference_warmup_rounds(cfg) == rounds, mode
    cfg, _ = load_config(["MODEL.COMPILE_MODE", "reduce-overhead"])  # not compiled: nothing is recorded
    assert inference_warmup_rounds(cfg) == 1

    seen = []

    class Count(torch.nn.Module):
        def forward(self, x):
            seen.append(int(x[0, 0]))
            return x

    class Two:
        def set_epoch(self, epoch, start_batch=0):
            pass

        def __iter__(self):
            yield from ((torch.full((2, 1), float(i)), torch.zeros(2)) for i in range(3))

    res = time_inference(Count(), Two(), torch.device("cpu"), nullcontext, batches=4, rounds=3)
    assert seen[:6] == [0, 1, 0, 1, 0, 1] and len(seen) == 6 + 4  # two batches held, three untimed rounds
    assert res["images"] == 4 * 2


def test_several_combinations_share_one_process_group(monkeypatch, capsys, tmp_path):
    """tools/benchmark.py sets the process group up once for every combination, and tears it down once."""
    import runpy
    import sys

    from runner import distributed

    calls = []
    setup, teardown = distributed.setup, distributed.teardown
    monkeypatch.setattr(distributed, "setup", lambda cfg: calls.append("setup") or setup(cfg))
    monkeypatch.setattr(distributed, "teardown", lambda: calls.append("teardown") or teardown())
    monkeypatch.setattr(sys, "argv", ["benchmark.py", *TINY, "--batch-sizes", "4,8", "OUTPUT_DIR", str(tmp_path)])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "tools" / "benchmark.py"), run_name="__main__")
    assert done.value.code == 0
    assert calls == ["setup", "teardown"]
    assert [r["batch_size"] for r in last_json(capsys.readouterr().out)] == [4, 8]
