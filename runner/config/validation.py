"""`validate`: every key's choices and range, and the rules across keys, checked on a merged config; the first
problem is one line naming where the value came from (schema.py says what each key accepts)."""
from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable
from typing import Any

from yacs.config import CfgNode as CN

from runner.config.derived import parse_time_limit
from runner.config.keypath import get_value, inline_yaml
from runner.config.schema import (
    EMA_METRICS,
    EVAL_METRICS,
    FSDP_UNSUPPORTED_OPTIMIZERS,
    OPTIMIZERS,
    UNSUPPORTED_OPTIMIZERS,
    enums,
    is_auto,
    rules,
)
from runner.errors import UserError
from runner.optim import SCHEDULES


def validate(cfg: CN, provenance: dict[str, str] | None = None, check_files: bool = True) -> None:
    """Check enums, ranges and cross-field rules; the first problem becomes a one-line UserError.

    DATA.NAME and its source's rules are not here (config/ names no data source): runner.preflight.load_config
    adds them (runner/data/sources.py), and tools/train.py checks them again before the claim.
    """
    prov = provenance or {}

    def fail(key: str, message: str, hint: str = "") -> None:
        raise UserError(f"{message} ({prov.get(key, 'default')}){hint}")

    for key, allowed in enums().items():
        value = get_value(cfg, key)
        if value not in allowed:
            hint = difflib.get_close_matches(str(value).lower(), allowed, n=1, cutoff=0.5)
            fail(key, f"{key} must be one of {'|'.join(allowed)}, got {value!r}",
                 f"; did you mean {hint[0]}?" if hint else "")
    opt = cfg.TRAIN.OPTIMIZER
    name = opt[len("lookahead_"):] if opt.startswith("lookahead_") else opt
    if name not in OPTIMIZERS:
        hint = difflib.get_close_matches(name.lower(), OPTIMIZERS, n=1, cutoff=0.6)
        fail("TRAIN.OPTIMIZER", "TRAIN.OPTIMIZER must be a timm optimizer name such as sgd|momentum|adamw|"
                                f"adam|lamb|lion|rmsprop (all {len(OPTIMIZERS)}: runner.config.OPTIMIZERS), "
                                f"optionally with a lookahead_ prefix, got {opt!r}",
             f"; did you mean {hint[0]}?" if hint else "")
    if name in UNSUPPORTED_OPTIMIZERS:
        fail("TRAIN.OPTIMIZER", f"TRAIN.OPTIMIZER {opt} is not supported: {UNSUPPORTED_OPTIMIZERS[name]}; "
                                "choose another, e.g. adamw")
    for key, (ok, words) in rules().items():
        if not is_auto(key, get_value(cfg, key)) and not ok(get_value(cfg, key)):
            fail(key, f"{key} must be {words}, got {inline_yaml(get_value(cfg, key))}")
    if not cfg.MODEL.NAME:
        fail("MODEL.NAME", "MODEL.NAME must name a timm model, e.g. resnet18")
    _validate_schedule(cfg, fail)
    _validate_cross_field(cfg, fail, check_files)


def _validate_schedule(cfg: CN, fail: Callable[..., None]) -> None:
    """TRAIN.SCHEDULER's own rule across keys, from runner.optim's table (config/ names no schedule)."""
    check = SCHEDULES[cfg.TRAIN.SCHEDULER].check
    problem = check(cfg) if check is not None else None
    if problem is not None:
        fail(*problem)


