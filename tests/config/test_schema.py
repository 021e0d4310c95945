"""runner/config/schema.py: the defaults validate, timm's optimizer names, coercion to the default's type."""
from __future__ import annotations

import pytest

from runner.config import OPTIMIZERS, coerce_value, get_default_config, load_config, validate
from runner.config.keypath import get_value
from runner.errors import UserError


def test_defaults_pass_validation():
    cfg, _ = load_config([])
    assert cfg.is_frozen() and cfg.OUTPUT_DIR == "output/default"
    validate(get_default_config())


def test_optimizer_list_matches_timm():
    timm_optim = pytest.importorskip("timm.optim")
    names = {n for n in timm_optim.list_optimizers() if not n.startswith(("bnb", "fused"))}
    assert set(OPTIMIZERS) == names


# ---------------------------------------------------------------------------------------------------------
# Coercion
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key, token, expected", [
    ("TRAIN.LR", "1", 1.0),  # int for a float key
    ("TRAIN.LR", "1e-3", 0.001),  # YAML 1.1 reads this as text; still a number here
    ("TRAIN.LR", "5E-2", 0.05),
    ("AMP.ENABLED", "true", True), ("AMP.ENABLED", "True", True),
    ("AMP.ENABLED", "false", False), ("AMP.ENABLED", "False", False),
    ("AMP.ENABLED", "yes", True), ("AMP.ENABLED", "off", False),  # YAML 1.1 booleans, as in files
    ("MODEL.NAME", "18", "18"),  # a number for a text key keeps its text
    ("MODEL.NAME", "1e-3", "1e-3"), ("MODEL.NAME", "1.50", "1.50"), ("MODEL.NAME", "'quoted'", "quoted"),
    ("DATA.ROOT", "", ""),
    ("DATA.BATCH_SIZE", "32.0", 32),  # a whole float for an int key
    ("DATA.NUM_WORKERS", "-1", -1),
    ("DATA.MEAN", "[0.5, 0.5, 0.5]", (0.5, 0.5, 0.5)),  # list -> tuple
    ("DATA.MEAN", "(1, 0.5, 0.5)", (1.0, 0.5, 0.5)),  # Python tuple text, ints to floats
    ("AUG.AUTO_AUGMENT", "rand-m9-mstd0.5-inc1", "rand-m9-mstd0.5-inc1"),
    ("TRAIN.OPTIMIZER", "lookahead_adamw", "lookahead_adamw"),
])
def test_command_line_coercion(key, token, expected):
    cfg, info = load_config([key, token])
    value = get_value(cfg, key)
    assert value == expected and type(value) is type(expected)
    assert info.overrides == [(key, expected)]


def test_null_only_where_the_default_is_none():
    assert coerce_value("X.ANY", None, None) is None
    assert coerce_value("X.ANY", [1, 2], None) == (1, 2)
    with pytest.raises(UserError, match="MODEL.NAME cannot be null"):
        coerce_value("MODEL.NAME", None, "resnet18")
    with pytest.raises(UserError, match="TRAIN.LR cannot be null"):
        coerce_value("TRAIN.LR", None, 0.1, "~", "f.yaml:2")


def test_valid_edge_values_pass():
    cfg, _ = load_config(["CHECKPOINT.RESUME", "none", "AUG.MIXUP", "0.8", "AUG.CUTMIX", "1.0",
                          "MODEL.COMPILE", "true", "CUDNN.DETERMINISTIC", "true", "MODEL.IN_CHANS", "1",
                          "DATA.MEAN", "[0.5]", "DATA.STD", "[0.5]", "DATA.NAME", "synthetic"])
    assert cfg.MODEL.COMPILE and cfg.CUDNN.DETERMINISTIC and cfg.DATA.MEAN == (0.5,)
