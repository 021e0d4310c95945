"""The configuration: every default in one place, layered YAML loading, overrides, validation."""
from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from yacs.config import CfgNode as CN

from runner.errors import UserError, argument_error

_C = CN()

# ---------------------------------------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------------------------------------
# Where everything of one run goes ("~" expanded; relative to the current folder); "" -> filled by the loader:
# output/<path of the --cfg file under configs/, no .yaml>[-<override tag>] (output/digits/resnet18), or
# output/<file name>-<hash of its path> for a file elsewhere
_C.OUTPUT_DIR = ""
# Seed for python, numpy and torch, the same on every rank (data order and augmentation derive from it)
_C.SEED = 0
# Where to run: auto (cuda when available) | cpu | cuda
_C.DEVICE = "auto"

# ---------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------
_C.MODEL = CN()
# timm model name, as accepted by timm.create_model
_C.MODEL.NAME = "resnet18"
# Number of output classes
_C.MODEL.NUM_CLASSES = 10
# Number of input image channels
_C.MODEL.IN_CHANS = 3
# Ask timm for pretrained weights (needs them cached locally; this machine has no internet)
_C.MODEL.PRETRAINED = False
# Local weights file to start from (a runner checkpoint or a plain state_dict); "" = none. "~" expanded;
# relative to the current folder
_C.MODEL.CHECKPOINT = ""
# Dropout rate before the classifier
_C.MODEL.DROP_RATE = 0.0
# Stochastic depth rate
_C.MODEL.DROP_PATH_RATE = 0.0
# Keep model and inputs in channels_last memory format (faster convolutions on tensor cores)
_C.MODEL.CHANNELS_LAST = False
# Wrap the model in torch.compile
_C.MODEL.COMPILE = False
# torch.compile mode: default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs
_C.MODEL.COMPILE_MODE = "default"
# Convert BatchNorm to SyncBatchNorm when training on several processes (CUDA only: torch has no CPU SyncBN)
_C.MODEL.SYNC_BN = False

# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------
_C.DATA = CN()
# Dataset: digits (sklearn 8x8 digits, in memory) | folder (ImageFolder layout under ROOT) | synthetic
_C.DATA.NAME = "digits"
# Dataset root folder (needed by folder); "~" expanded; relative to the current folder
_C.DATA.ROOT = ""
# Side of the square input images, in pixels
_C.DATA.IMG_SIZE = 32
# Training batch size per process (the global batch is this x world size x ACCUM_STEPS)
_C.DATA.BATCH_SIZE = 64
# Evaluation batch size per process; 0 = 2 x BATCH_SIZE
_C.DATA.EVAL_BATCH_SIZE = 0
# DataLoader worker processes per rank; -1 = auto (from the CPU count)
_C.DATA.NUM_WORKERS = -1
# Pin host memory for faster host-to-device copies
_C.DATA.PIN_MEMORY = True
# Batches each worker loads ahead
_C.DATA.PREFETCH_FACTOR = 4
# In-memory datasets (digits, synthetic) live on the device, skipping the DataLoader
_C.DATA.ON_DEVICE = True
# Fraction of the data held out for validation (datasets without a val split)
_C.DATA.VAL_FRACTION = 0.2
# Number of images in the synthetic dataset
_C.DATA.SYNTHETIC_SIZE = 1024
# Per-channel normalization mean
_C.DATA.MEAN = (0.485, 0.456, 0.406)
# Per-channel normalization std
_C.DATA.STD = (0.229, 0.224, 0.225)
# Fraction of unreadable image files tolerated (skipped with a warning) before the run stops
_C.DATA.BAD_FILE_BUDGET = 0.01
# Check the dataset before training (layout, classes, readable files)
_C.DATA.CHECK = True

# ---------------------------------------------------------------------------------------------------------
# Augmentation (training only; passed to timm's transform factory)
# ---------------------------------------------------------------------------------------------------------
_C.AUG = CN()
# Random resized crop: range of the crop area fraction
_C.AUG.SCALE = (0.08, 1.0)
# Random resized crop: range of the aspect ratio
_C.AUG.RATIO = (0.75, 1.3333333333333333)
# Probability of a horizontal flip
_C.AUG.HFLIP = 0.5
# Color jitter strength; 0 = off
_C.AUG.COLOR_JITTER = 0.4
# timm auto-augment policy string, e.g. rand-m9-mstd0.5-inc1; "" = off
_C.AUG.AUTO_AUGMENT = ""
# Random erasing probability; 0 = off
_C.AUG.REPROB = 0.0
# Random erasing fill mode: const | rand | pixel
_C.AUG.REMODE = "pixel"
# Center crop fraction at evaluation
_C.AUG.CROP_PCT = 0.875
# Resize interpolation: bilinear | bicubic | nearest | random
_C.AUG.INTERPOLATION = "bilinear"
# Mixup alpha; 0 = off
_C.AUG.MIXUP = 0.0
# CutMix alpha; 0 = off
_C.AUG.CUTMIX = 0.0
# Probability of applying mixup or cutmix to a batch
_C.AUG.MIXUP_PROB = 1.0
# Probability of switching to cutmix when both are on
_C.AUG.MIXUP_SWITCH_PROB = 0.5
# Pixels of random translation for in-memory datasets; 0 = off
_C.AUG.SHIFT = 0

# ---------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------
_C.TRAIN = CN()
# Number of epochs
_C.TRAIN.EPOCHS = 10
# Optimizer name from timm's registry (sgd, momentum, adamw, lamb, ...)
_C.TRAIN.OPTIMIZER = "sgd"
# Peak learning rate (scaled by LR_REF_BATCH when that is set)
_C.TRAIN.LR = 0.1
# SGD momentum
_C.TRAIN.MOMENTUM = 0.9
# Weight decay
_C.TRAIN.WEIGHT_DECAY = 5e-5
# LR schedule: cosine | step | none
_C.TRAIN.SCHEDULER = "cosine"
# Epochs of linear warmup (fractions allowed)
_C.TRAIN.WARMUP_EPOCHS = 0.0
# LR at the start of warmup
_C.TRAIN.WARMUP_LR = 1e-5
# Lowest LR the schedule reaches
_C.TRAIN.MIN_LR = 0.0
# Step schedule: epochs between decays
_C.TRAIN.DECAY_EPOCHS = 30.0
# Step schedule: factor applied at each decay
_C.TRAIN.DECAY_RATE = 0.1
# Micro-batches accumulated per optimizer step
_C.TRAIN.ACCUM_STEPS = 1
# Gradient clipping threshold; 0 = off
_C.TRAIN.CLIP_GRAD = 0.0
# Gradient clipping mode: norm | value | agc
_C.TRAIN.CLIP_MODE = "norm"
# Label smoothing for the cross-entropy loss
_C.TRAIN.LABEL_SMOOTHING = 0.0
# Keep an exponential moving average of the weights (evaluated as well)
_C.TRAIN.EMA = False
# EMA decay per optimizer step
_C.TRAIN.EMA_DECAY = 0.9998
# Linear LR scaling: 0 = off; else LR *= global batch / LR_REF_BATCH
_C.TRAIN.LR_REF_BATCH = 0
# Use fused/foreach optimizer kernels where available
_C.TRAIN.FUSED = True
# Stop after this many optimizer steps in total; 0 = no cap
_C.TRAIN.MAX_STEPS = 0

