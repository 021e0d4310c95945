"""The loop in-process: a toy model (nn.Linear) on random tensors, no config and no files.

With no hooks, and with a hook that records every call: their order and counts, the resume position, each
hook's part of the checkpoint, gradient accumulation, a run that ends mid-epoch, and how a stop ends the run.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn

from runner.engine import Hook, StopRun, Trainer, TrainStep
from runner.errors import NonFiniteLoss


class ToyLoader:
    """Fixed random batches, in a seeded order per epoch, resumable at (epoch, batch); records its calls."""

    def __init__(self, batches: int = 6, batch: int = 4):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(batches * batch, 4, generator=g)
        self.y = torch.randint(0, 3, (batches * batch,), generator=g)
        self.batch = batch
        self.position = (0, 0)
        self.calls: list[tuple] = []

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.calls.append(("set_epoch", epoch, start_batch))
        self.position = (epoch, start_batch)

    def __len__(self) -> int:
        return len(self.x) // self.batch

    def __iter__(self):
        self.calls.append(("iter",))
        epoch, start = self.position
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(epoch))
        for i in range(start, len(self)):
            idx = order[i * self.batch:(i + 1) * self.batch]
            yield self.x[idx], self.y[idx]


class Recorder(Hook):
    """Every call, with the loop's position at that moment; counts steps as its part of the checkpoint."""

    def __init__(self, log: list | None = None, name: str = "rec"):
        self.log = [] if log is None else log
        self.name = name
        self.steps = 0

    def _note(self, event: str, trainer) -> None:
        self.log.append((self.name, event, trainer.epoch, trainer.batch_in_epoch, trainer.step))

    def before_train(self, trainer):
        self._note("before_train", trainer)

    def before_epoch(self, trainer):
        self._note("before_epoch", trainer)

    def after_step(self, trainer):
        self.steps += 1
        self._note("after_step", trainer)

    def after_epoch(self, trainer):
        self._note("after_epoch", trainer)

    def after_train(self, trainer):
        self._note("after_train", trainer)

    def on_exception(self, trainer, error):
        self._note(f"on_exception {type(error).__name__}", trainer)

    def close(self, trainer):
        self._note("close", trainer)

    def state_dict(self) -> dict:
        return {f"{self.name}/steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state.get(f"{self.name}/steps", 0)


def toy(hooks=(), *, accum: int = 1, epochs: int = 2, total: int | None = None, batches: int = 6) -> Trainer:
    """A loop around nn.Linear(4, 3) with momentum SGD; `batches` per epoch, `accum` per optimizer step."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    stepper = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), accum=accum)
    steps_per_epoch = batches // accum
    return Trainer(stepper, ToyLoader(batches), hooks, steps_per_epoch=steps_per_epoch,
                   total_steps=epochs * steps_per_epoch if total is None else total)


def weights(trainer: Trainer) -> list[torch.Tensor]:
    """A copy of the model's parameters."""
    return [p.detach().clone() for p in trainer.stepper.model.parameters()]


def test_no_hooks_trains_every_epoch():
    trainer = toy()
    before = weights(trainer)
    assert trainer.train() == {}  # no status hook: no results
    assert (trainer.epoch, trainer.batch_in_epoch, trainer.step) == (2, 0, 12)
    assert trainer.images == 12 * 4 and trainer.data_wait >= 0
    assert any(not torch.equal(a, b) for a, b in zip(before, weights(trainer), strict=True))
    assert torch.isfinite(trainer.stepper.loss_sum) and trainer.stepper.loss_sum > 0
    assert trainer.loader.calls == [("set_epoch", 0, 0), ("iter",), ("set_epoch", 1, 0), ("iter",)]


def test_hooks_are_called_in_order_at_each_point():
    log = []
    trainer = toy([Recorder(log, "a"), Recorder(log, "b")], epochs=2, batches=2)
    trainer.train()
    events = [(event, epoch, batch, step) for name, event, epoch, batch, step in log if name == "a"]
    assert events == [
        ("before_train", 0, 0, 0),
        ("before_epoch", 0, 0, 0), ("after_step", 0, 1, 1), ("after_step", 0, 2, 2),
        ("after_epoch", 1, 0, 2),  # the position has moved on to the next epoch: a checkpoint resumes there
        ("before_epoch", 1, 0, 2), ("after_step", 1, 1, 3), ("after_step", 1, 2, 4), ("after_epoch", 2, 0, 4),
        ("after_train", 2, 0, 4),
        ("close", 2, 0, 4),
    ]
    # every point calls the hooks in their order; close goes the other way
    names = [(name, event) for name, event, *_ in log]
    assert names[:2] == [("a", "before_train"), ("b", "before_train")]
    assert names[-2:] == [("b", "close"), ("a", "close")]
    assert len(names) == 2 * len(events)


def test_accumulation_calls_after_step_per_optimizer_step():
    rec = Recorder()
    trainer = toy([rec], accum=3, epochs=1, batches=7)  # 7 batches: 2 steps of 3, the 7th batch is not used
    trainer.train()
    assert rec.steps == 2 and trainer.step == 2 and trainer.images == 6 * 4
    assert [e[3] for e in rec.log if e[1] == "after_step"] == [3, 6]  # batch_in_epoch at each optimizer step


def test_a_run_that_ends_mid_epoch_ends_its_epoch_there():
    rec = Recorder()
    trainer = toy([rec], epochs=3, total=4, batches=3)  # TRAIN.MAX_STEPS 4 with 3 steps per epoch
    trainer.train()
    ends = [e[2:] for e in rec.log if e[1] == "after_epoch"]
    assert ends == [(1, 0, 3), (1, 1, 4)]  # a whole epoch, then the partial one: its position stays
    assert rec.log[-2][1] == "after_train"


def test_resume_from_a_mid_epoch_state_equals_an_uninterrupted_run():
    reference = toy([Recorder()], epochs=2, batches=5)
    reference.train()

    saved = {}

    class SaveAt(Hook):
        def after_step(self, trainer):
            if trainer.step == 7:
                saved.update(trainer.state_dict())
                raise StopRun("stopped", "at step 7")

    first = toy([Recorder(), SaveAt()], epochs=2, batches=5)
    assert first.train() == {"status": "stopped", "step": 7}
    part = saved["hooks"]["Recorder"]  # each hook's part of the checkpoint under its own key
    assert (saved["epoch"], saved["batch_in_epoch"], saved["step"], part["rec/steps"]) == (1, 2, 7, 7)

    rec = Recorder()
    resumed = toy([rec], epochs=2, batches=5)
    resumed.load_state_dict(saved)
    assert (resumed.epoch, resumed.batch_in_epoch, resumed.step, rec.steps) == (1, 2, 7, 7)
    resumed.train()
    assert resumed.loader.calls[0] == ("set_epoch", 1, 2)  # the loader continues at the next batch
    assert rec.steps == 10 and resumed.step == 10
    for a, b in zip(weights(reference), weights(resumed), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(resumed.stepper.optimizer.state_dict()["state"][0]["momentum_buffer"],
                       reference.stepper.optimizer.state_dict()["state"][0]["momentum_buffer"])


def test_a_resumed_run_with_no_step_left_only_finishes():
    rec = Recorder()
    trainer = toy([rec], epochs=1)
    trainer.stepper.step = trainer.total_steps
    trainer.train()
    assert [e[1] for e in rec.log] == ["after_train"]


def test_a_failure_reaches_every_hook_then_is_raised():
    class Boom(Hook):
        def after_step(self, trainer):
            if trainer.step == 2:
                raise RuntimeError("boom")

    rec = Recorder()
    trainer = toy([Boom(), rec])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert [e[1] for e in rec.log[-2:]] == ["on_exception RuntimeError", "close"]
    assert rec.steps == 1  # the failing hook comes first: the recorder never saw step 2


def test_benchmark_steps_continue_the_open_epoch():
    trainer = toy(batches=4)
    for n in (1, 2, 3):  # 6 steps over two calls and more: the epoch's iterator is kept between calls
        trainer.run_until(trainer.step + n)
    assert trainer.step == 6 and (trainer.epoch, trainer.batch_in_epoch) == (1, 2)
    assert trainer.loader.calls == [("set_epoch", 0, 0), ("iter",), ("set_epoch", 1, 0), ("iter",)]


def test_non_finite_loss_is_found_at_its_step_without_a_sync_in_the_step():
    trainer = toy(epochs=1)
    trainer.loader.x[8:] = float("nan")  # batch 3 on (in epoch 0's order, some later batch) is poisoned
    trainer.run_until(6)
    with pytest.raises(NonFiniteLoss, match=r"non-finite at step \d \(epoch 1\)"):
        trainer.stepper.check_finite(1)
    clean = toy(epochs=1)
    clean.run_until(6)
    clean.stepper.check_finite(1)


def test_resumed_after_an_epochs_last_step_ends_that_epoch_first():
    """A stop right after an epoch's last step saves the position (epoch, all its batches): resuming ends the
    epoch (its hooks, evaluation and checkpoint in a run) before the next one begins."""
    saved = {}

    class SaveAt(Hook):
        def after_step(self, trainer):
            if trainer.step == 3:
                saved.update(trainer.state_dict())
                raise StopRun("stopped", "at an epoch's last step")

    toy([SaveAt()], batches=3).train()
    assert (saved["epoch"], saved["batch_in_epoch"]) == (0, 3)
    rec = Recorder()
    resumed = toy([rec], batches=3)
    resumed.load_state_dict(saved)
    resumed.train()
    assert [e[1:] for e in rec.log[:3]] == [("before_train", 0, 3, 3), ("after_epoch", 1, 0, 3),
                                           ("before_epoch", 1, 0, 3)]
    assert resumed.step == 6 and resumed.loader.calls[0] == ("set_epoch", 1, 0)


class Counter(Hook):
    """Counts steps under a key that every hook of its kind uses: the parts of the checkpoint keep them apart."""

    def __init__(self, every: int):
        self.every, self.count = every, 0

    def after_step(self, trainer):
        self.count += trainer.step % self.every == 0

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state.get("count", 0)


def test_each_hook_has_its_own_part_of_the_checkpoint():
    trainer = toy([Counter(1), Counter(2), Recorder()], epochs=1)
    trainer.train()
    state = trainer.state_dict()
    assert state["hooks"] == {"Counter": {"count": 6}, "Counter.2": {"count": 3}, "Recorder": {"rec/steps": 6}}
    resumed = toy([Counter(1), Counter(2), Recorder()], epochs=1)
    resumed.load_state_dict(state)
    assert [h.count for h in resumed.hooks[:2]] == [6, 3] and resumed.hooks[2].steps == 6


def test_a_checkpoint_with_the_hooks_parts_merged_still_resumes():
    """Checkpoints written before the hooks' parts were apart hold them as top-level keys."""
    trainer = toy([Recorder()], epochs=1)
    trainer.train()
    state = trainer.state_dict()
    flat = {**{k: v for k, v in state.items() if k != "hooks"}, **state["hooks"]["Recorder"]}
    resumed = toy([Recorder()], epochs=1)
    resumed.load_state_dict(flat)
    assert resumed.hooks[0].steps == 6 and resumed.step == trainer.step


class _Scripted(nn.Module):
    """A model whose output's loss is the step's scripted value: finite losses 1, 2, 3, ... and NaN/inf where told."""

    def __init__(self, bad: dict[int, float]):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.calls, self.bad = 0, bad

    def forward(self, x):
        self.calls += 1
        value = self.bad.get(self.calls, float(self.calls))
        return (self.w * 0 + value).expand(x.shape[0], 1)


@pytest.mark.parametrize("first_bad", [3, 64, 65, 130])  # within, at and past a fold of the loss slots
def test_the_window_sum_and_the_first_non_finite_step_over_many_steps(first_bad):
    from runner.engine.step import LOSS_SLOTS

    model = _Scripted({first_bad: float("nan"), first_bad + 2: float("inf")})
    stepper = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.0), criterion=lambda out, y: out.mean())
    x, y = torch.zeros(2, 1), torch.zeros(2, dtype=torch.long)
    total = 0.0
    for step in range(1, 2 * LOSS_SLOTS + 10):
        stepper.train_batch(x, y, last=True)
        total += 0.0 if step in (first_bad, first_bad + 2) else float(step)
        if step == 40:  # a metric window ends (LOG.PERIOD): the sum restarts, the first bad step is kept
            assert stepper.loss_sum.item() == total
            stepper.reset_loss()
            total = 0.0
    assert stepper.loss_sum.item() == total
    with pytest.raises(NonFiniteLoss, match=rf"non-finite at step {first_bad} \(epoch 1\)"):
        stepper.check_finite(1)


