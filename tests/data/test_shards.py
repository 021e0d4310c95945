"""DATA.NAME shards: the order (layout-free, each sample once, each rank its own streams), the loaders over local
files, HTTP (http.server on 127.0.0.1, bytes counted) and pipe:cat, exact resumes through tools/train.py and
torchrun, the class-ordered worst case against the folder path, and bad inputs (exit 2, one line)."""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from itertools import islice
from pathlib import Path

import pytest
import torch

from runner.config import load_config
from runner.data.loaders import rank_sequence
from runner.data.shards import build_shards
from runner.data.shards.order import EpochPlan
from runner.distributed import Dist
from tests.data.fixtures import export_digits_jpegs
from tests.engine.test_resume import Launch, assert_same_run, train_rows
from tests.utils import ROOT, TRAIN, assert_user_error, env, run_tool, torchrun

CPU = torch.device("cpu")
DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")


def make_shards(src: Path, dst: Path, *extra: str) -> Path:
    """tools/make_shards.py SRC DST with `extra` arguments; returns DST."""
    done = run_tool("make_shards.py", [str(src), str(dst), *extra], timeout=120)
    assert done.returncode == 0, done.stderr
    return dst


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> tuple[Path, Path]:
    """The digits as a 16 px JPEG folder and as shards of 100 samples (mixed classes)."""
    base = tmp_path_factory.mktemp("shards")
    jpegs = export_digits_jpegs(base / "jpegs", size=16)
    return jpegs, make_shards(jpegs, base / "shards", "--shard-size", "100")


class Server:
    """tests/data/shard_server.py over `root` on 127.0.0.1, stopped by pid; `served()` reads its byte log."""

    def __init__(self, root: Path, log: Path):
        self.log = log
        self.p = subprocess.Popen([sys.executable, "-m", "tests.data.shard_server", str(root), str(log)],
                                  stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env())
        self.url = f"http://127.0.0.1:{int(self.p.stdout.readline())}"

    def served(self, prefix: str = "") -> int:
        """Body bytes sent for paths starting with `prefix`."""
        rows = [line.split() for line in self.log.read_text().splitlines()] if self.log.exists() else []
        return sum(int(n) for path, _, n in rows if path.startswith(prefix))

    def stop(self) -> None:
        """Kill the server process (ours, by pid) and reap it."""
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait(10)


@pytest.fixture
def server(digits, tmp_path):
    srv = Server(digits[1], tmp_path / "served.log")
    yield srv
    srv.stop()


def config(root: str, *extra: str):
    """A shards config over `root` (16 px, resnet10t, batch 16)."""
    cfg, _ = load_config(["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.NAME", "shards", "DATA.ROOT", root,
                          "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "16", "DATA.SHARD_WINDOW", "64",
                          "AUG.SCALE", "[0.5, 1.0]", *extra])
    return cfg


def batches(cfg, rank: int = 0, world: int = 1, start: int = 0, n: int | None = None, workers: int = 0):
    """The training batches of one rank (in-process; `workers` loader workers), from batch `start`."""
    cfg.defrost()
    cfg.DATA.NUM_WORKERS = workers
    cfg.freeze()
    train, _, _ = build_shards(cfg, Dist(rank, world, rank, CPU), 32)
    train.set_epoch(0, start)
    return list(islice(iter(train), n))


def shard_bytes(root: Path, split: str) -> int:
    """Size of a split's tar files."""
    return sum(p.stat().st_size for p in (root / split).glob("*.tar"))


