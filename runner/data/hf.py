"""DATA.NAME hf: a Hugging Face dataset, DATA.ROOT its Hub repo id (org/name) or a local folder or file,
loaded with `datasets.load_dataset` (parquet, arrow, imagefolder; the Hub's data/train-*.parquet layout as it
is), read through runner/data/indexed.py (the image folders' transforms and loaders).

Splits: DATA.TRAIN_SPLIT (train) and DATA.VAL_SPLIT (the first of validation, val, valid, test; without one,
DATA.VAL_FRACTION of train is held out, the same rows for a given SEED). Columns: the one `Image` feature and the
one `ClassLabel` feature (else a column called label or labels), or DATA.IMAGE_COLUMN / DATA.LABEL_COLUMN; class
names from the ClassLabel. `datasets` honours HF_ENDPOINT, HF_HUB_OFFLINE, HF_HOME and HF_TOKEN itself; a Hub
dataset is downloaded by one process (rank 0) while the others wait (indexed.local_first). With
DATA.HF_STREAMING, nothing is downloaded: the parquet files are read as streams (hf_stream.py finds them, hf_rows.py
reads them in the shards source's order).

A source module (runner/data/sources.py): `datasets` only inside functions, so that the check says in one line
that it is missing.
"""
from __future__ import annotations

import importlib.util
import io
import logging
import os
from functools import lru_cache
from typing import Any

from runner.errors import UserError

log = logging.getLogger("runner")

INSTALL = 'DATA.NAME hf needs the datasets package: pip install -e ".[hf]"'
VAL_NAMES = ("validation", "val", "valid", "test")  # how Hub sets name their evaluation split, in preference
LABEL_NAMES = ("label", "labels")  # a label column found by name when no ClassLabel feature says which


def check(cfg: Any, fail: Any, check_files: bool, world: int) -> None:
    """`datasets` installed, a DATA.ROOT, a local-looking DATA.ROOT that exists, splits not named twice."""
    d = cfg.DATA
    if importlib.util.find_spec("datasets") is None:
        fail("DATA.NAME", INSTALL)
    if not d.ROOT:
        fail("DATA.NAME", "DATA.NAME hf needs DATA.ROOT: a Hugging Face dataset's repo id (org/name) or a local "
                          "folder of parquet, arrow or image files")
    if check_files and _looks_local(d.ROOT) and not os.path.exists(d.ROOT):
        fail("DATA.ROOT", f"DATA.ROOT {d.ROOT!r} is not a file or folder (a Hub dataset is named org/name)")
    splits = [s for s in (d.TRAIN_SPLIT or "train", d.VAL_SPLIT, d.TEST_SPLIT) if s]
    if len(set(splits)) < len(splits):
        fail("DATA.VAL_SPLIT", f"DATA.TRAIN_SPLIT, DATA.VAL_SPLIT and DATA.TEST_SPLIT name one split twice "
                               f"({', '.join(splits)}): each must be a different split")
    if d.HF_STREAMING:
        _check_streaming(cfg, fail, check_files, world)
    elif check_files and _at_hand(d.ROOT):
        try:
            _labelled(cfg)
        except UserError as e:
            fail("DATA.ROOT", str(e))


def _check_streaming(cfg: Any, fail: Any, check_files: bool, world: int) -> None:
    """DATA.HF_STREAMING's rules; with files, its splits, columns, classes and rows (footers only: nothing is
    downloaded, so a Hub dataset is checked too)."""
    from runner.data import hf_stream

    try:
        hf_stream.check_streams(cfg, world)
    except UserError as e:
        fail("DATA.HF_STREAMING", str(e))
    if check_files:
        try:
            hf_stream.check_rows(_stream_splits(cfg)[0], cfg.DATA.SHARD_STREAMS)
        except UserError as e:
            fail("DATA.ROOT", str(e))


