"""Checkpoints written off the training step (CHECKPOINT.ASYNC, runner.checkpoint.CheckpointWriter).

In-process: the host copy is the state of its step however training goes on; every way a run stops waits for the
write before its status; a failed write is raised at the next save. End to end (slow): resnet50's 280 MB
checkpoints take long enough to write that steps are logged during a write: a SIGKILL then leaves the previous
checkpoint whole and the rerun ends bit-identical to a run that wrote on its step; a Ctrl-C waits for the write.
"""
from __future__ import annotations

import json
import re
import shutil
import signal
import sys
import time
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from runner import checkpoint
from runner.distributed import Dist
from runner.engine.hooks import Checkpointer, Hook, RunState
from runner.engine.signals import DutiesStart, Pause, Preemption, StopFlag, TimeLimit
from runner.engine.watchdog import Watchdog, paused_while_waiting
from runner.errors import DataUnavailable, Preempted
from runner.fsutil import TMP_RE
from tests.engine.test_loop import ToyLoader, toy
from tests.engine.test_resume import (
    RESUMED,
    STEP_LINE,
    Launch,
    _steady,
    assert_checkpoints_load,
    assert_same,
    ckpt_step,
    train_rows,
    val_rows,
)
from tests.utils import ROOT, TRAIN

DIST = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


# ---- the host copy ----------------------------------------------------------------------------------------------
def test_host_copy_keeps_the_state_of_its_step_while_training_goes_on(tmp_path):
    """A state_dict's CPU tensors are the live weights and optimizer state: the copy must not follow them."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}
    before = torch.load(_saved(state, tmp_path / "before.pth"), weights_only=True)
    copy = checkpoint.host_copy(state)
    for _ in range(3):  # the next steps update weights and momentum in place
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    assert not torch.equal(state["model"]["weight"], before["model"]["weight"])  # the live state moved on
    assert_same(torch.load(_saved(copy, tmp_path / "copy.pth"), weights_only=True), before, "copy")


def test_host_copy_keeps_shared_storages_and_module_metadata(tmp_path):
    base = torch.arange(12.0)
    sd = OrderedDict(a=base[:6].view(2, 3), b=base[6:], c=base)
    sd._metadata = OrderedDict({"": {"version": 1}})  # what nn.Module.state_dict attaches (load_state_dict reads it)
    copy = checkpoint.host_copy({"model": sd})["model"]
    assert type(copy) is OrderedDict and copy._metadata == sd._metadata
    assert copy["a"].untyped_storage().data_ptr() == copy["c"].untyped_storage().data_ptr()  # still one storage
    assert copy["c"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert torch.equal(copy["a"], base[:6].view(2, 3)) and torch.equal(copy["b"], base[6:])
    sizes = [_saved({"model": d}, tmp_path / f"{i}.pth").stat().st_size for i, d in enumerate((copy, sd))]
    assert sizes[0] == sizes[1]  # the shared storage is saved once, as from the live state


def _saved(state: dict, path: Path) -> Path:
    """`state` written by torch.save to `path`."""
    torch.save(state, path)
    return path


# ---- every stop waits for the write ----------------------------------------------------------------------------
class Probe(Hook):
    """Where RunStatus writes the run's status: was a write still pending, and which step does last.pth hold."""

    def __init__(self, ck: Checkpointer):
        self.ck, self.seen = ck, []

    def after_train(self, trainer) -> None:
        self.seen.append(("done", *self.on_disk(trainer)))

    def on_exception(self, trainer, error: BaseException) -> None:
        self.seen.append((type(error).__name__, *self.on_disk(trainer)))

    def on_disk(self, trainer) -> tuple[bool, int | None, int]:
        """(a write still pending, the step of last.pth or None, the loop's step)."""
        last = self.ck.out / "checkpoints" / "last.pth"
        return self.ck.writer.pending, ckpt_step(last) if last.is_file() else None, trainer.step


def background(tmp_path: Path, period: int = 0) -> Checkpointer:
    """The real Checkpointer, writing in the background into tmp_path."""
    return Checkpointer(tmp_path, period, 3, DIST, background=True)


def test_the_run_end_waits_for_its_last_write(tmp_path):
    ck = background(tmp_path, period=1)
    probe = Probe(ck)
    toy([ck, probe]).train()
    assert probe.seen == [("done", False, 12, 12)]
    assert ck.writer.longest > 0 and ck.stop_cost() >= 2 * ck.writer.longest  # each write ran in the writer