def _validate_cross_field(cfg: CN, fail: Callable[..., None], check_files: bool) -> None:
    """Rules that involve several keys or the file system."""
    d, t = cfg.DATA, cfg.TRAIN
    for key in ("DATA.MEAN", "DATA.STD"):
        if not is_auto(key, get_value(cfg, key)) and len(get_value(cfg, key)) != cfg.MODEL.IN_CHANS:
            fail(key, f"{key} needs one value per input channel (MODEL.IN_CHANS {cfg.MODEL.IN_CHANS}), "
                      f"got {inline_yaml(get_value(cfg, key))}")
    if not is_auto("DATA.STD", d.STD) and min(d.STD) <= 0:
        fail("DATA.STD", f"DATA.STD values must be > 0, got {inline_yaml(d.STD)}")
    for key, top in (("AUG.SCALE", 1.0), ("AUG.RATIO", math.inf)):
        lo_hi = get_value(cfg, key)
        if len(lo_hi) != 2 or not 0 < lo_hi[0] <= lo_hi[1] <= top:
            fail(key, f"{key} must be [low, high] with 0 < low <= high{' <= 1' if top == 1.0 else ''}, "
                      f"got {inline_yaml(lo_hi)}")
    if t.MIN_LR > t.LR:
        fail("TRAIN.MIN_LR", f"TRAIN.MIN_LR ({t.MIN_LR}) must not exceed TRAIN.LR ({t.LR})")
    if t.WARMUP_EPOCHS >= t.EPOCHS and t.WARMUP_EPOCHS > 0:
        fail("TRAIN.WARMUP_EPOCHS", f"TRAIN.WARMUP_EPOCHS ({t.WARMUP_EPOCHS}) must be less than TRAIN.EPOCHS "
                                    f"({t.EPOCHS})")
    if t.BCE_TARGET_THRESH > 0 and t.LOSS != "bce":
        fail("TRAIN.BCE_TARGET_THRESH", f"TRAIN.BCE_TARGET_THRESH ({t.BCE_TARGET_THRESH}) needs TRAIN.LOSS bce "
                                        f"(it thresholds binary targets), got TRAIN.LOSS {t.LOSS}")
    if cfg.DIST.BACKEND == "nccl" and cfg.DEVICE == "cpu":
        fail("DIST.BACKEND", "DIST.BACKEND nccl needs GPUs; use gloo (or auto) with DEVICE cpu")
    if cfg.PROFILE.ONLY and not cfg.PROFILE.ENABLED:
        fail("PROFILE.ONLY", "PROFILE.ONLY needs PROFILE.ENABLED true")
    resume = cfg.CHECKPOINT.RESUME
    if not resume:
        fail("CHECKPOINT.RESUME", "CHECKPOINT.RESUME must be auto, none or a checkpoint path, got ''")
    if check_files and resume not in ("auto", "none") and not os.path.isfile(resume):
        fail("CHECKPOINT.RESUME", f"CHECKPOINT.RESUME {resume!r} is not a file (use auto, none or the path "
                                  "of a checkpoint)")
    if check_files and cfg.MODEL.CHECKPOINT and not os.path.isfile(cfg.MODEL.CHECKPOINT):
        fail("MODEL.CHECKPOINT", f"MODEL.CHECKPOINT {cfg.MODEL.CHECKPOINT!r} is not a file")
    _validate_distill(cfg, fail, check_files)
    _validate_fsdp(cfg, fail)
    _validate_best(cfg, fail)
    problem = img_size_schedule_problem(cfg.DATA.IMG_SIZE_SCHEDULE)
    if problem is not None:
        fail("DATA.IMG_SIZE_SCHEDULE", f"DATA.IMG_SIZE_SCHEDULE {problem}, got "
                                       f"{inline_yaml(cfg.DATA.IMG_SIZE_SCHEDULE)}")
    if parse_time_limit(cfg.TRAIN.TIME_LIMIT) is None:
        fail("TRAIN.TIME_LIMIT", f"TRAIN.TIME_LIMIT {cfg.TRAIN.TIME_LIMIT!r} is not a duration: write seconds "
                                 "(3600) or H:MM:SS (1:00:00), or '' for none")


def _validate_fsdp(cfg: CN, fail: Callable[..., None]) -> None:
    """What DIST.STRATEGY fsdp does not combine with (runner/fsdp.py)."""
    if cfg.DIST.STRATEGY != "fsdp":
        return
    if cfg.MODEL.COMPILE:
        fail("MODEL.COMPILE", "MODEL.COMPILE true does not combine with DIST.STRATEGY fsdp (the sharded model is not "
                              "compiled per block yet): set MODEL.COMPILE false or DIST.STRATEGY ddp")
    if cfg.MODEL.CHANNELS_LAST:
        fail("MODEL.CHANNELS_LAST", "MODEL.CHANNELS_LAST true does not combine with DIST.STRATEGY fsdp (FSDP2 shards "
                                    "contiguous parameters only): set MODEL.CHANNELS_LAST false")
    opt = cfg.TRAIN.OPTIMIZER
    name = opt[len("lookahead_"):] if opt.startswith("lookahead_") else opt
    if name in FSDP_UNSUPPORTED_OPTIMIZERS:
        fail("TRAIN.OPTIMIZER", f"TRAIN.OPTIMIZER {opt} does not combine with DIST.STRATEGY fsdp "
                                f"({FSDP_UNSUPPORTED_OPTIMIZERS[name]}): choose another, e.g. adamw, or "
                                "DIST.STRATEGY ddp")
    if cfg.TRAIN.CLIP_GRAD > 0 and cfg.TRAIN.CLIP_MODE == "agc":
        fail("TRAIN.CLIP_MODE", "TRAIN.CLIP_MODE agc does not combine with DIST.STRATEGY fsdp (its per-parameter "
                                "norms need whole tensors): use TRAIN.CLIP_MODE norm or value")


