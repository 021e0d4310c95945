"""runner/config/io.py: one flatten, output folder naming, dump and load back, diffs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from yacs.config import CfgNode

from runner.config import (
    MISSING,
    changed_from_defaults,
    config_from_yaml_text,
    default_output_dir,
    diff_configs,
    dump_config,
    flatten,
    get_default_config,
    load_config,
)
from runner.errors import UserError

CHAIN = Path(__file__).resolve().parents[2] / "configs" / "test" / "chain"


# ---------------------------------------------------------------------------------------------------------
# Flatten
# ---------------------------------------------------------------------------------------------------------
def test_one_flatten_for_configs_and_plain_mappings():
    cfg = get_default_config()
    flat = flatten(cfg)
    assert list(flat)[:4] == ["OUTPUT_DIR", "SEED", "DEVICE", "IMPORTS"]  # definition order
    assert flat["AUG.SCALE"] == (0.08, 1.0) and flat["AMP.ENABLED"] is False  # values as they are
    assert not any(isinstance(v, dict) for v in flat.values())
    # a dumped config read back as plain dicts (as tools/summarize.py reads config.yaml) gives the same keys
    plain = flatten(yaml.safe_load(dump_config(cfg)))
    assert plain == {k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}
    assert flatten({"A": {"B": {"C": 1}, "D": [1]}, "E": {}, 1: "x"}) == {"A.B.C": 1, "A.D": [1], "1": "x"}


def test_summary_reads_configs_with_the_one_flatten():
    import runner.sweep.summary

    assert runner.sweep.summary.flatten is flatten  # tools/predict.py's use: tests/test_predict.py (split_images)
    from runner.config.schema import AUTO_KEYS, is_auto

    # an "auto" key as a run without pretrained weights stores it (config.yaml holds resolved values)
    expected = {k: AUTO_KEYS[k] if is_auto(k, v) else v for k, v in flatten(get_default_config()).items()}
    assert runner.sweep.summary.default_values() == {k: list(v) if isinstance(v, tuple) else v
                                               for k, v in expected.items()}


# ---------------------------------------------------------------------------------------------------------
# Output folder naming
# ---------------------------------------------------------------------------------------------------------
def test_output_dir_naming_rules():
    assert default_output_dir([], []) == "output/default"
    assert re.fullmatch(r"output/a__resnet18-[0-9a-f]{8}",
                        default_output_dir(["configs/a.yaml", "configs/x/resnet18.yaml"], []))
    assert default_output_dir(["configs/c/resnet18.yaml"], [("LOG.PERIOD", 5), ("TRAIN.EXTEND", True)]) \
        == "output/c/resnet18"  # resume-safe overrides keep the folder
    # ... except the run's length: an epochs ablation is one run per value
    assert default_output_dir(["configs/c/resnet18.yaml"], [("TRAIN.EPOCHS", 30), ("LOG.PERIOD", 5)]) \
        == "output/c/resnet18-epochs=30"
    assert default_output_dir(["configs/c/resnet18.yaml"], [("TRAIN.MAX_STEPS", 9)]) == "output/c/resnet18-max_steps=9"
    assert default_output_dir(["configs/c/resnet18.yaml"], [("TRAIN.LR", 0.05), ("MODEL.NAME", "resnet10t")]) \
        == "output/c/resnet18-model.name=resnet10t-lr=0.05"
    # same config, same folder: order and repeated keys (last wins) do not matter
    shuffled = [("TRAIN.LR", 0.1), ("TRAIN.LR", 0.05), ("MODEL.NAME", "resnet10t")]
    assert default_output_dir(["r.yaml"], [("MODEL.NAME", "resnet10t"), ("TRAIN.LR", 0.05)]) \
        == default_output_dir(["r.yaml"], shuffled)


def test_output_dir_never_shared_and_always_safe():
    points = [[("TRAIN.LR", lr)] for lr in (0.1, 0.05, 0.01)] + [
        [("MODEL.NAME", "a/b")], [("MODEL.NAME", "a_b")], [("MODEL.NAME", "a b")],
        [("DATA.MEAN", (0.5, 0.5, 0.5))], [("DATA.MEAN", (0.5, 0.5, 0.4))],
        [("AUG.AUTO_AUGMENT", "x=1")], [("AUG.AUTO_AUGMENT", "x"), ("MODEL.NAME", "1")],
        [(k, 0.123456789) for k in ("TRAIN.LR", "TRAIN.MIN_LR", "TRAIN.WARMUP_LR", "TRAIN.MOMENTUM")],
        [(k, 0.123456789) for k in ("TRAIN.LR", "TRAIN.MIN_LR", "TRAIN.WARMUP_LR", "TRAIN.DECAY_RATE")],
    ]
    dirs = [default_output_dir(["cfg.yaml"], p) for p in points]
    assert len(set(dirs)) == len(dirs)
    for d in dirs:
        name = d.split("/", 1)[1]
        assert re.fullmatch(r"[A-Za-z0-9._=-]+", name) and len(name) <= 80, d


# ---------------------------------------------------------------------------------------------------------
# Round trip, diffs
# ---------------------------------------------------------------------------------------------------------
def test_dumped_config_loads_back_identically(tmp_path):
    cfg, _ = load_config(["--cfg", str(CHAIN / "top.yaml"), "MODEL.NAME", "18", "AUG.AUTO_AUGMENT", "1e-3",
                          "DATA.MEAN", "[1, 0.5, 0.25]", "TRAIN.WARMUP_LR", "1.5e-7", "DATA.ROOT", "yes",
                          "TRAIN.EPOCHS", "7"])
    path = tmp_path / "run" / "config.yaml"
    path.parent.mkdir()
    path.write_text(dump_config(cfg))
    again, _ = load_config(["--cfg", str(path)])
    assert diff_configs(cfg, again) == []
    assert again == cfg and again.DATA.MEAN == (1.0, 0.5, 0.25) and again.MODEL.NAME == "18"
    stored = config_from_yaml_text(dump_config(cfg))
    assert stored.is_frozen() and stored == cfg
    assert dump_config(again) == dump_config(cfg)


def test_config_from_yaml_text_rejects_bad_text():
    with pytest.raises(UserError, match="unknown config key TRAIN.NOPE"):
        config_from_yaml_text("TRAIN:\n  NOPE: 1\n", "ckpt")
    with pytest.raises(UserError, match="_BASE_ is not allowed"):
        config_from_yaml_text("_BASE_: a.yaml\n")


def test_diff_configs_and_changed_from_defaults():
    cfg, _ = load_config(["TRAIN.LR", "0.3", "DATA.MEAN", "[0.5, 0.5, 0.5]", "TRAIN.EPOCHS", "10"])
    default = get_default_config()
    assert diff_configs(default, cfg) == [("OUTPUT_DIR", "", cfg.OUTPUT_DIR),
                                          ("DATA.MEAN", "auto", (0.5, 0.5, 0.5)),
                                          ("TRAIN.LR", 0.1, 0.3)]
    assert changed_from_defaults(cfg) == {"DATA.MEAN": (0.5, 0.5, 0.5), "TRAIN.LR": 0.3}
    older = CfgNode({"TRAIN": {"LR": 0.3, "OLD_KEY": 1}})
    assert ("TRAIN.OLD_KEY", 1, MISSING) in diff_configs(older, cfg)
