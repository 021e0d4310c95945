"""The training step: a micro-batch's forward and backward, the optimizer step, and loss tracking.

Every choice (precision, accumulation, clipping, DDP's no_sync, EMA) is made once by whoever builds the
step (runner.engine.build from the config, or a test); the step only computes. It never reads a value back
to the host: losses are summed on the device and the first non-finite step is remembered there too, both
read by the hooks every LOG.PERIOD steps and before each checkpoint (which also saves the window's sum).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn as nn

from runner import distributed
from runner.errors import NonFiniteLoss, UserError
from runner.optim import ConstantLR

LOSS_SLOTS = 64  # steps' losses kept apart before they are summed (any LOG.PERIOD works: full slots fold early)


class TrainStep:
    """The model, its optimizer, schedule and precision, and the device-side loss accumulators."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, bare: nn.Module | None = None,
                 scheduler=None, accum: int = 1, criterion: Callable | None = None, mixup: Callable | None = None,
                 autocast: Callable = nullcontext, scaler: torch.amp.GradScaler | None = None,
                 clip: Callable | None = None, no_sync: Callable = nullcontext, ema=None,
                 loss_fn: Callable | None = None, reseed: Callable[[int, int], None] | None = None,
                 norm_stats: Callable[[int], None] | None = None, shards=None) -> None:
        """`model` is what runs (DDP, compiled); `bare` the module whose weights are saved (default `model`);
        `loss_fn(x, y)` the micro-batch's loss through `model` (default: `criterion(model(x), y)`; distillation's
        adds the teacher's term); `reseed(step, micro_step)` seeds the random draws of each micro-step (dropout,
        drop-path, mixup), so they follow the step and not what ran before in the process; `norm_stats(micro_step)`
        says before each micro-step whether BatchNorm updates its running statistics (see CanonicalNormStats);
        `shards` (DIST.STRATEGY fsdp, runner.fsdp.Shards): the model, optimizer and EMA are saved and loaded by it,
        as a folder every process writes, not in the checkpoint's dict."""
        self.model = model
        self.bare = model if bare is None else bare
        self.optimizer = optimizer
        self.scheduler = ConstantLR() if scheduler is None else scheduler
        self.accum = accum
        self.criterion = nn.CrossEntropyLoss() if criterion is None else criterion
        self.loss_fn = self._loss if loss_fn is None else loss_fn
        self.reseed = reseed
        self.norm_stats = norm_stats
        self.micro = 0  # micro-steps of the optimizer step in progress
        self.mixup = mixup
        self.autocast = autocast
        self.device = next(self.bare.parameters()).device
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False) if scaler is None else scaler
        self.clip = clip
        self.no_sync = no_sync  # DDP must not all-reduce gradients on accumulation micro-steps
        self.ema = ema
        self.shards = shards
        self.step = 0  # optimizer steps taken: what the schedule and the EMA follow
        self.step_loss: torch.Tensor | None = None
        # each step's loss goes into a slot (one copy: the ops of a running sum and a finiteness check cost a tiny
        # model's step 0.15 ms on a CPU); the slots are folded into the window's sum and the first non-finite step,
        # on the device, when they are full or read
        self._losses = torch.zeros(LOSS_SLOTS, device=self.device)
        self._slots = list(self._losses.unbind())
        self._filled = 0
        self._sum = torch.zeros((), device=self.device)
        self.first_bad = torch.full((), -1, dtype=torch.long, device=self.device)

    def train_batch(self, x: torch.Tensor, y: torch.Tensor, last: bool) -> bool:
        """One micro-batch, and the optimizer step when `last` completes an accumulation; True if it stepped."""
        if self.reseed is not None:
            self.reseed(self.step, self.micro)
        if self.norm_stats is not None:
            self.norm_stats(self.micro)
        loss = self._micro_step(x, y, sync=last)
        self.step_loss = loss if self.step_loss is None else self.step_loss + loss
        if not last:
            self.micro += 1
            return False
        self.micro = 0
        self._optimizer_step()
        self._track_loss(self.step_loss)
        self.step_loss = None
        return True

    def _micro_step(self, x: torch.Tensor, y: torch.Tensor, sync: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss share."""
        if self.mixup is not None:
            x, y = self.mixup(x, y)
        with nullcontext() if sync else self.no_sync():
            with self.autocast():
                loss = self.loss_fn(x, y) / self.accum
            self.scaler.scale(loss).backward()
        return loss.detach()

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of the model's output."""
        return self.criterion(self.model(x), y)

    def _optimizer_step(self) -> None:
        """Clip, step, update EMA and LR; no host sync."""
        if self.clip is not None:
            self.scaler.unscale_(self.optimizer)
            self.clip()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self.ema is not None:
            self.ema.update(self.bare, step=self.step)
        self.scheduler.step_update(self.step)

    def _track_loss(self, step_loss: torch.Tensor) -> None:
        """Keep the step's loss on the device, without a sync; fold the slots when they are full."""
        self._slots[self._filled].copy_(step_loss)
        self._filled += 1
        if self._filled == LOSS_SLOTS:
            self._fold()

    def _fold(self) -> None:
        """Add the slots' finite losses to the window's sum and remember the first non-finite step among them."""
        if not self._filled:
            return
        self._scan()
        part = self._losses[:self._filled]
        self._sum += torch.nan_to_num(part, nan=0.0, posinf=0.0, neginf=0.0).sum()
        self._filled = 0

    def _scan(self) -> None:
        """Remember the first non-finite step among the slots, leaving them unfolded (a scan twice finds the same)."""
        if not self._filled:
            return
        bad = ~torch.isfinite(self._losses[:self._filled])
        first = self.step - self._filled + 1 + bad.int().argmax()  # argmax: the first of equal maxima
        self.first_bad = torch.where(bad.any() & (self.first_bad < 0), first, self.first_bad)

    @property
    def loss_sum(self) -> torch.Tensor:
        """The sum of the finite step losses since the last reset_loss (on the device)."""
        self._fold()
        return self._sum

    def reset_loss(self) -> None:
        """Start a new loss sum (a new metric window)."""
        self._fold()  # the first non-finite step is kept across windows
        self._sum.zero_()

    def check_finite(self, epoch: int) -> None:
        """Stop (exit 3) if any rank saw a non-finite loss since the start; one host read (`epoch`: 1-based)."""
        # scanned, not folded: folding where a checkpoint happens to be saved would change the order of the
        # window's float sums, and a resumed run's logged loss in its last bit
        self._scan()
        bad = torch.where(self.first_bad >= 0, 2**40 - self.first_bad, torch.zeros_like(self.first_bad))
        distributed.all_reduce_(bad, "max")
        b = int(bad.item())
        if b:
            raise NonFiniteLoss(f"the loss became non-finite at step {2**40 - b} (epoch {epoch}); "
                                "nothing from that step on was saved; lower TRAIN.LR or enable TRAIN.CLIP_GRAD")

    def loss_window(self) -> dict:
        """The window's loss as host numbers: its sum and the steps' losses not yet added to it (a read of the
        device: for a checkpoint only, which syncs anyway)."""
        return {"sum": float(self._sum), "slots": self._losses[:self._filled].tolist()}

    def load_loss_window(self, window: dict) -> None:
        """Continue a window saved by loss_window: the same sum and unfolded losses, so the same float sums follow."""
        slots = window.get("slots", [])
        if len(slots) >= LOSS_SLOTS:  # another LOSS_SLOTS wrote it: fold what does not fit
            window = {"sum": window["sum"] + sum(slots), "slots": []}
            slots = []
        self._sum.fill_(window["sum"])
        if slots:
            self._losses[:len(slots)].copy_(torch.tensor(slots, dtype=self._losses.dtype))
        self._filled = len(slots)

    def state_dict(self) -> dict:
        """The step's part of a checkpoint: weights, EMA, optimizer, schedule and scaler (not the step count);
        sharded, the first three are None here (the Checkpointer has every process write them: self.shards)."""
        whole = self.shards is None
        return {
            "model": self.bare.state_dict() if whole else None,
            "ema": self.ema.state_dict() if self.ema is not None and whole else None,
            "optimizer": self.optimizer.state_dict() if whole else None,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Put a checkpoint's weights, EMA, optimizer, scaler and step count back; the LR follows the step."""
        if self.shards is not None:
            self._load_shards(state)
        else:
            self._load_whole(state)
        # no scheduler.load_state_dict for timm's: the LR is a function of the config and the step (set below), and
        # their saved state would bring back the old length, freezing a run extended with TRAIN.EPOCHS at its final
        # LR. A schedule whose state is not the step's (plateau's counters) says so and gets it back
        if getattr(self.scheduler, "saves_state", False):
            self.scheduler.load_state_dict(state["scheduler"])
        self._load_rest(state)

    def _load_whole(self, state: dict) -> None:
        """The weights, EMA and optimizer from the checkpoint's dict."""
        self.bare.load_state_dict(state["model"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])

    def _load_shards(self, state: dict) -> None:
        """The weights, EMA and optimizer from the checkpoint's shard folder (every process: a collective)."""
        from runner.checkpoint import SHARDS_KEY

        if not state.get(SHARDS_KEY):
            raise UserError("the checkpoint holds the whole model (DIST.STRATEGY ddp) but this run is DIST.STRATEGY "
                            "fsdp: resume it with DIST.STRATEGY ddp")
        self.shards.load(state[SHARDS_KEY])

    def _load_rest(self, state: dict) -> None:
        """The scaler and the step count; the LR follows the step."""
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step = state["step"]
        self._filled = 0
        self.scheduler.step_update(self.step)


class CanonicalNormStats:
    """BatchNorm running statistics updated from chunk 0 of each optimizer step only, in every layout.

    A step's global batch is cut into processes x accumulation chunks (chunk = micro_step x world + rank). Left
    alone, BatchNorm updates its statistics once per forward in each process: DDP keeps rank 0's, updated from
    its own chunk once per step, while one process accumulating 2 updates them twice per step, from both chunks.
    Updating them from chunk 0 alone (rank 0's first micro-batch) gives every layout of one global batch the
    same buffers and the same `num_batches_tracked`, at no cost: the other chunks still normalise with their own
    batch statistics (the layer's `track_running_stats` is switched off for their forward, which is all it
    skips). It is what DDP without accumulation already did on rank 0. SyncBatchNorm is left alone: its
    statistics are already those of all ranks' chunks of a micro-step.
    """

    def __init__(self, model: nn.Module, rank: int) -> None:
        """The model's tracking BatchNorm layers (not SyncBatchNorm), for the process of `rank`."""
        self.norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                      and not isinstance(m, nn.SyncBatchNorm) and m.track_running_stats]
        self.rank = rank
        self.tracking = True

    def __call__(self, micro: int) -> None:
        """Let the layers update their statistics in this micro-step only when it trains on chunk 0."""
        want = self.rank == 0 and micro == 0
        if want != self.tracking:  # set only on a change: rank 0 without accumulation never touches a layer
            for norm in self.norms:
                norm.track_running_stats = want
            self.tracking = want
