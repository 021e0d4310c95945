"""DATA.NAME torchvision over an MNIST the test writes in torchvision's own layout (DATA.ROOT/MNIST/raw/*-ubyte,
scikit-learn's digits): the table, the refusals (in-process, one line), grayscale to 1 or 3 channels, runs
through tools/train.py and torchrun (trained, stopped mid-epoch and resumed bit-identical, 2 processes -> 1),
and DATA.DOWNLOAD from a server on 127.0.0.1 (its mirror set by an IMPORTS module): one download for a
2-process job, counted at the server. Never the internet."""
from __future__ import annotations

import gzip
import hashlib
import inspect
import json
import shutil
import socket
import struct
import threading
from collections import Counter
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torchvision.datasets

from runner.config import load_config
from runner.data import sources, tvsets
from runner.data.indexed import dataset
from runner.errors import UserError
from tests.data import indexed_runs as runs
from tests.engine.test_resume import Launch

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def write_mnist(root: Path, train: int = 400, val: int = 100) -> Path:
    """Digits (8 px, 0-255) as MNIST's four raw idx files under root/MNIST/raw: `train` then `val` samples."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.images * 16).clip(0, 255).astype(np.uint8), d.target.astype(np.uint8)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, part in (("train", slice(0, train)), ("t10k", slice(train, train + val))):
        xs, ys = x[part], y[part]
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, len(xs), 8, 8) + xs.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, len(ys)) + ys.tobytes())
    return root


@pytest.fixture(scope="module")
def mnist(tmp_path_factory) -> Path:
    """A DATA.ROOT holding a 400 + 100 sample MNIST."""
    return write_mnist(tmp_path_factory.mktemp("tv") / "root")


def make_cfg(root: Path | str, *pairs: str):
    """A config for DATA.NAME torchvision DATA.SET mnist over `root` (the preprocessing given)."""
    cfg, _ = load_config(["DATA.NAME", "torchvision", "DATA.SET", "mnist", "DATA.ROOT", str(root), "DATA.IMG_SIZE",
                          "16", "MODEL.NUM_CLASSES", "10", "DATA.MEAN", "[0.5, 0.5, 0.5]", "DATA.STD",
                          "[0.5, 0.5, 0.5]", "AUG.INTERPOLATION", "bilinear", "EVAL.CROP_PCT", "0.875", *pairs],
                         check_paths=False)
    return cfg


def refused(cfg) -> str:
    """The one line the source's check gives `cfg` (files checked)."""
    with pytest.raises(UserError) as e:
        sources.check_config(cfg, {})
    assert "\n" not in str(e.value)
    return str(e.value)


# ---------------------------------------------------------------------------------------------------------
# The table, the samples, the refusals
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(tvsets.SETS))
def test_each_table_entry_is_a_torchvision_class_taking_its_split_arguments(name):
    entry = tvsets.SETS[name]
    signature = inspect.signature(getattr(torchvision.datasets, entry.cls))
    assert {"train", "val"} <= set(entry.splits)
    for arguments in entry.splits.values():
        signature.bind("root", **arguments, **entry.extra, download=False)


@pytest.mark.parametrize("given, found", [
    ("CIFAR-10", "cifar10"), ("cifar100", "cifar100"), ("MNIST", "mnist"), ("FashionMNIST", "fashion-mnist"),
    ("fashion_mnist", "fashion-mnist"), ("SVHN", "svhn"), ("STL-10", "stl10"), ("Flowers102", "flowers102"),
    ("OxfordIIITPet", "oxford-pets"), ("Food-101", "food101"), ("imagenet", None)])
def test_set_names_are_found_whatever_their_spelling(given, found):
    assert tvsets.find_set(given) == found


def test_samples_labels_and_class_names(mnist):
    cfg = make_cfg(mnist)
    train, val = tvsets._rows(cfg, "mnist", "train", True), tvsets._rows(cfg, "mnist", "val", True)
    assert (len(train.samples), len(val.samples)) == (400, 100)
    assert tvsets._class_names(train.opener.data, train)[:2] == ["0 - zero", "1 - one"]
    assert train.opener(0).mode == "L" and train.describe(3) == "mnist train sample 3"


