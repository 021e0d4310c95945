"""Optimizer and LR schedule through timm's factories; what a change of the run's length means for the schedule.

torch is imported only for type hints: the torch-free refusal of a longer run (runner.rundir.rules) says what
the schedule would do without loading torch.
"""
from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.errors import UserError
from runner.keys import DECLARED, Key, above, at_least, declare, fraction, owned_by

if TYPE_CHECKING:
    import torch
    import torch.nn as nn

log = logging.getLogger("runner")

_FUSED = {"sgd", "momentum", "adam", "adamw"}  # timm maps these onto torch.optim classes with fused kernels
# torch's fused SGD under a GradScaler: a skipped (overflowed) first step leaves its momentum buffers as
# torch.empty_like memory, and the next step makes the weights NaN (H200, torch 2.11, the GPU suite's fp16 test,
# 2026-11-26; the CPU kernel does the same). Fused Adam/AdamW keep their state on a skipped step.
_FUSED_UNSAFE_WITH_SCALER = {"sgd", "momentum"}
# torch 2.15 registers DTensor sharding rules for the fused Adam/AdamW kernels but none for fused SGD (checked:
# "aten._fused_sgd_.default does not have a sharding strategy registered" on the first fsdp step)
_FUSED_UNSAFE_ON_SHARDS = {"sgd", "momentum"}


def scaled_lr(cfg, world_size: int) -> float:
    """TRAIN.LR, scaled linearly by global batch / TRAIN.LR_REF_BATCH when that is set."""
    if cfg.TRAIN.LR_REF_BATCH <= 0:
        return cfg.TRAIN.LR
    global_batch = cfg.DATA.BATCH_SIZE * world_size * cfg.TRAIN.ACCUM_STEPS
    return cfg.TRAIN.LR * global_batch / cfg.TRAIN.LR_REF_BATCH


def build_optimizer(cfg, model: nn.Module, device: torch.device, world_size: int = 1,
                    grad_scaler: bool = False) -> torch.optim.Optimizer:
    """Optimizer from cfg.TRAIN through timm's create_optimizer_v2 (fused kernels where they are safe).

    `grad_scaler`: a GradScaler will step it (float16 on CUDA).
    """
    from timm.optim import create_optimizer_v2

    kwargs = {}
    opt = cfg.TRAIN.OPTIMIZER.lower()
    base = opt.split("_")[-1]  # lookahead_adamw wraps adamw
    fusable = base in _FUSED and not (grad_scaler and base in _FUSED_UNSAFE_WITH_SCALER)
    if base in _FUSED_UNSAFE_ON_SHARDS and _sharded(model):
        fusable = False  # torch has no sharding rule for the fused SGD kernel: a DTensor step raises
    if cfg.TRAIN.FUSED and fusable:
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


def _sharded(model: nn.Module) -> bool:
    """True when `model`'s parameters are DTensors (DIST.STRATEGY fsdp)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


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
    TRAIN.EPOCHS, so a longer run re-derives it (what a resume or an extension then says); `reads`: the
    schedule keys it reads (None: unknown, nothing is warned about); `check(cfg)`: (key, message) of a mistake;
    `doc`: what it does, one line of TRAIN.SCHEDULER's --help-keys text."""

    build: Callable[[Any, Any, int], Any]
    length_shaped: bool = False
    reads: tuple[str, ...] | None = None
    check: Callable[[Any], tuple[str, str] | None] | None = None
    doc: str = ""


SCHEDULES: dict[str, Schedule] = {}  # TRAIN.SCHEDULER's values (config/schema.py checks against this table)


def scheduler_comment() -> str:
    """TRAIN.SCHEDULER's --help-keys text, from the table: each schedule's line, which follow TRAIN.EPOCHS."""
    shaped = [name for name, s in SCHEDULES.items() if s.length_shaped]
    return "\n".join(
        ["LR schedule (timm's, stepped every optimizer step; all but none warm up over WARMUP_EPOCHS first):"]
        + [f"  {name}: {s.doc}" for name, s in SCHEDULES.items()]
        + [f"{', '.join(shaped)} follow TRAIN.EPOCHS (a longer run re-derives them); the others do not. A key below "
           "that the chosen schedule does not read is warned about once, not refused (timm ignores it too)"])


