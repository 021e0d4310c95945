"""Every warning of a run reaches log.txt: those from before the file opens, and Python's own warnings."""
from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.sinks import setup_logging


@pytest.fixture
def runner_log() -> Iterator[logging.Logger]:
    """The runner's logger; afterwards its handlers closed and removed and the warnings capture undone."""
    log = logging.getLogger("runner")
    try:
        yield log
    finally:
        logging.captureWarnings(False)
        for handler in log.handlers:
            handler.close()
        log.handlers.clear()


def _warn_and_read(log: logging.Logger, folder: Path, message: str) -> str:
    """Raise a UserWarning (shown always), flush the handlers, return log.txt."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(message, UserWarning, stacklevel=1)
    for handler in log.handlers:
        handler.flush()
    return (folder / "log.txt").read_text()


def test_early_and_python_warnings_reach_log_txt(tmp_path, runner_log):
    setup_logging(None, 0)  # the console only, while the folder is being claimed
    runner_log.warning("checkpoint x.pth is unusable (truncated): skipped")
    runner_log.info("an info line before the file: console only")
    setup_logging(str(tmp_path), 0)
    text = _warn_and_read(runner_log, tmp_path, "a library's UserWarning")
    assert "W checkpoint x.pth is unusable (truncated): skipped" in text.splitlines()[0]
    assert "a library's UserWarning" in text
    assert "an info line before the file" not in text


def test_warnings_reach_log_txt_after_a_capture_was_undone_from_outside(tmp_path, runner_log):
    """A capture undone by a warnings.catch_warnings block around an earlier run in this process (pytest wraps
    every test in one) is made again: logging.captureWarnings(True) alone does nothing the second time."""
    with warnings.catch_warnings():  # an earlier in-process run, inside a block that restores showwarning
        setup_logging(None, 0)
    setup_logging(str(tmp_path), 0)
    assert "after an undone capture" in _warn_and_read(runner_log, tmp_path, "after an undone capture")
