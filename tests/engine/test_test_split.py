"""DATA.TEST_SPLIT and per-class results (issue 38, item 4): a folder run evaluates best.pth on val and test once at
its end (results.json's test/* and splits, confusion_<split>.png, TensorBoard images), also when killed and resumed;
tools/eval.py --split test on demand gives the same numbers; the key's mistakes are one line."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from runner.config import get_default_config
from runner.data.sources import check_config
from runner.engine.evaluation import evaluate
from runner.engine.splits import class_names, split_entry
from runner.errors import UserError
from runner.rundir.layout import confusion_name
from runner.sinks.figures import confusion_image
from tests.data.fixtures import export_digits_jpegs
from tests.engine.test_resume import DIGITS, RESUMED, Launch
from tests.sweep.test_summary import done, make_run
from tests.utils import TRAIN, assert_user_error, run_tool

FOLDER = ["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.NAME", "folder", "DATA.IMG_SIZE", "16",
          "DATA.BATCH_SIZE", "32", "DATA.NUM_WORKERS", "0", "TRAIN.EPOCHS", "3", "TRAIN.LR", "0.1",
          "AUG.SCALE", "[0.5, 1.0]", "AUG.HFLIP", "0.0", "AUG.COLOR_JITTER", "0.0", "LOG.PERIOD", "1",
          "LOG.PROGRESS", "plain", "CHECKPOINT.PERIOD", "3", "DATA.TEST_SPLIT", "test"]
TEST_LINE = "test with checkpoints/best.pth"


def digits_with_test(root: Path) -> Path:
    """The digits as JPEGs under root/{train,val,test}/<digit>/ (test: another seed's val images, 6 a class)."""
    export_digits_jpegs(root, size=16, per_class=40)
    other = export_digits_jpegs(root.parent / f"{root.name}-other", size=16, per_class=30, seed=1)
    shutil.move(other / "val", root / "test")
    return root


# ---- fast: the pieces and the mistakes ----------------------------------------------------------------------------
def test_in_memory_sources_refuse_a_test_split(in_process):
    for name in ("digits", "synthetic"):
        proc = in_process("train.py", ["--cfg", DIGITS, "DATA.NAME", name, "DATA.TEST_SPLIT", "test"])
        assert_user_error(proc, f"DATA.NAME {name} has no 'test' split", "(command line)")


def test_test_split_mistakes_in_one_line(tmp_path: Path):
    cfg = get_default_config()
    cfg.DATA.NAME, cfg.DATA.ROOT = "folder", str(tmp_path)
    cfg.DATA.TEST_SPLIT = "val"
    with pytest.raises(UserError, match="a split the run trains or validates on"):
        check_config(cfg, {})
    cfg.DATA.TEST_SPLIT = "test"
    with pytest.raises(UserError, match=r"DATA.TEST_SPLIT 'test': .*test is not a folder"):
        check_config(cfg, {})
    (tmp_path / "test").mkdir()
    check_config(cfg, {})


class _Batches:
    """A fixed list of (images, targets) batches with the loader's set_epoch."""

    def __init__(self, batches):
        self.batches = batches

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        pass

    def __iter__(self):
        return iter(self.batches)


def test_confusion_counts_each_image_once():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 4))
    batches = [(torch.randn(n, 3, 2, 2), torch.randint(0, 3, (n,))) for n in (7, 5)]  # class 3: no image
    res = evaluate(model, _Batches(batches), torch.device("cpu"), num_classes=4)
    matrix = res["confusion"]
    assert sum(map(sum, matrix)) == res["count"] == 12 and sum(matrix[3]) == 0
    assert sum(matrix[i][i] for i in range(4)) == round(res["top1"] * 12 / 100)
    entry = split_entry(res, class_names(["a", "b", "c"], 4))
    assert list(entry["per_class"]) == ["a", "b", "c", "3"] and entry["per_class"]["3"] is None
    assert entry["per_class"]["a"] == 100.0 * matrix[0][0] / sum(matrix[0])


def test_confusion_picture():
    img = confusion_image([[5, 1], [0, 7]], ["cat", "dog"], "val: checkpoints/best.pth (step 9), top-1 92.31%")
    assert img.mode == "RGB" and img.width > 56 and img.height > 56


def test_summary_shows_test_top1_when_a_run_has_it(tmp_path: Path):
    from runner.sweep.summary import summarize

    make_run(tmp_path / "a", results=done(90.0))
    assert "test/top1" not in summarize(tmp_path)[0]
    make_run(tmp_path / "b", results=done(91.0, **{"test/top1": 88.5}))
    rows = {Path(r["run"]).name: r for r in summarize(tmp_path)}
    assert rows["b"]["test/top1"] == 88.5 and rows["a"]["test/top1"] is None


# ---- slow: real runs ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(data root, a folder run with DATA.TEST_SPLIT test SIGKILLed in its second epoch and resumed, launches)."""
    data = digits_with_test(tmp_path_factory.mktemp("data") / "digits")
    out, logs = tmp_path_factory.mktemp("run"), tmp_path_factory.mktemp("logs")
    argv = [sys.executable, TRAIN, *FOLDER, "DATA.ROOT", str(data), "OUTPUT_DIR", str(out)]
    launches = [Launch(argv, logs, "killed")]
    try:
        launches[0].wait_step(12)  # epoch 1 is 9 steps (300 images, batch 32): past its evaluation and best.pth
        launches[0].p.send_signal(signal.SIGKILL)
        assert launches[0].finish(60) == -signal.SIGKILL
        launches.append(Launch(argv, logs, "resumed"))
        assert launches[1].finish() == 0, launches[1].stdout[-3000:] + launches[1].stderr
    finally:
        for launch in launches:
            if launch.p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(launch.p.pid, signal.SIGKILL)
    return data, out, launches


