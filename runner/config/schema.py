"""What each key accepts: its type (the default's), its choices and ranges; validation.py checks a config by them.

A key declared by a component (runner.keys: a schedule's, a source's, a sink's knob) brings its own rule and
choices; `rules()` and `enums()` add them to _RULES and ENUMS when asked. What a value means at run time
(seconds of TRAIN.TIME_LIMIT, an epoch's image size, the best metric's direction) is derived.py's; dotted
keys (lookup, get_value, set_value) are keypath.py's.

Values (from files and from the command line alike) are read as YAML and then fitted to the default's type:
  float key: ints and numeric text too (YAML 1.1 reads `1e-3` as text); nan/inf refused
  int key:   whole floats (32.0); bools refused      bool key: YAML booleans only (true/True/yes/on/...)
  text key:  a plain number, bool or date keeps the text exactly as written (18 -> "18", 1e-3 -> "1e-3")
  list/tuple key: a list, a tuple or "(a, b)" text; elements fitted to the type of the default's first
  null: only where the default is None. Command-line "" is empty text.
"""
from __future__ import annotations

import ast
import math
import os
import re
from collections.abc import Set
from typing import Any

from yacs.config import CfgNode as CN

from runner.config.defaults import _C
from runner.config.keypath import ABSENT, get_value, inline_yaml, lookup, set_value
from runner.errors import UserError
from runner.keys import DECLARED, Rule, fraction
from runner.optim import SCHEDULES

# ---------------------------------------------------------------------------------------------------------
# What each key accepts
# ---------------------------------------------------------------------------------------------------------
# Keys that only extend or observe a run: changing them keeps the output folder and allows resuming (and every LOG.*
# and PROFILE.* key, and a declared key marked resume_safe: runner.keys)
_RESUME_SAFE = frozenset(
    ["TRAIN.EPOCHS", "TRAIN.MAX_STEPS", "TRAIN.EXTEND", "CHECKPOINT.PERIOD", "CHECKPOINT.KEEP", "CHECKPOINT.RESUME",
     "CHECKPOINT.ASYNC",  # how checkpoints are written, not what they hold
     "EVAL.PERIOD", "DATA.NUM_WORKERS", "DATA.WORKER_START", "DATA.PIN_MEMORY", "DATA.PREFETCH_FACTOR", "DATA.CHECK",
     "DATA.TEST_SPLIT",  # evaluated after training only: adding one to a run changes nothing it learned
     "DIST.TIMEOUT_S", "DIST.HANG_TIMEOUT_S", "MODEL.COMPILE", "MODEL.COMPILE_MODE",
     "TRAIN.ACCUM_STEPS", "TRAIN.TIME_LIMIT", "OUTPUT_DIR"]  # ACCUM_STEPS: the global batch is checked at resume
)