# ---------------------------------------------------------------------------------------------------------
# Mixed precision
# ---------------------------------------------------------------------------------------------------------
_C.AMP = CN()
# Run forward and loss under autocast
_C.AMP.ENABLED = False
# Autocast dtype: bfloat16 | float16 (float16 adds a gradient scaler)
_C.AMP.DTYPE = "bfloat16"

# ---------------------------------------------------------------------------------------------------------
# cuDNN and matmul precision
# ---------------------------------------------------------------------------------------------------------
_C.CUDNN = CN()
# Let cuDNN pick the fastest kernels for fixed input shapes
_C.CUDNN.BENCHMARK = True
# Deterministic kernels (slower; reproducible on the same hardware)
_C.CUDNN.DETERMINISTIC = False
# Allow TF32 in matmuls and convolutions on Ampere and newer GPUs
_C.CUDNN.TF32 = True

# ---------------------------------------------------------------------------------------------------------
# Distributed (torchrun)
# ---------------------------------------------------------------------------------------------------------
_C.DIST = CN()
# Process group backend: auto (nccl on GPU, gloo on CPU) | nccl | gloo
_C.DIST.BACKEND = "auto"
# Seconds a collective may wait before the process group gives up (at most 7 days: see _RULES)
_C.DIST.TIMEOUT_S = 600
# DDP: search for parameters that got no gradient (slower; for models with unused branches)
_C.DIST.FIND_UNUSED_PARAMETERS = False
# DDP: broadcast buffers (e.g. BatchNorm statistics) from rank 0 every forward
_C.DIST.BROADCAST_BUFFERS = True
# DDP: gradient bucket size in MiB
_C.DIST.BUCKET_CAP_MB = 25

# ---------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------
_C.EVAL = CN()
# Evaluate every this many epochs (and always at the end)
_C.EVAL.PERIOD = 1

# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------
_C.CHECKPOINT = CN()
# Save every this many optimizer steps; 0 = only at epoch ends
_C.CHECKPOINT.PERIOD = 0
# Number of step checkpoints kept (last.pth and best.pth are kept as well)
_C.CHECKPOINT.KEEP = 3
# auto (continue from OUTPUT_DIR when it has a checkpoint) | none (start fresh) | <path to a checkpoint>
# ("~" expanded; relative to the current folder)
_C.CHECKPOINT.RESUME = "auto"

# ---------------------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------------------
_C.LOG = CN()
# Log training scalars every this many optimizer steps
_C.LOG.PERIOD = 20
# Write TensorBoard event files
_C.LOG.TENSORBOARD = True
# Console progress: auto (bar on a terminal, plain lines otherwise) | bar | plain
_C.LOG.PROGRESS = "auto"

# ---------------------------------------------------------------------------------------------------------
# Profiler (torch.profiler)
# ---------------------------------------------------------------------------------------------------------
_C.PROFILE = CN()
# Profile a few training steps and write a trace to OUTPUT_DIR
_C.PROFILE.ENABLED = False
# Steps skipped before the profiler starts
_C.PROFILE.WAIT = 1
# Steps profiled but discarded (warm-up)
_C.PROFILE.WARMUP = 1
# Steps recorded
_C.PROFILE.ACTIVE = 3
# Stop the run after profiling
_C.PROFILE.ONLY = False
# Rows in the printed summary table
_C.PROFILE.ROW_LIMIT = 15


def get_default_config() -> CN:
    """A fresh, unfrozen copy of the defaults."""
    return _C.clone()


# =========================================================================================================
# Loading: defaults <- _BASE_ chains <- each --cfg file <- KEY VALUE overrides -> validate -> freeze
#
# Values (from files and from the command line alike) are read as YAML and then fitted to the default's type:
#   float key: ints and numeric text too (YAML 1.1 reads `1e-3` as text); nan/inf refused
#   int key:   whole floats (32.0); bools refused      bool key: YAML booleans only (true/True/yes/on/...)
#   text key:  a plain number, bool or date keeps the text exactly as written (18 -> "18", 1e-3 -> "1e-3")
#   list/tuple key: a list, a tuple or "(a, b)" text; elements fitted to the type of the default's first
#   null: only where the default is None. Command-line "" is empty text.
# =========================================================================================================

# Keys that only extend or observe a run: changing them keeps the output folder and allows resuming
RESUME_SAFE_KEYS = frozenset(
    ["TRAIN.EPOCHS", "TRAIN.MAX_STEPS", "CHECKPOINT.PERIOD", "CHECKPOINT.KEEP", "CHECKPOINT.RESUME",
     "EVAL.PERIOD", "DATA.NUM_WORKERS", "DATA.PIN_MEMORY", "DATA.PREFETCH_FACTOR", "DATA.CHECK",
     "DIST.TIMEOUT_S", "OUTPUT_DIR"]
    + [f"LOG.{k}" for k in _C.LOG] + [f"PROFILE.{k}" for k in _C.PROFILE]
)

