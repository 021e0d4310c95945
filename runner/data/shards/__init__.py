"""DATA.NAME shards: webdataset-format tar shards (KEY.jpg + KEY.cls, as tools/make_shards.py, img2dataset and
timm's wds reader have them) streamed once per epoch in a layout-free order that resumes mid-epoch on any number
of processes the stream count allows. Imports run index, order <- stream <- source (the source module:
runner/data/sources.py); this package builds the loaders."""
from __future__ import annotations

from typing import Any

from runner.data.shards.index import CLASS_MAP, INDEX, ShardSplit, check_source, read_classes, read_index

__all__ = ["CLASS_MAP", "INDEX", "ShardSplit", "build_shard_split", "build_shards", "check_source", "read_classes",
           "read_index"]


def build_shards(cfg: Any, dist: Any, eval_batch: int) -> tuple[Any, Any, list[str]]:
    """The train and val loaders over DATA.ROOT's shards, and the class names."""
    from runner.data.classes import check_classes
    from runner.data.folder import build_transform
    from runner.data.loaders import ToDevice, default_workers, worker_options
    from runner.data.shards.stream import Decoder, Patience, ShardLoader, TrainParts, ValParts

    check_source(cfg, dist.world_size)
    names = read_classes(cfg)
    check_classes(cfg, names, f"DATA.ROOT {cfg.DATA.ROOT}")
    d, workers = cfg.DATA, default_workers(cfg, dist)
    train_split, val_split = read_index(cfg, "train"), read_index(cfg, "val")
    decoders = [Decoder(build_transform(cfg, training), len(names), split.total, d.BAD_FILE_BUDGET, split.split)
                for training, split in ((True, train_split), (False, val_split))]
    train = TrainParts(train_split, decoders[0], dist, seed=cfg.SEED, batch_size=d.BATCH_SIZE,
                       accum=cfg.TRAIN.ACCUM_STEPS, streams=d.SHARD_STREAMS, window=d.SHARD_WINDOW,
                       patience=Patience(d.SHARD_RETRIES, d.RETRY_S))
    val = ValParts(val_split, decoders[1], dist, eval_batch, Patience(d.SHARD_RETRIES, d.RETRY_S))
    options = worker_options(cfg, train) if workers else {}
    loaders = [ToDevice(ShardLoader(parts, workers, d.PREFETCH_FACTOR, options), dist.device,
                        cfg.MODEL.CHANNELS_LAST) for parts in (train, val)]
    return loaders[0], loaders[1], names


def build_shard_split(cfg: Any, dist: Any, split: str, eval_batch: int) -> Any:
    """An evaluation loader over DATA.ROOT/<split>/'s shards (the test split), each sample once."""
    from runner.data.folder import build_transform
    from runner.data.loaders import ToDevice, default_workers, worker_options
    from runner.data.shards.stream import Decoder, Patience, ShardLoader, ValParts

    d, names, shards, workers = cfg.DATA, read_classes(cfg), read_index(cfg, split), default_workers(cfg, dist)
    decoder = Decoder(build_transform(cfg, False), len(names), shards.total, d.BAD_FILE_BUDGET, split)
    parts = ValParts(shards, decoder, dist, eval_batch, Patience(d.SHARD_RETRIES, d.RETRY_S))
    options = worker_options(cfg, parts) if workers else {}
    return ToDevice(ShardLoader(parts, workers, d.PREFETCH_FACTOR, options), dist.device, cfg.MODEL.CHANNELS_LAST)