class ResumeSafeKeys(Set):
    """The keys a resume may change, read when asked (a key declared by the user's module counts)."""

    def __contains__(self, key: object) -> bool:
        return (key in _RESUME_SAFE or (isinstance(key, str) and key.startswith(("LOG.", "PROFILE.")))
                or (key in DECLARED and DECLARED[key].resume_safe))

    def __iter__(self):
        return iter([key for key in _leaf_keys(_C) if key in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _leaf_keys(node: CN, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a section, in definition order."""
    out = []
    for key, value in node.items():
        out += _leaf_keys(value, f"{prefix}{key}.") if isinstance(value, CN) else [f"{prefix}{key}"]
    return out


RESUME_SAFE_KEYS = ResumeSafeKeys()


# timm optimizer names (timm.optim.list_optimizers() without the bnb*/fused* ones that need bitsandbytes or
# apex); hardcoded because importing timm costs seconds. tests/config/test_schema.py checks it against timm.
OPTIMIZERS = (
    "adabelief adadelta adafactor adafactorbv adafactorbvc adagrad adahessian adam adamax adamc adamp "
    "adamuon adamw adamwlegacy adan adanw adopt adoptc adoptw cadafactor cadafactorbv cadafactorbvc "
    "cadamc cadamp cadamw cadan cadanw cadopt cadoptc cadoptw clamb clambw claprop clion clionc cmars "
    "cnadamc cnadamw crmsproptf csgdc csgdp csgdw kron kronc kronw lamb lambc lambcd lambcw lambw laprop "
    "lapropc larc lars lion lionc madgrad madgradw mars momentum muon nadam nadamc nadamlegacy nadamuon "
    "nadamw nesterov nesterovw nlarc nlars nmuon novograd novogradc novogradw radabelief radam "
    "radamlegacy radamw rmsprop rmsproptf rmsproptfc rmsproptfw sgd sgdc sgdp sgdw"
).split()


class ScheduleNames:
    """TRAIN.SCHEDULER's allowed values, read from runner.optim's table when checked (a schedule registered by the
    user's own module counts)."""

    def __iter__(self):
        return iter(tuple(SCHEDULES))

    def __contains__(self, name: object) -> bool:
        return name in SCHEDULES

    def __len__(self) -> int:
        return len(SCHEDULES)


# Allowed values of the string keys that are choices (TRAIN.OPTIMIZER is checked separately; DATA.NAME and each
# source's own rules by the table of sources, runner/data/sources.py, which runner.preflight adds to validate)
ENUMS = {
    "DEVICE": ("auto", "cpu", "cuda"),
    "MODEL.COMPILE_MODE": ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "DATA.WORKER_START": ("forkserver", "fork", "spawn"),
    "AUG.REMODE": ("const", "rand", "pixel"),
    "AUG.INTERPOLATION": ("auto", "bilinear", "bicubic", "nearest", "random"),
    "TRAIN.SCHEDULER": ScheduleNames(),
    "TRAIN.CLIP_MODE": ("norm", "value", "agc"),
    "AMP.DTYPE": ("bfloat16", "float16"),
    "DIST.BACKEND": ("auto", "nccl", "gloo"),
    "DIST.STRATEGY": ("ddp", "fsdp"),
    "LOG.PROGRESS": ("auto", "bar", "plain"),
    "TRAIN.LOSS": ("ce", "bce"),
    "CHECKPOINT.BEST_MODE": ("auto", "max", "min"),
}


# Numeric rules: key -> (predicate, what the value must be)
_GE0 = (lambda x: x >= 0, ">= 0")
_GE1 = (lambda x: x >= 1, ">= 1")
# The largest image side: one 8192 px RGB image is 0.8 GB in float32; a larger value is a typo, and would end in an
# allocator traceback rather than a line
MAX_SIDE = 8192
_SIDE = (lambda x: 1 <= x <= MAX_SIDE, f"in [1, {MAX_SIDE}]")
# DataLoader workers per rank: more is a typo (1000 on 2 cores started 1000 processes and hung for minutes, or
# ran the machine out of memory); the loaders cap the count to the machine's cores at run time
MAX_WORKERS = 256
_GT0 = (lambda x: x > 0, "> 0")
_PROB = (lambda x: 0 <= x <= 1, "in [0, 1]")
_RATE = (lambda x: 0 <= x < 1, "in [0, 1)")
_RULES = {
    "SEED": (lambda x: 0 <= x < 2**32, "in [0, 2**32)"),
    "MODEL.NUM_CLASSES": _GE1, "MODEL.IN_CHANS": _GE1,
    "MODEL.DROP_RATE": _RATE, "MODEL.DROP_PATH_RATE": _RATE,
    "DATA.IMG_SIZE": _SIDE, "DATA.BATCH_SIZE": _GE1, "DATA.EVAL_BATCH_SIZE": _GE0,
    "DATA.NUM_WORKERS": (lambda x: -1 <= x <= MAX_WORKERS, f"in [0, {MAX_WORKERS}] (or -1 for auto)"),
    "DATA.PREFETCH_FACTOR": _GE1,
    "DATA.VAL_FRACTION": (lambda x: 0 < x < 1, "in (0, 1)"),
    "DATA.BAD_FILE_BUDGET": _PROB,
    "AUG.HFLIP": _PROB, "AUG.COLOR_JITTER": _GE0, "AUG.REPROB": _PROB,
    "AUG.CROP_PCT": fraction(), "AUG.MIXUP": _GE0, "AUG.CUTMIX": _GE0,
    "AUG.MIXUP_PROB": _PROB, "AUG.MIXUP_SWITCH_PROB": _PROB, "AUG.SHIFT": _GE0,
    "TRAIN.EPOCHS": _GE1, "TRAIN.LR": _GT0, "TRAIN.MOMENTUM": _RATE, "TRAIN.WEIGHT_DECAY": _GE0,
    "TRAIN.ACCUM_STEPS": _GE1,
    "TRAIN.CLIP_GRAD": _GE0, "TRAIN.LABEL_SMOOTHING": _RATE,
    "TRAIN.EMA_DECAY": (lambda x: 0 < x < 1, "in (0, 1)"), "TRAIN.LR_REF_BATCH": _GE0,
    "TRAIN.MAX_STEPS": _GE0, "TRAIN.BCE_TARGET_THRESH": _RATE,
    # 1 keeps every LR (timm still groups by layer); above 1 the stem would learn faster than the head
    "TRAIN.LAYER_DECAY": _PROB,
    "EVAL.IMG_SIZE": (lambda x: 0 <= x <= MAX_SIDE, f"in [0, {MAX_SIDE}] (0 = DATA.IMG_SIZE)"),
    "EVAL.CROP_PCT": _PROB, "DATA.REPEATED_AUG": _GE1,
    "DISTILL.ALPHA": _PROB, "DISTILL.TEMPERATURE": _GT0,
    "DIST.HANG_TIMEOUT_S": (lambda x: x >= 0 or x == -1, ">= 0 (0 = off) or -1 (auto)"),
    # a week: a rank that waits longer is hung; far larger values (1e300) overflow timedelta and torch's clocks
    "DIST.TIMEOUT_S": (lambda x: 1 <= x <= 7 * 24 * 3600, "in [1, 604800] (at most 7 days)"),
    "DIST.BUCKET_CAP_MB": _GE1,
    "EVAL.PERIOD": _GE1, "CHECKPOINT.PERIOD": _GE0, "CHECKPOINT.KEEP": _GE1, "LOG.PERIOD": _GE1,
    "EVAL.PERIOD_STEPS": _GE0, "TRAIN.EARLY_STOP_PATIENCE": _GE0, "TRAIN.EARLY_STOP_MIN_DELTA": _GE0,
    # above ~3e38 the scaled loss is inf in float32 and every step would be skipped
    "AMP.INIT_SCALE": (lambda x: 1 <= x <= 2.0**126, "in [1, 2**126]"),
    "PROFILE.WAIT": _GE0, "PROFILE.WARMUP": _GE0, "PROFILE.ACTIVE": _GE1, "PROFILE.ROW_LIMIT": _GE1,
}


def rules() -> dict[str, Rule]:
    """Every numeric rule: _RULES and those of the declared keys (runner.keys), read when asked."""
    return {**_RULES, **{name: key.check for name, key in _placed().items() if key.check is not None}}


def enums() -> dict[str, Any]:
    """Every key with a fixed set of values: ENUMS and the declared keys' choices."""
    return {**ENUMS, **{name: key.choices for name, key in _placed().items() if key.choices is not None}}


def _placed() -> dict[str, Any]:
    """The declared keys that are in the defaults (one declared after a key never declared waits outside)."""
    return {name: key for name, key in DECLARED.items() if lookup(name) is not ABSENT}


# Keys that may be "auto": the pretrained weights' own preprocessing (timm's pretrained_cfg) when MODEL.PRETRAINED,
# else the value here. runner/weights/preprocess.py resolves them once per run, before the claim; config.yaml stores
# the values they took, and a resume takes those (an "auto" never differs from a stored value)
AUTO = "auto"
AUTO_KEYS = {"DATA.MEAN": (0.485, 0.456, 0.406), "DATA.STD": (0.229, 0.224, 0.225), "AUG.INTERPOLATION": "bilinear",
             "EVAL.CROP_PCT": 0.0}


def is_auto(key: str, value: Any) -> bool:
    """True for an "auto" value of a key that takes one."""
    return key in AUTO_KEYS and value == AUTO


# Names timm lists that the training loop cannot drive, and why (validation refuses them in one line)
UNSUPPORTED_OPTIMIZERS = {
    "adahessian": "it needs second-order gradients (backward with create_graph=True), which the training loop "
                  "does not compute",
}


# timm's optimizers that fail on FSDP2's sharded parameters (DTensors), and why: each was trained 2 steps on 2
# sharded processes against the whole model (tests/fsdp_optimizers.py, torch 2.15); the others agree to 1e-4
_CAUTIOUS = ("cadafactor cadafactorbv cadafactorbvc cadamc cadamp cadamw cadan cadanw cadopt cadoptc cadoptw clamb "
             "clambw claprop clion clionc cmars cnadamc cnadamw crmsproptf csgdc csgdp csgdw").split()
FSDP_UNSUPPORTED_OPTIMIZERS = {
    **{name: "its cautious mask is rescaled in place by a mean over the whole tensor" for name in _CAUTIOUS},
    "mars": "its update is clamped in place by a norm over the whole tensor",
    **{name: "it mixes sharded and whole tensors (factored or Kronecker statistics)"
       for name in ("adafactor", "kron", "kronc", "kronw")},
    **{name: "its projection reshapes each whole parameter (the processes wait on each other forever)"
       for name in ("adamp", "sgdp")},
    **{name: "its orthogonalized update is added in place across placements" for name in ("adamuon", "nadamuon")},
    **{name: "its per-layer gradient norms need whole tensors" for name in ("novograd", "novogradc", "novogradw")},
}


# Keys holding paths: "~" is expanded once, in load_config, so validation, config.yaml and every use agree
PATH_KEYS = ("OUTPUT_DIR", "DATA.ROOT", "MODEL.CHECKPOINT", "CHECKPOINT.RESUME", "DISTILL.CHECKPOINT")


def expand_paths(cfg: CN) -> None:
    """Expand "~" in the path keys of an unfrozen config; relative paths stay relative to the current folder."""
    for key in PATH_KEYS:
        value = get_value(cfg, key)
        if value and not (key == "CHECKPOINT.RESUME" and value in ("auto", "none")):
            set_value(cfg, key, os.path.expanduser(value))


# ---------------------------------------------------------------------------------------------------------
# Coercion: a value fitted to the type of the key's default
# ---------------------------------------------------------------------------------------------------------
_INT_LIMIT = 2**63  # what torch and numpy hold in an integer
COMMAND_LINE = "command line"


def coerce_value(key: str, value: Any, default: Any, raw: str | None = None,
                 where: str = COMMAND_LINE) -> Any:
    """`value` converted to the type of `default`, or a UserError naming key, expected type and value."""
    if key in AUTO_KEYS:  # "auto", or a value of the type auto stands for
        if value == AUTO:
            return AUTO
        default = AUTO_KEYS[key]
    if default is None:
        return tuple(value) if isinstance(value, list) else value
    given = _clip(raw if raw is not None else inline_yaml(value))
    if value is None:
        hint = "; use '' for empty" if isinstance(default, str) else ""
        if raw is not None and raw.strip() == "~":  # YAML's null, though a shell user means the home folder
            hint = "; a lone ~ is YAML's null: write the full path, or ~/name for a folder in your home"
        raise UserError(f"{key} cannot be null ({where}): it expects {type_words(default)}{hint}")
    out = _convert(value, default, raw)
    if out is ABSENT:
        raise UserError(f"{key} expects {type_words(default)}, got {given!r} ({where})")
    if isinstance(out, float) and not math.isfinite(out):
        raise UserError(f"{key} must be a finite number, got {given!r} ({where})")
    if isinstance(out, int) and not isinstance(out, bool) and not -_INT_LIMIT <= out < _INT_LIMIT:
        rule = rules().get(key)
        if rule is not None and not rule[0](out):  # a key with its own range says that range, for every value
            raise UserError(f"{key} must be {rule[1]}, got {given} ({where})")
        raise UserError(f"{key} must be an integer in [-2**63, 2**63), got {given!r} ({where})")
    if isinstance(out, str) and "\0" in out:  # the OS refuses it in paths, C libraries cut names at it
        raise UserError(f"{key} contains a NUL character ({where}): text values cannot hold one")
    if isinstance(default, (tuple, list)) and default:
        items = (coerce_value(f"{key}[{i}]", v, default[0], None, where) for i, v in enumerate(out))
        out = type(default)(items)
    return out


def _convert(value: Any, default: Any, raw: str | None) -> Any:
    """The friendlier-than-yacs conversion; ABSENT when the value does not fit."""
    if isinstance(default, bool):
        return value if isinstance(value, bool) else ABSENT
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        # a number, bool or date for a text key: keep the text exactly as written ("18", "1e-3", "yes")
        return raw if raw is not None and not isinstance(value, (list, dict)) else ABSENT
    if isinstance(default, (int, float)):
        number = value
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as text
            try:
                number = float(value) if not _is_int_text(value) else int(value)
            except ValueError:
                return ABSENT
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            return ABSENT
        if isinstance(default, float):
            return float(number) if abs(number) < 2**1024 else math.inf  # float(10**400) raises OverflowError
        if isinstance(number, float):
            return int(number) if math.isfinite(number) and number.is_integer() else ABSENT
        return number
    if isinstance(default, (tuple, list)):
        if isinstance(value, str):
            try:
                value = ast.literal_eval(value)  # "(0.5, 0.5)", which YAML reads as text
            except (ValueError, SyntaxError):
                return ABSENT
        return type(default)(value) if isinstance(value, (list, tuple)) else ABSENT
    return ABSENT


def _clip(text: str, width: int = 60) -> str:
    """Long text shortened for a one-line message."""
    return text if len(text) <= width else text[:width] + "..."


def _is_int_text(text: str) -> bool:
    """True for text such as '12' or '-3' (int(text) would work)."""
    return bool(re.fullmatch(r"\s*[-+]?\d[\d_]*\s*", text))


def type_words(default: Any) -> str:
    """How the expected type reads in a message."""
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, str):
        return "text"
    if isinstance(default, (tuple, list)):
        return f"a list like {inline_yaml(default)}"
    return type(default).__name__


# What the Evaluator logs at each evaluation (runner/engine/evaluation.py), and with TRAIN.EMA; CHECKPOINT.BEST_METRIC
# is one of them (tests/engine/test_best.py checks these against an evaluation)
EVAL_METRICS = ("val/top1", "val/top5", "val/loss")
EMA_METRICS = ("val_ema/top1", "val_ema/top5")
