"""Data: what a run trains and evaluates on, as loaders that resume at (epoch, position).

Modules, imports running one way (each imports only those above it):
    classes   check_classes (MODEL.NUM_CLASSES against the data), class_map.json
    memory    in-memory sets (digits, synthetic) and their seeded shift
    folder/   image folders: scan (and check), decode (fast first steps), dataset (timm transforms)
    loaders   the resume contract (ResumableLoader), DeviceLoader, ShardSampler, ToDevice
    shards/   webdataset tar shards: index, the layout-free order of streams, the streaming loader
    indexed   a source over a set indexable by row, each row an (image, label): the folder's transforms and
              loaders, one download per node; hf (Hugging Face datasets) and tvsets (torchvision's sets) use it
    hf_stream, hf_rows   DATA.HF_STREAMING: parquet files as the shards' streams (order, resume, rank/worker split)
    sources   DATA.NAME -> Source, torch-free: each source's module (digits, synthetic, folder/source,
              shards/source, hf, tvsets: build, and its config check run before OUTPUT_DIR is claimed) and what the rest
              of the runner asks of it; nothing outside runner/data/ branches on DATA.NAME
    resize    DATA.IMG_SIZE_SCHEDULE: ResizedLoader resizes the training batches to their epoch's size
    build     build_data(cfg, dist): the source's loaders, and the warnings about keys it ignores

A new data source: one module with `build(cfg, dist)` (and optionally `check`, `known_split`) and one
`register(...)` line in sources.py (its docstring says how), which declares its own config keys too (`keys=`).
Importing this package stays cheap and torch-free: build (torch) and image folders (torchvision, timm's
transforms) load on first use.
"""
from __future__ import annotations

from typing import Any

from runner.data.classes import read_class_map, write_class_map

__all__ = ["DataBundle", "build_data", "read_class_map", "write_class_map"]


def __getattr__(name: str) -> Any:
    """build_data and DataBundle on first use: `import runner.data.sources` must not import torch."""
    if name in ("DataBundle", "build_data"):
        from runner.data import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
