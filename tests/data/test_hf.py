"""DATA.NAME hf over a local parquet dataset in the Hub's layout (data/train-*.parquet, data/validation-*.parquet),
written by the test from scikit-learn's digits with an Image and a ClassLabel column: splits, columns and classes
found or named, the loaders, the refusals (in-process, one line), and runs through tools/train.py and torchrun:
trained, stopped mid-epoch and resumed bit-identical, 2 processes -> 1. Never the internet."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("datasets")

import datasets  # noqa: E402
from PIL import Image  # noqa: E402

from runner.config import load_config  # noqa: E402
from runner.data import hf, sources  # noqa: E402
from runner.data.indexed import dataset  # noqa: E402
from runner.errors import UserError  # noqa: E402
from tests.data import indexed_runs as runs  # noqa: E402
from tests.utils import assert_user_error, run_tool  # noqa: E402

NAMES = [f"digit {i}" for i in range(10)]
FEATURES = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})


def write_split(root: Path, split: str, images: list, labels: list[int], features=FEATURES) -> None:
    """One split as the Hub stores it: data/<split>-00000-of-00001.parquet (features in its schema's metadata)."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    datasets.disable_progress_bars()
    table = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
    table.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))


def digits(per_class: int) -> tuple[list, list[int]]:
    """The first `per_class` digits of each class as 8 px RGB PIL images, classes interleaved, and their labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    picked = [i for c in range(10) for i in np.flatnonzero(d.target == c)[:per_class]]
    picked.sort()
    images = [Image.fromarray((d.images[i] * 16).clip(0, 255).astype(np.uint8), "L").convert("RGB") for i in picked]
    return images, [int(d.target[i]) for i in picked]


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    """500 digits: 400 in train, 100 in validation (every 5th), in the Hub's layout."""
    root = tmp_path_factory.mktemp("hub") / "digits"
    images, labels = digits(50)
    for split, keep in (("train", bool), ("validation", lambda r: not r)):
        idx = [i for i in range(len(images)) if keep(i % 5)]
        write_split(root, split, [images[i] for i in idx], [labels[i] for i in idx])
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    """datasets' cache in a folder of the test session, and no dataset remembered from another test."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf_cache"))
    hf.load.cache_clear()
    hf._FOUND.clear()
    yield
    hf.load.cache_clear()
    hf._FOUND.clear()


def make_cfg(root: Path | str, *pairs: str):
    """A frozen config for DATA.NAME hf over `root` (the preprocessing given: no weights to take it from)."""
    cfg, _ = load_config(["DATA.NAME", "hf", "DATA.ROOT", str(root), "MODEL.NUM_CLASSES", "10", "DATA.IMG_SIZE", "16",
                          "DATA.MEAN", "[0.5, 0.5, 0.5]", "DATA.STD", "[0.5, 0.5, 0.5]", "AUG.INTERPOLATION",
                          "bilinear", "EVAL.CROP_PCT", "0.875", *pairs], check_paths=False)
    return cfg


def refused(cfg, check_files: bool = True) -> str:
    """The one line the source's check gives `cfg`."""
    with pytest.raises(UserError) as e:
        sources.check_config(cfg, {}, check_files=check_files)
    assert "\n" not in str(e.value)
    return str(e.value)


def build_refused(cfg) -> str:
    """The one line building `cfg`'s splits gives."""
    with pytest.raises(UserError) as e:
        hf._splits(cfg)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---------------------------------------------------------------------------------------------------------
# Splits, columns, classes, samples
# ---------------------------------------------------------------------------------------------------------
def test_the_hub_layout_gives_splits_columns_and_class_names(hub):
    train, val, names = hf._splits(make_cfg(hub))
    assert names == NAMES
    assert (train.split, len(train.samples), val.split, len(val.samples)) == ("train", 400, "validation", 100)
    labels = digits(50)[1]
    assert [label for _, label in train.samples] == [t for i, t in enumerate(labels) if i % 5]
    image = train.opener(0)
    assert image.format == "PNG" and image.size == (8, 8)  # opened lazily from the row's bytes, as files are
    x, y = dataset(make_cfg(hub), val, training=False)[3]
    assert tuple(x.shape) == (3, 16, 16) and y == val.samples[3][1]


