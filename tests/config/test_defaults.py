"""runner/config/defaults.py: a fresh copy each time, every key commented, the keys the issue named."""
from __future__ import annotations

import re
from pathlib import Path

from runner.config import RESUME_SAFE_KEYS, flatten, get_default_config
from runner.config.defaults import _C

DEFAULTS_PY = Path(__file__).resolve().parents[2] / "runner" / "config" / "defaults.py"


def test_defaults_are_a_fresh_unfrozen_clone():
    a, b = get_default_config(), get_default_config()
    assert not a.is_frozen()
    a.TRAIN.LR = 3.0
    assert b.TRAIN.LR == 0.1 and _C.TRAIN.LR == 0.1
    assert a.DATA.MEAN == "auto" and isinstance(a.AUG.SCALE, tuple)


def test_every_default_key_has_a_comment_and_every_section_a_banner():
    lines = DEFAULTS_PY.read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"_C(\.[A-Z_]+)+ = ", line):
            if line.endswith("= CN()"):
                assert re.fullmatch(r"# -{20,}", lines[i - 1]) and lines[i - 1] == lines[i - 3], line
                assert lines[i - 2].startswith("# "), f"no section title above {line}"
            else:
                assert lines[i - 1].lstrip().startswith("#"), f"no comment above {line}"


def test_issue_keys_exist():
    keys = flatten(get_default_config())
    for key in ("OUTPUT_DIR SEED DEVICE MODEL.NAME MODEL.NUM_CLASSES MODEL.IN_CHANS MODEL.CHECKPOINT "
                "MODEL.CHANNELS_LAST MODEL.COMPILE DATA.NAME DATA.ROOT DATA.IMG_SIZE DATA.BATCH_SIZE "
                "DATA.NUM_WORKERS TRAIN.EPOCHS TRAIN.OPTIMIZER TRAIN.LR TRAIN.WEIGHT_DECAY TRAIN.SCHEDULER "
                "TRAIN.WARMUP_EPOCHS TRAIN.ACCUM_STEPS TRAIN.CLIP_GRAD TRAIN.LABEL_SMOOTHING AMP.ENABLED "
                "AMP.DTYPE CUDNN.BENCHMARK CUDNN.DETERMINISTIC CHECKPOINT.PERIOD CHECKPOINT.RESUME "
                "LOG.PERIOD EVAL.PERIOD").split():
        assert key in keys
    assert RESUME_SAFE_KEYS <= set(keys)
    assert {"LOG.PERIOD", "PROFILE.ENABLED", "TRAIN.EPOCHS", "OUTPUT_DIR"} <= RESUME_SAFE_KEYS
    assert "TRAIN.LR" not in RESUME_SAFE_KEYS
