"""Reading DATA.HF_STREAMING's parquet rows (runner/data/hf_stream.py finds the files): the shards source's train
and val parts and loader (runner/data/shards/stream.py), with rows of parquet files in place of tar members, so
the order, the split among processes and workers, and the resume at a position are the shards'."""
from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

from runner.data.hf_stream import ParquetSplit, open_file
from runner.data.shards.stream import Decoder, Patience, ShardLoader, StreamReader, TrainParts, ValParts
from runner.errors import UserError

BATCH_ROWS = 64  # rows decoded from parquet at a time: a small, bounded read ahead


# ---------------------------------------------------------------------------------------------------------
def _rows(url: str, first: int, end: int, columns: list[str]) -> Iterator[dict]:
    """Rows first..end-1 of one parquet file (only `columns`), starting at the row group that holds `first`."""
    import pyarrow.parquet as pq

    with open_file(url) as f:
        pf = pq.ParquetFile(f)
        groups, row, start = [], 0, None
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if row + n > first and row < end:
                groups.append(g)
                start = row if start is None else start
            row += n
        if row < end:
            raise UserError(f"parquet file {url} holds {row} rows, fewer than the {end} it held when the run began: "
                            "the dataset changed under the run")
        i = start if start is not None else first
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=groups, columns=columns):
            for record in batch.to_pylist():
                if i >= end:
                    return
                if i >= first:
                    yield {"__key__": f"row {i}", "__url__": url, **record}
                i += 1


def read_rows(shards: ParquetSplit, index: int, first: int, end: int, patience: Patience) -> Iterator[dict]:
    """Rows first..end-1 of the split's file `index`; a failed read is retried (DATA.SHARD_RETRIES) from the next
    row not yet yielded, then one line naming the file."""
    url, done, tries = shards.urls[index], first, 0
    while done < end:
        try:
            for sample in _rows(url, done, end, [shards.image, shards.label]):
                yield sample
                done += 1
        except (OSError, ValueError) as e:
            tries += 1
            if tries >= patience.retries:
                reason = " ".join(f"{type(e).__name__}: {e}".split())[:200]
                raise UserError(f"parquet file {url} cannot be read after {tries} tries ({reason})") from None
            time.sleep(0.2 * 2**tries)


class RowDecoder(Decoder):
    """A parquet row to (transformed image, target), bad images counted against DATA.BAD_FILE_BUDGET."""

    def __init__(self, shards: ParquetSplit, *args: Any):
        super().__init__(*args)
        self.image_key, self.label_key = shards.image, shards.label

    def target(self, sample: dict) -> int:
        """The row's class index; one line naming the row when it is not one."""
        label = sample[self.label_key]
        if not isinstance(label, int) or not 0 <= label < self.num_classes:
            raise UserError(f"{sample['__key__']} of {sample['__url__']} has label {label!r}, not a class index "
                            f"0..{self.num_classes - 1} (an unlabelled split?)")
        return label

    def image(self, sample: dict) -> Any:
        """The transformed image from the row's bytes (or path), or None (counted, named once) when unreadable."""
        from PIL import Image

        from runner.data.folder import DECODE_ERRORS

        cell = sample[self.image_key]
        try:
            if not isinstance(cell, dict) or not (cell.get("bytes") or cell.get("path")):
                raise ValueError(f"column {self.image_key!r} holds no image")
            return self.transform(Image.open(io.BytesIO(cell["bytes"]) if cell.get("bytes") else cell["path"]))
        except DECODE_ERRORS as e:
            self._failure(sample, e)
            return None


class RowStream(StreamReader):
    """One training stream over the split's parquet files."""

    def _read_from(self, b: int) -> Iterator[dict]:
        """The stream's rows from the start of block b to its end."""
        start, _ = self.plan.block_range(self.k, b)
        for index, first, end in self.plan.pieces(start, (self.k + 1) * self.plan.stream_len):
            yield from read_rows(self.shards, index, first, end, self.patience)


class TrainRows(TrainParts):
    """Each worker's part of every micro-batch of this rank, read from its streams' parquet rows."""

    reader = RowStream


class ValRows(ValParts):
    """Batches of this rank's val files (r, r + world, ...), each worker reading its own of them."""

    def read(self, s: int) -> Iterator[dict]:
        """Every row of file s."""
        return read_rows(self.shards, s, 0, self.shards.counts[s], self.patience)


# ---------------------------------------------------------------------------------------------------------
# The loaders
# ---------------------------------------------------------------------------------------------------------
def _loader(cfg: Any, dist: Any, parts: TrainRows | ValRows) -> Any:
    """A ShardLoader over `parts`, on the device."""
    from runner.data.loaders import ToDevice, default_workers, worker_options

    workers = default_workers(cfg, dist)
    options = worker_options(cfg, parts) if workers else {}
    return ToDevice(ShardLoader(parts, workers, cfg.DATA.PREFETCH_FACTOR, options), dist.device,
                    cfg.MODEL.CHANNELS_LAST)


def _decoder(cfg: Any, split: ParquetSplit, classes: int, training: bool) -> RowDecoder:
    """The split's decoder: timm's transforms from cfg.AUG, the bad-image budget."""
    from runner.data.folder import build_transform

    return RowDecoder(split, build_transform(cfg, training), classes, split.total, cfg.DATA.BAD_FILE_BUDGET,
                      split.split)


def bundle(cfg: Any, dist: Any, train: ParquetSplit, val: ParquetSplit, names: list[str]) -> Any:
    """The run's DataBundle: the streaming train loader (the shards' order over the files) and the val loader."""
    from runner.data.build import DataBundle, eval_batch_size

    d = cfg.DATA
    patience = Patience(d.SHARD_RETRIES, d.RETRY_S)
    parts = TrainRows(train, _decoder(cfg, train, len(names), True), dist, seed=cfg.SEED, batch_size=d.BATCH_SIZE,
                      accum=cfg.TRAIN.ACCUM_STEPS, streams=d.SHARD_STREAMS, window=d.SHARD_WINDOW, patience=patience)
    val_parts = ValRows(val, _decoder(cfg, val, len(names), False), dist, eval_batch_size(cfg), patience)
    return DataBundle(_loader(cfg, dist, parts), _loader(cfg, dist, val_parts), list(names))


def eval_loader(cfg: Any, dist: Any, rows: ParquetSplit, classes: int) -> Any:
    """An evaluation loader streaming another split, each row once (DATA.TEST_SPLIT, tools/eval.py --split)."""
    from runner.data.build import eval_batch_size

    patience = Patience(cfg.DATA.SHARD_RETRIES, cfg.DATA.RETRY_S)
    return _loader(cfg, dist, ValRows(rows, _decoder(cfg, rows, classes, False), dist, eval_batch_size(cfg), patience))