def test_a_training_sample_is_the_same_for_the_same_seed_in_any_worker(hub):
    ds = dataset(make_cfg(hub, "AUG.AUTO_AUGMENT", "rand-m9-mstd0.5", "AUG.REPROB", "0.5"), hf._splits(
        make_cfg(hub))[0], training=True)
    a, b, c = ds[(7, 1234)], ds[(7, 1234)], ds[(7, 99)]
    assert a[0].equal(b[0]) and not a[0].equal(c[0])


def test_named_splits_and_columns(hub):
    train, val, _ = hf._splits(make_cfg(hub, "DATA.TRAIN_SPLIT", "validation", "DATA.VAL_SPLIT", "train",
                                        "DATA.IMAGE_COLUMN", "image", "DATA.LABEL_COLUMN", "label"))
    assert (train.split, len(train.samples), val.split, len(val.samples)) == ("validation", 100, "train", 400)


def test_without_a_val_split_val_fraction_is_held_out_the_same_for_a_seed(tmp_path):
    images, labels = digits(5)
    write_split(tmp_path, "train", images, labels)
    train, val, _ = hf._splits(make_cfg(tmp_path, "DATA.VAL_FRACTION", "0.2"))
    assert (len(train.samples), len(val.samples)) == (40, 10)
    assert not {r for r, _ in train.samples} & {r for r, _ in val.samples}
    again = hf._splits(make_cfg(tmp_path, "DATA.VAL_FRACTION", "0.2"))[1]
    other = hf._splits(make_cfg(tmp_path, "DATA.VAL_FRACTION", "0.2", "SEED", "7"))[1]
    assert again.samples == val.samples != other.samples


def test_integer_labels_without_class_label_name_classes_by_index(tmp_path):
    images, labels = digits(2)
    plain = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    for split in ("train", "test"):
        write_split(tmp_path, split, images, labels, plain)
    train, val, names = hf._splits(make_cfg(tmp_path))
    assert names == [str(i) for i in range(10)] and val.split == "test" and len(train.samples) == 20


def test_a_held_out_split_for_data_test_split(tmp_path):
    images, labels = digits(2)
    for split in ("train", "validation", "test"):
        write_split(tmp_path, split, images, labels)
    test, classes = hf._held_out(make_cfg(tmp_path, "DATA.TEST_SPLIT", "test"), "test")
    assert (test.split, len(test.samples), classes) == ("test", 20, 10)
    for split in ("validation", "dev"):
        with pytest.raises(UserError, match=f"'{split}' is not a held-out split .*others: test"):
            hf._held_out(make_cfg(tmp_path), split)