class Breaks(Hook):
    """Once the write in flight is on disk, checkpoints/ becomes a file (the earlier one kept aside): the next
    write fails in the writer's thread (FileExistsError), a real failure of the write."""

    def __init__(self, ck: Checkpointer, step: int = 0, epoch: int = 0):
        self.ck, self.step, self.epoch = ck, step, epoch

    def after_step(self, trainer) -> None:
        if trainer.step == self.step:
            self.now()

    def after_epoch(self, trainer) -> None:
        if trainer.epoch == self.epoch:
            self.now()

    def now(self) -> None:
        """Break the folder now."""
        self.ck.wait()
        folder = self.ck.out / "checkpoints"
        if folder.is_dir():
            shutil.move(folder, self.ck.out / "kept")
        self.ck.out.mkdir(parents=True, exist_ok=True)
        folder.write_text("not a folder")


class AsksAtEpochEnd(Hook):
    """Asks to stop while the epoch's end is saved (before Preemption polls)."""

    def __init__(self, flag: StopFlag):
        self.flag = flag

    def after_epoch(self, trainer) -> None:
        self.flag.request("test")


def stopped(tmp_path: Path, how: str, broken: bool) -> list[tuple]:
    """A toy run stopped `how` (after step 1, or after epoch 1); with `broken`, the stop's own write fails.
    What the probe saw where RunStatus writes the status."""
    ck, flag = background(tmp_path), StopFlag(None)
    probe = Probe(ck)
    hooks = {"preempted": [ck, Preemption(flag, ck), probe],
             "preempted at the epoch end": [ck, AsksAtEpochEnd(flag), Preemption(flag, ck), probe],
             "profile only": [ck, Preemption(flag, ck, SimpleNamespace(done=True), profile_only=True), probe],
             "paused": [ck, probe, Pause(1)]}[how]
    if how == "preempted":
        flag.request("test")  # as a signal or TRAIN.TIME_LIMIT would
    if broken:
        hooks.insert(0, Breaks(ck, step=1) if how in ("preempted", "profile only") else Breaks(ck, epoch=1))
    try:
        toy(hooks).train()
    except (Preempted, FileExistsError):
        pass
    return probe.seen


STOPS = {"preempted": ("Preempted", 1), "preempted at the epoch end": ("Preempted", 6),
         "profile only": ("StopRun", 1), "paused": ("StopRun", 6)}


@pytest.mark.usefixtures("signal_handlers")
@pytest.mark.parametrize("how", STOPS)
def test_a_stop_waits_for_its_save_and_a_failed_one_fails_the_run(tmp_path, how):
    """Nothing pending and last.pth at the stop's step when the status is written; a stop whose write fails is
    that failure (the same error and exit as the synchronous save), never a clean stop without its checkpoint."""
    error, step = STOPS[how]
    assert stopped(tmp_path / "ok", how, broken=False) == [(error, False, step, step)]
    assert stopped(tmp_path / "broken", how, broken=True) == [("FileExistsError", False, None, step)]


class Unavailable(ToyLoader):
    """The data server goes away after `ok` batches of an epoch."""

    def __init__(self, ok: int):
        super().__init__(6)
        self.ok = ok

    def __iter__(self):
        for i, batch in enumerate(super().__iter__()):
            if i == self.ok:
                raise DataUnavailable("the data server stayed down")
            yield batch


@pytest.mark.usefixtures("signal_handlers")
def test_data_unavailable_waits_for_its_save(tmp_path):
    ck = background(tmp_path, period=2)
    probe = Probe(ck)
    trainer = toy([ck, Preemption(StopFlag(None), ck), probe])
    trainer.loader = Unavailable(ok=3)
    with pytest.raises(DataUnavailable):
        trainer.train()
    assert probe.seen == [("DataUnavailable", False, 3, 3)]  # saved at step 3, not 2 (the last periodic one)


def test_a_failure_waits_for_the_write_in_flight(tmp_path):
    ck = background(tmp_path, period=1)
    probe = Probe(ck)

    class Fails(Hook):
        def after_step(self, trainer) -> None:
            if trainer.step == 2:
                raise RuntimeError("a bug in a hook")

    with pytest.raises(RuntimeError, match="a bug"):
        toy([ck, Fails(), probe]).train()
    assert probe.seen == [("RuntimeError", False, 2, 2)]