# ---------------------------------------------------------------------------------------------------------
# The order
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_each_sample_once_and_each_rank_its_own_streams(world):
    counts = [100] * 14 + [37]
    plan = EpochPlan(counts, streams=8, window=64, seed=3, epoch=1)
    assert len(plan) == sum(counts) // 8 * 8
    virtual = set()
    for p in range(len(plan)):
        k, b, o = plan.where(p)
        virtual.add(plan.block_range(k, b)[0] + plan.block_order(k, b)[o])
    assert len(virtual) == len(plan)  # a permutation of the first len(plan) virtual samples: none twice
    for rank in range(world):
        seq = rank_sequence(torch.arange(len(plan)), 16, Dist(rank, world, rank, CPU), 8 // world)
        assert set((seq % 8 % world).tolist()) == {rank}  # rank r meets only streams k = r (mod world)
    assert plan.perm != EpochPlan(counts, 8, 64, seed=3, epoch=2).perm  # shards permuted per epoch


def test_two_ranks_and_one_accumulating_two_get_the_same_batches(digits):
    cfg = config(str(digits[1]), "TRAIN.ACCUM_STEPS", "2")
    one = batches(cfg, n=8)
    cfg = config(str(digits[1]))
    r0, r1 = batches(cfg, 0, 2, n=4), batches(cfg, 1, 2, n=4)
    two = [b for pair in zip(r0, r1, strict=True) for b in pair]  # step s: chunk 0 = rank 0, chunk 1 = rank 1
    for (x, y), (x2, y2) in zip(one, two, strict=True):
        assert torch.equal(y, y2) and torch.equal(x, x2)  # same samples, same seeded crops
    assert len({int(t) for _, y in one for t in y}) == 10  # class-mixed batches


def test_workers_and_a_mid_epoch_start_give_the_same_batches(digits):
    cfg = config(str(digits[1]))
    alone = batches(cfg, n=12)
    with_workers = batches(cfg, n=12, workers=2)
    resumed = batches(cfg, start=7, n=5, workers=2)
    for (x, y), (x2, y2) in zip(alone, with_workers, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    for (x, y), (x2, y2) in zip(alone[7:], resumed, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)


# ---------------------------------------------------------------------------------------------------------
# Three ways to serve the same shards
# ---------------------------------------------------------------------------------------------------------
def test_http_and_pipe_give_the_local_batches(digits, server):
    local = batches(config(str(digits[1])), n=3)
    http = batches(config(server.url), n=3)
    pipe = batches(config(str(digits[1]), "DATA.SHARD_URL", "pipe:cat {root}/{split}/{name}"), n=3)
    for (x, y), (xh, yh), (xp, yp) in zip(local, http, pipe, strict=True):
        assert torch.equal(x, xh) and torch.equal(x, xp) and torch.equal(y, yh) and torch.equal(y, yp)
    assert server.served("/train/train-") > 0


def test_two_ranks_with_two_workers_read_the_data_set_about_once(digits, server):
    cfg = config(server.url, "DATA.SHARD_WINDOW", "1000", "DATA.SHARD_STREAMS", "4")
    for rank in (0, 1):
        got = batches(cfg, rank, 2, workers=2)
        assert len(got) == 1437 // 32
    total = shard_bytes(digits[1], "train")
    largest = max(p.stat().st_size for p in (digits[1] / "train").glob("*.tar"))
    # streams are contiguous runs of the permuted shards: two adjacent streams both read their shared shard
    assert total * 0.97 < server.served("/train/train-") <= total + 3 * largest  # (streams - 1) shards twice at most


# ---------------------------------------------------------------------------------------------------------
# Bad inputs: exit 2, one line
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """60 digits at 8 px: 5 train shards of 10, 1 val shard."""
    base = tmp_path_factory.mktemp("small")
    return make_shards(export_digits_jpegs(base / "jpegs", size=8, per_class=6), base / "shards", "--shard-size", "10")


def variant(small: Path, dst: Path, shard: str = "", change=None, index: dict | None = None) -> Path:
    """A copy of the small shards with `shard`'s members passed through change(name, data) -> data (None
    drops the member), and train/index.json rows replaced by `index` ({name: count})."""
    shutil.copytree(small, dst)
    if shard:
        path = dst / "train" / shard
        with tarfile.open(path) as tar:
            members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
        with tarfile.open(path, "w") as tar:
            for name, data in members:
                data = change(name, data)
                if data is not None:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    if index:
        rows = json.loads((dst / "train" / "index.json").read_text())["shards"]
        rows = [[n, index.get(n, c)] for n, c in rows]
        (dst / "train" / "index.json").write_text(json.dumps({"shards": rows}))
    return dst


def each_member(suffix: str, value: bytes | None):
    """change() for variant: every member ending in `suffix` gets `value` (None: dropped)."""
    return lambda name, data: value if name.endswith(suffix) else data


def train_argv(root: str | Path, out: Path, *extra: str) -> list[str]:
    """A one-step run over the small shards."""
    return ["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.NAME", "shards", "DATA.ROOT", str(root),
            "DATA.IMG_SIZE", "8", "DATA.BATCH_SIZE", "8", "DATA.SHARD_STREAMS", "2", "DATA.NUM_WORKERS", "0",
            "TRAIN.MAX_STEPS", "2", "TRAIN.EPOCHS", "1", "OUTPUT_DIR", str(out), *extra]


def rewrite_file(path: Path, text: str | None) -> None:
    """Replace (or with None, delete) one layout file."""
    if text is None:
        path.unlink()
    else:
        path.write_text(text)


# (what, how to break the small shards, extra settings, fragments of the one line); checked before OUTPUT_DIR
BEFORE_WRITING = [
    ("no root", None, ["DATA.ROOT", ""], ["DATA.NAME shards needs DATA.ROOT"]),
    ("no index", ("train/index.json", None), [], ["index.json does not exist"]),
    ("index not json", ("train/index.json", "{"), [], ["index.json is not valid JSON"]),
    ("empty shard list", ("train/index.json", '{"shards": []}'), [], ["lists no shards"]),
    ("index not an index", ("val/index.json", '{"files": 3}'), [], ["is not a shard index"]),
    ("no class map", ("class_map.json", None), [], ["class_map.json does not exist"]),
    ("bad class map", ("class_map.json", '{"1": "a"}'), [], ["is not a class map"]),
    ("pattern matches nothing", None, ["DATA.TRAIN_SHARDS", "train-{000100..000105}.tar"], ["matches none"]),
    ("bad url template", None, ["DATA.SHARD_URL", "{root}/{shard}"], ["takes only {root}, {split} and {name}"]),
    ("repeated augmentation", None, ["DATA.REPEATED_AUG", "2"], ["not supported with DATA.NAME shards"]),
    ("streams below 1", None, ["DATA.SHARD_STREAMS", "0"], ["DATA.SHARD_STREAMS must be >= 1"]),
]


@pytest.mark.parametrize("what, breakage, extra, fragments", BEFORE_WRITING, ids=[b[0] for b in BEFORE_WRITING])
def test_bad_layouts_and_settings_are_refused_before_writing(small, tmp_path, what, breakage, extra, fragments,
                                                            in_process):
    root = shutil.copytree(small, tmp_path / "shards")
    if breakage:
        rewrite_file(root / breakage[0], breakage[1])
    out = tmp_path / "out"
    assert_user_error(in_process("train.py", train_argv(root, out, *extra)), *fragments)
    assert not out.exists()


def test_a_stream_count_the_world_size_cannot_take_is_refused(small, tmp_path, in_process, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv("WORLD_SIZE", "3")
    got = in_process("train.py", train_argv(small, out, "DATA.SHARD_STREAMS", "4"))
    assert_user_error(got, "DATA.SHARD_STREAMS 4 cannot be split evenly among 3 processes", "run on 1, 2, 4")
    assert not out.exists()


def test_a_url_that_404s_is_named(small, tmp_path, in_process):
    srv = Server(small, tmp_path / "served.log")
    try:
        got = in_process("train.py", train_argv(f"{srv.url}/nowhere", tmp_path / "out", "DATA.SHARD_RETRIES", "2"))
    finally:
        srv.stop()
    assert_user_error(got, f"{srv.url}/nowhere/class_map.json cannot be fetched after 2 tries", "404")


JPEG_GARBAGE = b"\xff\xd8 not a jpeg"
DURING_THE_RUN = [  # (what, variant arguments, extra settings, fragments)
    ("corrupt image over budget", dict(shard="train-000001.tar", change=each_member(".jpg", JPEG_GARBAGE)),
     ["DATA.BAD_FILE_BUDGET", "0"], ["of 50 train samples are unreadable", "in shard", "train-000001.tar"]),
    ("truncated shard", {}, [], ["train-000002.tar", "truncated"]),
    ("missing .cls", dict(shard="train-000003.tar", change=each_member(".cls", None)), [], ["has no .cls member"]),
    ("label out of range", dict(shard="train-000004.tar", change=each_member(".cls", b"42")), [],
     ["class 42 is outside the class map's 0..9"]),
    ("shorter than its index", dict(index={"train-000000.tar": 14}), [], ["holds 10 samples, fewer than the 14"]),
    ("failing pipe", {}, ["DATA.SHARD_URL", "pipe:cat {root}/{split}/missing-{name}", "DATA.SHARD_RETRIES", "2"],
     ["missing-train-", "cannot be read after 2 tries", "No such file or directory"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("what, how, extra, fragments", DURING_THE_RUN, ids=[d[0] for d in DURING_THE_RUN])
def test_bad_shards_are_named(small, tmp_path, what, how, extra, fragments):
    root = variant(small, tmp_path / "shards", **how)
    if what == "truncated shard":
        tar = root / "train" / "train-000002.tar"
        tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2 + 100])
    got = run_tool("train.py", train_argv(root, tmp_path / "out", "DATA.SHARD_STREAMS", "1", "TRAIN.MAX_STEPS", "0",
                                          *extra), timeout=180)
    assert_user_error(got, *fragments)


def test_make_shards_refuses_bad_arguments(small, tmp_path, in_process):
    assert_user_error(run_tool("make_shards.py", [str(small.parent / "jpegs"), str(small)]), "is not empty")
    assert_user_error(in_process("make_shards.py", [str(tmp_path), str(tmp_path / "x")]), "needs train/ and val/")
    assert_user_error(in_process("make_shards.py", [str(small.parent / "jpegs"), str(tmp_path / "y"),
                                                    "--shard-size", "0"]), "--shard-size 0")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


# ---------------------------------------------------------------------------------------------------------
# Runs: another number of processes, and workers, resumed exactly (the real tools/train.py and torchrun)
# ---------------------------------------------------------------------------------------------------------
RUN = ["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.NAME", "shards", "DATA.IMG_SIZE", "16",
       "DATA.BATCH_SIZE", "16", "TRAIN.EPOCHS", "1", "LOG.PERIOD", "1", "LOG.PROGRESS", "plain",
       "DATA.SHARD_WINDOW", "128", "AUG.SCALE", "[0.5, 1.0]", "MODEL.DROP_RATE", "0.2", "AUG.MIXUP", "0.2",
       "TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "0.9", "CHECKPOINT.PERIOD", "3", "DATA.NUM_WORKERS", "2",
       "DATA.SHARD_STREAMS", "4"]
STEPS = 400 // 32  # 400 train samples (4 streams of 100) in global batches of 32


@pytest.fixture(scope="module")
def fifty(tmp_path_factory) -> Path:
    """50 digits a class at 16 px: 400 train samples in 16 shards of 25."""
    base = tmp_path_factory.mktemp("fifty")
    return make_shards(export_digits_jpegs(base / "jpegs", size=16, per_class=50), base / "shards",
                       "--shard-size", "25")


def run_argv(root: str, out: Path, procs: int, *extra: str) -> list[str]:
    """RUN over `root` in `out` on `procs` processes, TRAIN.ACCUM_STEPS keeping the global batch at 32."""
    cmd = [TRAIN, *RUN, "DATA.ROOT", root, "TRAIN.ACCUM_STEPS", str(2 // procs), *extra, "OUTPUT_DIR", str(out)]
    return torchrun(["--standalone", f"--nproc_per_node={procs}", *cmd]) if procs > 1 else [sys.executable, *cmd]


def losses(out: Path) -> list[float]:
    """Every step's training loss."""
    rows = train_rows(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return [r["train/loss"] for r in rows]


@pytest.fixture(scope="module")
def over_http(fifty, tmp_path_factory):
    """The 2-process reference run, 2 loader workers each, reading the shards over HTTP; (its folder, the train
    shard bytes the server sent, the train shards' size)."""
    logs = tmp_path_factory.mktemp("http_ref")
    srv = Server(fifty, logs / "served.log")
    try:
        run = Launch(run_argv(srv.url, logs / "ref", 2), logs, "ref")
        assert run.finish() == 0, run.stderr[-3000:]
        served = srv.served("/train/train-")
    finally:
        srv.stop()
    return logs / "ref", served, shard_bytes(fifty, "train")


@pytest.mark.slow
def test_two_processes_with_two_workers_read_the_shards_once_an_epoch(over_http, fifty):
    ref, served, total = over_http
    largest = max(p.stat().st_size for p in (fifty / "train").glob("*.tar"))
    assert total * 0.97 < served <= total + 3 * largest, (served, total)  # 4 streams: 3 shared boundary shards
    assert json.loads((ref / "results.json").read_text())["val/top1"] > 50


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_killed_and_resumed_on_another_number_of_processes(over_http, fifty, tmp_path, before, after):
    out, root = tmp_path / "run", str(fifty)  # local files: where the shards are read from does not matter
    first = Launch(run_argv(root, out, before), tmp_path, "first")
    first.wait_step(7)
    first.kill_all()  # SIGKILL, every process: the run continues from its last periodic checkpoint
    saved = torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)["step"]
    assert 3 <= saved < STEPS, saved
    second = Launch(run_argv(root, out, after), tmp_path, "second")
    assert second.finish() == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    got, want = losses(out), losses(over_http[0])
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)  # only the order of sums differs between layouts
    res, ref_res = (json.loads((d / "results.json").read_text()) for d in (out, over_http[0]))
    assert res["val/top1"] == ref_res["val/top1"] and res["val_ema/top1"] == ref_res["val_ema/top1"]


@pytest.mark.slow
def test_same_layout_with_workers_resumes_bit_identically(fifty, tmp_path):
    ref, out, root = tmp_path / "ref", tmp_path / "out", str(fifty)
    extra = ["DATA.SHARD_URL", "pipe:cat {root}/{split}/{name}"]
    alone = Launch(run_argv(root, ref, 1, *extra), tmp_path, "ref")
    assert alone.finish() == 0, alone.stderr[-3000:]
    first = Launch(run_argv(root, out, 1, *extra), tmp_path, "first")
    first.wait_step(5)
    first.p.send_signal(signal.SIGTERM)
    assert first.finish(60) == 75, first.stderr[-3000:]
    second = Launch(run_argv(root, out, 1, *extra), tmp_path, "second")
    assert second.finish() == 0, second.stderr[-3000:]
    assert second.stderr == ""
    assert_same_run(out, ref)


def test_check_data_reads_every_sample(small, tmp_path, in_process):
    args = ["--cfg", DIGITS, "DATA.NAME", "shards", "DATA.SHARD_STREAMS", "2", "DATA.ROOT"]
    clean = in_process("check_data.py", [*args, str(small)])
    assert clean.returncode == 0 and "60 samples read" in clean.stdout and "all samples are readable" in clean.stdout
    root = variant(small, tmp_path / "bad", shard="train-000001.tar", change=each_member(".jpg", JPEG_GARBAGE))
    bad = in_process("check_data.py", [*args, str(root)])
    assert bad.returncode == 1 and "10 bad samples" in bad.stdout and "train-000001.tar 00000" in bad.stdout


def test_check_data_reads_the_test_splits_shards(small, tmp_path, in_process):
    """DATA.TEST_SPLIT's shards are read too (issue 46, item 12): its column of counts and its bad samples."""
    root = shutil.copytree(small, tmp_path / "with_test")
    shutil.copytree(small / "val", root / "test")
    with tarfile.open(root / "test" / "val-000000.tar") as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(root / "test" / "val-000000.tar", "w") as tar:
        for name, data in members:
            data = JPEG_GARBAGE if name.startswith("0000003_") and name.endswith(".jpg") else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    got = in_process("check_data.py", ["--cfg", DIGITS, "DATA.NAME", "shards", "DATA.SHARD_STREAMS", "2",
                                       "DATA.ROOT", str(root), "DATA.TEST_SPLIT", "test"])
    assert got.returncode == 1, got.stderr
    assert "70 samples read" in got.stdout and "1 bad samples" in got.stdout and "test/val-000000.tar" in got.stdout
    assert next(ln for ln in got.stdout.splitlines() if ln.startswith("class")).split() == [
        "class", "train", "val", "test"]
