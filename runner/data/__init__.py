"""Data: what a run trains and evaluates on, as loaders that resume at (epoch, position).

Modules, imports running one way (each imports only those above it):
    classes   check_classes (MODEL.NUM_CLASSES against the data), class_map.json
    memory    in-memory sets (digits, synthetic) and their seeded shift
    folder/   image folders: scan (and check), decode (fast first steps), dataset (timm transforms)
    loaders   the resume contract (ResumableLoader), DeviceLoader, ShardSampler, ToDevice
    shards/   webdataset tar shards: index, the layout-free order of streams, the streaming loader
    build     build_data(cfg, dist): the one place that reads cfg.DATA to wire them

A new data set: one module (or package) with a builder, and one line in build.SOURCES (and its name in schema.py).
Importing this package stays cheap: image folders (torchvision, timm's transforms) load only when used.
"""
from runner.data.build import DataBundle, build_data
from runner.data.classes import read_class_map, write_class_map

__all__ = ["DataBundle", "build_data", "read_class_map", "write_class_map"]
