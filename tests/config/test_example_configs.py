"""Every example config under configs/ loads, validates and names a real timm model and optimizer."""
from __future__ import annotations

from pathlib import Path

import pytest
import timm
from timm.optim import list_optimizers

from runner.config import diff_configs, load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if "test" not in p.parts and "sweeps" not in p.parts
                  and p.name != "base.yaml")  # configs/sweeps: sweep files (runner.sweep), not configs


def test_there_are_examples():
    names = {p.relative_to(ROOT / "configs").as_posix() for p in EXAMPLES}
    assert {"digits/resnet18.yaml", "imagenet/resnet50.yaml", "imagenet/vit_small.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_example_config_loads(path, tmp_path):
    cfg, _ = load_config(["--cfg", str(path), "DATA.ROOT", str(tmp_path), "OUTPUT_DIR", str(tmp_path / "o")])
    assert cfg.is_frozen()
    assert timm.is_model(cfg.MODEL.NAME), cfg.MODEL.NAME
    assert cfg.TRAIN.OPTIMIZER in list_optimizers()


def test_digits_config_old_name_loads_the_renamed_one():
    """configs/digits/resnet18.yaml (the old name) is test_resnet.yaml but for its own default OUTPUT_DIR."""
    old, _ = load_config(["--cfg", str(ROOT / "configs/digits/resnet18.yaml")])
    new, _ = load_config(["--cfg", str(ROOT / "configs/digits/test_resnet.yaml")])
    assert new.MODEL.NAME == "test_resnet" and new.OUTPUT_DIR.endswith("digits/test_resnet")
    assert diff_configs(old, new) == [("OUTPUT_DIR", old.OUTPUT_DIR, new.OUTPUT_DIR)]