# The knobs of the schedules below (TRAIN.SCHEDULER's values are checked against SCHEDULES by config/schema.py).
# One the chosen schedule does not read, set away from its default, is warned about once (timm's train.py ignores
# it silently; a refusal would break a sweep over TRAIN.SCHEDULER)
declare([
    Key("TRAIN.SCHEDULER", "cosine", scheduler_comment),
    Key("TRAIN.WARMUP_EPOCHS", 0.0,
        "Epochs of linear warmup from WARMUP_LR to LR (fractions allowed; every schedule but none)",
        check=at_least(0)),
    Key("TRAIN.WARMUP_LR", 1e-05,
        "LR at the start of warmup",
        check=at_least(0)),
    Key("TRAIN.MIN_LR", 0.0,
        "Lowest LR the schedule reaches (cosine, tanh, poly: their end and cooldown; plateau: its floor)",
        check=at_least(0)),
    Key("TRAIN.DECAY_EPOCHS", 30.0,
        "step: epochs between decays (fractions allowed)",
        check=above(0)),
    Key("TRAIN.DECAY_RATE", 0.1,
        "step, multistep, plateau: the factor applied to the LR at each decay (plateau: < 1)",
        check=fraction()),
    Key("TRAIN.DECAY_MILESTONES", (30.0, 60.0, 90.0),
        "multistep: the LR is multiplied by DECAY_RATE after each of these epochs (increasing; fractions "
        "allowed), counted from the start, warmup included. timm's --decay-milestones, but a milestone m "
        "acts after m whole epochs, as step and torch's MultiStepLR do (timm's own applies it one epoch, "
        "or one step, early)",
        check=(lambda x: len(x) > 0 and x[0] > 0 and list(x) == sorted(set(x)),
              "a non-empty list of increasing epochs > 0, e.g. [30, 60, 90]")),
    Key("TRAIN.POLY_POWER", 0.5,
        "poly: the power of the decay, (1 - t/T)**POLY_POWER: 1 is linear, below 1 holds the LR high for "
        "longer (timm's PolyLRScheduler power; timm's train.py passes --decay-rate for it)",
        check=above(0)),
    Key("TRAIN.K_DECAY", 1.0,
        "cosine, poly: k-decay (timm's --lr-k-decay, arXiv 2004.05909): t becomes t**K_DECAY; above 1 the "
        "LR stays high for longer, then falls faster. 1 = the plain curve",
        check=above(0)),
    Key("TRAIN.CYCLE_LIMIT", 1,
        "cosine, tanh, poly: the number of cycles (warm restarts, SGDR) that fill TRAIN.EPOCHS (less "
        "COOLDOWN_EPOCHS); each restarts from the previous peak times CYCLE_DECAY. timm's train.py trains "
        "--epochs per cycle; here TRAIN.EPOCHS is the whole run",
        check=at_least(1)),
    Key("TRAIN.CYCLE_MUL", 1.0,
        "cosine, tanh, poly: each cycle is CYCLE_MUL times as long as the one before (SGDR's T_mult)",
        check=above(0)),
    Key("TRAIN.CYCLE_DECAY", 0.5,
        "cosine, tanh, poly: each cycle's peak LR is the previous one's times CYCLE_DECAY (timm's --lr- "
        "cycle-decay)",
        check=fraction()),
    Key("TRAIN.COOLDOWN_EPOCHS", 0.0,
        "cosine, tanh, poly: the last COOLDOWN_EPOCHS of TRAIN.EPOCHS hold the LR at MIN_LR after the "
        "cycles end (timm's --cooldown-epochs, which timm's train.py adds after --epochs; here they are "
        "part of TRAIN.EPOCHS)",
        check=at_least(0)),
    Key("TRAIN.PLATEAU_PATIENCE", 10,
        "plateau: evaluations in a row without improving the best metric that are tolerated; the next one "
        "without improvement lowers the LR (torch's ReduceLROnPlateau patience, timm's --patience- "
        "epochs). Evaluations during the warmup do not count",
        check=at_least(0)),
    Key("TRAIN.PLATEAU_COOLDOWN", 0,
        "plateau: evaluations after a decay during which no improvement is expected (ReduceLROnPlateau's "
        "cooldown)",
        check=at_least(0)),
], owner="schedule", after="TRAIN.WEIGHT_DECAY")


