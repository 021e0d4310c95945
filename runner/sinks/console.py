"""The console as a sink: each training window as one line, on a progress bar's postfix (LOG.PROGRESS) on a
terminal or as a log line otherwise; log.txt gets the line either way. Evaluation says its own line."""
from __future__ import annotations

import sys
import time

from runner.sinks.base import Sink, SinkContext
from runner.sinks.logs import log, to_file

# The scalars of a training window (runner.engine.hooks.MetricLogger): a row with them is a console line
WINDOW = ("train/loss", "train/lr", "train/img_per_s")


def _fmt_eta(seconds: float) -> str:
    """h:mm:ss."""
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class ConsoleSink(Sink):
    """The training line: epoch, step, loss, LR, img/s and the time left."""

    def __init__(self, ctx: SinkContext):
        """Open the progress bar when LOG.PROGRESS asks for it (opened last of all sinks: the others' start
        lines print above it)."""
        self.epochs, self.total_steps = ctx.cfg.TRAIN.EPOCHS, ctx.total_steps
        self.start_step, self.t_start = ctx.resume_step, ctx.t_start
        self.bar = None
        mode = ctx.cfg.LOG.PROGRESS
        if mode == "bar" or (mode == "auto" and sys.stdout.isatty()):
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self.bar = tqdm(total=ctx.total_steps, initial=ctx.resume_step, unit="step", dynamic_ncols=True,
                            leave=True)
            # log lines go through tqdm.write, which lifts the bar first: a line never starts after the bar
            self._redirect = logging_redirect_tqdm([log])
            self._redirect.__enter__()

    def write(self, step: int, epoch: int, scalars: dict[str, float]) -> None:
        """A training window's line; other rows (evaluation) are not shown here."""
        if not all(k in scalars for k in WINDOW):
            return
        shown = (f"loss {scalars['train/loss']:.4f} lr {scalars['train/lr']:.3g} "
                 f"img/s {scalars['train/img_per_s']:.0f}")
        where = f"epoch {epoch}/{self.epochs}"
        self.show(f"{where} step {step}/{self.total_steps} {shown} eta {self.eta(step)}", step, shown, where)

    def eta(self, step: int) -> str:
        """Estimated time left from the pace since this process started."""
        done = step - self.start_step
        return _fmt_eta((self.total_steps - step) * (time.time() - self.t_start) / done) if done > 0 else "?"

    def show(self, text: str, step: int, postfix: str, epoch: str) -> None:
        """The bar (`epoch` its description, `postfix` after it) on a terminal, a log line otherwise."""
        if self.bar is None:
            log.info(text)
            return
        self.bar.n = step
        self.bar.set_description_str(epoch, refresh=False)
        self.bar.set_postfix_str(postfix, refresh=True)
        to_file(text)

    def end_progress(self) -> None:
        """Close the progress bar (it stays on screen, complete): the lines that follow print below it."""
        if self.bar is not None:
            self.bar.close()
            self._redirect.__exit__(None, None, None)
            self.bar = None

    def close(self) -> None:
        """End the bar if training did not."""
        self.end_progress()


open_sink = ConsoleSink
