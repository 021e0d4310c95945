"""TRAIN.TIME_LIMIT's formats: seconds, [D-][H:]MM:SS as SLURM writes them; malformed clocks refused."""
from __future__ import annotations

import pytest

from runner.config.derived import parse_time_limit


@pytest.mark.parametrize("text, seconds", [("", 0.0), ("0", 0.0), ("90", 90.0), ("1:30", 90.0), ("90:00", 5400.0),
                                           ("1:02:03", 3723.0), ("2-00:00:10", 172810.0)])
def test_accepted_formats(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["1:99:00", "1:00:60", "1:2:3:4", "-5", "x", "a-1:00:00", "nan"])
def test_malformed_clocks_are_refused(text):
    assert parse_time_limit(text) is None