def schedule_keys() -> tuple[str, ...]:
    """The TRAIN keys that schedules declared (the built-in knobs and any a registered schedule added)."""
    return tuple(name.split(".", 1)[1] for name in owned_by("schedule")
                 if name.startswith("TRAIN.") and name != "TRAIN.SCHEDULER")


SCHEDULE_KEYS = schedule_keys()  # the built-in schedules' knobs
_WARMUP = ("WARMUP_EPOCHS", "WARMUP_LR")
_CYCLES = ("MIN_LR", "CYCLE_LIMIT", "CYCLE_MUL", "CYCLE_DECAY", "COOLDOWN_EPOCHS")


def register_schedule(name: str, build: Callable[[Any, Any, int], Any], length_shaped: bool = False,
                      reads: tuple[str, ...] | None = None,
                      check: Callable[[Any], tuple[str, str] | None] | None = None, doc: str = "",
                      keys: tuple[Key, ...] = ()) -> Schedule:
    """Add an LR schedule under `name`: the one line a new schedule needs (its module defines `build`).

    `keys`: its own knobs (runner.keys.Key, TRAIN.*), added to the config; it reads them as well as `reads`.
    """
    declare(keys, owner=f"schedule {name}")
    own = tuple(key.name.split(".", 1)[1] for key in keys)
    SCHEDULES[name] = Schedule(build, length_shaped, None if reads is None else reads + own, check, doc)
    return SCHEDULES[name]


def cycle_epochs(train) -> float:
    """The first cycle's length in epochs: CYCLE_LIMIT cycles (each CYCLE_MUL times the one before), then
    COOLDOWN_EPOCHS at MIN_LR, fill TRAIN.EPOCHS."""
    n, mul = train.CYCLE_LIMIT, train.CYCLE_MUL
    cycles = n if mul == 1 else (mul**n - 1) / (mul - 1)
    return (train.EPOCHS - train.COOLDOWN_EPOCHS) / cycles


def timm_schedule(name: str) -> Callable[[Any, Any, int], Any]:
    """A builder over timm's create_scheduler_v2 for its schedule `name`, stepped per optimizer step."""

    def build(cfg, optimizer, steps_per_epoch: int):
        """timm's scheduler from cfg.TRAIN."""
        from timm.scheduler import create_scheduler_v2

        t = cfg.TRAIN
        # TRAIN.EPOCHS is the whole run: timm's train.py trains its cycles and cooldown after --epochs instead
        sched, _ = create_scheduler_v2(
            optimizer, sched=name, num_epochs=cycle_epochs(t), decay_epochs=t.DECAY_EPOCHS,
            decay_rate=t.POLY_POWER if name == "poly" else t.DECAY_RATE,  # timm's poly reads its power there
            min_lr=t.MIN_LR, warmup_lr=t.WARMUP_LR, warmup_epochs=t.WARMUP_EPOCHS, cycle_mul=t.CYCLE_MUL,
            cycle_decay=t.CYCLE_DECAY, cycle_limit=t.CYCLE_LIMIT, k_decay=t.K_DECAY, step_on_epochs=False,
            updates_per_epoch=steps_per_epoch)
        return sched

    return build


def multistep(cfg, optimizer, steps_per_epoch: int):
    """timm's MultiStepLRScheduler: the LR times DECAY_RATE after each of DECAY_MILESTONES epochs."""
    from timm.scheduler import MultiStepLRScheduler

    t = cfg.TRAIN
    # timm applies milestone m at index m - 1 (kept for its old per-epoch runs); one step on, the LR drops after m
    # whole epochs, as 'step' with DECAY_EPOCHS m and torch's MultiStepLR do
    milestones = [round(m * steps_per_epoch) + 1 for m in t.DECAY_MILESTONES]
    return MultiStepLRScheduler(optimizer, decay_t=milestones, decay_rate=t.DECAY_RATE,
                                warmup_t=t.WARMUP_EPOCHS * steps_per_epoch, warmup_lr_init=t.WARMUP_LR,
                                warmup_prefix=False, t_in_epochs=False)


