"""Image folders (DATA.NAME folder): scan (and check) the tree, decode fast, and the datasets with timm's
transforms; `source` is the source module (runner/data/sources.py); `files` reads loose image files for
tools/predict.py. Imports run scan, decode <- dataset <- source, and scan, decode <- files; this package gathers
their public names, each imported on first use (the table of sources imports `source` before any torch)."""
from __future__ import annotations

import importlib
from typing import Any

_HOME = {  # public name -> the module of this package that defines it
    **dict.fromkeys(["FolderDataset", "build_folder_datasets", "build_transform", "check_auto_augment", "image_mode",
                     "timm_transform"], "dataset"),
    **dict.fromkeys(["DECODE_ERRORS", "open_image", "speed_up"], "decode"),
    **dict.fromkeys(["IMG_EXTENSIONS", "MAX_WARNINGS", "SPLITS", "FolderIndex", "check_budget", "check_file",
                     "class_dirs", "image_files", "scan_folder"], "scan"),
    **dict.fromkeys(["ImageFiles", "collate_files", "expand_images", "read_image"], "files"),
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """A public name, imported from its module now (and kept)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value