# timm optimizer names (timm.optim.list_optimizers() without the bnb*/fused* ones that need bitsandbytes or
# apex); hardcoded because importing timm costs seconds. tests/test_config.py checks it against timm.
OPTIMIZERS = (
    "adabelief adadelta adafactor adafactorbv adafactorbvc adagrad adahessian adam adamax adamc adamp "
    "adamuon adamw adamwlegacy adan adanw adopt adoptc adoptw cadafactor cadafactorbv cadafactorbvc "
    "cadamc cadamp cadamw cadan cadanw cadopt cadoptc cadoptw clamb clambw claprop clion clionc cmars "
    "cnadamc cnadamw crmsproptf csgdc csgdp csgdw kron kronc kronw lamb lambc lambcd lambcw lambw laprop "
    "lapropc larc lars lion lionc madgrad madgradw mars momentum muon nadam nadamc nadamlegacy nadamuon "
    "nadamw nesterov nesterovw nlarc nlars nmuon novograd novogradc novogradw radabelief radam "
    "radamlegacy radamw rmsprop rmsproptf rmsproptfc rmsproptfw sgd sgdc sgdp sgdw"
).split()

# Allowed values of the string keys that are choices (TRAIN.OPTIMIZER is checked separately)
ENUMS = {
    "DEVICE": ("auto", "cpu", "cuda"),
    "MODEL.COMPILE_MODE": ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "DATA.NAME": ("digits", "folder", "synthetic"),
    "AUG.REMODE": ("const", "rand", "pixel"),
    "AUG.INTERPOLATION": ("bilinear", "bicubic", "nearest", "random"),
    "TRAIN.SCHEDULER": ("cosine", "step", "none"),
    "TRAIN.CLIP_MODE": ("norm", "value", "agc"),
    "AMP.DTYPE": ("bfloat16", "float16"),
    "DIST.BACKEND": ("auto", "nccl", "gloo"),
    "LOG.PROGRESS": ("auto", "bar", "plain"),
}

# Numeric rules: key -> (predicate, what the value must be)
_GE0 = (lambda x: x >= 0, ">= 0")
_GE1 = (lambda x: x >= 1, ">= 1")
_GT0 = (lambda x: x > 0, "> 0")
_PROB = (lambda x: 0 <= x <= 1, "in [0, 1]")
_RATE = (lambda x: 0 <= x < 1, "in [0, 1)")
_RULES = {
    "SEED": (lambda x: 0 <= x < 2**32, "in [0, 2**32)"),
    "MODEL.NUM_CLASSES": _GE1, "MODEL.IN_CHANS": _GE1,
    "MODEL.DROP_RATE": _RATE, "MODEL.DROP_PATH_RATE": _RATE,
    "DATA.IMG_SIZE": _GE1, "DATA.BATCH_SIZE": _GE1, "DATA.EVAL_BATCH_SIZE": _GE0,
    "DATA.NUM_WORKERS": (lambda x: x >= -1, ">= 0 (or -1 for auto)"), "DATA.PREFETCH_FACTOR": _GE1,
    "DATA.VAL_FRACTION": (lambda x: 0 < x < 1, "in (0, 1)"), "DATA.SYNTHETIC_SIZE": _GE1,
    "DATA.BAD_FILE_BUDGET": _PROB,
    "AUG.HFLIP": _PROB, "AUG.COLOR_JITTER": _GE0, "AUG.REPROB": _PROB,
    "AUG.CROP_PCT": (lambda x: 0 < x <= 1, "in (0, 1]"), "AUG.MIXUP": _GE0, "AUG.CUTMIX": _GE0,
    "AUG.MIXUP_PROB": _PROB, "AUG.MIXUP_SWITCH_PROB": _PROB, "AUG.SHIFT": _GE0,
    "TRAIN.EPOCHS": _GE1, "TRAIN.LR": _GT0, "TRAIN.MOMENTUM": _RATE, "TRAIN.WEIGHT_DECAY": _GE0,
    "TRAIN.WARMUP_EPOCHS": _GE0, "TRAIN.WARMUP_LR": _GE0, "TRAIN.MIN_LR": _GE0, "TRAIN.DECAY_EPOCHS": _GT0,
    "TRAIN.DECAY_RATE": (lambda x: 0 < x <= 1, "in (0, 1]"), "TRAIN.ACCUM_STEPS": _GE1,
    "TRAIN.CLIP_GRAD": _GE0, "TRAIN.LABEL_SMOOTHING": _RATE,
    "TRAIN.EMA_DECAY": (lambda x: 0 < x < 1, "in (0, 1)"), "TRAIN.LR_REF_BATCH": _GE0,
    "TRAIN.MAX_STEPS": _GE0,
    # a week: a rank that waits longer is hung; far larger values (1e300) overflow timedelta and torch's clocks
    "DIST.TIMEOUT_S": (lambda x: 1 <= x <= 7 * 24 * 3600, "in [1, 604800] (at most 7 days)"),
    "DIST.BUCKET_CAP_MB": _GE1,
    "EVAL.PERIOD": _GE1, "CHECKPOINT.PERIOD": _GE0, "CHECKPOINT.KEEP": _GE1, "LOG.PERIOD": _GE1,
    "PROFILE.WAIT": _GE0, "PROFILE.WARMUP": _GE0, "PROFILE.ACTIVE": _GE1, "PROFILE.ROW_LIMIT": _GE1,
}

# Names timm lists that the training loop cannot drive, and why (validation refuses them in one line)
UNSUPPORTED_OPTIMIZERS = {
    "adahessian": "it needs second-order gradients (backward with create_graph=True), which the training loop "
                  "does not compute",
}

# Keys holding paths: "~" is expanded once, in load_config, so validation, config.yaml and every use agree
PATH_KEYS = ("OUTPUT_DIR", "DATA.ROOT", "MODEL.CHECKPOINT", "CHECKPOINT.RESUME")
_MAX_YAML_DEPTH = 32  # a config is sections of keys with short lists; PyYAML's composer recurses per level
_MAX_YAML_NODES = 100_000  # values after expanding aliases and merge keys ("billion laughs" stops here)
_INT_LIMIT = 2**63  # what torch and numpy hold in an integer

MISSING = "<missing>"  # stands for a key one config has and the other lacks, in diff_configs
COMMAND_LINE = "command line"
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PY_TAG = "tag:yaml.org,2002:python/"
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class _Entry:
    """One value assignment read from a YAML file or the command line."""

    key: str
    value: Any
    raw: str | None  # the text as written, for plain scalars: lets string keys keep "1e-3" or "18" verbatim
    source: str  # "file:line" or "command line"
    chain: tuple[str, ...] = ()  # the files that led here, outermost first
    merged: bool = False  # came through a YAML merge key (<<: *anchor), which later keys may override


