"""Where scalars and log lines go: the console, OUTPUT_DIR/log.txt, metrics.jsonl and TensorBoard.

MetricWriter is the one place the engine's producers (training windows, evaluation, the final hparams) write
through; none of them knows which sinks are open.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import sys
import warnings
from pathlib import Path

from runner.fsutil import atomic_write
from runner.trackers import open_trackers

log = logging.getLogger("runner")

_FMT = "%(asctime)s %(levelname).1s %(message)s"


class _Early(logging.Handler):
    """Rank 0's warnings from before log.txt is open (claiming the folder: a damaged checkpoint skipped, say),
    kept to be written into log.txt first when it opens: every warning of a run reaches its log."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record (a bounded number)."""
        if len(self.records) < 200:
            self.records.append(record)


_EARLY = _Early()
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
        _EARLY.records.clear()
        log.addHandler(_EARLY)
    if rank == 0 and output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(Path(output_dir) / "log.txt", encoding="utf-8", errors="backslashreplace")
        fh.setFormatter(logging.Formatter(_FMT, "%Y-%m-%d %H:%M:%S"))
        for record in _EARLY.records:
            fh.handle(record)
        _EARLY.records.clear()
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


def _to_file(message: str) -> None:
    """An INFO line for log.txt only: the console shows it another way (the progress bar's postfix)."""
    for handler in log.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, message, None, None))


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop lines past `last_step` (and any partial trailing line) so a resumed run never duplicates steps."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    atomic_write(path, "".join(line + "\n" for line in kept))


# Resume-safe keys that the HParams tab still shows: a run may be extended with a new value, but the value
# changes what the run learned (the other resume-safe keys only observe it: logging, workers, checkpoints)
LENGTH_KEYS = frozenset(["TRAIN.EPOCHS", "TRAIN.MAX_STEPS"])


def _observe_only(key: str) -> bool:
    """True for a key that never changes what a run learns (runner.config.RESUME_SAFE_KEYS, less the length)."""
    from runner.config import RESUME_SAFE_KEYS

    return key in RESUME_SAFE_KEYS and key not in LENGTH_KEYS


def run_hparams(cfg, keys: list[str]) -> dict:
    """The config keys shown in TensorBoard's HParams tab, with the run's values.

    The keys set on the command line (a sweep's swept keys), in order, even where a value equals the default:
    TensorBoard builds its table from one run's key list, so every point of a sweep must write the same one.
    Without such keys (a plain run), the keys that differ from the defaults; without those, MODEL.NAME.
    """
    from runner.config import changed_from_defaults

    chosen = [k for k in dict.fromkeys(keys) if not _observe_only(k)]  # keys load_config already checked
    if not chosen:
        chosen = [k for k in changed_from_defaults(cfg) if not _observe_only(k)] or ["MODEL.NAME"]
    return {k: _hparam_value(functools.reduce(getattr, k.split("."), cfg)) for k in chosen}


def _hparam_value(value) -> int | float | str:
    """A value TensorBoard's HParams can hold: numbers as they are, everything else as text."""
    if isinstance(value, bool):  # torch's summary.hparams would store a bool as the number 0 or 1
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


# Scalars kept in metrics.jsonl but not plotted: a count is not a curve worth a chart
NOT_PLOTTED = ("/count",)


