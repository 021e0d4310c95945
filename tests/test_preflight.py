"""Mistakes knowable before OUTPUT_DIR is claimed (runner/preflight.py) are said before it: exit 2, one line,
no folder made or locked. Real tools/train.py runs, alone and under torchrun (gloo, 2 processes)."""
from __future__ import annotations

import re
import subprocess

import pytest

from runner import preflight
from runner.config import load_config
from tests.utils import ROOT, TINY, TRAIN, assert_user_error, env, run_tool, torchrun

DIGITS = str(ROOT / "configs" / "digits" / "test_resnet.yaml")
# torchrun's own lines after a worker failed: its log lines, then its traceback and summary
TORCHRUN_LINE = re.compile(r"^[DIWE]\d{4} .*torch/distributed/")


@pytest.mark.parametrize("fraction", [0.2, 0.1, 0.5])
def test_the_digits_sizes_are_those_of_the_data(fraction):
    from runner.data.memory import load_digits_tensors

    cfg, _ = load_config(["DATA.IMG_SIZE", "8", "DATA.VAL_FRACTION", str(fraction)], check_paths=False)
    xt, yt, _, _ = load_digits_tensors(cfg)
    assert preflight.train_split(cfg) == (len(xt), len(set(yt.tolist())))


def test_world_size_from_the_environment():
    assert preflight.world_size({}) == 1 and preflight.world_size({"WORLD_SIZE": "8"}) == 8


def test_too_few_classes_is_said_before_the_claim(tmp_path):
    # said after the claim: OUTPUT_DIR made, locked, with log.txt and a failed run.json
    out = tmp_path / "run"
    r = run_tool("train.py", ["--cfg", DIGITS, *TINY, "MODEL.NUM_CLASSES", "5", "OUTPUT_DIR", str(out)], timeout=60)
    assert_user_error(r, "DATA.NAME digits has 10 classes but MODEL.NUM_CLASSES is 5: set MODEL.NUM_CLASSES 10")
    assert not out.exists()


def test_a_global_batch_larger_than_the_split_is_said_before_the_claim(tmp_path):
    out = tmp_path / "run"
    r = run_tool("train.py", ["--cfg", DIGITS, *TINY, "DATA.BATCH_SIZE", "1000", "TRAIN.ACCUM_STEPS", "2",
                              "OUTPUT_DIR", str(out)], timeout=60)
    assert_user_error(r, "the global batch (DATA.BATCH_SIZE 1000 x 1 process x TRAIN.ACCUM_STEPS 2 = 2000) is "
                         "larger than the training split of DATA.NAME digits (1437 samples)",
                      "DATA.BATCH_SIZE 718 or less")
    assert not out.exists()


@pytest.mark.slow
def test_a_global_batch_larger_than_the_split_under_torchrun(tmp_path):
    # said after the claim, by every rank's data set-up, with the folder made and marked failed
    out = tmp_path / "run"
    r = subprocess.run(torchrun(["--standalone", "--nproc_per_node", "2", TRAIN, "--cfg", DIGITS, *TINY,
                                 "DATA.BATCH_SIZE", "1000", "OUTPUT_DIR", str(out)]),
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env())
    lines = r.stderr.splitlines()
    ours = lines[:next((i for i, line in enumerate(lines) if TORCHRUN_LINE.match(line)), len(lines))]
    assert ours == ["error: the global batch (DATA.BATCH_SIZE 1000 x 2 processes x TRAIN.ACCUM_STEPS 1 = 2000) is "
                    "larger than the training split of DATA.NAME digits (1437 samples), so an epoch would train no "
                    "step: use DATA.BATCH_SIZE 718 or less"], r.stderr[-3000:]
    assert r.returncode != 0 and "exitcode: 2" in r.stderr  # torchrun's summary: the rank's own exit code
    assert not out.exists()