@dataclass
class ConfigInfo:
    """How a config was assembled: the arguments, the files, the overrides and where each value came from."""

    args: argparse.Namespace
    files: list[str]
    overrides: list[tuple[str, Any]]  # (key, coerced value), in command-line order
    provenance: dict[str, str] = field(default_factory=dict)  # key -> "file:line" or "command line"
    history: dict[str, list[tuple[Any, str]]] = field(default_factory=dict)  # key -> every (value, source)

    def config_text(self, cfg: CN) -> str:
        """The text --print-config shows: the merged config as YAML."""
        return dump_config(cfg)

    def explain_text(self, cfg: CN) -> str:
        """The text --explain shows: every non-default value and what set it."""
        changed = changed_from_defaults(cfg, keep_output_dir=True)
        if not changed:
            return "# every key has its default value\n"
        rows = [(k, _fmt(v), self._explain_source(k)) for k, v in changed.items()]
        wk, wv = max(len(r[0]) for r in rows), min(max(len(r[1]) for r in rows), 40)
        lines = ["# keys that differ from the defaults in runner/config.py, and what set them"]
        lines += [f"{k:<{wk}}  {v:<{wv}}  <- {src}" for k, v, src in rows]
        return "\n".join(lines) + "\n"

    def _explain_source(self, key: str) -> str:
        """Where `key` got its final value, with any earlier values it replaced."""
        src = self.provenance.get(key, "default")
        earlier = self.history.get(key, [])[:-1]
        if earlier:
            src += "  (replaced " + ", ".join(f"{_fmt(v)} from {s}" for v, s in earlier) + ")"
        return src


def build_parser(**kwargs: Any) -> argparse.ArgumentParser:
    """An argument parser with the config arguments, whose errors are one-line UserErrors."""
    kwargs.setdefault("allow_abbrev", False)
    kwargs.setdefault("epilog", "Any further KEY VALUE pairs override config keys, e.g. TRAIN.LR 0.05.")
    parser = argparse.ArgumentParser(**kwargs)
    add_config_arguments(parser)
    return parser


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --cfg, --print-config and --explain to `parser`, and make its errors one-line UserErrors."""
    parser.add_argument("--cfg", action="append", default=[], metavar="FILE",
                        help="YAML config file; repeat to layer several (later files win)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the merged config as YAML and exit")
    parser.add_argument("--explain", action="store_true",
                        help="print where every non-default value came from and exit")
    parser.error = argument_error  # argparse would print usage and a second line


def load_config(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None,
                check_paths: bool = True) -> tuple[CN, ConfigInfo]:
    """Parse arguments, merge defaults <- files <- overrides, validate, freeze; UserError on any mistake.

    check_paths False skips the checks that data, weights and OUTPUT_DIR exist, for tools that read and write
    none of them (tools/flops.py); --print-config and --explain skip them too (they only show the config).
    """
    if parser is None:
        parser = build_parser()
    elif not any("--cfg" in a.option_strings for a in parser._actions):
        add_config_arguments(parser)
    parser.error = argument_error
    args, rest = parser.parse_known_args(argv)
    options = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    pairs = _pair_overrides(rest, options)
    cfg = get_default_config()
    info = ConfigInfo(args=args, files=[os.path.expanduser(p) for p in args.cfg], overrides=[])
    for path in info.files:
        _apply(cfg, _file_entries(path, ()), info)
    for key, token in pairs:
        value = yaml_scalar(token)
        _apply(cfg, [_Entry(key, value, token, COMMAND_LINE)], info)
        info.overrides.append((key, _get(cfg, key)))
    if not cfg.OUTPUT_DIR:
        cfg.OUTPUT_DIR = default_output_dir(info.files, info.overrides)
        info.provenance["OUTPUT_DIR"] = "derived from the --cfg file path and the overrides"
    expand_paths(cfg)
    showing = getattr(args, "print_config", False) or getattr(args, "explain", False)
    validate(cfg, info.provenance, check_files=check_paths and not showing)
    cfg.freeze()
    return cfg, info


def expand_paths(cfg: CN) -> None:
    """Expand "~" in the path keys of an unfrozen config; relative paths stay relative to the current folder."""
    for key in PATH_KEYS:
        value = _get(cfg, key)
        if value and not (key == "CHECKPOINT.RESUME" and value in ("auto", "none")):
            _set(cfg, key, os.path.expanduser(value))


def handle_info_flags(cfg: CN, info: ConfigInfo) -> bool:
    """Print --print-config / --explain output if asked; True means the caller should exit 0 now."""
    shown = False
    if getattr(info.args, "print_config", False):
        sys.stdout.write(info.config_text(cfg))
        shown = True
    if getattr(info.args, "explain", False):
        sys.stdout.write(info.explain_text(cfg))
        shown = True
    sys.stdout.flush()
    return shown


def yaml_scalar(token: str) -> Any:
    """A command-line token read like a YAML value; text that is not valid YAML stays text."""
    if not token.strip():
        return token  # DATA.ROOT "" means empty text, not YAML's null
    try:
        return yaml.safe_load(token)
    except yaml.YAMLError:
        return token


def _pair_overrides(tokens: list[str], options: list[str]) -> list[tuple[str, str]]:
    """Split the leftover command-line tokens into (KEY, VALUE) pairs, refusing stray flags and odd lists."""
    leaf_keys = _leaf_keys(_C)
    pairs, i = [], 0
    for tok in tokens:
        if tok.startswith("--") or re.match(r"^-[A-Za-z]", tok):
            name = tok.split("=")[0]
            if name.lstrip("-") in leaf_keys:
                raise UserError(f"unknown option {tok}: config keys take no dashes: {name.lstrip('-')} VALUE")
            close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UserError(f"unknown option {tok}{hint} (options: {', '.join(options)}; config keys are "
                            "given as KEY VALUE without dashes)")
    while i < len(tokens):
        key = tokens[i]
        if key not in leaf_keys:
            raise UserError(_bad_key_token(key, tokens[:i]))
        if i + 1 >= len(tokens):
            raise UserError(f"{key} has no value: overrides come in KEY VALUE pairs, e.g. {key} "
                            f"{_fmt(_get(_C, key))}")
        if tokens[i + 1] in leaf_keys:
            raise UserError(f"{key} has no value (it is followed by the key {tokens[i + 1]}): "
                            "overrides come in KEY VALUE pairs")
        pairs.append((key, tokens[i + 1]))
        i += 2
    return pairs


def _bad_key_token(tok: str, before: list[str]) -> str:
    """The message for a token standing where a KEY should be."""
    section = _lookup(tok.upper())
    if isinstance(section, CN):
        return f"{tok} is a section, not a key: name a key in it, e.g. {tok.upper()}.{next(iter(section))}"
    if _KEY_RE.match(tok) and ("." in tok or tok.isupper()):
        return f"unknown config key {tok} on the command line{_suggest(tok)}"
    after = f" (after {' '.join(before[-2:])})" if before else ""
    return (f"value {tok!r} has no key{after}: overrides come in KEY VALUE pairs, e.g. TRAIN.LR 0.05")


# ---------------------------------------------------------------------------------------------------------
# YAML files
# ---------------------------------------------------------------------------------------------------------
def _file_entries(path: str, chain: tuple[str, ...], named_at: str = "") -> list[_Entry]:
    """The entries of `path` after those of its _BASE_ files (recursively), in merge order."""
    where = named_at or "--cfg"
    if not path:
        raise UserError(f"empty config file path (from {where}): give the path of a YAML file")
    if path.endswith(".py"):
        raise UserError(f"{path} (from {where}): Python config files are not supported (they would be "
                        "executed); write the config as YAML")
    if not os.path.isfile(path):
        what = ("is a directory, not a config file" if os.path.isdir(path) else
                "is not a regular file (a device, pipe or socket)" if os.path.exists(path) else "not found")
        raise UserError(f"config file {path} {what} (from {where}{_chain_text(chain)}){_suggest_file(path)}")
    real = os.path.realpath(path)
    if real in {os.path.realpath(c) for c in chain}:
        raise UserError("_BASE_ cycle: " + " -> ".join(chain + (path,)))
    chain = chain + (path,)
    bases, entries = _parse_yaml(_read(path), path, chain)
    out: list[_Entry] = []
    for base, line in bases:
        base_path = os.path.normpath(os.path.join(os.path.dirname(path), os.path.expanduser(base)))
        out += _file_entries(base_path, chain, f"_BASE_ at {path}:{line}")
    return out + entries


def _read(path: str) -> str:
    """The text of a config file, or a UserError saying why it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config file {path}: {e}") from None


