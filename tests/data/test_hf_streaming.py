"""DATA.NAME hf with DATA.HF_STREAMING true over a local parquet dataset in the Hub's layout, several train files
of unequal length (scikit-learn's digits, written as tests/data/test_hf.py writes them): files, row counts and
classes from the footers; the shards' order over the rows, resumed at a batch, the same with workers, each rank
reading only its share; the refusals (in-process, one line); runs through tools/train.py and torchrun: trained,
stopped mid-epoch and resumed bit-identical, 2 processes -> 1. Never the internet, no mocks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("datasets")

import datasets  # noqa: E402
import torch  # noqa: E402

from runner.data import hf, hf_rows, hf_stream, sources  # noqa: E402
from runner.distributed import Dist  # noqa: E402
from runner.errors import UserError  # noqa: E402
from tests.data import indexed_runs as runs  # noqa: E402
from tests.data.test_hf import FEATURES, digits, make_cfg, write_split  # noqa: E402

TRAIN_FILES = (130, 90, 100, 80)  # rows of data/train-0000i-of-00004.parquet: 400, streams cutting across files
STREAM = ["DATA.HF_STREAMING", "true", "DATA.SHARD_WINDOW", "16"]  # 8 streams of 50 rows, blocks of 16


def write_files(root: Path, split: str, images: list, labels: list[int], sizes: tuple[int, ...],
                features=FEATURES) -> None:
    """One split as the Hub stores a larger one: data/<split>-0000i-of-0000n.parquet, `sizes` rows each, row
    groups of 32 rows (a resume skips whole groups)."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    start = 0
    for i, n in enumerate(sizes):
        table = datasets.Dataset.from_dict({"image": images[start:start + n], "label": labels[start:start + n]},
                                           features=features)
        table.to_parquet(str(root / "data" / f"{split}-{i:05d}-of-{len(sizes):05d}.parquet"), batch_size=32)
        start += n


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    """500 digits: 400 in 4 train files, 100 in 2 validation files (every 5th)."""
    root = tmp_path_factory.mktemp("hub_stream") / "digits"
    images, labels = digits(50)
    train = [i for i in range(len(images)) if i % 5]
    val = [i for i in range(len(images)) if not i % 5]
    write_files(root, "train", [images[i] for i in train], [labels[i] for i in train], TRAIN_FILES)
    write_files(root, "validation", [images[i] for i in val], [labels[i] for i in val], (60, 40))
    return root


@pytest.fixture(autouse=True)
def fresh(tmp_path_factory, monkeypatch):
    """datasets' cache in the test session's folder; no files or footers remembered from another test."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf_cache"))
    for cached in (hf_stream.data_files, hf_stream.footer):
        cached.cache_clear()
    yield
    for cached in (hf_stream.data_files, hf_stream.footer):
        cached.cache_clear()


def cfg_of(root: Path, *pairs: str):
    """A streaming config over `root`: batches of 8, no loader workers unless given."""
    return make_cfg(root, *STREAM, "DATA.BATCH_SIZE", "8", "DATA.NUM_WORKERS", "0", "DATA.WORKER_START", "fork",
                    *pairs)


def train_loader(cfg, rank: int = 0, world: int = 1):
    """The training loader `cfg` builds on process `rank` of `world`."""
    return hf.build(cfg, Dist(rank, world, rank, torch.device("cpu"))).train


def epoch(loader, epoch_: int = 0, start: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every (images, targets) batch of `epoch_` from batch `start`."""
    loader.set_epoch(epoch_, start)
    return [(x.clone(), y.clone()) for x, y in loader]


def same(a: list, b: list) -> bool:
    """Two lists of batches hold the same images and targets, in order."""
    return len(a) == len(b) and all(x.equal(u) and y.equal(v) for (x, y), (u, v) in zip(a, b, strict=True))


# ---------------------------------------------------------------------------------------------------------
# Files, counts, classes; the order
# ---------------------------------------------------------------------------------------------------------
def test_files_row_counts_and_classes_come_from_the_footers(hub):
    train, val, names = hf._stream_splits(cfg_of(hub))
    assert names == [f"digit {i}" for i in range(10)]
    assert (train.split, train.counts, val.split, val.counts) == ("train", list(TRAIN_FILES), "validation", [60, 40])
    assert [Path(u).name for u in train.urls] == [f"train-{i:05d}-of-00004.parquet" for i in range(4)]
    assert sources.source("hf").known_split(cfg_of(hub)) == (400, 10)
    sources.check_config(cfg_of(hub), {}, check_files=True)