def known_split(cfg: Any) -> tuple[int, int] | None:
    """(training samples, classes) of a dataset at hand (local, or from the cache offline); None for one on the
    Hub, which rank 0 downloads after the claim (streamed, its row count from the footers)."""
    if cfg.DATA.HF_STREAMING:
        train, _, names = _stream_splits(cfg)
        return train.total, len(names)
    if not _at_hand(cfg.DATA.ROOT):
        return None
    train, _, names = _labelled(cfg)
    return len(train.samples), len(names)


def _at_hand(root: str) -> bool:
    """Whether loading the dataset reads only this machine: a local path, or any dataset with HF_HUB_OFFLINE set
    (then from the cache). Such a dataset is loaded, and its splits, columns and labels checked, before the claim."""
    if _looks_local(root):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _labelled(cfg: Any) -> tuple[Any, Any, list[str]]:
    """_splits, every label of train and val a class index (the one-line UserError otherwise)."""
    from runner.data.indexed import check_labels

    train, val, names = _splits(cfg)
    for rows in (train, val):
        check_labels(rows, len(names), _where(cfg))
    return train, val, names


def _looks_local(root: str) -> bool:
    """A path rather than a Hub repo id: absolute, relative with ./ or ../, or something that exists here."""
    return root.startswith(("/", "./", "../", "~")) or os.path.exists(root)


def build(cfg: Any, dist: Any) -> Any:
    """Load the dataset (rank 0 first), find splits and columns, and the train and val loaders."""
    from runner.data import indexed

    if cfg.DATA.HF_STREAMING:
        return _build_streaming(cfg, dist)
    train, val, names = indexed.local_first(dist, lambda first: _splits(cfg))
    return indexed.bundle(cfg, dist, train, val, names, _where(cfg))


def build_split(cfg: Any, dist: Any, split: str) -> Any:
    """An evaluation loader over another split of the dataset, classes as training's."""
    from runner.data import indexed

    if cfg.DATA.HF_STREAMING:
        from runner.data import hf_rows

        files = _stream_files(cfg)
        rows = _stream_held_out(cfg, files, split)
        return hf_rows.eval_loader(cfg, dist, rows, len(_stream_columns(cfg, files)[2]))
    rows, classes = indexed.local_first(dist, lambda first: _held_out(cfg, split))
    return indexed.eval_loader(cfg, dist, rows, classes, _where(cfg))


