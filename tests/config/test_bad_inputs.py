"""Bad inputs found by benchmarks/bad_inputs.py that used to end in a traceback or be taken silently."""
from __future__ import annotations

import pytest

from runner.config import load_config
from runner.errors import UserError


@pytest.mark.parametrize("key, value, fragment", [
    ("DATA.IMG_SIZE", "100000", "DATA.IMG_SIZE must be in [1, 8192], got 100000"),  # was a 39-line allocator traceback
    ("EVAL.IMG_SIZE", "100000", "EVAL.IMG_SIZE must be in [0, 8192]"),
    ("TRAIN.TIME_LIMIT", "1:99:00", "TRAIN.TIME_LIMIT"),  # was taken as 2:39:00
])
def test_refused_in_one_line(key, value, fragment):
    with pytest.raises(UserError) as refused:
        load_config([key, value], check_paths=False)
    assert fragment in str(refused.value) and "\n" not in str(refused.value)


def test_the_largest_sides_are_still_taken():
    cfg, _ = load_config(["DATA.IMG_SIZE", "8192", "EVAL.IMG_SIZE", "0"], check_paths=False)
    assert cfg.DATA.IMG_SIZE == 8192