def _fmt_eta(seconds: float) -> str:
    """h:mm:ss."""
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class MetricWriter:
    """One sink for scalars: JSON lines, TensorBoard, console line or progress bar. Rank 0 only."""

    def __init__(self, output_dir: str, cfg, resume_step: int, enabled: bool, total_steps: int,
                 params: dict | None = None):
        """`params`: the run's HParams keys (run_hparams), which trackers use as tags."""
        self.enabled = enabled
        self.total_steps = total_steps
        self.tb = None
        self.bar = None
        self.trackers = []
        if not enabled:
            return
        self.dir = Path(output_dir)
        self.jsonl_path = self.dir / "metrics.jsonl"
        truncate_jsonl(self.jsonl_path, resume_step)
        self.jsonl = open(self.jsonl_path, "a")
        if cfg.LOG.TENSORBOARD:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a killed run wrote after its last checkpoint, or before its first one
            self.tb = SummaryWriter(str(self.dir), purge_step=resume_step + 1)
        self.trackers = open_trackers(cfg, self.dir, resume_step, params)  # W&B, MLflow: runner/trackers/
        mode = cfg.LOG.PROGRESS
        if mode == "bar" or (mode == "auto" and sys.stdout.isatty()):
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar = tqdm(total=total_steps, initial=resume_step, unit="step", dynamic_ncols=True, leave=True)
            # log lines go through tqdm.write, which lifts the bar first: a line never starts after the bar
            self._redirect = logging_redirect_tqdm([log])
            self._redirect.__enter__()

    def write(self, step: int, epoch: int, scalars: dict[str, float]) -> None:
        """Record scalars at `step` in every sink."""
        if not self.enabled:
            return
        row = {"step": step, "epoch": epoch, **{k: _clean(v) for k, v in scalars.items()}}
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for k, v in scalars.items():
                if not k.endswith(NOT_PLOTTED):
                    self.tb.add_scalar(k, v, step)
        for tracker in self.trackers:
            tracker.write(step, epoch, scalars)

    def flush(self) -> None:
        """Put every scalar written so far into the files (metrics.jsonl is flushed line by line already)."""
        if self.tb is not None:
            self.tb.flush()
        for tracker in self.trackers:  # a checkpoint is about to cover what they keep: they send it now
            tracker.flush()

    def console(self, text: str, step: int | None = None, postfix: str | None = None, epoch: str = "") -> None:
        """A progress line: the bar (`epoch` its description, `postfix` after it) on a terminal, a log line
        otherwise; log.txt gets the line either way."""
        if not self.enabled:
            return
        if self.bar is not None and step is not None:
            self.bar.n = step
            if epoch:
                self.bar.set_description_str(epoch, refresh=False)
            self.bar.set_postfix_str(postfix or text, refresh=True)
            _to_file(text)
        else:
            log.info(text)

    def eta(self, step: int, start_step: int, elapsed: float) -> str:
        """Estimated time left from the pace since this process started."""
        done = step - start_step
        return _fmt_eta((self.total_steps - step) * elapsed / done) if done > 0 else "?"

    def hparams(self, hparams: dict, metrics: dict) -> None:
        """The run's keys (see run_hparams) for TensorBoard's HParams tab, with the val scalars as its metrics.

        Written into the run's own event file: the tab then shows each metric's last value from the run's
        `val/*` curves. SummaryWriter.add_hparams is not used because it writes a one-point `hparam/*` chart
        per metric (crowding the Scalars page) into a sub-run of its own (a second event file, a second run
        in TensorBoard). Instead the summaries it would write go through the writer's public `file_writer`
        (a FileWriter, whose add_summary takes a ready Summary). The best values (`best/*`, no curve of
        their own) stay in results.json and the sweep table.
        """
        for tracker in self.trackers:
            tracker.finish(hparams, metrics)
        if self.tb is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        hp = {k: _hparam_value(v) for k, v in hparams.items()} or {"config": "defaults"}
        tags = {k: v for k, v in metrics.items() if not k.startswith("best/") and not k.endswith(NOT_PLOTTED)}
        for summary in hparams_summaries(hp, tags):  # the experiment, the session start and its end
            self.tb.file_writer.add_summary(_name_session(summary, self.dir))
        self.tb.flush()

    def end_progress(self) -> None:
        """Close the progress bar (it stays on screen, complete): the lines that follow print below it."""
        if self.bar is not None:
            self.bar.close()
            self._redirect.__exit__(None, None, None)
            self.bar = None

    def close(self) -> None:
        """Flush and close every sink."""
        if not self.enabled:
            return
        self.end_progress()
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        for tracker in self.trackers:
            tracker.close()


def _name_session(summary, run_dir: Path):
    """The session-start summary with a group name that begins with the run's own folder name.

    TensorBoard's HParams table shows a session by its run path under --logdir, cut to a few characters
    (`sweeps/lr_x_mo...` for every point of a sweep); a group name is shown instead. The parent path after
    the folder name keeps two runs of one name in different folders apart (one group would average them).
    """
    from tensorboard.plugins.hparams import plugin_data_pb2

    value = summary.value[0]
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    if data.WhichOneof("data") == "session_start_info":
        data.session_start_info.group_name = f"{run_dir.name} ({run_dir.parent})"
        value.metadata.plugin_data.content = data.SerializeToString()
    return summary


def _clean(v: float) -> float | None:
    """JSON has no NaN: non-finite values are written as null."""
    v = float(v)
    return v if math.isfinite(v) else None
