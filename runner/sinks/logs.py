"""The runner's log lines: the console for every rank, OUTPUT_DIR/log.txt for rank 0, Python's warnings too."""
from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

from runner.rundir import layout

log = logging.getLogger("runner")

_FMT = "%(asctime)s %(levelname).1s %(message)s"


class _WarningsBeforeLogFile(logging.Handler):
    """Rank 0's warnings from before log.txt is open (claiming the folder: a damaged checkpoint skipped, say),
    kept to be written into log.txt first when it opens: every warning of a run reaches its log."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record (a bounded number)."""
        if len(self.records) < 200:
            self.records.append(record)


_BEFORE_LOG_FILE = _WarningsBeforeLogFile()
_SETUP: tuple[str | None, int] | None = None  # setup_logging's latest arguments: a spawned worker repeats them


def logging_setup() -> tuple[str | None, int] | None:
    """(output_dir, rank) of this process's latest setup_logging, for a worker process to set up the same way."""
    return _SETUP


def setup_logging(output_dir: str | None, rank: int) -> None:
    """Console for rank 0 (warnings and errors only elsewhere, tagged with the rank), log.txt for rank 0.

    Python warnings (torch's, timm's) go the same way, so they reach log.txt too. Called once without a folder
    (the console only, until the folder is known to be ours), then with it.
    """
    global _SETUP
    _SETUP = (output_dir, rank)
    log.handlers.clear()
    log.propagate = False
    log.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stdout)
    if rank == 0:
        console.setFormatter(logging.Formatter(_FMT, "%H:%M:%S"))
    else:
        console.setLevel(logging.WARNING)
        console.setFormatter(logging.Formatter(f"[rank {rank}] {_FMT}", "%H:%M:%S"))
    log.addHandler(console)
    if rank == 0 and not output_dir:
        _BEFORE_LOG_FILE.records.clear()
        log.addHandler(_BEFORE_LOG_FILE)
    if rank == 0 and output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(layout.path(output_dir, layout.LOG), encoding="utf-8", errors="backslashreplace")
        fh.setFormatter(logging.Formatter(_FMT, "%Y-%m-%d %H:%M:%S"))
        for record in _BEFORE_LOG_FILE.records:
            fh.handle(record)
        _BEFORE_LOG_FILE.records.clear()
        log.addHandler(fh)
    _capture_warnings()


def _capture_warnings() -> None:
    """Route Python's warnings through the runner's handlers (console and log.txt), once per setup."""
    if getattr(warnings.showwarning, "__module__", None) != "logging":
        # an earlier capture was undone from outside (a warnings.catch_warnings block restored showwarning), and
        # captureWarnings(True) alone would then do nothing: it patches only when it thinks it has not yet
        logging.captureWarnings(False)
    logging.captureWarnings(True)
    py_warnings = logging.getLogger("py.warnings")
    py_warnings.handlers[:] = log.handlers
    py_warnings.propagate = False


def log_to_file(message: str) -> None:
    """An error line for log.txt only: the console already gets it once, on stderr, from the CLI wrapper."""
    for handler in log.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.emit(log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None))


def to_file(message: str) -> None:
    """An INFO line for log.txt only: the console shows it another way (the progress bar's postfix)."""
    for handler in log.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, message, None, None))