def test_a_failed_write_is_raised_at_the_next_save_and_leaves_the_previous_checkpoint(tmp_path):
    """Step 2's write fails in the writer's thread (checkpoints/ became a file): step 3's save raises it."""
    ck = background(tmp_path, period=1)
    trainer = toy([Breaks(ck, step=2), ck])
    with pytest.raises(FileExistsError):
        trainer.train()
    assert trainer.step == 3  # raised by the next save, as the synchronous save raised it at step 2
    assert ckpt_step(tmp_path / "kept" / "last.pth") == 1 and not ck.writer.pending


def test_without_async_the_step_writes_the_file(tmp_path):
    ck = Checkpointer(tmp_path, 1, 3, DIST, background=False)

    class Looks(Hook):
        seen: list[int] = []

        def after_step(self, trainer) -> None:
            self.seen.append(ckpt_step(tmp_path / "checkpoints" / "last.pth"))  # written before this hook runs

    looks = Looks()
    toy([ck, looks], epochs=1).train()  # steps 1-5 saved after their step; step 6, the epoch's end, after it
    assert ck.writer is None and looks.seen == [1, 2, 3, 4, 5, 5] and ck.stop_cost() == 0.0


# ---- the watchdog and TRAIN.TIME_LIMIT --------------------------------------------------------------------------
def test_waiting_for_a_write_pauses_the_watchdog(tmp_path):
    dog = Watchdog(60.0, tmp_path, DIST, None)
    dog.last, dog.paused = time.monotonic() - 1000, False  # a wait that took long: not a hang, no step time
    with paused_while_waiting(dog):
        assert dog.paused
    assert not dog.paused and time.monotonic() - dog.last < 5
    dog.paused = True  # waiting within a save (the checkpointer's own pause): it stays paused
    with paused_while_waiting(dog):
        pass
    assert dog.paused


def test_the_time_limit_budgets_the_whole_write_a_stop_waits_for(tmp_path):
    ck = background(tmp_path, period=1)
    toy([ck], epochs=1).train()
    cost = ck.stop_cost()
    assert cost == ck.copy_s + 2 * ck.writer.longest > 0
    limit = TimeLimit(3600, StopFlag(None), DutiesStart(), started=time.time(), lag=0)
    trainer = SimpleNamespace(step=1, total_steps=1000, steps_per_epoch=100, batch_in_epoch=1,
                              stepper=SimpleNamespace(accum=1), run_state=RunState(save_cost=lambda: 100.0))
    limit.after_step(trainer)
    assert limit.duties == 100.0 and limit.need(trainer) > 100.0  # the duties timed only the host copy
    assert limit.state_dict()["time_limit"]["duties"] == 100.0  # and the next job starts from it


# ---- end to end: resnet50 (280 MB checkpoints with AdamW), 16 px, one process -----------------------------------
DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
BIG = ["--cfg", DIGITS, "MODEL.NAME", "resnet50", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "32",
       "DATA.NUM_WORKERS", "0", "CUDNN.DETERMINISTIC", "true", "LOG.PERIOD", "1", "LOG.PROGRESS", "plain",
       "LOG.TENSORBOARD", "false", "CHECKPOINT.PERIOD", "2", "CHECKPOINT.KEEP", "2", "TRAIN.EPOCHS", "1"]
EXIT_PREEMPTED = 75


def stop_during_a_write(run: Launch, ck: Path, sig: int, after_one: bool = False) -> int:
    """Send `sig` once a step after a save is logged while that save's file is still being written (a temporary
    file of it exists): a write in the background, not on the step; with `after_one`, only once an earlier
    checkpoint is whole (last.pth exists: the first write may be the one in flight). Returns the step of that
    write."""
    end = time.monotonic() + 180
    while time.monotonic() < end and run.p.poll() is None:
        temps = [int(m.group(1)) for f in (ck.iterdir() if ck.is_dir() else [])  # this process's, not a stale one
                 if (m := re.match(rf"^\.step_(\d+)\.pth\.tmp\.{run.p.pid}$", f.name))]
        earlier = not after_one or (ck / "last.pth").exists()
        if temps and earlier and any(int(m.group(1)) > temps[0] for m in STEP_LINE.finditer(run.stdout)):
            run.p.send_signal(sig)
            return temps[0]
        time.sleep(0.005)
    raise AssertionError(f"no step was logged during a write (rc {run.p.poll()}):\n{run.stdout[-3000:]}")