def _where(cfg: Any) -> str:
    """The dataset, as messages name it."""
    subset = f" ({cfg.DATA.SET})" if cfg.DATA.SET else ""
    return f"DATA.ROOT {cfg.DATA.ROOT}{subset}"


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------
def _quiet() -> Any:
    """The datasets module with its progress bars and warnings off: a run's stderr holds its own lines only."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


@lru_cache(maxsize=2)
def load(root: str, subset: str) -> Any:
    """The DatasetDict at `root` (a repo id or a local path), its configuration `subset` ('' = the default); a
    dataset that cannot be found or read is one line."""
    datasets = _quiet()
    try:
        loaded = datasets.load_dataset(os.path.expanduser(root), subset or None)
    except (datasets.exceptions.DatasetsError, OSError, ValueError, ImportError) as e:
        raise UserError(_not_loaded(root, e, datasets.config)) from None
    if not isinstance(loaded, datasets.DatasetDict):
        raise UserError(f"DATA.ROOT {root}: a streaming dataset (set DATA.HF_STREAMING false)")
    return loaded


def _not_loaded(root: str, err: Exception, config: Any) -> str:
    """The one line for a dataset that load_dataset could not give: what it said, and offline, what to do."""
    said = " ".join(str(err).split())[:300] or type(err).__name__
    line = f"DATA.ROOT {root}: the Hugging Face dataset could not be loaded: {said}"
    if config.HF_HUB_OFFLINE:
        line += (f" (HF_HUB_OFFLINE is set: only datasets already in the cache {config.HF_DATASETS_CACHE} load; "
                 "run once with the network, or on a machine that has it with the same HF_HOME)")
    return line


def _train_val(cfg: Any, splits: list[str]) -> tuple[str, str]:
    """(the train split's name, the val split's name or '' to hold out DATA.VAL_FRACTION of train)."""
    train = cfg.DATA.TRAIN_SPLIT or "train"
    if train not in splits:
        raise UserError(f"{_where(cfg)} has no split {train!r} (it has {', '.join(splits)}): set DATA.TRAIN_SPLIT")
    if cfg.DATA.VAL_SPLIT:
        if cfg.DATA.VAL_SPLIT not in splits:
            raise UserError(f"{_where(cfg)} has no split {cfg.DATA.VAL_SPLIT!r} (it has {', '.join(splits)}): "
                            "set DATA.VAL_SPLIT")
        return train, cfg.DATA.VAL_SPLIT
    found = [s for s in VAL_NAMES if s in splits and s not in (train, cfg.DATA.TEST_SPLIT)]
    return train, found[0] if found else ""


_FOUND: dict[tuple, tuple] = {}  # _splits' answers by the keys they read: the check, known_split and build ask alike
_READS = ("ROOT", "SET", "TRAIN_SPLIT", "VAL_SPLIT", "TEST_SPLIT", "IMAGE_COLUMN", "LABEL_COLUMN", "VAL_FRACTION")


def _splits(cfg: Any) -> tuple[Any, Any, list[str]]:
    """(train Rows, val Rows, class names) of the dataset, found once per process for the same keys."""
    key = (cfg.SEED, *(getattr(cfg.DATA, k) for k in _READS))
    if key not in _FOUND:
        _FOUND[key] = _find_splits(cfg)
    return _FOUND[key]


def _find_splits(cfg: Any) -> tuple[Any, Any, list[str]]:
    """(train Rows, val Rows, class names): the splits, columns and classes found or named."""
    dd = load(cfg.DATA.ROOT, cfg.DATA.SET)
    train_name, val_name = _train_val(cfg, list(dd))
    table = dd[train_name]
    image, label = image_column(cfg, table), label_column(cfg, table)
    names, to_index = classes(table, label)
    train = _rows(cfg, table, train_name, image, label, to_index)
    if val_name:
        log.info("%s: training on split %s, validating on %s", _where(cfg), train_name, val_name)
        return train, _rows(cfg, dd[val_name], val_name, image, label, to_index), names
    log.info("%s has no validation split (%s): holding out DATA.VAL_FRACTION %g of %s", _where(cfg),
             "|".join(VAL_NAMES), cfg.DATA.VAL_FRACTION, train_name)
    return (*hold_out(train, cfg.DATA.VAL_FRACTION, cfg.SEED), names)


def _held_out(cfg: Any, split: str) -> tuple[Any, int]:
    """(Rows of `split`, the number of training classes) for an evaluation of another split."""
    dd = load(cfg.DATA.ROOT, cfg.DATA.SET)
    train_name, val_name = _train_val(cfg, list(dd))
    if split not in dd or split in (train_name, val_name):
        others = [s for s in dd if s not in (train_name, val_name)]
        raise UserError(f"{_where(cfg)}: {split!r} is not a held-out split (train {train_name}, val "
                        f"{val_name or 'held out of train'}; others: {', '.join(others) or 'none'})")
    table = dd[train_name]
    image, label = image_column(cfg, table), label_column(cfg, table)
    names, to_index = classes(table, label)
    return _rows(cfg, dd[split], split, image, label, to_index), len(names)


# ---------------------------------------------------------------------------------------------------------
# DATA.HF_STREAMING: the parquet files read as streams (runner/data/hf_stream.py, hf_rows.py)
# ---------------------------------------------------------------------------------------------------------
def _build_streaming(cfg: Any, dist: Any) -> Any:
    """The streaming loaders: nothing downloaded, each process reading its streams of the train files."""
    from runner.data import hf_rows, hf_stream
    from runner.data.classes import check_classes

    hf_stream.check_streams(cfg, dist.world_size)
    train, val, names = _stream_splits(cfg)
    check_classes(cfg, names, _where(cfg))
    for rows in (train, val):
        log.info("%s: %d rows in %d parquet files, streamed (%s)", rows.split, rows.total, len(rows.urls),
                 _where(cfg))
    return hf_rows.bundle(cfg, dist, train, val, names)


def _stream_files(cfg: Any) -> dict[str, tuple[str, ...]]:
    """{split: parquet files} of the dataset, as `datasets` resolves them; one line when it cannot."""
    from runner.data import hf_stream

    datasets = _quiet()
    try:
        return hf_stream.data_files(cfg.DATA.ROOT, cfg.DATA.SET)
    except (datasets.exceptions.DatasetsError, OSError, ValueError, ImportError) as e:
        raise UserError(_not_loaded(cfg.DATA.ROOT, e, datasets.config)) from None


def _stream_columns(cfg: Any, files: dict[str, tuple[str, ...]]) -> tuple[str, str, list[str]]:
    """(image column, label column, class names) from the features of the train split's first file."""
    from types import SimpleNamespace

    from runner.data import hf_stream

    table = SimpleNamespace(features=hf_stream.features(files[_train_val(cfg, list(files))[0]][0]))
    image, label = image_column(cfg, table), label_column(cfg, table)
    return image, label, hf_stream.index_classes(table.features[label], cfg.MODEL.NUM_CLASSES, label, _where(cfg))