def img_size_schedule_problem(schedule: Any) -> str | None:
    """What is wrong with a DATA.IMG_SIZE_SCHEDULE ([[start, size], ...]), or None."""
    pairs = list(schedule)
    if not pairs:
        return None
    if not all(isinstance(p, (list, tuple)) and len(p) == 2 and all(_is_number(v) for v in p) for p in pairs):
        return "must be a list of [start, size] pairs of numbers, e.g. [[0, 128], [0.5, 160], [0.9, 192]]"
    starts, sizes = [p[0] for p in pairs], [p[1] for p in pairs]
    if any(not float(v).is_integer() or v <= 0 for v in sizes):
        return "sizes must be whole numbers of pixels above 0"
    if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
        return "starts must increase from 0 (the first size is the first epoch's)"
    if max(starts) >= 1 and not all(float(v).is_integer() for v in starts):
        return ("starts are all fractions of TRAIN.EPOCHS (below 1) or all whole epoch counts: a mix is "
                "ambiguous (write 0.5 or 5, not both kinds)")
    return None


def _is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _validate_distill(cfg: CN, fail: Callable[..., None], check_files: bool) -> None:
    """DISTILL.*: a teacher needs local weights; weights need a teacher."""
    k = cfg.DISTILL
    if k.TEACHER and not k.CHECKPOINT:
        fail("DISTILL.CHECKPOINT", f"DISTILL.TEACHER {k.TEACHER} needs DISTILL.CHECKPOINT, a local file with the "
                                   "teacher's weights (a random teacher would teach nothing; nothing is downloaded)")
    if k.CHECKPOINT and not k.TEACHER:
        fail("DISTILL.TEACHER", "DISTILL.CHECKPOINT is set but DISTILL.TEACHER is empty: name the teacher's timm "
                                "model (e.g. DISTILL.TEACHER resnet18)")
    if check_files and k.CHECKPOINT and not os.path.isfile(k.CHECKPOINT):
        fail("DISTILL.CHECKPOINT", f"DISTILL.CHECKPOINT {k.CHECKPOINT!r} is not a file")


def _validate_best(cfg: CN, fail: Callable[..., None]) -> None:
    """CHECKPOINT.BEST_METRIC is a metric this run logs; early stopping's min delta needs its patience."""
    metric = cfg.CHECKPOINT.BEST_METRIC
    if metric in EMA_METRICS and not cfg.TRAIN.EMA:
        fail("CHECKPOINT.BEST_METRIC", f"CHECKPOINT.BEST_METRIC {metric} needs TRAIN.EMA true (without an EMA the "
                                       f"run logs no val_ema/* metric); choose one of {'|'.join(EVAL_METRICS)}")
    if metric not in EVAL_METRICS + EMA_METRICS:
        hint = difflib.get_close_matches(metric, EVAL_METRICS + EMA_METRICS, n=1, cutoff=0.5)
        fail("CHECKPOINT.BEST_METRIC", f"CHECKPOINT.BEST_METRIC must be a metric the run logs at evaluation: "
                                       f"{'|'.join(EVAL_METRICS + EMA_METRICS)} (val_ema/* with TRAIN.EMA), got "
                                       f"{metric!r}", f"; did you mean {hint[0]}?" if hint else "")
    t = cfg.TRAIN
    if t.EARLY_STOP_MIN_DELTA > 0 and not t.EARLY_STOP_PATIENCE:
        fail("TRAIN.EARLY_STOP_MIN_DELTA", f"TRAIN.EARLY_STOP_MIN_DELTA ({t.EARLY_STOP_MIN_DELTA:g}) needs "
                                           "TRAIN.EARLY_STOP_PATIENCE > 0 (early stopping is off at 0)")