def check_cycles(cfg) -> tuple[str, str] | None:
    """Warmup and cooldown leave room for the cycles."""
    t = cfg.TRAIN
    if t.COOLDOWN_EPOCHS and t.WARMUP_EPOCHS + t.COOLDOWN_EPOCHS >= t.EPOCHS:
        return "TRAIN.COOLDOWN_EPOCHS", (f"TRAIN.WARMUP_EPOCHS ({t.WARMUP_EPOCHS}) + TRAIN.COOLDOWN_EPOCHS "
                                         f"({t.COOLDOWN_EPOCHS}) must be less than TRAIN.EPOCHS ({t.EPOCHS})")
    return None


def check_plateau(cfg) -> tuple[str, str] | None:
    """A plateau must lower the LR."""
    if cfg.TRAIN.DECAY_RATE >= 1:
        return "TRAIN.DECAY_RATE", (f"TRAIN.SCHEDULER plateau needs TRAIN.DECAY_RATE < 1 (the factor applied at a "
                                    f"plateau), got {cfg.TRAIN.DECAY_RATE}")
    return None


class PlateauLR:
    """'plateau': linear warmup per step, then the LR times DECAY_RATE (down to MIN_LR) whenever more than
    PLATEAU_PATIENCE evaluations in a row have not improved the best metric: torch's ReduceLROnPlateau, as timm's
    PlateauLRScheduler wraps it, but with all its counters saved (timm's keeps only the best and warns that a
    resumed run starts its patience afresh)."""

    saves_state = True  # TrainStep restores it from a checkpoint: it is not a function of the step

    def __init__(self, optimizer: torch.optim.Optimizer, *, warmup_steps: float = 0, warmup_lr: float = 0.0,
                 metric: str = "val/top1", mode: str = "max", **plateau: Any) -> None:
        """`plateau`: ReduceLROnPlateau's factor, patience, cooldown, min_lr."""
        from torch.optim.lr_scheduler import ReduceLROnPlateau

        self.optimizer, self.metric = optimizer, metric
        self.base = [group["lr"] for group in optimizer.param_groups]
        self.warmup_steps, self.warmup_lr = warmup_steps, warmup_lr
        self.plateau = ReduceLROnPlateau(optimizer, mode=mode, **plateau)
        self.started = False  # the warmup has ended and the base LR was set; from then on the plateau owns the LR
        self.updates, self.missing_warned = 0, False
        self.step_update(0)

    def step_update(self, num_updates: int) -> None:
        """The warmup's LR; at its end the base LR, once."""
        self.updates = num_updates
        if num_updates < self.warmup_steps:
            self._set([self.warmup_lr + num_updates * (b - self.warmup_lr) / self.warmup_steps for b in self.base])
        elif not self.started:
            self._set(self.base)
            self.started = True

    def observe(self, scalars: dict[str, float]) -> None:
        """One evaluation's scalars: the plateau logic steps on its metric (evaluations in warmup do not count,
        as in timm's)."""
        if self.metric not in scalars:
            if not self.missing_warned:
                log.warning("TRAIN.SCHEDULER plateau: the evaluation has no %s; the LR stays", self.metric)
            self.missing_warned = True
            return
        if self.started:
            self.plateau.step(scalars[self.metric])

    def _set(self, values: list[float]) -> None:
        """Each group's LR, times its layer-decay scale (as timm's schedulers do)."""
        for group, value in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = value * group.get("lr_scale", 1.0)

    def state_dict(self) -> dict:
        """The plateau's counters (best, bad evaluations, cooldown) and whether the warmup has ended."""
        keys = ("best", "num_bad_epochs", "cooldown_counter", "last_epoch", "_last_lr")
        return {"started": self.started, "plateau": {k: getattr(self.plateau, k) for k in keys}}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's counters (the knobs stay the config's; the LR is the optimizer's)."""
        self.started = state["started"]
        for key, value in state["plateau"].items():
            setattr(self.plateau, key, value)