def _stream_splits(cfg: Any) -> tuple[Any, Any, list[str]]:
    """(train, val ParquetSplit, class names); a val split is needed (a stream has no rows to hold out)."""
    from runner.data import hf_stream

    files = _stream_files(cfg)
    train, val = _train_val(cfg, list(files))
    if not val:
        raise UserError(f"{_where(cfg)} has no validation split ({'|'.join(VAL_NAMES)}): DATA.HF_STREAMING cannot "
                        "hold out DATA.VAL_FRACTION of a stream; name one with DATA.VAL_SPLIT")
    image, label, names = _stream_columns(cfg, files)
    splits = [hf_stream.parquet_split(s, files[s], image, label, _where(cfg)) for s in (train, val)]
    return splits[0], splits[1], names


def _stream_held_out(cfg: Any, files: dict[str, tuple[str, ...]], split: str) -> Any:
    """The ParquetSplit of a held-out split (DATA.TEST_SPLIT, tools/eval.py --split)."""
    from runner.data import hf_stream

    train, val = _train_val(cfg, list(files))
    if split not in files or split in (train, val):
        others = [s for s in files if s not in (train, val)]
        raise UserError(f"{_where(cfg)}: {split!r} is not a held-out split (train {train}, val {val or 'none'}; "
                        f"others: {', '.join(others) or 'none'})")
    image, label, _ = _stream_columns(cfg, files)
    return hf_stream.parquet_split(split, files[split], image, label, _where(cfg))


# ---------------------------------------------------------------------------------------------------------
# Columns, classes, rows
# ---------------------------------------------------------------------------------------------------------
def _columns_of(table: Any, kind: str) -> list[str]:
    """The columns whose feature is datasets' `kind` (Image, ClassLabel)."""
    return [name for name, feature in table.features.items() if type(feature).__name__ == kind]


def image_column(cfg: Any, table: Any) -> str:
    """DATA.IMAGE_COLUMN, or the one column with an Image feature."""
    return _column(cfg, table, "IMAGE_COLUMN", _columns_of(table, "Image"), "an Image feature")