# ---------------------------------------------------------------------------------------------------------
# Refusals: one line, in-process
# ---------------------------------------------------------------------------------------------------------
def test_without_datasets_installed_the_source_says_how_to_install_it(hub, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # what find_spec sees when the package is absent
    assert refused(make_cfg(hub)) == 'DATA.NAME hf needs the datasets package: pip install -e ".[hf]" (default)'


@pytest.mark.parametrize("pairs, fragment", [
    (["DATA.ROOT", ""], "DATA.NAME hf needs DATA.ROOT"),
    (["DATA.ROOT", "/no/such/folder"], "DATA.ROOT '/no/such/folder' is not a file or folder"),
    (["DATA.VAL_SPLIT", "test", "DATA.TEST_SPLIT", "test"], "name one split twice"),
])
def test_bad_settings_are_refused_before_the_claim(hub, pairs, fragment):
    assert fragment in refused(make_cfg(hub, *pairs))


@pytest.mark.parametrize("pairs, fragment", [
    (["DATA.TRAIN_SPLIT", "training"], "has no split 'training' (it has train, validation): set DATA.TRAIN_SPLIT"),
    (["DATA.VAL_SPLIT", "dev"], "has no split 'dev' (it has train, validation): set DATA.VAL_SPLIT"),
    (["DATA.IMAGE_COLUMN", "img"], "DATA.IMAGE_COLUMN 'img': DATA.ROOT"),
    (["DATA.LABEL_COLUMN", "fine_label"], "has no such column (it has image, label)"),
    (["DATA.IMAGE_COLUMN", "label"], "column 'label' does not hold images"),
    (["DATA.SET", "nope"], "the Hugging Face dataset could not be loaded"),
])
def test_splits_and_columns_that_are_not_there_are_one_line(hub, pairs, fragment):
    assert fragment in build_refused(make_cfg(hub, *pairs))


def test_unlabelled_val_rows_and_too_few_outputs_are_refused(tmp_path):
    images, labels = digits(2)
    write_split(tmp_path, "train", images, labels)
    write_split(tmp_path, "test", images, [-1] * len(labels))  # how Hub sets publish a test split without labels
    train, val, names = hf._splits(make_cfg(tmp_path))
    from runner.data.indexed import check_labels

    with pytest.raises(UserError, match=r"test row 0 has label -1, not a class index 0..9 \(an unlabelled split"):
        check_labels(val, len(names), "here")
    from runner.data.classes import check_classes

    with pytest.raises(UserError, match="has 10 classes but MODEL.NUM_CLASSES is 5"):
        check_classes(make_cfg(tmp_path, "MODEL.NUM_CLASSES", "5"), names, "here")


def test_a_local_dataset_is_checked_before_the_claim(hub, tmp_path):
    from runner import preflight

    assert sources.source("hf").known_split(make_cfg(hub)) == (400, 10)
    assert "has no split 'training'" in refused(make_cfg(hub, "DATA.TRAIN_SPLIT", "training"))
    with pytest.raises(UserError, match="has 10 classes but MODEL.NUM_CLASSES is 5"):
        preflight.check_before_claim(make_cfg(hub, "MODEL.NUM_CLASSES", "5"), 1)
    with pytest.raises(UserError, match=r"larger than the training split of DATA.NAME hf \(400 samples\)"):
        preflight.check_before_claim(make_cfg(hub, "DATA.BATCH_SIZE", "256"), 2)
    images, labels = digits(2)
    write_split(tmp_path, "train", images, labels)
    write_split(tmp_path, "test", images, [-1] * len(labels))
    assert "test row 0 has label -1" in refused(make_cfg(tmp_path))


def test_a_hub_dataset_missing_offline_is_one_line(monkeypatch):
    import huggingface_hub.constants

    for config in (datasets.config, huggingface_hub.constants):  # what HF_HUB_OFFLINE=1 sets at their import
        monkeypatch.setattr(config, "HF_HUB_OFFLINE", True)
    line = build_refused(make_cfg("nobody/no-such-dataset"))
    assert line.startswith("DATA.ROOT nobody/no-such-dataset: the Hugging Face dataset could not be loaded")
    assert "HF_HUB_OFFLINE is set: only datasets already in the cache" in line


def test_a_run_offline_without_the_dataset_exits_2_with_one_line(tmp_path):
    out = tmp_path / "o"
    proc = run_tool("train.py", ["DATA.NAME", "hf", "DATA.ROOT", "nobody/no-such-dataset", "OUTPUT_DIR", str(out)],
                    env=dict(runs_env(tmp_path), HF_HUB_OFFLINE="1"), timeout=120)
    assert_user_error(proc, "DATA.ROOT nobody/no-such-dataset: the Hugging Face dataset could not be loaded",
                      "HF_HUB_OFFLINE is set")
    assert not out.exists()  # said before the claim: nothing written


def runs_env(tmp_path: Path) -> dict:
    """The test environment with datasets' cache (HF_HOME) under `tmp_path`."""
    from tests.utils import env

    return env(HF_HOME=str(tmp_path / "hf_home"))


# ---------------------------------------------------------------------------------------------------------
# Runs: tools/train.py and torchrun
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_args(hub) -> list[str]:
    """The DATA.* arguments of the runs."""
    return ["DATA.NAME", "hf", "DATA.ROOT", str(hub), "MODEL.NUM_CLASSES", "10"]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> dict[str, str]:
    """HF_HOME for the runs: datasets' cache of the parquet files, shared by the module's runs."""
    return {"HF_HOME": str(tmp_path_factory.mktemp("hf_home"))}


@pytest.fixture(scope="module")
def reference(hf_args, home, tmp_path_factory) -> Path:
    """The uninterrupted 1-process run's folder."""
    return runs.reference(hf_args, tmp_path_factory.mktemp("hf_ref"), **home)


@pytest.mark.slow
def test_a_run_trains_and_keeps_the_class_names(reference):
    assert json.loads((reference / "results.json").read_text())["val/top1"] > 20  # chance: 10, after 12 steps
    assert json.loads((reference / "class_map.json").read_text())["3"] == "digit 3"


@pytest.mark.slow
def test_stopped_mid_epoch_and_resumed_bit_identical(hf_args, home, reference, tmp_path):
    runs.stopped_and_resumed(hf_args, reference, tmp_path, **home)


@pytest.mark.slow
def test_two_processes_killed_and_resumed_on_one(hf_args, home, reference, tmp_path):
    runs.two_killed_then_one(hf_args, reference, tmp_path, **home)
