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


@pytest.mark.parametrize("value", ["-1", "4294967296", str(2**70), str(-2**70)])
def test_seed_has_one_range_and_one_message(value):
    # -1 was refused as "[0, 2**32)" and 2**70 as "[-2**63, 2**63)": one key, one range
    with pytest.raises(UserError) as refused:
        load_config(["SEED", value], check_paths=False)
    assert str(refused.value) == f"SEED must be in [0, 2**32), got {value} (command line)"


def test_seed_range_from_a_file_names_the_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(f"SEED: {2**70}\n")
    with pytest.raises(UserError, match=r"SEED must be in \[0, 2\*\*32\), got 1180591620717411303424 \(.*c.yaml:1"):
        load_config(["--cfg", str(f)], check_paths=False)


def test_an_unbounded_key_keeps_the_integer_limit():
    with pytest.raises(UserError, match=r"DATA.BATCH_SIZE must be an integer in \[-2\*\*63, 2\*\*63\)"):
        load_config(["DATA.BATCH_SIZE", str(2**70)], check_paths=False)


@pytest.mark.parametrize("value, ok", [("1000", False), ("257", False), ("256", True), ("-1", True), ("0", True)])
def test_num_workers_has_an_upper_bound(value, ok):
    # 1000 workers on 2 cores started 1000 processes and hung for minutes (or ran out of memory)
    if ok:
        assert load_config(["DATA.NUM_WORKERS", value], check_paths=False)[0].DATA.NUM_WORKERS == int(value)
        return
    with pytest.raises(UserError) as refused:
        load_config(["DATA.NUM_WORKERS", value], check_paths=False)
    assert str(refused.value) == (f"DATA.NUM_WORKERS must be in [0, 256] (or -1 for auto), got {value} "
                                  "(command line)")