def test_an_epoch_reads_every_row_once_in_an_order_of_seed_and_epoch(hub):
    loader = train_loader(cfg_of(hub))
    first = epoch(loader)
    assert len(loader) == len(first) == 50
    labels = [t for i, t in enumerate(digits(50)[1]) if i % 5]
    assert sorted(torch.cat([y for _, y in first]).tolist()) == sorted(labels)
    assert same(epoch(train_loader(cfg_of(hub))), first)  # a function of SEED and the epoch: the same again
    assert not same(epoch(loader, 1), first)
    assert not same(epoch(train_loader(cfg_of(hub, "SEED", "7"))), first)


def test_resumed_at_a_batch_and_with_workers_the_same_batches(hub):
    cfg = cfg_of(hub, "AUG.AUTO_AUGMENT", "rand-m9-mstd0.5", "AUG.REPROB", "0.5")
    whole = epoch(train_loader(cfg))
    assert same(epoch(train_loader(cfg), start=17), whole[17:])
    assert same(epoch(train_loader(cfg_of(hub, "DATA.NUM_WORKERS", "2"))), epoch(train_loader(cfg_of(hub))))


def test_each_rank_reads_only_its_share_and_together_the_single_process_order(hub, monkeypatch):
    read: dict[int, list[tuple[int, int, int]]] = {0: [], 1: []}
    rank = [0]
    original = hf_rows.read_rows

    def recording(shards, index, first, end, patience):
        """read_rows, noting which rows this rank asked for."""
        read[rank[0]].append((index, first, end))
        return original(shards, index, first, end, patience)

    monkeypatch.setattr(hf_rows, "read_rows", recording)
    single = epoch(train_loader(cfg_of(hub, "TRAIN.ACCUM_STEPS", "2")))
    read[0].clear()
    parts = []
    for rank[0] in (0, 1):
        parts.append(epoch(train_loader(cfg_of(hub), rank[0], 2)))
    rows = [{(i, r) for i, a, b in read[k] for r in range(a, b)} for k in (0, 1)]
    assert not rows[0] & rows[1] and len(rows[0] | rows[1]) == 400  # disjoint, every row once
    for m in range(len(parts[0])):  # global batch m: rank 0's then rank 1's micro-batch, as 2 accumulated
        assert torch.cat([parts[0][m][1], parts[1][m][1]]).equal(torch.cat([single[2 * m][1], single[2 * m + 1][1]]))
        assert torch.cat([parts[0][m][0], parts[1][m][0]]).equal(torch.cat([single[2 * m][0], single[2 * m + 1][0]]))


def test_val_and_a_test_split_stream_every_row_once(hub, tmp_path):
    val = hf.build(cfg_of(hub), Dist(0, 1, 0, torch.device("cpu"))).val
    assert sum(len(y) for _, y in val) == 100
    images, labels = digits(3)
    write_files(tmp_path, "train", images, labels, (15, 15))
    write_files(tmp_path, "validation", images, labels, (30,))
    write_files(tmp_path, "test", images, labels, (20, 10))
    test = hf.build_split(cfg_of(tmp_path, "DATA.TEST_SPLIT", "test"), Dist(0, 1, 0, torch.device("cpu")), "test")
    assert sorted(torch.cat([y for _, y in test]).tolist()) == sorted(labels)


def test_bad_images_are_skipped_within_the_budget_and_stop_the_run_past_it(tmp_path, caplog):
    images, labels = digits(4)
    cells = [{"bytes": b"not an image", "path": None} if i in (3, 20) else im for i, im in enumerate(images)]
    write_files(tmp_path, "train", cells, labels, (20, 20))
    write_files(tmp_path, "validation", images, labels, (40,))
    got = epoch(train_loader(cfg_of(tmp_path, "DATA.BAD_FILE_BUDGET", "0.1")))
    assert sum(len(y) for _, y in got) == 40  # a bad image gives its block's next one: the batch stays whole
    assert "skipping sample row 3 of" not in caplog.text and "skipping sample row 3 in shard" in caplog.text
    with pytest.raises(UserError, match="unreadable, over DATA.BAD_FILE_BUDGET"):
        epoch(train_loader(cfg_of(tmp_path, "DATA.BAD_FILE_BUDGET", "0.01")))


