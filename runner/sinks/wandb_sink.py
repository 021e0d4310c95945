"""Weights & Biases as a sink (LOG.WANDB*): one W&B run per OUTPUT_DIR, continued across resumes.

Offline runs (LOG.WANDB_MODE offline, or online without an API key or a network) are written to
OUTPUT_DIR/wandb/ (`wandb beta sync OUTPUT_DIR/wandb` uploads them into one W&B run); a resumed offline run
rewrites the rows up to its checkpoint into its own fragment and removes the earlier, superseded ones.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import wandb

from runner.errors import one_line
from runner.sinks.tracker import TrackerSink, flat_config, group_name, logged_rows, run_name

log = logging.getLogger("runner")

# How long an online start may wait for the server before the run logs offline instead (WANDB_INIT_TIMEOUT)
INIT_TIMEOUT_S = 30.0
# W&B's limit on the length of a tag
_TAG_CHARS = 64


def check(cfg) -> None:
    """Nothing to open before the claim: the mode is checked with the config, credentials at the start."""


class WandbSink(TrackerSink):
    """One W&B run: every scalar at its step, the config, the results as its summary."""

    name = "wandb"
    label = "W&B"

    def start(self, earlier: dict) -> dict:
        """wandb.init, resuming `earlier`'s run id; online trouble (no key, no server) falls back to offline."""
        run_id = earlier.get("id")  # None: W&B makes one
        mode = self.cfg.LOG.WANDB_MODE
        try:
            self.run = self._init(run_id, mode)
        except wandb.errors.Error as e:  # no API key (UsageError), no server (CommError)
            if mode == "offline":
                raise
            self.run = self._init(run_id, "offline")
            mode = "offline"
            log.warning("W&B: cannot log online (%s); logging offline instead: upload later with `wandb beta sync "
                        "%s`", one_line(str(e)).splitlines()[0][:200], self.out.resolve() / "wandb")
        run_id = self.run.id
        self.run.config.update(flat_config(self.cfg), allow_val_change=True)  # resume-safe keys may change
        if earlier:
            self._catch_up(mode)
        if mode == "online":
            log.info("W&B run %s", self.run.url)
        return {"id": run_id, "project": self.cfg.LOG.WANDB_PROJECT, "mode": mode}

    def _catch_up(self, mode: str) -> None:
        """Log again what a killed process may have lost, from metrics.jsonl (already cut at the checkpoint).

        W&B buffers in its own process, which a SIGKILL ends with the last second of rows unwritten. Online,
        the server says where the run stands (starting_step); offline, the new fragment gets every row up to
        the checkpoint and the earlier processes' fragments, which it supersedes, are removed: the folder then
        holds one complete fragment, and syncing can never meet a step twice.
        """
        start = int(getattr(self.run, "starting_step", 0) or 0) if mode == "online" else 0
        self.send([row for row in logged_rows(self.out, self.resume_step) if row[0] >= start])
        self.sent = self.resume_step
        if mode == "offline":
            own = Path(self.run.dir).parent.resolve()
            for old in (self.out / "wandb").glob(f"offline-run-*-{self.run.id}"):
                if old.resolve() != own:
                    shutil.rmtree(old, ignore_errors=True)

    def _init(self, run_id: str | None, mode: str):
        """wandb.init for this OUTPUT_DIR: quiet, no console capture, no system sampling, files in OUTPUT_DIR."""
        os.environ.setdefault("WANDB_SILENT", "true")  # its login lines come before any setting applies
        timeout = float(os.environ.get("WANDB_INIT_TIMEOUT", INIT_TIMEOUT_S))
        # the .wandb file is written every second (W&B's default: 15 s), so rows a checkpoint covered survive a
        # SIGKILL that comes a second or more after that checkpoint
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, disable_git=True,
                                  save_code=False, init_timeout=timeout, x_transaction_log_flush_interval=1.0)
        tags = list(self.cfg.LOG.WANDB_TAGS) + [f"{k}={v}"[:_TAG_CHARS] for k, v in self.params.items()]
        Path(self.out).mkdir(parents=True, exist_ok=True)
        return wandb.init(project=self.cfg.LOG.WANDB_PROJECT, entity=self.cfg.LOG.WANDB_ENTITY or None,
                          id=run_id, resume="allow", name=run_name(self.out), group=group_name(self.out), tags=tags,
                          dir=str(self.out), mode=mode, settings=settings)

    def send(self, rows: list[tuple[int, int, dict]]) -> None:
        """Each row at its step (W&B merges the rows of one step: training window and evaluation)."""
        for step, epoch, scalars in rows:
            self.run.log({**scalars, "epoch": epoch}, step=step)

    def summary(self, results: dict) -> None:
        """The final results as the run's summary."""
        self.run.summary.update(results)

    def end(self, done: bool) -> None:
        """Finish the run: complete, or stopped (marked failed until a resume continues it)."""
        self.run.finish(exit_code=0 if done else 1)


open_sink = WandbSink.open
