"""Hostile shard inputs (issue 34): a served index whose shard names would run shell commands or leave DATA.ROOT
is refused before the claim, and the placeholders of a pipe: command are quoted; tools/make_shards.py packs no
file from outside SRC and no file that is not an image; an index that undercounts a shard, and a local shard that
is missing, are refused (the refusals before the claim through the tools' main, in this process)."""
from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from runner.data.shards.index import read_index
from runner.data.shards.stream import Patience, read_shard
from runner.errors import UserError
from tests.data.fixtures import export_digits_jpegs
from tests.data.test_shards import Server, batches, config, make_shards, train_argv, variant
from tests.utils import assert_user_error, run_tool


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> Path:
    """60 digits at 8 px as an image folder (6 a class: 5 train, 1 val)."""
    return export_digits_jpegs(tmp_path_factory.mktemp("trust") / "jpegs", size=8, per_class=6)


@pytest.fixture(scope="module")
def small(jpegs) -> Path:
    """Those digits as 5 train shards of 10 and 1 val shard."""
    return make_shards(jpegs, jpegs.parent / "shards", "--shard-size", "10")


def rename_first(root: Path, split: str, name: str) -> None:
    """Give the first shard of `split`'s index the name `name` in the index only (the file keeps its own)."""
    path = root / split / "index.json"
    rows = json.loads(path.read_text())["shards"]
    rows[0][0] = name
    path.write_text(json.dumps({"shards": rows}))


# ---------------------------------------------------------------------------------------------------------
# 1. Shard names: a safe pattern, refused before the claim; pipe: placeholders quoted
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_served_index_cannot_run_a_shell_command(small, tmp_path):
    root, pwned, out = shutil.copytree(small, tmp_path / "shards"), tmp_path / "PWNED", tmp_path / "out"
    rename_first(root, "train", f"train-000000.tar $(touch {pwned})")
    srv = Server(root, tmp_path / "served.log")
    try:
        got = run_tool("train.py", train_argv(srv.url, out, "DATA.SHARD_URL", "pipe:curl -s -f {root}/{split}/{name}"),
                       timeout=120)
    finally:
        srv.stop()
    assert not pwned.exists(), "the shard name ran a shell command"
    assert_user_error(got, f"{srv.url}/train/index.json", "$(touch", "letters, digits")
    assert not out.exists()  # refused before the run folder is claimed


UNSAFE = ["train-000000.tar;id", "a b.tar", "../val/val-000000.tar", "sub/../../x.tar", "/etc/passwd",
          "-o.tar", "sub/-rf", "x.tar\n", "", ".", "sub//x.tar", "x`id`.tar", "sub/"]


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_shard_names_are_refused(small, tmp_path, name):
    root = shutil.copytree(small, tmp_path / "shards")
    cfg = config(str(root))
    rename_first(root, "val", name)
    with pytest.raises(UserError) as e:
        read_index(cfg, "val")
    assert str(root / "val" / "index.json") in str(e.value) and repr(name) in str(e.value)
    assert "\n" not in str(e.value)


def test_sub_folders_and_usual_names_are_kept(small, tmp_path):
    root = shutil.copytree(small, tmp_path / "shards")
    cfg = config(str(root))
    rename_first(root, "val", "part_1/val-000000.v2.tar")
    assert read_index(cfg, "val").urls == [f"{root}/val/part_1/val-000000.v2.tar"]


def test_pipe_placeholders_are_one_shell_word_each(small, tmp_path):
    odd = shutil.copytree(small, tmp_path / "my shards $HOME")  # a space and a $: literal, not for the shell
    local = batches(config(str(small)), n=2)
    piped = batches(config(str(odd), "DATA.SHARD_URL", "pipe:cat {root}/{split}/{name}", "DATA.SHARD_RETRIES", "1"),
                    n=2)
    for (x, y), (xp, yp) in zip(local, piped, strict=True):
        assert torch.equal(x, xp) and torch.equal(y, yp)


# ---------------------------------------------------------------------------------------------------------
# 2. tools/make_shards.py: nothing from outside SRC, nothing that is not an image
# ---------------------------------------------------------------------------------------------------------
def members(dst: Path) -> dict[str, bytes]:
    """Every member of every shard under dst (a shards folder or one split's), by name."""
    out = {}
    for path in sorted(dst.glob("*/*.tar")) + sorted(dst.glob("*.tar")):
        with tarfile.open(path) as tar:
            out.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})
    return out


@pytest.mark.parametrize("target", ["secret", "image"])
def test_make_shards_refuses_a_link_out_of_src(jpegs, tmp_path, target, in_process):
    src = shutil.copytree(jpegs, tmp_path / "src")
    outside = tmp_path / "outside.jpg"
    if target == "secret":  # what a link to /etc/shadow would pack
        outside.write_bytes(b"root:$6$not-a-real-hash:19000:0:99999:7:::\n")
    else:  # a good image: refused for where it is, not for what it is
        shutil.copy(next((jpegs / "train" / "1").iterdir()), outside)
    link = src / "train" / "0" / "x.jpg"
    link.symlink_to(outside)
    dst = tmp_path / "dst"
    got = in_process("make_shards.py", [str(src), str(dst)])
    assert_user_error(got, str(link), str(outside), "outside")
    assert not dst.exists()