class EagerToyLoader(ToyLoader):
    """A ToyLoader whose iterator starts when asked for (as a DataLoader's workers do), not at its first batch."""

    def __iter__(self):
        self.calls.append(("iter",))
        return self._batches(*self.position)

    def _batches(self, epoch: int, start: int):
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(epoch))
        for i in range(start, len(self)):
            idx = order[i * self.batch:(i + 1) * self.batch]
            yield self.x[idx], self.y[idx]


class LoaderAtEpochEnd(Hook):
    """What the loader had been asked for when each epoch's end hooks ran (where the evaluation runs)."""

    def __init__(self):
        self.seen: list[list[tuple]] = []

    def after_epoch(self, trainer):
        self.seen.append(list(trainer.loader.calls))


def eager_toy(hooks, epochs: int = 3) -> Trainer:
    """toy() over an EagerToyLoader."""
    trainer = toy(hooks, epochs=epochs)
    trainer.loader = EagerToyLoader(6)
    return trainer


def test_the_next_epochs_batches_start_before_the_epochs_end_hooks_and_train_the_same():
    seen = LoaderAtEpochEnd()
    trainer = eager_toy([seen])
    trainer.train()
    start = [("set_epoch", 0, 0), ("iter",)]
    assert seen.seen == [
        start + [("set_epoch", 1, 0), ("iter",)],  # epoch 1's loading runs beside epoch 0's evaluation
        start + [("set_epoch", 1, 0), ("iter",), ("set_epoch", 2, 0), ("iter",)],
        start + [("set_epoch", 1, 0), ("iter",), ("set_epoch", 2, 0), ("iter",)],  # the last: nothing after it
    ]
    plain = toy(epochs=3)  # the lazy loader starts each epoch after the hooks: the same batches, the same weights
    plain.train()
    assert all(torch.equal(a, b) for a, b in zip(weights(trainer), weights(plain), strict=True))


class StopAfterFirstEpoch(Hook):
    """Stops the run at the first epoch's end (as --pause-after-epoch does), keeping the batches started by then."""

    def after_epoch(self, trainer):
        self.started = trainer._next[1]
        raise StopRun("paused", "paused after epoch 1")


def test_a_stop_at_an_epoch_end_closes_the_next_epochs_started_batches():
    stop = StopAfterFirstEpoch()
    trainer = eager_toy([stop])
    assert trainer.train() == {"status": "paused", "step": 6}
    assert inspect.getgeneratorstate(stop.started) == inspect.GEN_CLOSED  # its readers end with the run
