"""Optimizer and LR schedule through timm's factories; what a change of the run's length means for the schedule.

torch is imported only for type hints: the torch-free refusal of a longer run (runner.rundir.rules) says what
the schedule would do without loading torch.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.errors import UserError

if TYPE_CHECKING:
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
    base = opt.split("_")[-1]  # lookahead_adamw wraps adamw
    if cfg.TRAIN.FUSED and base in _FUSED:
        # one kernel per step (no GradScaler sync for inf checks on CUDA); on the CPU too, where torch's fused
        # SGD steps resnet18 in 7.4 ms against 25.7 ms with foreach (docs/PERFORMANCE.md)
        kwargs["fused"] = True
    elif device.type == "cuda" and _accepts(base, "foreach"):
        # 27 of timm's classes (adamp, madgrad, novograd, ...) take no foreach argument. On the CPU torch's own
        # default (a loop per tensor) beats foreach: resnet18's timm SGD step 11.4 ms vs 14.7 ms (2 cores)
        kwargs["foreach"] = True
    if base.startswith("kron") and importlib.util.find_spec("opt_einsum") is None:
        raise UserError(f"TRAIN.OPTIMIZER {opt} needs the opt_einsum package (pip install opt_einsum): without it "
                        "torch.einsum contracts Kron's preconditioners in an order that allocates gigabytes per "
                        "layer; or choose another optimizer")
    if cfg.TRAIN.LAYER_DECAY > 0:
        # timm groups the parameters by depth and stores each group's lr_scale; its schedulers apply it
        kwargs["layer_decay"] = cfg.TRAIN.LAYER_DECAY
    optimizer = create_optimizer_v2(model, opt=opt, lr=scaled_lr(cfg, world_size),
                                    weight_decay=cfg.TRAIN.WEIGHT_DECAY, momentum=cfg.TRAIN.MOMENTUM, **kwargs)
    if device.type != "cuda":
        _eager_kron(optimizer)
    return optimizer


def _eager_kron(optimizer: torch.optim.Optimizer) -> None:
    """Kron's preconditioner math without torch.compile (same numbers): on CPU, compiling it takes ~40 s per
    tensor shape and Inductor's buffers reach gigabytes."""
    from timm.optim import kron

    inner = getattr(optimizer, "base_optimizer", optimizer)  # lookahead_kron
    if not isinstance(inner, kron.Kron):
        return
    for name in ("_calc_A_and_conjB", "_q_terms", "_precond_grad", "_balance_Q"):
        if hasattr(kron, name):
            setattr(inner, name, getattr(kron, name))


def _accepts(name: str, arg: str) -> bool:
    """True when timm's optimizer class for `name` takes the keyword `arg`."""
    import inspect

    from timm.optim import get_optimizer_class

    try:
        params = inspect.signature(get_optimizer_class(name, bind_defaults=False)).parameters
    except (TypeError, ValueError):  # a callable without a readable signature: do not guess
        return False
    return arg in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class ConstantLR:
    """The 'none' schedule: the LR stays as set; same interface as timm's schedulers."""

    def __init__(self, optimizer: torch.optim.Optimizer | None = None):
        # timm's schedulers multiply each group's LR by its lr_scale (layer decay); without one, do it once here
        for group in optimizer.param_groups if optimizer is not None else ():
            if "lr_scale" in group:
                group["lr"] = group["lr"] * group["lr_scale"]

    def step_update(self, num_updates: int) -> None:
        """Nothing to update."""

    def state_dict(self) -> dict:
        """No state."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """No state."""


@dataclass(frozen=True)
class Schedule:
    """A TRAIN.SCHEDULER value: `build(cfg, optimizer, steps_per_epoch)` returns the per-step schedule (timm's
    interface: step_update(num_updates), state_dict, load_state_dict); `length_shaped`: its shape follows
    TRAIN.EPOCHS, so a longer run re-derives it (what a resume or an extension then says)."""

    build: Callable[[Any, Any, int], Any]
    length_shaped: bool = False


SCHEDULES: dict[str, Schedule] = {}  # TRAIN.SCHEDULER's values (config/schema.py checks against this table)


def register_schedule(name: str, build: Callable[[Any, Any, int], Any], length_shaped: bool = False) -> Schedule:
    """Add an LR schedule under `name`: the one line a new schedule needs (its module defines `build`)."""
    SCHEDULES[name] = Schedule(build, length_shaped)
    return SCHEDULES[name]


def timm_schedule(name: str) -> Callable[[Any, Any, int], Any]:
    """A builder over timm's create_scheduler_v2 for its schedule `name`, stepped per optimizer step."""

    def build(cfg, optimizer, steps_per_epoch: int):
        """timm's scheduler from cfg.TRAIN."""
        from timm.scheduler import create_scheduler_v2

        sched, _ = create_scheduler_v2(
            optimizer, sched=name, num_epochs=cfg.TRAIN.EPOCHS, decay_epochs=cfg.TRAIN.DECAY_EPOCHS,
            decay_rate=cfg.TRAIN.DECAY_RATE, min_lr=cfg.TRAIN.MIN_LR, warmup_lr=cfg.TRAIN.WARMUP_LR,
            warmup_epochs=cfg.TRAIN.WARMUP_EPOCHS, step_on_epochs=False, updates_per_epoch=steps_per_epoch)
        return sched

    return build


# timm derives cosine's shape from num_epochs; step's decay points and the constant LR only shift with the length
register_schedule("cosine", timm_schedule("cosine"), length_shaped=True)
register_schedule("step", timm_schedule("step"))
register_schedule("none", lambda cfg, optimizer, steps_per_epoch: ConstantLR(optimizer))


def build_scheduler(cfg, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
    """The per-step LR schedule TRAIN.SCHEDULER names."""
    return SCHEDULES[cfg.TRAIN.SCHEDULER].build(cfg, optimizer, steps_per_epoch)


def reshaped_by_length(cfg, old_epochs) -> bool:
    """True when training `cfg` on from a run of `old_epochs` epochs re-derives the LR schedule's shape."""
    schedule = SCHEDULES.get(cfg.TRAIN.SCHEDULER)
    return old_epochs != cfg.TRAIN.EPOCHS and schedule is not None and schedule.length_shaped


def schedule_on_extension(cfg, old_epochs, step) -> str:
    """How the LR schedule continues when a finished run of `old_epochs` epochs and `step` steps is trained on."""
    if not reshaped_by_length(cfg, old_epochs):
        return "the LR follows the same schedule on"
    return (f"the LR schedule is re-derived for {cfg.TRAIN.EPOCHS} epochs instead of {old_epochs} and continues from "
            f"step {step}: a {cfg.TRAIN.SCHEDULER} schedule that had ended starts again (a warm restart)")


def schedule_on_resume(cfg, old_epochs: int) -> str:
    """What a resume with another TRAIN.EPOCHS than the checkpoint's does to the LR schedule."""
    if reshaped_by_length(cfg, old_epochs):
        return ("the LR schedule is re-derived for the new length from this step (cosine: the LR jumps to the new "
                "curve)")
    return "the LR schedule stays the same"