def test_make_shards_packs_a_link_inside_src(jpegs, tmp_path):
    src = shutil.copytree(jpegs, tmp_path / "src")
    first = sorted((src / "train" / "1").iterdir())[0]
    (src / "train" / "0" / "linked.jpg").symlink_to(os.path.relpath(first, src / "train" / "0"))
    dst = make_shards(src, tmp_path / "dst")
    packed = [data for name, data in members(dst).items() if name.endswith("_0_linked.jpg")]
    assert packed == [first.read_bytes()]


def test_make_shards_skips_files_that_are_not_images(jpegs, tmp_path, in_process):
    src = shutil.copytree(jpegs, tmp_path / "src")
    (src / "train" / "0" / "notes.jpg").write_text("not an image\n")
    good = sorted((src / "train" / "2").iterdir())[0].read_bytes()
    (src / "train" / "2" / "cut.jpg").write_bytes(good[: len(good) // 2])  # truncated
    dst = tmp_path / "dst"
    got = in_process("make_shards.py", [str(src), str(dst)])
    assert got.returncode == 0, got.stderr
    skipped = [line for line in got.stderr.splitlines() if line.strip()]
    assert len(skipped) == 2 and all(line.startswith("skipped ") for line in skipped), got.stderr
    assert any("notes.jpg" in line for line in skipped) and any("cut.jpg" in line for line in skipped)
    names = members(dst)
    assert not any("notes" in n or "cut" in n for n in names)
    assert json.loads((dst / "train" / "index.json").read_text())["shards"][0][1] == 50  # the 50 good ones
    assert "train: 50 samples" in got.stdout and "2 files skipped" in got.stdout


def test_make_shards_packs_the_images_in_a_class_folders_sub_folders(jpegs, tmp_path):
    """A class whose images lie only in sub-folders (and one nested deeper) is packed with the count the folder
    source trains on, under its own class index (issue 46, item 10: the class was packed empty)."""
    from runner.data.folder import scan_folder
    from tests.data.test_folder import make_cfg

    src = shutil.copytree(jpegs, tmp_path / "src")
    cat = src / "train" / "3"
    files = sorted(cat.iterdir())
    for n, f in enumerate(files):
        sub = cat / ("indoor" if n % 2 else "outdoor/deeper")
        sub.mkdir(parents=True, exist_ok=True)
        f.rename(sub / f.name)
    (cat / ".hidden").mkdir()  # hidden entries are never data, in either tool
    shutil.copy(cat / "indoor" / files[1].name, cat / ".hidden" / "x.jpg")
    dst = make_shards(src, tmp_path / "dst", "--class-order")
    trained = scan_folder(make_cfg(src)).counts
    classes = json.loads((dst / "class_map.json").read_text())
    for split in ("train", "val"):
        labels = [classes[data.decode()] for name, data in members(dst / split).items() if name.endswith(".cls")]
        assert {c: labels.count(c) for c in classes.values()} == trained[split]
    assert trained["train"]["3"] == len(files) == 5


# ---------------------------------------------------------------------------------------------------------
# 3. An index that undercounts a shard; a local shard that is missing
# ---------------------------------------------------------------------------------------------------------
def test_a_shard_longer_than_its_index_is_refused_where_it_ends(small):
    url = str(small / "train" / "train-000000.tar")
    patience = Patience(1, 0)
    assert len(list(read_shard(url, 0, 8, patience))) == 8  # a stream's piece may stop inside a shard
    with pytest.raises(UserError, match="holds more than the 8 samples its index gives"):
        list(read_shard(url, 0, 8, patience, count=8))  # read to what the index says is its end: it is not
    assert len(list(read_shard(url, 3, 10, patience, count=10))) == 7


@pytest.mark.slow
def test_training_on_an_index_that_undercounts_a_shard_is_refused(small, tmp_path):
    root = variant(small, tmp_path / "shards", index={"train-000000.tar": 8})
    got = run_tool("train.py", train_argv(root, tmp_path / "out", "DATA.SHARD_STREAMS", "1", "TRAIN.MAX_STEPS", "0"),
                   timeout=120)
    assert_user_error(got, "train-000000.tar", "holds more than the 8 samples its index gives")


def test_check_data_reports_an_undercounting_index(small, tmp_path, in_process):
    root = variant(small, tmp_path / "shards", index={"train-000000.tar": 8})
    got = in_process("check_data.py", ["--cfg", str(Path(__file__).parents[2] / "configs/digits/resnet18.yaml"),
                                       "DATA.NAME", "shards", "DATA.SHARD_STREAMS", "2", "DATA.ROOT", str(root)])
    assert got.returncode == 2 and "holds more than the 8 samples" in got.stderr, got.stdout + got.stderr


@pytest.mark.parametrize("split, shard", [("train", "train-000003.tar"), ("val", "val-000000.tar")])
def test_a_missing_local_shard_is_refused_before_the_claim(small, tmp_path, split, shard, in_process):
    root = shutil.copytree(small, tmp_path / "shards")
    (root / split / shard).unlink()
    out = tmp_path / "out"
    got = in_process("train.py", train_argv(root, out))
    assert_user_error(got, f"{root / split / 'index.json'}", shard, "does not exist")
    assert not out.exists()
