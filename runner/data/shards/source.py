"""DATA.NAME shards: webdataset tar shards under DATA.ROOT (a folder or an http(s) URL), streamed in a
layout-free order (this package).

A source module (runner/data/sources.py): only the small index reads before `build`; webdataset, torch and
timm's transforms inside it.
"""
from __future__ import annotations

from typing import Any

from runner.data.shards.index import INDEX, check_local_files, check_source, read_index, split_url
from runner.errors import UserError


def check(cfg: Any, fail: Any, check_files: bool, world: int) -> None:
    """A root, no repeated augmentation; with files checked, the index, class map, selection and stream count
    (check_source) before anything is written to OUTPUT_DIR."""
    d = cfg.DATA
    if not d.ROOT:
        fail("DATA.NAME", "DATA.NAME shards needs DATA.ROOT, the folder or http(s) URL that holds class_map.json "
                          "and train/, val/ (tools/make_shards.py writes them)")
    if d.REPEATED_AUG > 1:
        fail("DATA.REPEATED_AUG", f"DATA.REPEATED_AUG {d.REPEATED_AUG} is not supported with DATA.NAME shards "
                                  "(streams read each sample once); use 1")
    if check_files:
        try:
            check_source(cfg, world)
            if d.TEST_SPLIT:
                check_local_files(read_index(cfg, d.TEST_SPLIT), split_url(d.ROOT, d.TEST_SPLIT, INDEX))
        except UserError as e:
            fail("DATA.ROOT", str(e))


def build(cfg: Any, dist: Any) -> Any:
    """The streaming train and val loaders and the class map's names."""
    from runner.data.build import DataBundle, eval_batch_size
    from runner.data.shards import build_shards

    return DataBundle(*build_shards(cfg, dist, eval_batch_size(cfg)))


def build_split(cfg: Any, dist: Any, split: str) -> Any:
    """An evaluation loader over DATA.ROOT/<split>/'s shards (the test split)."""
    from runner.data.build import eval_batch_size
    from runner.data.shards import build_shard_split

    return build_shard_split(cfg, dist, split, eval_batch_size(cfg))
