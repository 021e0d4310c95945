"""Image-folder mistakes end in one line at setup, through the tools' main in this process (class counts,
AUG.AUTO_AUGMENT, MODEL.IN_CHANS, loose files); every AUG.REMODE and AUG.INTERPOLATION value works; symbolic-link
loops and doubles are counted once."""
from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from runner.config import get_default_config
from runner.data.folder import (
    build_folder_datasets,
    build_transform,
    check_auto_augment,
    open_image,
    scan_folder,
)
from runner.data.folder.dataset import posterize
from runner.errors import UserError
from tests.data.fixtures import export_digits_jpegs
from tests.utils import ROOT, TINY, assert_user_error, merge_pairs, run_tool


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    """An image folder of 3 classes (digits 0, 1, 2; 4 images each, 1 of them in val)."""
    root = export_digits_jpegs(tmp_path_factory.mktemp("three") / "data", size=32, per_class=4)
    for split in ("train", "val"):
        for c in range(3, 10):
            shutil.rmtree(root / split / str(c))
    return root


def folder_args(root: Path, *pairs: str) -> list[str]:
    """TINY on an image folder, 3 classes, one step."""
    return [*TINY, "DATA.NAME", "folder", "DATA.ROOT", str(root), "MODEL.NUM_CLASSES", "3", "DATA.BATCH_SIZE", "4",
            "TRAIN.MAX_STEPS", "1", *pairs]


def folder_cfg(root: Path, *pairs: str):
    """A frozen config for the folder at root."""
    cfg = get_default_config()
    merge_pairs(cfg, folder_args(root, *pairs))
    cfg.freeze()
    return cfg


# ---- 1. class counts ---------------------------------------------------------------------------------------
def test_fewer_outputs_than_folders_is_refused(three: Path, tmp_path: Path, in_process):
    proc = in_process("train.py", folder_args(three, "MODEL.NUM_CLASSES", "2", "OUTPUT_DIR", str(tmp_path / "o")))
    assert_user_error(proc, f"DATA.ROOT {three} has 3 classes but MODEL.NUM_CLASSES is 2", "set MODEL.NUM_CLASSES 3")
    assert not (tmp_path / "o").exists()  # said before the claim (runner/data/folder/source.py: known_split)


def test_more_outputs_than_folders_trains_with_a_warning(three: Path, caplog):
    with caplog.at_level(logging.WARNING, logger="runner"):
        _, _, names = build_folder_datasets(folder_cfg(three, "MODEL.NUM_CLASSES", "5"))
    assert names == ["0", "1", "2"] and "outputs 3..4 never get a target" in caplog.text


def test_check_data_compares_the_classes_with_num_classes(three: Path, in_process):
    fewer = in_process("check_data.py", ["DATA.NAME", "folder", "DATA.ROOT", str(three), "MODEL.NUM_CLASSES", "2"])
    assert_user_error(fewer, "has 3 classes but MODEL.NUM_CLASSES is 2")
    more = in_process("check_data.py", ["DATA.NAME", "folder", "DATA.ROOT", str(three), "MODEL.NUM_CLASSES", "5"])
    assert more.returncode == 0, more.stderr
    assert "note: MODEL.NUM_CLASSES is 5 but DATA.ROOT has 3 classes" in more.stdout


# ---- 3. augmentation settings -------------------------------------------------------------------------------
MALFORMED = [("rand-mX", "section 'mX' is not one rand takes"), ("foo", "unknown policy 'foo'"),
             ("rand-m9-zzz", "section 'zzz'")]


def test_malformed_auto_augment_is_refused_at_setup(three: Path, tmp_path: Path):
    # after the claim (the transforms are built with the data): a process of its own, which the failure ends
    value, fragment = MALFORMED[0]
    proc = run_tool("train.py", folder_args(three, "AUG.AUTO_AUGMENT", value, "OUTPUT_DIR", str(tmp_path / "o")))
    line = assert_user_error(proc, f"AUG.AUTO_AUGMENT '{value}'", fragment, "timm's syntax: rand[-m<int>]")
    assert "augmix" in line and "original|originalr|v0|v0r|3a" in line
    assert line == f"error: {refusal(three, value)}"  # the transform's own line, as the one below checks the others


