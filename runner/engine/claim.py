"""Claiming OUTPUT_DIR for this run, finding the checkpoint to resume from, writing the run's files.

The engine's act on the run folder, with the process group, the lock, the status hook and the trainer; the rules
it follows are runner.rundir's (torch-free, shared with the tools). Following CHECKPOINT.RESUME runs one way:
claim -> rundir.rules (refusals) and runner.checkpoint (loading) -> rundir.checkpoints, rundir.layout.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner import checkpoint as ckpt
from runner import distributed
from runner.data.sources import source
from runner.distributed import Dist
from runner.errors import UserError
from runner.fsutil import atomic_write, remove_stale_temps
from runner.optim import schedule_on_resume
from runner.process import threads
from runner.rundir import reader, rules
from runner.rundir.layout import CONFIG, ENV, LOCK
from runner.rundir.lock import RunLock
from runner.rundir.marker import DONE, RUNNING, is_done, write_status

if TYPE_CHECKING:
    from runner.engine.loop import Trainer
    from runner.engine.status import RunStatus
    from runner.weights.hub import Pretrained

log = logging.getLogger("runner")


@dataclass(eq=False)
class AlreadyDone(Exception):
    """OUTPUT_DIR's finished run already covers this config: nothing trains, nothing is rewritten."""

    results: dict  # results.json's
    why: str  # why it covers this config
    main: bool  # this process says so (rank 0)

    def __str__(self) -> str:
        """Why the run is done."""
        return self.why


def claim_output_dir(cfg, dist: Dist, control, lock: RunLock, status: RunStatus):
    """Rank 0 checks OUTPUT_DIR, locks it and marks it as this run's; every rank learns the verdict.

    Returns (a finished run's (results, why) or None, the checkpoint rank 0 will resume from or None, what an
    earlier attempt without a checkpoint left: '' or a few words). A refusal leaves the folder as it was.
    """
    from runner.config import dump_config

    verdict: tuple = ("go", None)
    failure, found, attempt = None, None, ""
    if dist.is_main:
        undo = _Undo(Path(cfg.OUTPUT_DIR))
        try:
            rules.check_output_dir(cfg)  # again: the folder may have changed since tools/train.py
            lock.acquire()
            done = rules.finished_run(cfg)  # under the lock: no other job is writing results now
            if done is None:
                found = find_checkpoint(cfg, dist.world_size)  # a run-changing config is refused before any write
                attempt = "" if found is not None else _earlier_attempt(Path(cfg.OUTPUT_DIR))
                # the marker carries the config in the same atomic write: config.yaml comes seconds later (after
                # the resume checks), and a run killed in between must still bind the folder to its config
                write_status(cfg.OUTPUT_DIR, RUNNING, config=dump_config(cfg))
                remove_stale_temps(Path(cfg.OUTPUT_DIR))  # not this process's own: only killed writes' are left
                status.claimed = True
            verdict = ("go", None) if done is None else ("done", done)
        except UserError as e:
            undo(lock)
            verdict = ("error", str(e))
        except Exception as e:  # the other ranks must not wait for a verdict that never comes
            verdict, failure = ("failed", f"{type(e).__name__}: {e}"), e
    kind, payload = distributed.broadcast_object(verdict, control)
    if failure is not None:
        raise failure
    if kind == "error":
        raise UserError(payload)
    if kind == "failed":
        raise RuntimeError(f"rank 0 could not take OUTPUT_DIR {cfg.OUTPUT_DIR}: {payload}")
    return payload, found, attempt


def _earlier_attempt(out: Path) -> str:
    """What an attempt that saved no checkpoint left in `out` (its config was checked to be this one); '' if none."""
    return rules.has_run_data(out) or ("an earlier attempt's config.yaml" if (out / CONFIG).is_file() else "")


class _Undo:
    """What taking the lock changes, put back when the claim is refused: the lock file's text, a new folder."""

    def __init__(self, out: Path):
        self.out = out
        self.made = out  # the topmost folder that taking the lock would create
        while not self.made.parent.exists() and self.made.parent != self.made:
            self.made = self.made.parent
        lock_file = out / LOCK
        self.lock_text = lock_file.read_bytes() if lock_file.is_file() else None
        self.existed = self.made.exists()

    def __call__(self, lock: RunLock) -> None:
        """Give the folder back as it was before this command."""
        lock_file = self.out / LOCK
        try:
            if self.lock_text is not None and lock.fd is not None:
                os.ftruncate(lock.fd, 0)
                os.pwrite(lock.fd, self.lock_text, 0)
            lock.release()
            if not self.existed:
                lock_file.unlink(missing_ok=True)
                for folder in [self.out, *self.out.parents]:  # only the empty folders this command made
                    folder.rmdir()
                    if folder == self.made:
                        break
        except OSError:  # not ours to clean any further (another job took the folder meanwhile)
            pass


def find_checkpoint(cfg, world_size: int) -> tuple[str, dict] | None:
    """The checkpoint to resume (auto: the newest valid one; or the named one), refused if the run differs."""
    how = cfg.CHECKPOINT.RESUME
    if how == "none":
        return None
    found = ckpt.find_resumable(cfg.OUTPUT_DIR) if how == "auto" else (how, ckpt.load_explicit(how))
    if found is not None:
        rules.refuse_changed(cfg, found[1]["config"], f"stored in checkpoint {found[0]}")
        check_global_batch(cfg, found[1], world_size, found[0])
    return found