def _parse_yaml(text: str, name: str,
                chain: tuple[str, ...] = ()) -> tuple[list[tuple[str, int]], list[_Entry]]:
    """Safely parse YAML text into (_BASE_ paths with lines, flattened entries with lines)."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as e:  # control characters: a binary file, or text that is not YAML
        code = e.character if isinstance(e.character, int) else 0
        raise UserError(f"{name}: not a YAML text file (character #x{code:04x} at offset {e.position} is not "
                        "allowed in YAML)") from None
    try:
        _refuse_huge_yaml(text, name)
        root = loader.get_single_node()
        if root is None:
            return [], []
        _refuse_tags(root, name)
        if not isinstance(root, yaml.MappingNode):
            raise UserError(f"{name}:{root.start_mark.line + 1}: the top level of a config file must be a "
                            f"mapping of KEY: value, got a {_node_kind(root)}")
        bases: list[tuple[str, int]] = []
        entries: list[_Entry] = []
        for key, knode, vnode, merged in _mapping_items(loader, root, name, ""):
            if key == "_BASE_":
                bases = _base_list(loader, knode, vnode, name)
            else:
                _flatten(loader, key, knode, vnode, name, chain, entries, merged)
        _refuse_flat_duplicates(entries, name)
        return bases, entries
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        context = e.context or ""
        if e.context and e.context_mark and e.context_mark.line != mark.line:
            context += f" (from line {e.context_mark.line + 1})"
        detail = " ".join(x for x in (context, e.problem or "") if x)
        raise UserError(f"{name}{line}: YAML syntax error: {detail}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{name}: YAML error: {' '.join(str(e).split())}") from None
    except RecursionError:  # a backstop: _refuse_huge_yaml bounds the depth before anything recurses
        raise UserError(f"{name}: YAML nested too deep; a config file holds sections of KEY: value") from None
    finally:
        loader.dispose()


def _refuse_huge_yaml(text: str, name: str) -> None:
    """Refuse deep nesting and alias expansion past the limits, from the event stream (iterative, cheap)."""
    total, sizes, open_ = 0, {}, []  # values so far (aliases expanded), anchor -> values under it, open nodes
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in open_):
                raise UserError(f"{name}:{line}: alias *{event.anchor} points into the node that holds it (a loop)")
            total += sizes.get(event.anchor, 1)  # an undefined alias: the composer names it
        elif isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            total += 1
            open_.append((event.anchor, total - 1))
            if len(open_) > _MAX_YAML_DEPTH:
                raise UserError(f"{name}:{line}: YAML nested deeper than {_MAX_YAML_DEPTH} levels; a config file "
                                "holds sections of KEY: value")
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, start = open_.pop()
            if anchor:
                sizes[anchor] = total - start
        if total > _MAX_YAML_NODES:
            raise UserError(f"{name}:{line}: YAML anchors and aliases (or merge keys <<:) expand to more than "
                            f"{_MAX_YAML_NODES} values; a config file needs far fewer: write the values out")


def _refuse_tags(node: yaml.Node, name: str, seen: set[int] | None = None) -> None:
    """Refuse Python-tagged (or other non-standard) YAML before anything is constructed."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    if node.tag.startswith(_PY_TAG):
        raise UserError(f"{name}:{node.start_mark.line + 1}: Python-tagged YAML ({node.tag.split(':')[-1]}) "
                        "is refused: config files hold plain values only")
    if not node.tag.startswith("tag:yaml.org,2002:"):
        raise UserError(f"{name}:{node.start_mark.line + 1}: unsupported YAML tag {node.tag}")
    children = node.value if isinstance(node, yaml.SequenceNode) else (
        [n for kv in node.value for n in kv] if isinstance(node, yaml.MappingNode) else [])
    for child in children:
        _refuse_tags(child, name, seen)


