"""Every example config under configs/ loads, validates and names a real timm model and optimizer."""
from __future__ import annotations

from pathlib import Path

import pytest
import timm
from timm.optim import list_optimizers

from runner.config import load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if "test" not in p.parts and p.name != "base.yaml")


def test_there_are_examples():
    names = {p.relative_to(ROOT / "configs").as_posix() for p in EXAMPLES}
    assert {"digits/resnet18.yaml", "imagenet/resnet50.yaml", "imagenet/vit_small.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_example_config_loads(path, tmp_path):
    cfg, _ = load_config(["--cfg", str(path), "DATA.ROOT", str(tmp_path), "OUTPUT_DIR", str(tmp_path / "o")])
    assert cfg.is_frozen()
    assert timm.is_model(cfg.MODEL.NAME), cfg.MODEL.NAME
    assert cfg.TRAIN.OPTIMIZER in list_optimizers()