def resume(cfg, trainer: Trainer, found: tuple[str, dict] | None, status: RunStatus) -> None:
    """Restore the checkpoint rank 0 found while claiming (the other ranks find it themselves)."""
    dist_main = status.dist.is_main
    found = found if dist_main else find_checkpoint(cfg, status.dist.world_size)
    if found is None:
        return
    path, state = found
    followed = threads.follow_run(state.get("cpu_threads"))
    if followed and dist_main:
        log.info("%s", followed)
    trainer.load_state_dict(state)
    results = reader.results(cfg.OUTPUT_DIR)
    if trainer.at_end and is_done(results):
        status.write(DONE, trainer.step)  # claiming marked it running; results.json and config.yaml stay
        raise AlreadyDone(results, f"it ran {trainer.step} steps, as many as this config asks for", dist_main)
    log.info("resumed from %s: epoch %d, batch %d of the epoch, step %d", path, trainer.epoch + 1,
             trainer.batch_in_epoch, trainer.step)
    _say_new_length(cfg, state["config"], trainer.step, dist_main)


def _say_new_length(cfg, stored_yaml: str, step: int, main: bool) -> None:
    """One line when the resumed run's length differs from its checkpoint's, and what that does to the LR."""
    from runner.config import config_from_yaml_text

    old = config_from_yaml_text(stored_yaml).TRAIN
    if not main or (old.EPOCHS, old.MAX_STEPS) == (cfg.TRAIN.EPOCHS, cfg.TRAIN.MAX_STEPS):
        return
    log.info("the run's length changed since the checkpoint (TRAIN.EPOCHS %d -> %d, TRAIN.MAX_STEPS %d -> %d) "
             "at step %d: %s", old.EPOCHS, cfg.TRAIN.EPOCHS, old.MAX_STEPS, cfg.TRAIN.MAX_STEPS, step,
             schedule_on_resume(cfg, old.EPOCHS))


def check_global_batch(cfg, state: dict, world: int, path: str) -> None:
    """Refuse a resume whose global batch differs from the checkpoint's, naming the settings that keep it.

    Only the number of processes and TRAIN.ACCUM_STEPS may change: DATA.BATCH_SIZE is what each forward (and
    BatchNorm) sees, so it is never resume-safe, and advice to change it would be refused in turn.
    """
    old = state.get("global_batch")
    batch, accum = cfg.DATA.BATCH_SIZE, cfg.TRAIN.ACCUM_STEPS
    if old is None or old == batch * world * accum:
        return
    chunks = old // batch  # processes x TRAIN.ACCUM_STEPS that the checkpoint's global batch was cut into
    fixes = []
    if old % (batch * world) == 0:
        fixes.append(f"TRAIN.ACCUM_STEPS {old // (batch * world)}")
    if old % (batch * accum) == 0:
        fixes.append(f"{old // (batch * accum)} processes")
    fix = " or ".join(fixes) or f"processes x TRAIN.ACCUM_STEPS = {chunks}"
    raise UserError(f"{path} was saved by a run with a global batch of {old} samples (DATA.BATCH_SIZE x processes x "
                    f"TRAIN.ACCUM_STEPS) but this one has {batch} x {world} x {accum} = {batch * world * accum}; the "
                    f"run continues exactly only with the same global batch: use {fix}")


def write_run_files(cfg, dist: Dist, class_names: list[str], pretrained: Pretrained | None = None) -> None:
    """config.yaml, env.txt (with the pretrained weights' file), class_map.json and the status file (rank 0),
    after resume checks passed."""
    if not dist.is_main:
        return
    from runner.config import dump_config
    from runner.rundir.envinfo import collect_env, format_env

    out = Path(cfg.OUTPUT_DIR)
    extended = rules.keep_finished_result(cfg)  # after the resume checks: a refused extension renames nothing
    if extended:
        log.info("%s", extended)
    dev = dist.device
    # asking every GPU for free memory would create a CUDA context on each of them for the whole run
    env_text = format_env(collect_env(free_mem_devices=[dev.index or 0] if dev.type == "cuda" else []))
    env_text += _user_code(cfg, out / ENV)
    if pretrained is not None:
        env_text += pretrained.env_line() + "\n"
    atomic_write(out / CONFIG, dump_config(cfg))
    atomic_write(out / ENV, env_text)
    for line in env_text.splitlines()[:4]:
        log.info("env: %s", line)
    if source(cfg.DATA.NAME).run_class_map:
        from runner.data import write_class_map

        write_class_map(out, class_names)
    write_status(out, RUNNING)


def _user_code(cfg, env_path: Path) -> str:
    """env.txt's IMPORTS lines; a warning for each file that changed since the run's last env.txt.

    A changed list is refused like any run-changing key; edited code under the same list is only warned about:
    the checkpoint still loads, and a fix to the user's own module is a reason to resume."""
    from runner.config.imports import imported_files
    from runner.rundir.envinfo import changed_imports, format_imports

    records = imported_files(cfg.IMPORTS)
    try:
        old = env_path.read_text()
    except OSError:
        old = ""
    for change in changed_imports(old, records):
        log.warning("IMPORTS: %s changed since this run's last start: the resumed run runs the new code", change)
    return format_imports(records)

