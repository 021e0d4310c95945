"""End-to-end runs of tools/train.py on CPU: digits, synthetic and image folders, outputs read back (each run
made once and read by several tests; the tools that only read a run called in this process)."""
from __future__ import annotations

import json
import math
import os
import socket

import pytest
import torch

from tests.utils import ROOT, TINY, read_jsonl, run_tool

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")


@pytest.fixture
def digits_run(finished_digits):
    """One tiny digits run (2 epochs), trained once for the session, read by the tests below."""
    return finished_digits


def test_digits_outputs(digits_run):
    out, r = digits_run
    for name in ("config.yaml", "log.txt", "metrics.jsonl", "results.json", "env.txt", "run.json"):
        assert (out / name).is_file(), name
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "done" and res["step"] == 2 * (1437 // 64) and res["epoch"] == 2
    assert 50 < res["val/top1"] <= 100 and res["val/top5"] >= res["val/top1"]
    assert res["best/val/top1"] >= res["val/top1"] and res["wall_s"] > 0 and res["train/img_per_s"] > 0
    rows = read_jsonl(out / "metrics.jsonl")
    assert all("step" in row and "epoch" in row for row in rows)
    train = [row for row in rows if "train/loss" in row]
    assert [row["step"] for row in train][:3] == [5, 10, 15]
    assert all(math.isfinite(row["train/loss"]) and row["train/lr"] >= 0 and row["train/img_per_s"] > 0
               for row in train)
    val = [row for row in rows if "val/top1" in row]
    assert [row["epoch"] for row in val] == [1, 2] and all(row["val/count"] == 360 for row in val)
    assert train[0]["train/loss"] > train[-1]["train/loss"]  # it learns
    assert "Traceback" not in r.stderr


def test_tensorboard_events_read_back(digits_run):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    out, _ = digits_run
    mux = EventMultiplexer().AddRunsFromDirectory(str(out))
    mux.Reload()
    tags = mux.Runs()["."]["scalars"]
    for tag in ("train/loss", "train/lr", "train/img_per_s", "val/top1", "val/top5"):
        assert tag in tags
    steps = [e.step for e in mux.Scalars(".", "val/top1")]
    jsonl = [row["step"] for row in read_jsonl(out / "metrics.jsonl") if "val/top1" in row]
    assert steps == jsonl
    values = [e.value for e in mux.Scalars(".", "val/top1")]
    assert values[-1] == pytest.approx(json.loads((out / "results.json").read_text())["val/top1"], rel=1e-5)
    # the finished run's hparams: the keys given on the command line, not the ones that only observe the run
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer as PluginMux

    pmux = PluginMux().AddRunsFromDirectory(str(out))
    pmux.Reload()
    start = pmux.PluginRunToTagToContent("hparams")["."]["_hparams_/session_start_info"]
    assert b"MODEL.NAME" in start and b"resnet10t" in start and b"LOG.PERIOD" not in start
    assert not [t for t in tags if t.startswith("hparam/")] and "val/count" not in tags


def test_config_yaml_reloads_identically(digits_run, in_process):
    out, _ = digits_run
    r = in_process("train.py", ["--cfg", str(out / "config.yaml"), "--print-config"])
    assert r.returncode == 0
    assert r.stdout == (out / "config.yaml").read_text()


def test_eval_tool_matches_results(digits_run, in_process):
    out, _ = digits_run
    last = str(out / "checkpoints" / "last.pth")
    r = in_process("eval.py", ["--cfg", str(out / "config.yaml"), "MODEL.CHECKPOINT", last])
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    res = json.loads((out / "results.json").read_text())
    assert got["val/count"] == 360 and got["val/top1"] == pytest.approx(res["val/top1"], abs=1e-9)


def test_rerun_of_finished_run_does_not_train(digits_run, in_process):
    out, _ = digits_run
    before = (out / "metrics.jsonl").read_text()
    r = in_process("train.py", ["--cfg", DIGITS, *TINY, "TRAIN.EPOCHS", "2", "OUTPUT_DIR", str(out)])
    assert r.returncode == 0 and "already done" in r.stdout
    assert (out / "metrics.jsonl").read_text() == before


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    """(OUTPUT_DIR, the finished process) of one synthetic run of 4 steps with the progress bar asked for."""
    out = tmp_path_factory.mktemp("synthetic")
    r = run_tool("train.py", ["DATA.NAME", "synthetic", "DATA.SYNTHETIC_SIZE", "64", "DATA.BATCH_SIZE", "16",
                              "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "TRAIN.EPOCHS", "1",
                              "LOG.PERIOD", "1", "LOG.PROGRESS", "bar", "OUTPUT_DIR", str(out)])
    return out, r


def test_synthetic_run(synthetic_run):
    out, r = synthetic_run
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["step"] == 4 and res["status"] == "done"


def test_folder_run_from_png_tree(tmp_path):
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    for i, (img, label) in enumerate(zip(d.images[:200], d.target[:200], strict=True)):
        split = "val" if i % 4 == 0 else "train"
        folder = tmp_path / "data" / split / f"digit{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img * 15.9).astype("uint8")).resize((20, 20)).save(folder / f"{i}.png")
    out = tmp_path / "out"
    r = run_tool("train.py", ["DATA.NAME", "folder", "DATA.ROOT", str(tmp_path / "data"), "MODEL.NAME", "resnet10t",
                              "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "16", "TRAIN.EPOCHS", "1", "LOG.PERIOD", "3",
                              "DATA.NUM_WORKERS", "0", "AUG.HFLIP", "0", "OUTPUT_DIR", str(out)])
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["step"] == 150 // 16
    val = [row for row in read_jsonl(out / "metrics.jsonl") if "val/count" in row]
    assert val[-1]["val/count"] == 50
    class_map = json.loads((out / "class_map.json").read_text())
    assert sorted(class_map.values()) == [f"digit{i}" for i in range(10)]


def test_nan_loss_exits_3_and_saves_nothing_nonfinite(tmp_path):
    r = run_tool("train.py", ["--cfg", DIGITS, *TINY, "TRAIN.LR", "1e30", "CHECKPOINT.PERIOD", "1",
                              "OUTPUT_DIR", str(tmp_path)])
    assert r.returncode == 3, r.stdout + r.stderr
    assert "non-finite at step" in r.stderr and "Traceback" not in r.stderr
    for f in (tmp_path / "checkpoints").glob("step_*.pth"):
        state = torch.load(f, weights_only=True)
        assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "nonfinite"


@pytest.mark.slow  # the Hub client retries a refused connection 5 times (1 + 2 + 4 + 8 + 8 s) before it gives up
def test_pretrained_not_on_disk_and_no_hub_is_exit_2(tmp_path):
    """No weights in the cache and a Hub that refuses connections (a closed port on 127.0.0.1): one line naming the
    cache and the way out, before anything is written. (tests/weights/test_hub.py: a working stand-in Hub.)"""
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    out = tmp_path / "run"
    r = run_tool("train.py", ["--cfg", DIGITS, "MODEL.PRETRAINED", "true", "OUTPUT_DIR", str(out)],
                 env=dict(run_tool.__globals__["env"](), HF_HOME=str(tmp_path / "hf"),
                          HF_ENDPOINT=f"http://127.0.0.1:{closed}"))
    assert r.returncode == 2 and "MODEL.CHECKPOINT" in r.stderr and "cannot be reached" in r.stderr
    assert f"{tmp_path / 'hf' / 'hub'}" in r.stderr and "python tools/fetch_weights.py test_resnet" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not out.exists()


def test_unknown_model_is_exit_2(tmp_path):
    r = run_tool("train.py", ["--cfg", DIGITS, "MODEL.NAME", "resnet181", "OUTPUT_DIR", str(tmp_path)])
    assert r.returncode == 2 and "resnet18" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_busy_output_dir_is_refused_and_left_alone(tmp_path):
    from runner.rundir.lock import RunLock

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "epoch": 1}\n')
    lock = RunLock(str(tmp_path))
    lock.acquire()  # as a running job would hold it
    try:
        r = run_tool("train.py", ["--cfg", DIGITS, *TINY, "OUTPUT_DIR", str(tmp_path)])
    finally:
        lock.release()
    assert r.returncode == 2 and "in use by a running job" in r.stderr and f"pid {os.getpid()}" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "epoch": 1}\n'
    assert not (tmp_path / "config.yaml").exists() and not (tmp_path / "checkpoints").exists()


def test_progress_bar_when_asked(synthetic_run):
    _, r = synthetic_run
    assert r.returncode == 0, r.stderr
    assert "4/4" in r.stderr and ("step/s" in r.stderr or "s/step" in r.stderr)
    assert " step 4/4 loss" not in r.stdout  # the bar replaces the plain lines