@pytest.mark.parametrize("value, fragment", MALFORMED)
def test_malformed_auto_augment_line(three: Path, value: str, fragment: str):
    line = refusal(three, value)
    for part in (f"AUG.AUTO_AUGMENT '{value}'", fragment, "timm's syntax: rand[-m<int>]", "augmix",
                 "original|originalr|v0|v0r|3a"):
        assert part in line and "\n" not in line


def refusal(root: Path, value: str) -> str:
    """The one line that building the training transform with AUG.AUTO_AUGMENT `value` refuses."""
    with pytest.raises(UserError) as refused:
        build_transform(folder_cfg(root, "AUG.AUTO_AUGMENT", value), is_training=True)
    return str(refused.value)


def test_check_data_refuses_the_transform_settings_training_refuses(three: Path, in_process):
    proc = in_process("check_data.py", ["DATA.NAME", "folder", "DATA.ROOT", str(three), "MODEL.NUM_CLASSES", "3",
                                      "AUG.AUTO_AUGMENT", "rand-mX"])
    assert_user_error(proc, "AUG.AUTO_AUGMENT 'rand-mX': section 'mX'")


MISREAD = ["randaugment", "rand-m9-n", "rand-m1.5", "augmix-x3", "v1", "v0-m3", "rand-tfoo", "rand--m9"]
VALID = ["rand", "rand-m9-mstd0.5-inc1", "rand-m9-n3-mstd0.5", "rand-mstd1-tweights", "rand-m7-mmax10-p0.5",
         "augmix-m5-w4-d2", "augmix-a1.0-b1-mstd0.5", "original", "originalr-mstd0.5", "v0", "v0r", "3a"]


def test_auto_augment_strings_timm_would_misread_are_refused_and_valid_ones_run(three: Path):
    for value in MISREAD:  # timm asserts on some, silently skips a section in the others
        with pytest.raises(UserError, match=f"AUG.AUTO_AUGMENT '{value}'"):
            build_transform(folder_cfg(three, "AUG.AUTO_AUGMENT", value), is_training=True)
    image = str(next((three / "train" / "0").glob("*.jpg")))
    for value in VALID:
        check_auto_augment(value)
        x = build_transform(folder_cfg(three, "AUG.AUTO_AUGMENT", value), is_training=True)(open_image(image))
        assert x.shape == (3, 16, 16)


@pytest.mark.parametrize("value", ["v0", "rand-mstd1-tweights", "augmix-m5-w4-d2-mstd1"])
def test_posterize_down_to_zero_bits_gives_black_not_a_bad_file(three: Path, value: str):
    """timm's posterize keeps 0 bits at some magnitudes ('v0': about 3% of images); Pillow 13 raises a
    ValueError there, which the dataset would count against DATA.BAD_FILE_BUDGET as an unreadable file."""
    transform = build_transform(folder_cfg(three, "AUG.AUTO_AUGMENT", value), is_training=True)
    image = str(next((three / "train" / "0").glob("*.jpg")))
    for seed in range(300):
        random.seed(seed)
        np.random.seed(seed)
        assert transform(open_image(image)).shape == (3, 16, 16)
    gray = Image.new("RGB", (4, 4), (200, 100, 50))
    assert posterize(gray, 0).getextrema() == ((0, 0),) * 3 and posterize(gray, 8) is gray


@pytest.mark.parametrize("remode", ["const", "rand", "pixel"])
def test_every_remode_and_interpolation_runs_in_train_and_eval(three: Path, remode: str, tmp_path: Path):
    big = tmp_path / "big.jpg"  # large enough for the torch resize path too
    Image.open(next((three / "train" / "0").glob("*.jpg"))).resize((640, 480)).save(big)
    for interpolation in ("bilinear", "bicubic", "nearest", "random"):  # random: timm's eval resize has none
        cfg = folder_cfg(three, "AUG.REMODE", remode, "AUG.INTERPOLATION", interpolation, "AUG.REPROB", "1.0")
        for training in (True, False):
            transform = build_transform(cfg, is_training=training)
            for path in (big, next((three / "val" / "1").glob("*.jpg"))):
                x = transform(open_image(str(path)))
                assert x.shape == (3, 16, 16) and x.isfinite().all(), (interpolation, training)


