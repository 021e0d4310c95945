"""Image folders (DATA.NAME folder): scan (and check) the tree, decode fast, and the datasets with timm's
transforms. Imports run scan, decode <- dataset; this package gathers their public names."""
from runner.data.folder.dataset import (
    FolderDataset,
    build_folder_datasets,
    build_transform,
    check_auto_augment,
    image_mode,
    timm_transform,
)
from runner.data.folder.decode import DECODE_ERRORS, open_image, speed_up
from runner.data.folder.scan import (
    IMG_EXTENSIONS,
    MAX_WARNINGS,
    SPLITS,
    FolderIndex,
    check_budget,
    check_file,
    class_dirs,
    scan_folder,
)

__all__ = [
    "DECODE_ERRORS", "IMG_EXTENSIONS", "MAX_WARNINGS", "SPLITS", "FolderDataset", "FolderIndex",
    "build_folder_datasets", "build_transform", "check_auto_augment", "check_budget", "check_file", "class_dirs",
    "image_mode", "open_image", "scan_folder", "speed_up", "timm_transform",
]