@pytest.mark.slow
def test_test_split_evaluated_once_with_best(run):
    data, out, launches = run
    assert RESUMED.search(launches[1].stdout)
    assert TEST_LINE not in launches[0].stdout and launches[1].stdout.count(TEST_LINE) == 1
    assert (out / "log.txt").read_text().count(TEST_LINE) == 1
    res = json.loads((out / "results.json").read_text())
    splits = res["splits"]
    names = [str(i) for i in range(10)]
    assert splits["weights"] == "checkpoints/best.pth" and splits["step"] == res["best/step"]
    assert splits["classes"] == names and res["test/count"] == 60 == splits["test"]["count"]
    assert res["test/top1"] == splits["test"]["top1"] and res["test/top5"] == splits["test"]["top5"]
    assert splits["val"]["top1"] == pytest.approx(res["best/val/top1"])  # best.pth's weights, not the last ones
    for split in ("val", "test"):
        matrix, per_class = splits[split]["confusion"], splits[split]["per_class"]
        assert list(per_class) == names and sum(map(sum, matrix)) == splits[split]["count"]
        assert per_class["7"] == pytest.approx(100.0 * matrix[7][7] / sum(matrix[7]))
        with Image.open(out / confusion_name(split)) as img:
            img.verify()
    assert _event_images(out) == {"confusion/val": 1, "confusion/test": 1}


def _event_images(out: Path) -> dict[str, int]:
    """The number of images of each tag in the run's TensorBoard event files."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer().AddRunsFromDirectory(str(out))
    mux.Reload()
    tags = mux.Runs()["."]["images"]
    return {tag: len(mux.Images(".", tag)) for tag in tags}


@pytest.mark.slow
def test_eval_split_test_on_demand(run):
    data, out, _ = run
    res = json.loads((out / "results.json").read_text())
    proc = run_tool("eval.py", ["--cfg", str(out / "config.yaml"), "MODEL.CHECKPOINT",
                                str(out / "checkpoints" / "best.pth"), "--split", "test"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["test/top1"] == res["test/top1"] and got["test/count"] == 60
    assert got["confusion"] == res["splits"]["test"]["confusion"]
    assert got["per_class"] == res["splits"]["test"]["per_class"]
    missing = run_tool("eval.py", ["--cfg", str(out / "config.yaml"), "MODEL.CHECKPOINT",
                                   str(out / "checkpoints" / "best.pth"), "--split", "holdout"])
    assert_user_error(missing, "missing split folder", "holdout")


def test_shards_test_split(tmp_path: Path):
    from runner.config import load_config
    from runner.data.sources import source
    from runner.distributed import Dist

    data = digits_with_test(tmp_path / "digits")
    made = run_tool("make_shards.py", [str(data), str(tmp_path / "shards"), "--shard-size", "25"])
    assert made.returncode == 0 and "test: 60 samples in 3 shards" in made.stdout, made.stderr
    cfg, _ = load_config(["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.NAME", "shards", "DATA.ROOT",
                          str(tmp_path / "shards"), "DATA.IMG_SIZE", "16", "DATA.NUM_WORKERS", "0",
                          "DATA.TEST_SPLIT", "test"])
    check_config(cfg, {})
    loader = source("shards").build_split(cfg, Dist(0, 1, 0, torch.device("cpu")), "test")
    loader.set_epoch(0, 0)
    targets = torch.cat([y for _, y in loader])
    assert len(targets) == 60 and torch.bincount(targets, minlength=10).tolist() == [6] * 10
    cfg.defrost()
    cfg.DATA.TEST_SPLIT = "holdout"
    with pytest.raises(UserError, match="holdout/index.json does not exist"):
        check_config(cfg, {})


@pytest.mark.slow
def test_val_of_best_is_the_runs_own_evaluation_and_equals_evaluating_best_pth(tmp_path: Path):
    """best.pth's weights were evaluated on val during the run: the end reuses that result (no second pass over
    val) and it is what evaluating best.pth gives."""
    out = tmp_path / "run"
    proc = run_tool("train.py", ["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "TRAIN.EPOCHS",
                                 "3", "TRAIN.LR", "0.1", "DATA.NUM_WORKERS", "0", "OUTPUT_DIR", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    line = f"val with checkpoints/best.pth: top1 {res['best/val/top1']:.2f}"
    assert f"(its evaluation at step {res['best/step']})" in (out / "log.txt").read_text().split(line)[1]
    again = run_tool("eval.py", ["--cfg", str(out / "config.yaml"), "MODEL.CHECKPOINT",
                                 str(out / "checkpoints" / "best.pth"), "--split", "val"])
    assert again.returncode == 0, again.stderr[-3000:]
    got = json.loads(again.stdout.strip().splitlines()[-1])
    assert got["val/top1"] == res["splits"]["val"]["top1"] == res["best/val/top1"]
    assert got["confusion"] == res["splits"]["val"]["confusion"]
    assert got["per_class"] == res["splits"]["val"]["per_class"]