def _mapping_items(loader: yaml.SafeLoader, node: yaml.MappingNode, name: str, prefix: str):
    """(key, key node, value node, merged) of a mapping, refusing duplicate and non-string keys."""
    first: dict[str, int] = {}
    for knode, _ in node.value:
        if knode.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(knode)
        line = knode.start_mark.line + 1
        if not isinstance(key, str):
            raise UserError(f"{name}:{line}: config keys are names, got {key!r}")
        if key in first:
            raise UserError(f"{name}:{line}: duplicate key {prefix}{key} (first set at line {first[key]})")
        first[key] = line
    own = {id(k) for k, _ in node.value}
    loader.flatten_mapping(node)  # resolves YAML merge keys (<<: *anchor); the mapping's own keys come last
    for knode, vnode in node.value:
        yield loader.construct_object(knode), knode, vnode, id(knode) not in own


def _base_list(loader: yaml.SafeLoader, knode: yaml.Node, vnode: yaml.Node,
               name: str) -> list[tuple[str, int]]:
    """The _BASE_ value as a list of (path, line): a path or a list of paths."""
    value = loader.construct_object(vnode, deep=True)
    line = knode.start_mark.line + 1
    paths = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise UserError(f"{name}:{line}: _BASE_ must be a path or a list of paths, got {value!r}")
    return [(p, line) for p in paths]


def _flatten(loader: yaml.SafeLoader, key: str, knode: yaml.Node, vnode: yaml.Node, name: str,
             chain: tuple[str, ...], out: list[_Entry], merged: bool) -> None:
    """Append the leaf entries under `key` (nested mappings become dotted keys)."""
    if isinstance(vnode, yaml.MappingNode) and isinstance(_lookup(key), CN):
        for sub, sknode, svnode, sub_merged in _mapping_items(loader, vnode, name, key + "."):
            _flatten(loader, f"{key}.{sub}", sknode, svnode, name, chain, out, merged or sub_merged)
        return
    raw = vnode.value if isinstance(vnode, yaml.ScalarNode) and vnode.style is None else None
    out.append(_Entry(key, loader.construct_object(vnode, deep=True), raw,
                      f"{name}:{knode.start_mark.line + 1}", chain, merged))


def _refuse_flat_duplicates(entries: list[_Entry], name: str) -> None:
    """The same key written twice in one file, also as TRAIN.LR next to TRAIN: {LR: ...}."""
    first: dict[str, str] = {}
    for e in (e for e in entries if not e.merged):
        if e.key in first:
            raise UserError(f"{e.source}: duplicate key {e.key} (first set at {first[e.key]})")
        first[e.key] = e.source


def _node_kind(node: yaml.Node) -> str:
    """'list', 'mapping' or 'value', for messages."""
    return {yaml.SequenceNode: "list", yaml.MappingNode: "mapping"}.get(type(node), "single value")


# ---------------------------------------------------------------------------------------------------------
# Merging and coercion
# ---------------------------------------------------------------------------------------------------------
def _apply(cfg: CN, entries: list[_Entry], info: ConfigInfo) -> None:
    """Set each entry on `cfg` (coerced to the default's type), recording where it came from."""
    for e in entries:
        default = _lookup(e.key)
        if default is _ABSENT:
            raise UserError(_unknown_key_message(e))
        if isinstance(default, CN):
            if e.value is None:  # "TRAIN:" with every key commented out
                continue
            raise UserError(f"{e.key} is a section, not a value ({_where(e)}): give a mapping of its keys, "
                            f"e.g. {e.key}.{next(iter(default))}")
        value = coerce_value(e.key, e.value, default, e.raw, _where(e))
        _set(cfg, e.key, value)
        info.provenance[e.key] = e.source
        info.history.setdefault(e.key, []).append((value, e.source))


def _where(e: _Entry) -> str:
    """Where an entry was written, with the file chain when it came through _BASE_."""
    return e.source + _chain_text(e.chain)


def _chain_text(chain: tuple[str, ...]) -> str:
    """'; chain a -> b' when more than one file is involved."""
    return f"; chain {' -> '.join(chain)}" if len(chain) > 1 else ""


def _unknown_key_message(e: _Entry) -> str:
    """Unknown key: where it was written, and the closest real key."""
    parts = e.key.split(".")
    for i in range(1, len(parts)):
        if not isinstance(_lookup(".".join(parts[:i])), CN) and _lookup(".".join(parts[:i])) is not _ABSENT:
            leaf = ".".join(parts[:i])
            return (f"{leaf} expects {_type_words(_lookup(leaf))}, got a mapping ({_where(e)})")
    return f"unknown config key {e.key} ({_where(e)}){_suggest(e.key)}"


def coerce_value(key: str, value: Any, default: Any, raw: str | None = None,
                 where: str = COMMAND_LINE) -> Any:
    """`value` converted to the type of `default`, or a UserError naming key, expected type and value."""
    if default is None:
        return tuple(value) if isinstance(value, list) else value
    given = _clip(raw if raw is not None else _fmt(value))
    if value is None:
        hint = "; use '' for empty" if isinstance(default, str) else ""
        if raw is not None and raw.strip() == "~":  # YAML's null, though a shell user means the home folder
            hint = "; a lone ~ is YAML's null: write the full path, or ~/name for a folder in your home"
        raise UserError(f"{key} cannot be null ({where}): it expects {_type_words(default)}{hint}")
    out = _convert(value, default, raw)
    if out is _ABSENT:
        raise UserError(f"{key} expects {_type_words(default)}, got {given!r} ({where})")
    if isinstance(out, float) and not math.isfinite(out):
        raise UserError(f"{key} must be a finite number, got {given!r} ({where})")
    if isinstance(out, int) and not isinstance(out, bool) and not -_INT_LIMIT <= out < _INT_LIMIT:
        raise UserError(f"{key} must be an integer in [-2**63, 2**63), got {given!r} ({where})")
    if isinstance(out, str) and "\0" in out:  # the OS refuses it in paths, C libraries cut names at it
        raise UserError(f"{key} contains a NUL character ({where}): text values cannot hold one")
    if isinstance(default, (tuple, list)) and default:
        items = (coerce_value(f"{key}[{i}]", v, default[0], None, where) for i, v in enumerate(out))
        out = type(default)(items)
    return out