@pytest.mark.parametrize("chans, mean", [(1, "[0.5]"), (3, "[0.5, 0.5, 0.5]")])
def test_grayscale_gives_one_channel_or_three_equal_ones(mnist, chans, mean):
    cfg = make_cfg(mnist, "MODEL.IN_CHANS", str(chans), "DATA.MEAN", mean, "DATA.STD", mean)
    val = tvsets._rows(cfg, "mnist", "val", False)
    x, y = dataset(cfg, val, training=False)[0]
    assert tuple(x.shape) == (chans, 16, 16) and y == val.samples[0][1] and x.std() > 0
    assert all(x[c].equal(x[0]) for c in range(chans))


@pytest.mark.parametrize("pairs, fragment", [
    (["DATA.SET", "imagenet"], "DATA.SET 'imagenet': DATA.NAME torchvision reads one of cifar10|cifar100|mnist|"),
    (["DATA.ROOT", ""], "DATA.NAME torchvision needs DATA.ROOT"),
    (["DATA.TEST_SPLIT", "test"], "DATA.TEST_SPLIT 'test': mnist has no such held-out split (none: its test split "
                                  "is the val split)"),
    (["DATA.SET", "cifar10"], "DATA.SET cifar10: not found in DATA.ROOT {root} (no cifar-10-batches-py); set "
                              "DATA.DOWNLOAD true to download it there (default)"),
])
def test_bad_settings_are_refused_before_the_claim(mnist, pairs, fragment):
    assert fragment.format(root=mnist) in refused(make_cfg(mnist, *pairs))


def test_downloading_or_a_held_out_split_passes_the_check(mnist):
    sources.check_config(make_cfg(mnist / "empty", "DATA.DOWNLOAD", "true"), {})
    sources.check_config(make_cfg(mnist / "empty", "DATA.SET", "flowers102", "DATA.TEST_SPLIT", "test",
                                  "DATA.DOWNLOAD", "true"), {})


def test_files_missing_past_the_check_and_a_failed_download_are_one_line(mnist, tmp_path, monkeypatch):
    broken = shutil.copytree(mnist, tmp_path / "broken")
    (broken / "MNIST" / "raw" / FILES[3]).unlink()
    with pytest.raises(UserError, match=r"^DATA.SET mnist: not found in DATA.ROOT .* set DATA.DOWNLOAD true"):
        tvsets._rows(make_cfg(broken), "mnist", "val", True)
    monkeypatch.setattr(torchvision.datasets.MNIST, "mirrors", [f"http://127.0.0.1:{closed_port()}/"])
    with pytest.raises(UserError, match=r"^DATA.SET mnist: the download into .* failed: Error downloading") as e:
        tvsets._rows(make_cfg(broken, "DATA.DOWNLOAD", "true"), "mnist", "val", True)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("rank, local_rank, first", [(0, 0, True), (2, 0, True), (1, 1, False), (3, 1, False)])
def test_each_process_loads_once_the_first_of_each_node_downloading(rank, local_rank, first):
    import torch

    from runner.data.indexed import local_first
    from runner.distributed import Dist

    calls = []
    dist = Dist(rank, 4, local_rank, torch.device("cpu"))  # 2 nodes of 2; alone, each barrier passes at once
    assert local_first(dist, lambda download: calls.append(download) or "loaded") == "loaded"
    assert calls == [first]
    with pytest.raises(UserError, match="gone"):
        local_first(dist, lambda download: (_ for _ in ()).throw(UserError("gone")))


def closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (the OS picked it, then it was closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------------
# Runs: tools/train.py and torchrun
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tv_args(mnist) -> list[str]:
    """The DATA.* arguments of the runs (3 channels: MNIST converted to RGB)."""
    return ["DATA.NAME", "torchvision", "DATA.SET", "mnist", "DATA.ROOT", str(mnist), "MODEL.NUM_CLASSES", "10"]


@pytest.fixture(scope="module")
def reference(tv_args, tmp_path_factory) -> Path:
    """The uninterrupted 1-process run's folder."""
    return runs.reference(tv_args, tmp_path_factory.mktemp("tv_ref"))


@pytest.mark.slow
def test_a_run_trains_and_keeps_the_class_names(reference):
    assert json.loads((reference / "results.json").read_text())["val/top1"] > 20  # chance: 10, after 12 steps
    assert json.loads((reference / "class_map.json").read_text())["3"] == "3 - three"


@pytest.mark.slow
def test_stopped_mid_epoch_and_resumed_bit_identical(tv_args, reference, tmp_path):
    runs.stopped_and_resumed(tv_args, reference, tmp_path)


@pytest.mark.slow
def test_two_processes_killed_and_resumed_on_one(tv_args, reference, tmp_path):
    runs.two_killed_then_one(tv_args, reference, tmp_path)


# ---------------------------------------------------------------------------------------------------------
# DATA.DOWNLOAD: local rank 0 downloads, the other rank waits, then reads
# ---------------------------------------------------------------------------------------------------------
MIRROR = '''"""Points torchvision's MNIST at the test's server (an IMPORTS module: imported by every rank)."""
import json
import os

from torchvision.datasets import MNIST

_spec = json.loads(os.environ["TEST_MNIST_MIRROR"])
MNIST.mirrors = [_spec["url"]]
MNIST.resources = [tuple(r) for r in _spec["resources"]]
'''


class Counting(SimpleHTTPRequestHandler):
    """Serves a folder and counts the GET requests per path; logs nothing."""

    counts: Counter

    def do_GET(self) -> None:
        """Count, then serve."""
        self.counts[self.path] += 1
        super().do_GET()

    def log_message(self, *args) -> None:
        """Quiet."""


@pytest.fixture
def server(mnist, tmp_path):
    """MNIST's four files gzipped (as its mirrors hold them), served on 127.0.0.1; (URL, resources, counts)."""
    served = tmp_path / "served"
    served.mkdir()
    resources = []
    for name in FILES:
        data = gzip.compress((mnist / "MNIST" / "raw" / name).read_bytes(), mtime=0)
        (served / f"{name}.gz").write_bytes(data)
        resources.append((f"{name}.gz", hashlib.md5(data).hexdigest()))
    handler = type("Handler", (Counting,), {"counts": Counter()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/", resources, handler.counts
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.slow
def test_two_processes_download_once_into_data_root(server, tmp_path):
    url, resources, counts = server
    (tmp_path / "mirror.py").write_text(MIRROR)
    root, out = tmp_path / "downloaded", tmp_path / "out"
    args = ["DATA.NAME", "torchvision", "DATA.SET", "mnist", "DATA.ROOT", str(root), "DATA.DOWNLOAD", "true",
            "MODEL.NUM_CLASSES", "10", "IMPORTS", f"[{tmp_path / 'mirror.py'}]"]
    argv = runs.run_argv(args, out, 2) + ["TRAIN.MAX_STEPS", "2"]
    run = Launch(argv, tmp_path, "download", TEST_MNIST_MIRROR=json.dumps({"url": url, "resources": resources}))
    assert run.finish() == 0, run.stderr[-3000:]
    # one process fetched each file: torchvision's redirect probe (a GET with a "Method: HEAD" header) and the
    # download; the other rank read what it left
    assert counts == {f"/{name}": 2 for name, _ in resources}, counts
    assert all((root / "MNIST" / "raw" / name).is_file() for name in FILES)
    assert json.loads((out / "results.json").read_text())["step"] == 2


def test_check_data_opens_every_image_of_the_set(mnist, in_process):
    """tools/check_data.py reads the set as the run does: every image of train and val decoded, counted per class."""
    proc = in_process("check_data.py", ["DATA.NAME", "torchvision", "DATA.SET", "mnist", "DATA.ROOT", str(mnist),
                                        "MODEL.NUM_CLASSES", "10", "DATA.IMG_SIZE", "16"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"DATA.NAME torchvision {mnist}: 10 classes, 500 images checked" in proc.stdout
    rows = [line.split()[-2:] for line in proc.stdout.splitlines() if line[:1].isdigit()]  # "0 - zero  40  10"
    assert len(rows) == 10 and sum(int(r[0]) for r in rows) == 400 and sum(int(r[1]) for r in rows) == 100
    assert "all images are readable" in proc.stdout
