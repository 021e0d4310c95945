"""DATA.HF_STREAMING: where a Hugging Face dataset's parquet files are and what they hold, read without loading
the dataset (runner/data/hf.py finds splits, columns and classes with them; runner/data/hf_rows.py reads rows).

The split's files are the ones `datasets` resolves (its data-files patterns: the Hub's data/<split>-*.parquet
layout, a local folder or file; hf:// URLs for a Hub repo, read by range requests through fsspec and
huggingface_hub), in its order; their row counts come from the parquet footers (steps per epoch are known before
step 1), the features (Image, ClassLabel) from the schema `datasets` stores in them. Torch-free: the check before
the claim reads these.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from runner.data.shards.index import ShardSplit
from runner.errors import UserError


@dataclass(frozen=True)
class ParquetSplit(ShardSplit):
    """One split's parquet files (`urls`, datasets' order), their row counts, and the image and label columns."""

    image: str
    label: str


@lru_cache(maxsize=4)
def data_files(root: str, subset: str) -> dict[str, tuple[str, ...]]:
    """{split: its files} as `datasets` resolves them for `root` (nothing downloaded); one line for a dataset that
    is not parquet files. datasets' own errors (not found, offline) pass to the caller."""
    import datasets

    builder = datasets.load_dataset_builder(os.path.expanduser(root), subset or None)
    files = {str(split): tuple(str(f) for f in found) for split, found in (builder.config.data_files or {}).items()}
    odd = sorted({f.rsplit(".", 1)[-1] for fs in files.values() for f in fs if not f.endswith(".parquet")})
    if builder.name != "parquet" or odd or not files:
        raise UserError(f"DATA.ROOT {root}: DATA.HF_STREAMING reads parquet files only, and this dataset is "
                        f"{builder.name} ({', '.join(odd) or 'no data files'}): set DATA.HF_STREAMING false")
    return files


def open_file(url: str) -> Any:
    """A binary file object for a local path or any fsspec URL (hf:// through huggingface_hub, HF_TOKEN honoured)."""
    import fsspec

    return fsspec.open(url, "rb").open()


@lru_cache(maxsize=256)
def footer(url: str) -> tuple[int, Any]:
    """(rows, arrow schema) of one parquet file, from its footer alone."""
    import pyarrow.parquet as pq

    try:
        with open_file(url) as f:
            pf = pq.ParquetFile(f)
            return pf.metadata.num_rows, pf.schema_arrow
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise UserError(f"parquet file {url} cannot be read: {' '.join(str(e).split())[:200]}") from None


def features(url: str) -> Any:
    """The datasets Features of a parquet file (as datasets stored them in its schema, else from the arrow types)."""
    import datasets

    return datasets.Features.from_arrow_schema(footer(url)[1])


def parquet_split(split: str, urls: tuple[str, ...], image: str, label: str, where: str) -> ParquetSplit:
    """One split's files with their row counts; its first file must hold both columns."""
    have = features(urls[0])
    missing = [c for c in (image, label) if c not in have]
    if missing:
        raise UserError(f"{where}: split {split} lacks the column {missing[0]}")
    return ParquetSplit(split, list(urls), [footer(u)[0] for u in urls], image, label)


def index_classes(feature: Any, num_classes: int, label: str, where: str) -> list[str]:
    """Class names of a label column whose values are class indices: a ClassLabel's names, or for integers
    MODEL.NUM_CLASSES's indices; string labels are refused (their classes are known only after every row)."""
    if type(feature).__name__ == "ClassLabel":
        return list(feature.names)
    if str(getattr(feature, "dtype", "")).startswith(("int", "uint")):
        return [str(i) for i in range(num_classes)]
    raise UserError(f"{where}: DATA.HF_STREAMING needs class indices in column {label!r} (a ClassLabel or integers), "
                    f"not {feature}: its classes would be known only after reading every row")


def check_streams(cfg: Any, world: int) -> None:
    """No repeated augmentation; DATA.SHARD_STREAMS split evenly among `world` processes."""
    d = cfg.DATA
    if d.REPEATED_AUG > 1:
        raise UserError(f"DATA.REPEATED_AUG {d.REPEATED_AUG} is not supported with DATA.HF_STREAMING (streams read "
                        "each sample once); use 1")
    if d.SHARD_STREAMS % world:
        fits = [w for w in range(1, d.SHARD_STREAMS + 1) if d.SHARD_STREAMS % w == 0]
        raise UserError(f"DATA.SHARD_STREAMS {d.SHARD_STREAMS} cannot be split evenly among {world} processes: run "
                        f"on {', '.join(map(str, fits))} processes (it fixes DATA.HF_STREAMING's training order: a "
                        "resume refuses a change)")


def check_rows(train: ParquetSplit, streams: int) -> None:
    """At least one training row per stream."""
    if train.total < streams:
        raise UserError(f"split {train.split} holds {train.total} rows, fewer than DATA.SHARD_STREAMS {streams}")