def _convert(value: Any, default: Any, raw: str | None) -> Any:
    """The friendlier-than-yacs conversion; _ABSENT when the value does not fit."""
    if isinstance(default, bool):
        return value if isinstance(value, bool) else _ABSENT
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        # a number, bool or date for a text key: keep the text exactly as written ("18", "1e-3", "yes")
        return raw if raw is not None and not isinstance(value, (list, dict)) else _ABSENT
    if isinstance(default, (int, float)):
        number = value
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as text
            try:
                number = float(value) if not _is_int_text(value) else int(value)
            except ValueError:
                return _ABSENT
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            return _ABSENT
        if isinstance(default, float):
            return float(number) if abs(number) < 2**1024 else math.inf  # float(10**400) raises OverflowError
        if isinstance(number, float):
            return int(number) if math.isfinite(number) and number.is_integer() else _ABSENT
        return number
    if isinstance(default, (tuple, list)):
        if isinstance(value, str):
            try:
                value = ast.literal_eval(value)  # "(0.5, 0.5)", which YAML reads as text
            except (ValueError, SyntaxError):
                return _ABSENT
        return type(default)(value) if isinstance(value, (list, tuple)) else _ABSENT
    return _ABSENT


def _clip(text: str, width: int = 60) -> str:
    """Long text shortened for a one-line message."""
    return text if len(text) <= width else text[:width] + "..."


def _is_int_text(text: str) -> bool:
    """True for text such as '12' or '-3' (int(text) would work)."""
    return bool(re.fullmatch(r"\s*[-+]?\d[\d_]*\s*", text))


def _type_words(default: Any) -> str:
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
        return f"a list like {_fmt(default)}"
    return type(default).__name__


class _Absent:
    """Marker for 'no such key' / 'does not convert' (None is a legitimate value)."""


_ABSENT = _Absent()


def _lookup(key: str, node: CN = _C) -> Any:
    """The default for a dotted key, a CfgNode for a section, or _ABSENT."""
    for part in key.split("."):
        if not isinstance(node, CN) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _get(cfg: CN, key: str) -> Any:
    """The value of a dotted key."""
    return _lookup(key, cfg)


def _set(cfg: CN, key: str, value: Any) -> None:
    """Set a dotted key on an unfrozen config."""
    *sections, leaf = key.split(".")
    node = cfg
    for part in sections:
        node = node[part]
    node[leaf] = value


def _leaf_keys(cfg: CN) -> dict[str, Any]:
    """Every dotted leaf key with its value, in definition order."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        if isinstance(v, CN):
            out.update({f"{k}.{sub}": sv for sub, sv in _leaf_keys(v).items()})
        else:
            out[k] = v
    return out


def _suggest(key: str) -> str:
    """'; did you mean X?' with the closest real key, or ''."""
    keys = list(_leaf_keys(_C))
    upper = key.upper()
    last = upper.split(".")[-1]
    exact = [k for k in keys if k == upper] or [k for k in keys if k.split(".")[-1] == last]
    near_last = difflib.get_close_matches(last, [k.split(".")[-1] for k in keys], n=1, cutoff=0.75)
    close = exact or difflib.get_close_matches(upper, keys, n=1, cutoff=0.6) or [
        k for k in keys if k.split(".")[-1] in near_last]
    return f"; did you mean {' or '.join(close[:3])}?" if close else ""


def _suggest_file(path: str) -> str:
    """'; did you mean X?' with a similarly named file next to `path`, or ''."""
    if os.path.isdir(path):  # name a file in it rather than its neighbour
        try:
            inside = sorted(n for n in os.listdir(path) if n.endswith((".yaml", ".yml")))
        except OSError:
            inside = []
        return f"; did you mean {os.path.join(path, inside[0])}?" if inside else ""
    folder = os.path.dirname(path) or "."
    try:
        names = [n for n in os.listdir(folder) if n.endswith((".yaml", ".yml"))]
    except OSError:
        return ""
    close = difflib.get_close_matches(os.path.basename(path), names, n=1, cutoff=0.6)
    return f"; did you mean {os.path.join(os.path.dirname(path), close[0])}?" if close else ""


# ---------------------------------------------------------------------------------------------------------
# Validation (every rule in one place)
# ---------------------------------------------------------------------------------------------------------
def validate(cfg: CN, provenance: dict[str, str] | None = None, check_files: bool = True) -> None:
    """Check enums, ranges and cross-field rules; the first problem becomes a one-line UserError."""
    prov = provenance or {}

    def fail(key: str, message: str, hint: str = "") -> None:
        raise UserError(f"{message} ({prov.get(key, 'default')}){hint}")

    for key, allowed in ENUMS.items():
        value = _get(cfg, key)
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
    for key, (ok, words) in _RULES.items():
        if not ok(_get(cfg, key)):
            fail(key, f"{key} must be {words}, got {_fmt(_get(cfg, key))}")
    if not cfg.MODEL.NAME:
        fail("MODEL.NAME", "MODEL.NAME must name a timm model, e.g. resnet18")
    _validate_cross_field(cfg, fail, check_files)


def _validate_cross_field(cfg: CN, fail: Callable[..., None], check_files: bool) -> None:
    """Rules that involve several keys or the file system."""
    d, t = cfg.DATA, cfg.TRAIN
    if d.NAME == "folder" and not d.ROOT:
        fail("DATA.NAME", "DATA.NAME folder needs DATA.ROOT, the folder that holds the class folders")
    if check_files and d.NAME == "folder" and not os.path.isdir(d.ROOT):
        fail("DATA.ROOT", f"DATA.ROOT {d.ROOT!r} is not a folder")
    if check_files and os.path.exists(cfg.OUTPUT_DIR) and not os.path.isdir(cfg.OUTPUT_DIR):
        fail("OUTPUT_DIR", f"OUTPUT_DIR {cfg.OUTPUT_DIR} is a file, not a folder; choose another OUTPUT_DIR")
    for key in ("DATA.MEAN", "DATA.STD"):
        if len(_get(cfg, key)) != cfg.MODEL.IN_CHANS:
            fail(key, f"{key} needs one value per input channel (MODEL.IN_CHANS {cfg.MODEL.IN_CHANS}), "
                      f"got {_fmt(_get(cfg, key))}")
    if min(d.STD) <= 0:
        fail("DATA.STD", f"DATA.STD values must be > 0, got {_fmt(d.STD)}")
    for key, top in (("AUG.SCALE", 1.0), ("AUG.RATIO", math.inf)):
        lo_hi = _get(cfg, key)
        if len(lo_hi) != 2 or not 0 < lo_hi[0] <= lo_hi[1] <= top:
            fail(key, f"{key} must be [low, high] with 0 < low <= high{' <= 1' if top == 1.0 else ''}, "
                      f"got {_fmt(lo_hi)}")
    if t.MIN_LR > t.LR:
        fail("TRAIN.MIN_LR", f"TRAIN.MIN_LR ({t.MIN_LR}) must not exceed TRAIN.LR ({t.LR})")
    if t.WARMUP_EPOCHS >= t.EPOCHS and t.WARMUP_EPOCHS > 0:
        fail("TRAIN.WARMUP_EPOCHS", f"TRAIN.WARMUP_EPOCHS ({t.WARMUP_EPOCHS}) must be less than TRAIN.EPOCHS "
                                    f"({t.EPOCHS})")
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


# ---------------------------------------------------------------------------------------------------------
# Output folder, dumping, comparing
# ---------------------------------------------------------------------------------------------------------
def default_output_dir(files: list[str], overrides: list[tuple[str, Any]], cwd: str | None = None) -> str:
    """output/<config label>[-<tag from the overrides>]; the same arguments in the same folder give the same one."""
    stem = _config_label(files, cwd or os.getcwd())
    latest = {k: v for k, v in overrides if k not in RESUME_SAFE_KEYS}  # a repeated key: the last value wins
    if not latest:
        return os.path.join("output", stem)
    parts = [f"{_short_key(k)}={_fmt_tag(v)}" for k, v in sorted(latest.items())]
    readable = "-".join(parts)
    tag = _sanitize(readable)
    # a hash keeps folders apart when sanitizing lost information, a value has '=' in it, or the tag is long
    if tag != readable or any("=" in _fmt_tag(v) for v in latest.values()) or len(tag) > 60:
        digest = hashlib.sha1(repr(sorted(latest.items())).encode()).hexdigest()[:8]
        kept = [p for i, p in enumerate(_sanitize(p) for p in parts) if len("-".join(parts[:i + 1])) <= 48]
        tag = "-".join(kept or [tag[:48]]) + f"-{digest}"
    return os.path.join("output", f"{stem}-{tag}")


def _config_label(files: list[str], cwd: str) -> str:
    """digits/resnet18 for configs/digits/resnet18.yaml; name-<hash of the path> for a file outside configs/;
    several files: the first label, '__', the other names and a hash of every path."""
    if not files:
        return "default"
    configs = os.path.join(os.path.abspath(cwd), "configs")
    full = [os.path.normpath(os.path.join(cwd, os.path.expanduser(f))) for f in files]
    labels = []
    for path in full:
        rel = os.path.relpath(os.path.splitext(path)[0], configs)
        if rel.split(os.sep)[0] != os.pardir:
            labels.append("/".join(_sanitize(part) for part in rel.split(os.sep)))
        else:  # a name alone could be shared by files in different folders
            labels.append(f"{_sanitize(_stem(path))}-{_digest(path)}")
    if len(labels) == 1:
        return labels[0]
    return "__".join([labels[0]] + [_sanitize(_stem(p)) for p in full[1:]]) + f"-{_digest(' '.join(full))}"


def _stem(path: str) -> str:
    """The file name without its extension."""
    return os.path.splitext(os.path.basename(path))[0]


def _digest(text: str) -> str:
    """8 hex digits that tell different texts apart in folder names."""
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _short_key(key: str) -> str:
    """The key's last part, lower-case, with its section when that part is not unique (model.name)."""
    last = key.split(".")[-1]
    same = [k for k in _leaf_keys(_C) if k.split(".")[-1] == last]
    return (last if len(same) == 1 else key).lower()