# ---------------------------------------------------------------------------------------------------------
# Refusals: one line, in-process
# ---------------------------------------------------------------------------------------------------------
def refused(cfg, world: int = 1) -> str:
    """The one line the source's check gives `cfg` on `world` processes."""
    with pytest.raises(UserError) as e:
        sources.check_config(cfg, {}, check_files=True, world=world)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("pairs, world, fragment", [
    (["DATA.SHARD_STREAMS", "8"], 3, "DATA.SHARD_STREAMS 8 cannot be split evenly among 3 processes: run on 1, 2, 4"),
    (["DATA.REPEATED_AUG", "2"], 1, "DATA.REPEATED_AUG 2 is not supported with DATA.HF_STREAMING"),
    (["DATA.SHARD_STREAMS", "512"], 1, "split train holds 400 rows, fewer than DATA.SHARD_STREAMS 512"),
    (["DATA.LABEL_COLUMN", "image"], 1, "DATA.HF_STREAMING needs class indices in column 'image'"),
    (["DATA.TRAIN_SPLIT", "training"], 1, "has no split 'training' (it has train, validation)"),
])
def test_what_cannot_stream_is_refused_before_the_claim(hub, pairs, world, fragment):
    assert fragment in refused(cfg_of(hub, *pairs), world)


def test_a_dataset_without_a_val_split_or_parquet_files_is_refused(tmp_path):
    images, labels = digits(2)
    write_split(tmp_path / "noval", "train", images, labels)
    assert "DATA.HF_STREAMING cannot hold out DATA.VAL_FRACTION" in refused(cfg_of(tmp_path / "noval"))
    folder = tmp_path / "pngs" / "train" / "a"
    folder.mkdir(parents=True)
    images[0].save(folder / "0.png")
    assert "DATA.HF_STREAMING reads parquet files only, and this dataset is imagefolder" in refused(
        cfg_of(tmp_path / "pngs"))


def test_string_labels_are_refused(tmp_path):
    images, labels = digits(2)
    named = datasets.Features({"image": datasets.Image(), "label": datasets.Value("string")})
    for split in ("train", "validation"):
        write_split(tmp_path, split, images, [f"d{t}" for t in labels], named)
    assert "its classes would be known only after reading every row" in refused(cfg_of(tmp_path))


def test_a_file_shorter_than_when_the_run_began_is_one_line(tmp_path):
    images, labels = digits(4)
    write_files(tmp_path, "train", images, labels, (20, 20))
    write_files(tmp_path, "validation", images, labels, (40,))
    loader = train_loader(cfg_of(tmp_path))
    write_files(tmp_path, "train", images[:30], labels[:30], (20, 10))  # a new revision of the data
    with pytest.raises(UserError, match=r"holds 10 rows, fewer than the \d+ it held when the run began"):
        epoch(loader)


# ---------------------------------------------------------------------------------------------------------
# Runs: tools/train.py and torchrun
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stream_args(hub) -> list[str]:
    """The DATA.* arguments of the runs."""
    return ["DATA.NAME", "hf", "DATA.ROOT", str(hub), "MODEL.NUM_CLASSES", "10", *STREAM]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> dict[str, str]:
    """HF_HOME for the runs (streaming writes nothing there, but datasets looks)."""
    return {"HF_HOME": str(tmp_path_factory.mktemp("hf_home_stream"))}


@pytest.fixture(scope="module")
def reference(stream_args, home, tmp_path_factory) -> Path:
    """The uninterrupted 1-process run's folder."""
    return runs.reference(stream_args, tmp_path_factory.mktemp("stream_ref"), **home)


@pytest.mark.slow
def test_a_streaming_run_trains_and_keeps_the_class_names(reference):
    assert json.loads((reference / "results.json").read_text())["val/top1"] > 20  # chance: 10, after 12 steps
    assert json.loads((reference / "class_map.json").read_text())["3"] == "digit 3"


@pytest.mark.slow
def test_stopped_mid_epoch_and_resumed_bit_identical(stream_args, home, reference, tmp_path):
    runs.stopped_and_resumed(stream_args, reference, tmp_path, **home)


@pytest.mark.slow
def test_two_processes_killed_and_resumed_on_one(stream_args, home, reference, tmp_path):
    runs.two_killed_then_one(stream_args, reference, tmp_path, **home)
