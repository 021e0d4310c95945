"""Every warning of a run reaches log.txt: those from before the file opens, and Python's own warnings."""
from __future__ import annotations

import logging
import warnings

from runner.sinks import setup_logging


def test_early_and_python_warnings_reach_log_txt(tmp_path):
    log = logging.getLogger("runner")
    try:
        setup_logging(None, 0)  # the console only, while the folder is being claimed
        log.warning("checkpoint x.pth is unusable (truncated): skipped")
        log.info("an info line before the file: console only")
        setup_logging(str(tmp_path), 0)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's UserWarning", UserWarning, stacklevel=1)
        for handler in log.handlers:
            handler.flush()
        text = (tmp_path / "log.txt").read_text()
        assert "W checkpoint x.pth is unusable (truncated): skipped" in text.splitlines()[0]
        assert "a library's UserWarning" in text
        assert "an info line before the file" not in text
    finally:
        logging.captureWarnings(False)
        for handler in log.handlers:
            handler.close()
        log.handlers.clear()


def test_warnings_reach_log_txt_after_a_capture_was_undone_from_outside(tmp_path):
    """A capture undone by a warnings.catch_warnings block around an earlier run in this process (pytest wraps
    every test in one) is made again: logging.captureWarnings(True) alone does nothing the second time."""
    log = logging.getLogger("runner")
    try:
        with warnings.catch_warnings():  # an earlier in-process run, inside a block that restores showwarning
            setup_logging(None, 0)
        setup_logging(str(tmp_path), 0)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("after an undone capture", UserWarning, stacklevel=1)
        for handler in log.handlers:
            handler.flush()
        assert "after an undone capture" in (tmp_path / "log.txt").read_text()
    finally:
        logging.captureWarnings(False)
        for handler in log.handlers:
            handler.close()
        log.handlers.clear()
