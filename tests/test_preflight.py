"""Mistakes knowable before OUTPUT_DIR is claimed (runner/preflight.py) are said before it: exit 2, one line,
no folder made or locked. Real tools/train.py runs, alone and under torchrun (gloo, 2 processes)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

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


FOLDER_CHECKS = """
import json, sys
from runner import preflight
from runner.errors import UserError

said = {}
for name, root, classes in json.loads(sys.argv[1]):
    cfg, _ = preflight.load_config(["DATA.NAME", "folder", "DATA.ROOT", root, "MODEL.NUM_CLASSES", classes])
    try:
        preflight.check_before_claim(cfg, 1)
        said[name] = None
    except UserError as e:
        said[name] = str(e)
print(json.dumps({"said": said, "torch": "torch" in sys.modules}))
"""


def image_tree(root, train: list[str], val: list[str], loose: int = 0):
    """DATA.ROOT with train/ and val/ class folders of one (empty) .jpg each, and `loose` images in train/ itself;
    a split of None classes is left out. Nothing here is opened: the names alone are checked."""
    for split, classes in (("train", train), ("val", val)):
        if classes is None:
            continue
        (root / split).mkdir(parents=True)
        for c in classes:
            (root / split / c).mkdir()
            (root / split / c / "a.jpg").write_bytes(b"")
    for i in range(loose):
        (root / "train" / f"{i}.jpg").write_bytes(b"")
    return str(root)


def test_a_folder_trees_mistakes_are_said_before_torch_loads(tmp_path):
    # the class count and a tree without class folders were said by the scan, after the claim and torch (13.8 s)
    cases = [("fine", image_tree(tmp_path / "a", ["x", "y"], ["x", "y"]), "2"),
             ("more outputs", image_tree(tmp_path / "a2", ["x", "y"], ["x", "y"]), "5"),
             ("fewer outputs", image_tree(tmp_path / "b", ["x", "y", "z"], ["x", "y", "z"]), "2"),
             ("loose", image_tree(tmp_path / "c", [], ["x"], loose=3), "1"),
             ("no val", image_tree(tmp_path / "d", ["x"], None), "1"),
             ("differ", image_tree(tmp_path / "e", ["x", "y"], ["x", "w"]), "3")]
    r = subprocess.run([sys.executable, "-c", FOLDER_CHECKS, json.dumps(cases)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, env=env())
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert not got["torch"]
    said = got["said"]
    assert said["fine"] is None and said["more outputs"] is None  # more outputs: the scan's warning, later
    assert said["fewer outputs"] == (f"DATA.ROOT {tmp_path / 'b'} has 3 classes but MODEL.NUM_CLASSES is 2: set "
                                     "MODEL.NUM_CLASSES 3")
    assert said["loose"] == (f"empty split {tmp_path / 'c' / 'train'}: its 3 images lie directly in it; move them "
                             f"into {tmp_path / 'c' / 'train'}/<class>/")
    assert said["no val"] == f"missing split folder {tmp_path / 'd' / 'val'}: expected DATA.ROOT/val/<class>/<images>"
    assert said["differ"] == "class folders differ between train and val: only in train: y; only in val: w"


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
