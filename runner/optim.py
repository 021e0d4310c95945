"""Optimizer and LR schedule through timm's factories."""
from __future__ import annotations

import torch
import torch.nn as nn

_FUSED = {"sgd", "momentum", "adam", "adamw"}  # timm maps these onto torch.optim classes with fused kernels


def scaled_lr(cfg, world_size: int) -> float:
    """TRAIN.LR, scaled linearly by global batch / TRAIN.LR_REF_BATCH when that is set."""
    if cfg.TRAIN.LR_REF_BATCH <= 0:
        return cfg.TRAIN.LR
    global_batch = cfg.DATA.BATCH_SIZE * world_size * cfg.TRAIN.ACCUM_STEPS
    return cfg.TRAIN.LR * global_batch / cfg.TRAIN.LR_REF_BATCH


def build_optimizer(cfg, model: nn.Module, device: torch.device, world_size: int = 1) -> torch.optim.Optimizer:
    """Optimizer from cfg.TRAIN through timm's create_optimizer_v2 (fused kernels on CUDA)."""
    from timm.optim import create_optimizer_v2

    kwargs = {}
    opt = cfg.TRAIN.OPTIMIZER.lower()
    if cfg.TRAIN.FUSED and device.type == "cuda" and opt in _FUSED:
        kwargs["fused"] = True  # one kernel per step, and no GradScaler sync for inf checks
    else:
        kwargs["foreach"] = True
    return create_optimizer_v2(model, opt=opt, lr=scaled_lr(cfg, world_size), weight_decay=cfg.TRAIN.WEIGHT_DECAY,
                               momentum=cfg.TRAIN.MOMENTUM, **kwargs)


class ConstantLR:
    """The 'none' schedule: the LR stays as set; same interface as timm's schedulers."""

    def step_update(self, num_updates: int) -> None:
        """Nothing to update."""

    def state_dict(self) -> dict:
        """No state."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """No state."""


def build_scheduler(cfg, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
    """Per-step LR schedule from cfg.TRAIN through timm's create_scheduler_v2."""
    from timm.scheduler import create_scheduler_v2

    if cfg.TRAIN.SCHEDULER == "none":
        return ConstantLR()
    sched, _ = create_scheduler_v2(
        optimizer, sched=cfg.TRAIN.SCHEDULER, num_epochs=cfg.TRAIN.EPOCHS, decay_epochs=cfg.TRAIN.DECAY_EPOCHS,
        decay_rate=cfg.TRAIN.DECAY_RATE, min_lr=cfg.TRAIN.MIN_LR, warmup_lr=cfg.TRAIN.WARMUP_LR,
        warmup_epochs=cfg.TRAIN.WARMUP_EPOCHS, step_on_epochs=False, updates_per_epoch=steps_per_epoch,
    )
    return sched