def plateau(cfg, optimizer, steps_per_epoch: int) -> PlateauLR:
    """The plateau schedule on the best metric (CHECKPOINT.BEST_METRIC, in BEST_MODE)."""
    t, metric, mode = cfg.TRAIN, cfg.CHECKPOINT.BEST_METRIC, cfg.CHECKPOINT.BEST_MODE
    if mode == "auto":  # as the best's (runner.engine.best): min for a loss, max otherwise (timm's train.py)
        mode = "min" if metric.rsplit("/", 1)[-1] == "loss" else "max"
    return PlateauLR(optimizer, warmup_steps=t.WARMUP_EPOCHS * steps_per_epoch, warmup_lr=t.WARMUP_LR,
                     metric=metric, mode=mode,
                     factor=t.DECAY_RATE, patience=t.PLATEAU_PATIENCE, cooldown=t.PLATEAU_COOLDOWN, min_lr=t.MIN_LR)


# cosine, tanh and poly derive their shape from TRAIN.EPOCHS (their cycles and cooldown fill it); step's and
# multistep's decay points, plateau's evaluations and the constant LR do not move with the length
register_schedule("cosine", timm_schedule("cosine"), length_shaped=True, reads=_WARMUP + _CYCLES + ("K_DECAY",),
                  check=check_cycles, doc="from LR down to MIN_LR over the run, in CYCLE_LIMIT cycles then "
                                          "COOLDOWN_EPOCHS (K_DECAY)")
register_schedule("tanh", timm_schedule("tanh"), length_shaped=True, reads=_WARMUP + _CYCLES, check=check_cycles,
                  doc="as cosine along a tanh curve (no K_DECAY)")
register_schedule("poly", timm_schedule("poly"), length_shaped=True,
                  reads=_WARMUP + _CYCLES + ("POLY_POWER", "K_DECAY"), check=check_cycles,
                  doc="from LR down to MIN_LR as (1 - t/T)**POLY_POWER; cycles, cooldown and K_DECAY as cosine")
register_schedule("step", timm_schedule("step"), reads=_WARMUP + ("DECAY_EPOCHS", "DECAY_RATE"),
                  doc="LR times DECAY_RATE every DECAY_EPOCHS")
register_schedule("multistep", multistep, reads=_WARMUP + ("DECAY_MILESTONES", "DECAY_RATE"),
                  doc="LR times DECAY_RATE after each of DECAY_MILESTONES")
register_schedule("plateau", plateau, reads=_WARMUP + ("MIN_LR", "DECAY_RATE", "PLATEAU_PATIENCE",
                                                       "PLATEAU_COOLDOWN"), check=check_plateau,
                  doc="LR times DECAY_RATE (down to MIN_LR) once CHECKPOINT.BEST_METRIC (in BEST_MODE) has not "
                      "improved for more than PLATEAU_PATIENCE evaluations; its counters are in the checkpoint")
register_schedule("constant", timm_schedule("constant"), reads=_WARMUP, doc="LR after the warmup")
register_schedule("none", lambda cfg, optimizer, steps_per_epoch: ConstantLR(optimizer), reads=(),
                  doc="LR as set, no warmup")


def build_scheduler(cfg, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
    """The per-step LR schedule TRAIN.SCHEDULER names."""
    warn_ignored_keys(cfg)
    return SCHEDULES[cfg.TRAIN.SCHEDULER].build(cfg, optimizer, steps_per_epoch)


def warn_ignored_keys(cfg) -> None:
    """One warning naming the schedule keys set away from their defaults that TRAIN.SCHEDULER does not read (the
    defaults are the declarations', so this module needs nothing of config/)."""
    reads = SCHEDULES[cfg.TRAIN.SCHEDULER].reads
    ignored = [f"TRAIN.{key} {cfg.TRAIN[key]}" for key in schedule_keys()
               if reads is not None and key not in reads and cfg.TRAIN[key] != DECLARED[f"TRAIN.{key}"].default]
    if ignored:
        log.warning("TRAIN.SCHEDULER %s ignores %s (python tools/train.py --help-keys TRAIN says which schedule "
                    "reads what)", cfg.TRAIN.SCHEDULER, ", ".join(ignored))


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
