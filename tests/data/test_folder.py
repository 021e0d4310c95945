"""Folder datasets: scan and check, bad-file budget, decoding, class maps, check_data.py, training with bad files."""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from runner.config import get_default_config
from runner.data import folder, read_class_map, write_class_map
from runner.data.folder import (
    FolderDataset,
    build_folder_datasets,
    build_transform,
    check_budget,
    check_file,
    open_image,
    scan,
    scan_folder,
    timm_transform,
)
from runner.errors import UserError
from tests.data.fixtures import export_digits_jpegs
from tests.utils import ROOT, merge_pairs


def make_cfg(root: Path | str, **overrides) -> object:
    """A frozen default config for DATA.NAME folder at `root`, 32 px, with dotted-key overrides."""
    cfg = get_default_config()
    cfg.DATA.NAME, cfg.DATA.ROOT, cfg.DATA.IMG_SIZE = "folder", str(root) if root else "", 32
    merge_pairs(cfg, [x for key, value in overrides.items() for x in (key.replace("__", "."), value)])
    cfg.freeze()
    return cfg


def write_bad_files(root: Path) -> dict[str, Path]:
    """A truncated JPEG, a zero-byte file and a text file named .jpg in train/3; returns them by kind."""
    noise = np.random.default_rng(0).integers(0, 255, (96, 96, 3), dtype=np.uint8)
    full = root / "full.jpg"
    Image.fromarray(noise).save(full, quality=95)
    data = full.read_bytes()
    full.unlink()
    bad = {"truncated": root / "train/3/truncated.jpg", "empty": root / "train/3/zero.jpg",
           "text": root / "train/3/notes.jpg"}
    bad["truncated"].write_bytes(data[: len(data) * 6 // 10])
    bad["empty"].write_bytes(b"")
    bad["text"].write_text("this is not an image\n")
    return bad


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Digits JPEGs (6 per class) plus three bad files, a hidden class folder and hidden files inside classes."""
    return make_tree(tmp_path)


def make_tree(tmp_path: Path) -> Path:
    """The `tree` fixture's folder, under tmp_path/data."""
    root = export_digits_jpegs(tmp_path / "data", size=32, per_class=6)
    write_bad_files(root)
    hidden = root / "train/.ipynb_checkpoints"
    hidden.mkdir()
    shutil.copy(next((root / "train/0").glob("*.jpg")), hidden / "copy.jpg")
    (root / "train/1/.cache").mkdir()
    (root / "train/1/.cache/junk.jpg").write_bytes(b"")
    (root / "train/2/.hidden.jpg").write_bytes(b"")
    (root / "train/2/readme.txt").write_text("not an image extension: ignored")
    return root


def run_tool(tool: str, *args: str) -> subprocess.CompletedProcess:
    """Run tools/<tool> in a fresh interpreter."""
    return subprocess.run([sys.executable, str(ROOT / "tools" / tool), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def write_yaml(path: Path, root: Path, extra: str = "") -> Path:
    """A folder-dataset config file."""
    path.write_text(f"DATA:\n  NAME: folder\n  ROOT: {root}\n  IMG_SIZE: 32\n{extra}")
    return path


# ---------------------------------------------------------------------------------------------------------
# Scan and check
# ---------------------------------------------------------------------------------------------------------
def test_check_file_reasons(tree: Path):
    reasons = {p.name: check_file(str(p)) for p in (tree / "train/3").iterdir()}
    assert "truncated" in reasons["truncated.jpg"]
    assert "empty" in reasons["zero.jpg"] and "0 bytes" in reasons["zero.jpg"]
    assert "not an image" in reasons["notes.jpg"]
    good = [r for n, r in reasons.items() if n not in ("truncated.jpg", "zero.jpg", "notes.jpg")]
    assert good and all(r is None for r in good)


def test_check_file_accepts_jpeg_with_trailing_bytes(tmp_path: Path):
    p = tmp_path / "tail.jpg"
    Image.new("RGB", (40, 30), (10, 200, 30)).save(p)
    p.write_bytes(p.read_bytes() + b"camera metadata after the end marker")
    assert check_file(str(p)) is None  # no end marker at the tail: a full decode decides, and it decodes


def test_check_file_catches_truncated_png(tmp_path: Path):
    p = tmp_path / "cut.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (64, 64), dtype=np.uint8)).save(p)
    p.write_bytes(p.read_bytes()[:-300])
    assert check_file(str(p)) is not None


def test_scan_sets_bad_files_aside_and_ignores_hidden(tree: Path):
    index = scan_folder(make_cfg(tree))
    assert index.classes == [str(d) for d in range(10)]
    bad = {Path(p).name: r for p, r in index.bad}
    assert set(bad) == {"truncated.jpg", "zero.jpg", "notes.jpg"}
    every = [p for p, _ in index.train + index.val]
    assert not any("/." in p for p in every), "hidden files and folders must be ignored"
    assert not any(Path(p).name in bad for p in every)
    assert index.counts["train"]["3"] == 5 and index.bad_counts["train"]["3"] == 3
    assert index.counts["val"] == {str(d): 1 for d in range(10)}
    assert index.n_bad("train") == 3 and index.n_files("train") == 53 and index.n_bad("val") == 0
    assert all(0 <= t < 10 and Path(p).parent.name == index.classes[t] for p, t in index.train)


def test_scan_without_check_keeps_every_file(tree: Path):
    index = scan_folder(make_cfg(tree, DATA__CHECK=False))
    assert index.bad == [] and not index.checked
    assert len(index.train) == 53


@pytest.mark.parametrize("breakage, expected", [
    ("no_root", "is not a folder"),
    ("no_val", "missing split folder"),
    ("empty_split", "empty split"),
    ("empty_class", "empty class folder"),
    ("class_mismatch", "only in train: extra; only in val: -"),
])
def test_structural_problems_are_one_clear_error(tree: Path, breakage: str, expected: str):
    root = tree
    if breakage == "no_root":
        root = tree / "nowhere"
    elif breakage == "no_val":
        shutil.rmtree(tree / "val")
    elif breakage == "empty_split":
        for f in (tree / "val").rglob("*.jpg"):
            f.unlink()
    elif breakage == "empty_class":
        for f in (tree / "train/7").glob("*.jpg"):
            f.unlink()
    elif breakage == "class_mismatch":
        (tree / "train/extra").mkdir()
        shutil.copy(next((tree / "train/0").glob("*.jpg")), tree / "train/extra/a.jpg")
    with pytest.raises(UserError) as e:
        scan_folder(make_cfg(root))
    msg = str(e.value)
    assert expected in msg and "\n" not in msg
    if breakage == "empty_class":
        assert "train: 7 " in msg


def test_empty_data_root_is_an_error():
    with pytest.raises(UserError, match="DATA.ROOT is empty"):
        scan_folder(make_cfg(""))


@pytest.mark.parametrize("below_s", [1.0, 0.0])
def test_the_check_gives_each_files_reason_in_order_in_one_thread_or_on_a_pool(tree: Path, monkeypatch, below_s):
    """Fast files are checked in this thread; a slow chunk (below_s 0: every chunk) hands the rest to a pool."""
    paths = sorted(str(p) for p in tree.rglob("*.*") if "/." not in str(p))
    monkeypatch.setattr(scan, "SERIAL_CHUNK", 4)
    monkeypatch.setattr(scan, "SERIAL_BELOW_S", below_s)
    assert scan._check_all(paths) == [check_file(p) for p in paths]
    assert sum(r is not None for r in scan._check_all(paths)) >= 3


def test_scan_is_parallel_and_fast_enough(tmp_path: Path):
    root = export_digits_jpegs(tmp_path / "d", size=32)  # 1,797 files
    import time

    t0 = time.perf_counter()
    index = scan_folder(make_cfg(root))
    assert len(index.train) + len(index.val) == 1797 and not index.bad
    assert time.perf_counter() - t0 < 20


# ---------------------------------------------------------------------------------------------------------
# Budget
# ---------------------------------------------------------------------------------------------------------
def test_budget_over_raises_with_count_share_and_tool(tree: Path):
    cfg = make_cfg(tree)  # 3 of 53 train files bad = 5.7% > 1%
    with pytest.raises(UserError) as e:
        check_budget(scan_folder(cfg), cfg)
    msg = str(e.value)
    assert "3 of 53 train" in msg and "5.66%" in msg and "1.00%" in msg and "check_data.py" in msg


def test_budget_under_warns_once_per_bad_file(tree: Path, caplog):
    cfg = make_cfg(tree, DATA__BAD_FILE_BUDGET=0.1)
    with caplog.at_level(logging.WARNING, logger="runner"):
        check_budget(scan_folder(cfg), cfg)
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3
    for name in ("truncated.jpg", "zero.jpg", "notes.jpg"):
        assert sum(name in w for w in warned) == 1


def test_budget_warnings_are_capped(tmp_path: Path, caplog):
    root = export_digits_jpegs(tmp_path / "d", size=16, per_class=4)
    for k in range(25):
        (root / "train/0" / f"bad{k:02d}.jpg").write_bytes(b"")
    cfg = make_cfg(root, DATA__BAD_FILE_BUDGET=0.9)
    with caplog.at_level(logging.WARNING, logger="runner"):
        check_budget(scan_folder(cfg), cfg)
    assert len(caplog.records) == folder.MAX_WARNINGS + 1
    assert "5 more" in caplog.records[-1].getMessage()


# ---------------------------------------------------------------------------------------------------------
# Dataset and transforms
# ---------------------------------------------------------------------------------------------------------
def test_datasets_give_normalized_tensors_and_targets(tree: Path):
    cfg = make_cfg(tree, DATA__BAD_FILE_BUDGET=0.1)
    train, val, names = build_folder_datasets(cfg)
    assert names == [str(d) for d in range(10)] and len(train) == 50 and len(val) == 10
    x, y = train[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and isinstance(y, int)
    xv, yv = val[3]
    assert xv.shape == (3, 32, 32) and yv == 3
    assert -3 < float(xv.min()) and float(xv.max()) < 3 and float(xv.std()) > 0.1


def test_num_classes_must_match_the_folders(tree: Path):
    with pytest.raises(UserError, match="has 10 classes but MODEL.NUM_CLASSES is 7"):
        build_folder_datasets(make_cfg(tree, DATA__BAD_FILE_BUDGET=0.1, MODEL__NUM_CLASSES=7))


def test_fast_eval_transform_matches_timm(tmp_path: Path):
    """Same size, same values within a few levels as timm's transform on a fully decoded PIL image."""
    rng = np.random.default_rng(0)
    smooth = np.kron(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8), np.ones((16, 16, 1), np.uint8))
    p = tmp_path / "big.jpg"
    Image.fromarray(smooth).save(p, quality=95)  # 960x640: large enough for reduced decoding and torch resize
    for size in (32, 224):
        cfg = make_cfg(tmp_path, DATA__IMG_SIZE=size)
        ref = timm_transform(cfg, False)(Image.open(p).convert("RGB"))
        ours = build_transform(cfg, False)(open_image(str(p)))
        assert ours.shape == ref.shape == (3, size, size)
        levels = (ours - ref).abs() * 0.229 * 255
        assert float(levels.mean()) < 2.0, size


def test_train_transform_keeps_timm_steps_and_size(tmp_path: Path):
    cfg = make_cfg(tmp_path, AUG__AUTO_AUGMENT="rand-m9-mstd0.5-inc1", AUG__REPROB=0.5)
    t = build_transform(cfg, True)
    names = [type(s).__name__ for s in t.transforms]
    assert names[0] == "FastRandomResizedCrop" and "RandAugment" in names and names[-1] == "RandomErasing"
    p = tmp_path / "a.jpg"
    Image.new("RGB", (300, 200), (200, 10, 10)).save(p)
    assert t(open_image(str(p))).shape == (3, 32, 32)


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "I;16", "CMYK"])
def test_any_image_mode_decodes_to_rgb(tmp_path: Path, mode: str):
    arr = np.random.default_rng(0).integers(0, 255, (50, 70, 4), dtype=np.uint8)
    img = Image.fromarray(arr, "RGBA")
    if mode == "I;16":
        img = Image.fromarray(arr[:, :, 0].astype(np.uint16) * 257)
    elif mode == "P":
        img = img.convert("RGB").convert("P")
    else:
        img = img.convert(mode)
    p = tmp_path / ("x.jpg" if mode in ("L", "CMYK") else "x.png")
    img.save(p)
    for train in (True, False):
        assert build_transform(make_cfg(tmp_path), train)(open_image(str(p))).shape == (3, 32, 32)


def test_file_that_goes_bad_is_skipped_and_counted(tree: Path, caplog):
    cfg = make_cfg(tree, DATA__BAD_FILE_BUDGET=0.1)
    index = scan_folder(cfg)
    path, _ = index.val[4]
    Path(path).write_bytes(b"")  # went bad after the scan
    ds = FolderDataset(index.val, build_transform(cfg, False), budget=0.5, split="val")
    with caplog.at_level(logging.WARNING, logger="runner"):
        x, y = ds[4]
        assert y == index.val[5][1]  # the next sample, deterministically
        ds[4]
    assert ds.failures() == 1
    assert sum(path in r.getMessage() for r in caplog.records) == 1  # warned once per file
    strict = FolderDataset(index.val, build_transform(cfg, False), budget=0.05, split="val")
    with pytest.raises(UserError) as e:
        strict[4]
    assert "1 of 10 val" in str(e.value) and "DATA.BAD_FILE_BUDGET" in str(e.value) and path in str(e.value)


def test_failures_are_counted_across_loader_workers(tree: Path):
    cfg = make_cfg(tree, DATA__BAD_FILE_BUDGET=0.1)
    index = scan_folder(cfg)
    for path, _ in index.train[:4]:
        Path(path).write_bytes(b"not a jpeg any more")
    ds = FolderDataset(index.train, build_transform(cfg, True), budget=0.2, known_bad=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2)
    assert sum(len(y) for _, y in loader) == 50
    assert ds.failures() == 4  # seen from the main process: the count lives in shared memory
    over = FolderDataset(index.train, build_transform(cfg, True), budget=0.1, known_bad=3)
    with pytest.raises(UserError, match="6 of 53 train image files are unreadable"):  # 6 > 10% of 53
        list(torch.utils.data.DataLoader(over, batch_size=5, num_workers=2))


# ---------------------------------------------------------------------------------------------------------
# Class map and digits export
# ---------------------------------------------------------------------------------------------------------
def test_class_map_round_trip(tmp_path: Path):
    path = write_class_map(tmp_path / "run", ["cat", "dog", "zebra"])
    assert json.loads(path.read_text()) == {"0": "cat", "1": "dog", "2": "zebra"}
    assert read_class_map(path) == ["cat", "dog", "zebra"]
    path.write_text('{"0": "cat", "2": "zebra"}')
    with pytest.raises(UserError, match="not a readable class map"):
        read_class_map(path)


def test_export_digits_is_seeded_rgb_jpeg(tmp_path: Path):
    a = export_digits_jpegs(tmp_path / "a", size=24, per_class=5)
    b = export_digits_jpegs(tmp_path / "b", size=24, per_class=5)
    files_a = sorted(p.relative_to(a) for p in a.rglob("*.jpg"))
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*.jpg")) and len(files_a) == 50
    assert len(list((a / "val").rglob("*.jpg"))) == 10
    with Image.open(a / files_a[0]) as im:
        assert im.format == "JPEG" and im.mode == "RGB" and im.size == (24, 24)


# ---------------------------------------------------------------------------------------------------------
# tools/check_data.py
# ---------------------------------------------------------------------------------------------------------
def test_check_data_lists_every_bad_file(tree: Path, tmp_path: Path):
    res = run_tool("check_data.py", "--cfg", str(write_yaml(tmp_path / "c.yaml", tree)))
    assert res.returncode == 1, res.stderr
    for name, reason in (("truncated.jpg", "truncated"), ("zero.jpg", "0 bytes"), ("notes.jpg", "not an image")):
        line = next(ln for ln in res.stdout.splitlines() if name in ln)
        assert reason in line
    assert "5 (+3 bad)" in res.stdout and "3 of 53" in res.stdout and ".ipynb" not in res.stdout


def test_check_data_clean_tree_exits_0(tmp_path: Path):
    root = export_digits_jpegs(tmp_path / "d", size=16, per_class=3)
    res = run_tool("check_data.py", "--cfg", str(write_yaml(tmp_path / "c.yaml", root)), "DATA.CHECK", "False")
    assert res.returncode == 0, res.stderr
    assert "all files are readable" in res.stdout


def test_check_data_structural_problem_exits_2_with_one_line(tree: Path, tmp_path: Path):
    for f in (tree / "val/4").glob("*.jpg"):
        f.unlink()
    res = run_tool("check_data.py", "--cfg", str(write_yaml(tmp_path / "c.yaml", tree)))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "empty class folder" in res.stderr and "4" in res.stderr
    assert "notes.jpg" in res.stdout  # bad files are still listed alongside
    missing = run_tool("check_data.py", "--cfg", str(write_yaml(tmp_path / "m.yaml", tree / "nope")))
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0 and "nope" in missing.stderr


def tree_with_test_split(tmp_path: Path) -> tuple[Path, str]:
    """Digits (3 a class) with a test split copied from val, two of train/3's bad files moved into test/3, and a
    config reading it as DATA.TEST_SPLIT."""
    root = export_digits_jpegs(tmp_path / "d", size=16, per_class=3)
    shutil.copytree(root / "val", root / "test")
    write_bad_files(root)
    for name in ("truncated.jpg", "notes.jpg"):
        (root / "train/3" / name).rename(root / "test/3" / name)
    return root, str(write_yaml(tmp_path / "c.yaml", root, "  TEST_SPLIT: test\n"))


def test_check_data_counts_and_lists_the_test_splits_bad_files(tmp_path: Path, in_process):
    """DATA.TEST_SPLIT is checked like train and val (issue 46, item 12): its column of counts, its bad files."""
    root, cfg = tree_with_test_split(tmp_path)
    res = in_process("check_data.py", ["--cfg", cfg])
    assert res.returncode == 1, res.stderr
    header = next(ln for ln in res.stdout.splitlines() if ln.startswith("class"))
    assert header.split() == ["class", "train", "val", "test"]
    assert "test: 2 of 12 files bad" in res.stdout and "test/3/notes.jpg" in res.stdout
    assert "test/3/truncated.jpg" in res.stdout
    total = next(ln for ln in res.stdout.splitlines() if ln.startswith("total"))
    assert total.split()[1:] == ["20", "(+1", "bad)", "10", "10", "(+2", "bad)"]


def test_check_data_refuses_a_test_split_the_run_refuses(tmp_path: Path, in_process):
    """A test class folder train lacks, or a missing test folder: a structural problem, exit 2, one line."""
    root, cfg = tree_with_test_split(tmp_path)
    (root / "test/zebra").mkdir()
    shutil.copy(next((root / "test/0").glob("*.jpg")), root / "test/zebra/z.jpg")
    unknown = in_process("check_data.py", ["--cfg", cfg])
    assert unknown.returncode == 2 and unknown.stderr.strip().count("\n") == 0, unknown.stderr
    assert "zebra" in unknown.stderr and "train/3/zero.jpg" in unknown.stdout  # train's report is still made
    shutil.rmtree(root / "test")
    missing = in_process("check_data.py", ["--cfg", cfg])
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0, missing.stderr
    assert "TEST_SPLIT" in missing.stderr and str(root / "test") in missing.stderr


def test_check_data_help_states_exit_codes(in_process):
    res = in_process("check_data.py", ["--help"])
    assert res.returncode == 0 and "1 bad files found" in res.stdout and "2 structural" in res.stdout


# ---------------------------------------------------------------------------------------------------------
# Training on a folder with bad files (tools/train.py)
# ---------------------------------------------------------------------------------------------------------
TINY = ["MODEL.NAME", "resnet10t", "TRAIN.EPOCHS", "1", "DATA.BATCH_SIZE", "16", "DATA.NUM_WORKERS", "1",
        "LOG.TENSORBOARD", "False", "AUG.COLOR_JITTER", "0.0"]


def test_training_with_bad_files_under_budget_completes(tree: Path, tmp_path: Path):
    out = tmp_path / "run"
    res = run_tool("train.py", "--cfg", str(write_yaml(tmp_path / "c.yaml", tree)), "OUTPUT_DIR", str(out),
                   "DATA.BAD_FILE_BUDGET", "0.1", *TINY)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((out / "results.json").read_text())["status"] == "done"
    assert read_class_map(out / "class_map.json") == [str(d) for d in range(10)]
    log = res.stdout + res.stderr
    for name in ("truncated.jpg", "zero.jpg", "notes.jpg"):
        assert name in log


@pytest.mark.slow
def test_training_says_what_the_scan_found_and_that_an_inherited_shift_is_ignored(tree: Path, tmp_path: Path):
    """One line per split with the counts, and one warning for AUG.SHIFT 2 inherited from the digits config."""
    cfg = write_yaml(tmp_path / "c.yaml", tree, f"_BASE_: {ROOT / 'configs' / 'digits' / 'test_resnet.yaml'}\n")
    res = run_tool("train.py", "--cfg", str(cfg), "OUTPUT_DIR", str(tmp_path / "run"), "DATA.BAD_FILE_BUDGET", "0.1",
                   "TRAIN.MAX_STEPS", "2", *TINY)
    assert res.returncode == 0, res.stderr[-2000:]
    assert " I train: 50 images in 10 classes (3 skipped)" in res.stdout, res.stdout[-3000:]
    assert " I val: 10 images in 10 classes (0 skipped)" in res.stdout
    assert res.stdout.count(" W DATA.NAME folder ignores AUG.SHIFT 2: it shifts in-memory images only") == 1


def test_training_over_budget_stops_with_exit_2(tree: Path, tmp_path: Path):
    res = run_tool("train.py", "--cfg", str(write_yaml(tmp_path / "c.yaml", tree)), "OUTPUT_DIR",
                   str(tmp_path / "run"), *TINY)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "DATA.BAD_FILE_BUDGET" in res.stderr and "Traceback" not in res.stderr


@pytest.fixture(scope="module")
def run_time_failure(tmp_path_factory) -> subprocess.CompletedProcess:
    """DATA.CHECK False: the bad files are only met by the loader workers, during training (one run, read by the
    tests below)."""
    tmp_path = tmp_path_factory.mktemp("run_time_failure")
    return run_tool("train.py", "--cfg", str(write_yaml(tmp_path / "c.yaml", make_tree(tmp_path))), "OUTPUT_DIR",
                    str(tmp_path / "run"), "DATA.CHECK", "False", *TINY)


def test_training_stops_when_files_go_bad_past_budget_at_run_time(run_time_failure):
    assert run_time_failure.returncode == 2, run_time_failure.stderr[-2000:]
    assert "DATA.BAD_FILE_BUDGET" in run_time_failure.stderr


def test_run_time_budget_error_is_one_line(run_time_failure):
    assert run_time_failure.stderr.strip().count("\n") == 0, run_time_failure.stderr


def test_digits_export_has_the_in_memory_val_split(tmp_path):
    """The JPEG export of all digits holds out exactly the 360 images DATA.NAME digits validates on."""
    from runner.data.memory import read_digits, stratified_split

    root = export_digits_jpegs(tmp_path / "d", size=8)
    _, labels = read_digits()
    val = sorted(int(p.stem) for p in (root / "val").rglob("*.jpg"))
    assert val == stratified_split(labels, 0.2)[1].tolist() and len(val) == 360
    assert len(list((root / "train").rglob("*.jpg"))) == 1797 - 360