def label_column(cfg: Any, table: Any) -> str:
    """DATA.LABEL_COLUMN, or the one ClassLabel column, or a column called label or labels."""
    found = _columns_of(table, "ClassLabel") or [c for c in LABEL_NAMES if c in table.features][:1]
    return _column(cfg, table, "LABEL_COLUMN", found, "a ClassLabel feature (or the name label)")


def _column(cfg: Any, table: Any, key: str, found: list[str], what: str) -> str:
    """The named column (that exists), or the only one found; a one-line UserError otherwise."""
    named, columns = getattr(cfg.DATA, key), ", ".join(table.features)
    if named:
        if named not in table.features:
            raise UserError(f"DATA.{key} {named!r}: {_where(cfg)} has no such column (it has {columns})")
        return named
    if len(found) != 1:
        many = f"{len(found)} columns with {what} ({', '.join(found)})" if found else f"no column with {what}"
        raise UserError(f"{_where(cfg)} has {many}: name one with DATA.{key} (columns: {columns})")
    return found[0]


def classes(table: Any, column: str) -> tuple[list[str], dict[Any, int] | None]:
    """(class names, a map from label values to class indices, or None when they are indices already)."""
    feature = table.features[column]
    if type(feature).__name__ == "ClassLabel":
        return list(feature.names), None
    values = set(table[column])
    if all(isinstance(v, int) for v in values):
        return [str(i) for i in range(max(values) + 1)], None
    names = sorted(str(v) for v in values)  # string labels: classes sorted by name, as image folders are
    return names, {v: names.index(str(v)) for v in values}


def _rows(cfg: Any, table: Any, split: str, image: str, label: str, to_index: dict | None) -> Any:
    """Rows of one split: labels read once (a column of the arrow table), images opened row by row."""
    from runner.data.indexed import Rows

    if label not in table.features or image not in table.features:
        raise UserError(f"{_where(cfg)}: split {split} lacks the column {label if image in table.features else image}")
    labels = list(table[label])
    if to_index is not None:
        labels = [to_index.get(v, -1) for v in labels]
    reader = RowImages(_images_only(table, image), image, split)
    return Rows(split, list(enumerate(labels)), reader, reader.describe)


def _images_only(table: Any, column: str) -> Any:
    """The split with its image column alone, undecoded (bytes or a path): opened lazily as image files are."""
    datasets = _quiet()
    try:
        return table.select_columns([column]).cast_column(column, datasets.Image(decode=False))
    except (ValueError, TypeError, NotImplementedError) as e:  # pyarrow's casts raise subclasses of these
        raise UserError(f"column {column!r} does not hold images ({table.features[column]}): name the image "
                        f"column with DATA.IMAGE_COLUMN ({' '.join(str(e).split())[:200]})") from None


def hold_out(rows: Any, fraction: float, seed: int) -> tuple[Any, Any]:
    """(train, val) Rows: `fraction` of `rows` held out for validation, the same ones for the same seed."""
    import random
    from dataclasses import replace

    order = list(range(len(rows.samples)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(fraction * len(order)))
    val = sorted(order[:n_val])
    train = sorted(order[n_val:])
    return (replace(rows, samples=[rows.samples[i] for i in train]),
            replace(rows, split="val", samples=[rows.samples[i] for i in val]))


class RowImages:
    """The image of a row of one split, opened lazily (header only) from its bytes or its file, as open_image
    opens files: the transforms then choose a reduced decode. Pickled into loader workers with the split (an
    arrow table memory-mapped from datasets' cache)."""

    def __init__(self, table: Any, column: str, split: str):
        self.table, self.column, self.split = table, column, split

    def __call__(self, row: int) -> Any:
        """The row's PIL image, not yet decoded."""
        from PIL import Image

        cell = self.table[row][self.column]
        if cell.get("bytes"):
            return Image.open(io.BytesIO(cell["bytes"]))
        return Image.open(cell["path"])

    def describe(self, row: int) -> str:
        """The row as messages name it."""
        return f"{self.split} row {row}"