# ---- 5. input channels ----------------------------------------------------------------------------------------
def test_in_chans_image_files_cannot_give_is_refused(three: Path, tmp_path: Path):
    proc = run_tool("train.py", folder_args(three, "MODEL.IN_CHANS", "4", "DATA.MEAN", "[0.5, 0.5, 0.5, 0.5]",
                                            "DATA.STD", "[0.25, 0.25, 0.25, 0.25]", "OUTPUT_DIR", str(tmp_path / "o")))
    assert_user_error(proc, "MODEL.IN_CHANS 4", "grayscale (1 channel) or RGB (3 channels)", "set MODEL.IN_CHANS 3")


# ---- 8. symbolic links -------------------------------------------------------------------------------------------
@pytest.fixture
def linked(three: Path, tmp_path: Path) -> Path:
    """The 3-class folder with link loops (a class linking itself and, twice, its split) and doubles (a folder
    linked twice inside a class, a file linked beside itself, class 0 linked into class 2)."""
    root = tmp_path / "linked"
    shutil.copytree(three, root)
    train = root / "train"
    os.symlink(".", train / "0" / "self")
    os.symlink("..", train / "1" / "up")
    os.symlink("..", train / "1" / "up_again")  # two loops: the old os.walk branched 2**40 ways
    (train / "2" / "more").mkdir()
    os.symlink("../../0", train / "2" / "more" / "zero_a")
    os.symlink("../../0", train / "2" / "more" / "zero_b")
    first = sorted((train / "1").glob("*.jpg"))[0]
    os.symlink(first.name, train / "1" / "same_image.jpg")
    return root


def test_links_are_followed_once_without_loops(linked: Path):
    index = scan_folder(folder_cfg(linked), check=False)
    counts = index.counts["train"]
    # 0: its own 3; 1: its own 3, plus the 3 of 0 and the 3 of 2 (+3 of 0 through 2) reached through 'up'
    # once; 2: its own 3 plus 0's through two links, once
    assert counts["0"] == 3 and counts["2"] == 6
    paths_1 = [p for p, c in index.train if c == 1]
    real_1 = [os.path.realpath(p) for p in paths_1]
    assert len(real_1) == len(set(real_1)) == counts["1"] == 9
    assert not any("same_image" in p for p in paths_1)
    assert index.notes and "under more than one class folder" in index.notes[0]


def test_check_data_does_not_hang_on_link_loops(linked: Path, in_process):
    proc = in_process("check_data.py", ["DATA.NAME", "folder", "DATA.ROOT", str(linked), "MODEL.NUM_CLASSES", "3"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "note:" in proc.stdout and "each is a sample of every class it is under" in proc.stdout
    total = next(line for line in proc.stdout.splitlines() if line.startswith("total"))
    assert total.split()[1:] == ["18", "3"]


# ---- 9. relatives -------------------------------------------------------------------------------------------------
def test_images_directly_in_the_split_folder_are_refused(tmp_path: Path, in_process):
    root = tmp_path / "flat"
    for split in ("train", "val"):
        (root / split).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8)).save(root / split / f"{i}.jpg")
    proc = in_process("train.py", folder_args(root, "OUTPUT_DIR", str(tmp_path / "o")))
    assert_user_error(proc, f"empty split {root / 'train'}: its 3 images lie directly in it",
                      f"move them into {root / 'train'}/<class>/")



def test_check_data_on_a_config_without_a_folder_says_so(in_process):
    # it said "DATA.ROOT is empty: DATA.NAME folder needs DATA.ROOT", naming a DATA.NAME the config does not have
    r = in_process("check_data.py", ["--cfg", str(ROOT / "configs" / "digits" / "resnet18.yaml")])
    assert_user_error(r, "checks image folders", "DATA.NAME digits")