@pytest.mark.slow
def test_killed_during_a_background_write_resumes_from_the_previous_checkpoint(tmp_path):
    """SIGKILL while a step's checkpoint is written in the background (training on meanwhile): the previous
    checkpoint is whole, and the rerun ends bit-identical to the same run that wrote on its step (ASYNC False)."""
    steps = ["TRAIN.MAX_STEPS", "12"]
    ref = Launch([sys.executable, TRAIN, *BIG, *steps, "CHECKPOINT.ASYNC", "false", "OUTPUT_DIR",
                  str(tmp_path / "ref")], tmp_path, "reference")
    out, ck = tmp_path / "run", tmp_path / "run" / "checkpoints"
    argv = [sys.executable, TRAIN, *BIG, *steps, "OUTPUT_DIR", str(out)]
    end = time.monotonic() + 240  # a loaded machine may end a write between its sight and the kill: try again
    for attempt in range(20):
        if attempt and time.monotonic() > end:
            break
        shutil.rmtree(out, ignore_errors=True)  # each try from the start: the run's steps are few
        run = Launch(argv, tmp_path, f"killed{attempt}")
        try:
            writing = stop_during_a_write(run, ck, signal.SIGKILL, after_one=True)
        except AssertionError:  # every write ended before the next step was logged (a loaded machine): again
            run.finish(60)
            half = []
            continue
        assert run.finish(60) == -signal.SIGKILL
        half = [f for f in ck.iterdir() if f.name == f".step_{writing:08d}.pth.tmp.{run.p.pid}"]
        if half:  # the kill landed inside the write (else it had just ended: try again from there)
            break
    assert half, "no kill landed inside a background write"
    assert_checkpoints_load(out)
    assert not (ck / f"step_{writing:08d}.pth").exists() and ckpt_step(ck / "last.pth") < writing
    previous = ckpt_step(ck / "last.pth")
    final = Launch(argv, tmp_path, "final")
    assert final.finish(300) == 0, final.stdout[-3000:] + final.stderr
    assert int(RESUMED.search(final.stdout).group(4)) == previous
    assert not [f for f in ck.iterdir() if TMP_RE.match(f.name)], "the killed write's temporary file is removed"
    assert ref.finish(300) == 0, ref.stdout[-3000:] + ref.stderr
    got, want = (torch.load(d / "checkpoints" / "last.pth", weights_only=True) for d in (out, tmp_path / "ref"))
    assert_same(_steady(got), _steady(want), "last.pth")
    assert train_rows(out) == train_rows(tmp_path / "ref") and val_rows(out) == val_rows(tmp_path / "ref")


@pytest.mark.slow
def test_ctrl_c_during_a_background_write_waits_for_it_then_saves_and_exits_75(tmp_path):
    """Ctrl-C reaches the main thread only: the write in flight goes on to the end, the stop's own save follows,
    and run.json says preempted only once that one is on disk."""
    out, ck = tmp_path / "run", tmp_path / "run" / "checkpoints"
    run = Launch([sys.executable, TRAIN, *BIG, "OUTPUT_DIR", str(out)], tmp_path, "ctrl_c")
    writing = stop_during_a_write(run, ck, signal.SIGINT)
    assert run.finish(120) == EXIT_PREEMPTED, run.stderr
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "preempted" and status["step"] > writing
    assert ckpt_step(ck / "last.pth") == status["step"]
    assert ckpt_step(ck / f"step_{writing:08d}.pth") == writing  # the write in flight was not cut short
    assert_checkpoints_load(out)
    assert not [f for f in ck.iterdir() if TMP_RE.match(f.name)]
    assert "Traceback" not in run.stderr and "Ctrl-C again" in run.stdout


def test_the_key_turns_it_off_and_may_change_on_resume():
    from runner.config import RESUME_SAFE_KEYS, get_default_config

    assert get_default_config().CHECKPOINT.ASYNC is True and "CHECKPOINT.ASYNC" in RESUME_SAFE_KEYS