def _fmt_tag(value: Any) -> str:
    """A value as it reads in a folder name."""
    if isinstance(value, (tuple, list)):
        return ",".join(_fmt_tag(v) for v in value)
    return value if isinstance(value, str) else _fmt(value)


def _sanitize(text: str) -> str:
    """Only characters that are safe in a folder name on every system."""
    return re.sub(r"[^A-Za-z0-9._=-]", "_", text)


def _fmt(value: Any) -> str:
    """A value written as YAML would write it inline (true, 0.05, [1, 2], '')."""
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text[:-3].strip() if text.endswith("\n...") or text.endswith("...") else text


def _to_dict(cfg: CN) -> dict[str, Any]:
    """Nested plain dicts with tuples as lists, ready for yaml.safe_dump."""
    return {k: _to_dict(v) if isinstance(v, CN) else list(v) if isinstance(v, tuple) else v
            for k, v in cfg.items()}


class _Dumper(yaml.SafeDumper):
    """Sections as blocks, lists inline ([0.485, 0.456, 0.406]), as a person would write the file."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def dump_config(cfg: CN) -> str:
    """The config as YAML text that gives back an identical config when loaded with --cfg."""
    return yaml.dump(_to_dict(cfg), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=10**6)


def config_from_yaml_text(text: str, name: str = "<stored config>") -> CN:
    """A frozen config from YAML text (e.g. a checkpoint's config), merged onto the defaults and validated."""
    cfg = get_default_config()
    bases, entries = _parse_yaml(text, name)
    if bases:
        raise UserError(f"{name}: _BASE_ is not allowed in a stored config")
    info = ConfigInfo(args=argparse.Namespace(), files=[], overrides=[])
    _apply(cfg, entries, info)
    expand_paths(cfg)  # a config stored before "~" was expanded compares equal to today's
    validate(cfg, info.provenance, check_files=False)
    cfg.freeze()
    return cfg


def _same(a: Any, b: Any) -> bool:
    """Equal values, with lists and tuples alike."""
    a, b = (list(v) if isinstance(v, tuple) else v for v in (a, b))
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def diff_configs(a: CN, b: CN) -> list[tuple[str, Any, Any]]:
    """(key, value in a, value in b) for every flattened key that differs; MISSING where a key is absent."""
    fa, fb = _leaf_keys(a), _leaf_keys(b)
    keys = list(fa) + [k for k in fb if k not in fa]
    return [(k, fa.get(k, MISSING), fb.get(k, MISSING)) for k in keys
            if k not in fa or k not in fb or not _same(fa[k], fb[k])]


def changed_from_defaults(cfg: CN, keep_output_dir: bool = False) -> dict[str, Any]:
    """Flattened keys whose value differs from the default (OUTPUT_DIR left out unless asked for)."""
    return {k: new for k, _, new in diff_configs(_C, cfg)
            if new is not MISSING and (keep_output_dir or k != "OUTPUT_DIR")}
