"""Every config key with its default and a comment saying what it means; nothing else.

A YAML file holds only what differs from these. The rules a value must follow are in schema.py, loading in
loader.py. The keys of a registered component (an LR schedule's knobs, a data source's, a sink's) are declared in
its own module (runner.keys.Key, beside its registration) and added here, each at the place its declaration names:
runner/optim.py (TRAIN.SCHEDULER and its knobs), runner/data/sources.py (DATA.NAME and the sources' keys),
runner/sinks/catalog.py (LOG.TENSORBOARD, LOG.WANDB*, LOG.MLFLOW*). `python tools/train.py --help-keys` lists all.
"""
from __future__ import annotations

from yacs.config import CfgNode as CN

from runner import keys
from runner.errors import UserError

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
# The user's own code, imported by every tool's opening (on every rank) before the config is checked or anything
# is built: module names (installed or on PYTHONPATH) or .py file paths ("~" expanded; relative to the current
# folder), e.g. [my_models, ~/code/my_source.py]. What they register counts: timm models (@register_model), data
# sources (runner.data.sources.register), sinks (runner.sinks.catalog.register), LR schedules
# (runner.optim.register_schedule). env.txt names each file with its sha256; a resume refuses another list and
# warns when a file changed
_C.IMPORTS = ()

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
# Start from timm's pretrained weights for MODEL.NAME, read from the local Hugging Face cache only: the runner
# never downloads (a cache miss is one error line). Fill the cache once where there is a network
# (timm.create_model(name, pretrained=True)), or give a local file in MODEL.CHECKPOINT instead
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
# Wrap the model in torch.compile, for training and for evaluation (may differ between a run and its resume)
_C.MODEL.COMPILE = False
# torch.compile mode: default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs
_C.MODEL.COMPILE_MODE = "default"
# Convert BatchNorm to SyncBatchNorm when training on several processes (CUDA only: torch has no CPU SyncBN)
_C.MODEL.SYNC_BN = False
# Recompute each block's activations in the backward pass instead of keeping them (timm's
# set_grad_checkpointing): less memory for about a third more compute, same numbers (large ViT/Swin recipes)
_C.MODEL.GRAD_CHECKPOINTING = False

# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------
_C.DATA = CN()
# Dataset root folder (needed by folder, shards, torchvision; shards also take an http(s) URL; hf: a Hub repo id
# or a local path); "~" expanded; relative to the current folder
_C.DATA.ROOT = ""
# Side of the square input images, in pixels
_C.DATA.IMG_SIZE = 32
# Progressive resizing (FFCV, Composer): the training size by epoch, [[start, size], ...] with starts increasing
# from 0, each a fraction of TRAIN.EPOCHS (all below 1: [[0, 128], [0.5, 160], [0.9, 192]]; epoch
# floor(f x EPOCHS) on) or a whole epoch count (all whole: [[0, 128], [5, 160]]: after 5 epochs, 160). Each
# training batch is resized (bilinear, antialiased when shrinking) from DATA.IMG_SIZE to its epoch's size on the
# device; evaluation keeps EVAL.IMG_SIZE or DATA.IMG_SIZE. [] = always DATA.IMG_SIZE
_C.DATA.IMG_SIZE_SCHEDULE = ()
# Training batch size per process (the global batch is this x world size x ACCUM_STEPS)
_C.DATA.BATCH_SIZE = 64
# Evaluation batch size per process; 0 = 2 x BATCH_SIZE
_C.DATA.EVAL_BATCH_SIZE = 0
# DataLoader worker processes per rank, at most 256; -1 = auto (from the CPU count)
_C.DATA.NUM_WORKERS = -1
# How DataLoader workers start: forkserver (from a clean helper process started once, so no worker inherits a
# lock that one of the run's threads held at the fork: gloo, the watchdog, TensorBoard), fork (fastest start,
# shares the parent's memory; can deadlock at the fork) or spawn (a fresh interpreter per worker, slowest)
_C.DATA.WORKER_START = "forkserver"
# Pin host memory for faster host-to-device copies
_C.DATA.PIN_MEMORY = True
# Batches each worker loads ahead
_C.DATA.PREFETCH_FACTOR = 4
# In-memory datasets (digits, synthetic) live on the device, skipping the DataLoader
_C.DATA.ON_DEVICE = True
# Fraction of the data held out for validation (datasets without a val split)
_C.DATA.VAL_FRACTION = 0.2
# Per-channel normalization mean, e.g. [0.5, 0.5, 0.5]; auto = the pretrained weights' (timm's pretrained_cfg) with
# MODEL.PRETRAINED, else ImageNet's [0.485, 0.456, 0.406]. config.yaml stores the values auto took
_C.DATA.MEAN = "auto"
# Per-channel normalization std; auto = the pretrained weights' with MODEL.PRETRAINED, else [0.229, 0.224, 0.225]
_C.DATA.STD = "auto"
# Fraction of unreadable image files tolerated (skipped with a warning) before the run stops
_C.DATA.BAD_FILE_BUDGET = 0.01
# Check the dataset before training (layout, classes, readable files)
_C.DATA.CHECK = True
# A held-out split evaluated once, at the run's end, with best.pth (results.json's test/* and splits.test:
# top-1/top-5, per-class accuracy, the confusion matrix); a folder's DATA.ROOT/<name>/<class>/ or the shards'
# DATA.ROOT/<name>/index.json, e.g. "test". "" = none. tools/eval.py --split NAME evaluates one on demand
_C.DATA.TEST_SPLIT = ""
# Repeated augmentation (DeiT, "ResNet strikes back"): each sample appears this many times per epoch, its copies
# in the same global batch under different random augmentations, so an epoch holds that many passes over the
# data (DeiT's 300 epochs at 3 cost what TRAIN.EPOCHS 100 costs here). 1 = off
_C.DATA.REPEATED_AUG = 1

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
# Resize interpolation: auto | bilinear | bicubic | nearest | random; auto = the pretrained weights' with
# MODEL.PRETRAINED (bicubic for most ViTs), else bilinear
_C.AUG.INTERPOLATION = "auto"
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
# Micro-batches accumulated per optimizer step
_C.TRAIN.ACCUM_STEPS = 1
# Gradient clipping threshold; 0 = off
_C.TRAIN.CLIP_GRAD = 0.0
# Gradient clipping mode: norm | value | agc
_C.TRAIN.CLIP_MODE = "norm"
# Label smoothing for the cross-entropy loss
_C.TRAIN.LABEL_SMOOTHING = 0.0
# Training loss: ce (cross-entropy) | bce (timm's BinaryCrossEntropy, one sigmoid per class: "ResNet strikes
# back" A1-A3, DeiT III). With mixup/cutmix the mixed soft targets carry the label smoothing, as in timm's train.py
_C.TRAIN.LOSS = "ce"
# bce only: targets above this become 1, the rest 0 (after mixup/smoothing; RSB A1-A3 use 0.2); 0 = none
_C.TRAIN.BCE_TARGET_THRESH = 0.0
# Layer-wise LR decay: the LR of a layer n layers below the head is scaled by LAYER_DECAY**n, depth as timm's
# group_matcher counts it (BEiT, MAE and DeiT III fine-tuning use 0.65-0.75); 0 = off
_C.TRAIN.LAYER_DECAY = 0.0
# Keep an exponential moving average of the weights (evaluated as well)
_C.TRAIN.EMA = False
# EMA decay per optimizer step
_C.TRAIN.EMA_DECAY = 0.9998
# Linear LR scaling: 0 = off; else LR *= global batch / LR_REF_BATCH
_C.TRAIN.LR_REF_BATCH = 0
# Use fused/foreach optimizer kernels where available (SGD is not fused under float16's gradient scaler: torch's
# fused SGD keeps uninitialised momentum when the scaler skips its first step)
_C.TRAIN.FUSED = True
# Stop after this many optimizer steps in total; 0 = no cap
_C.TRAIN.MAX_STEPS = 0
# Train a FINISHED run in OUTPUT_DIR on to a larger TRAIN.EPOCHS / TRAIN.MAX_STEPS (without it that is refused).
# Its results.json is kept as results-step<N>.json. The LR is a function of the config and the step: raising only
# MAX_STEPS follows the same schedule on; raising EPOCHS re-derives it for the new length from step N (for
# cosine the LR climbs back up from its end: a warm restart). The default OUTPUT_DIR names the length, so an
# extension needs the finished run's OUTPUT_DIR given explicitly
_C.TRAIN.EXTEND = False
# Early stopping (Lightning's EarlyStopping): end the run after this many evaluations in a row without an improvement
# of CHECKPOINT.BEST_METRIC (in BEST_MODE) of more than EARLY_STOP_MIN_DELTA over its last improvement; every
# evaluation counts (epoch ends, EVAL.PERIOD_STEPS). The run is then done: results.json says early_stop (at which
# step, the best and when, why), and a re-run prints done. Its count is in the checkpoint: a resumed run stops at the
# same step. 0 = off
_C.TRAIN.EARLY_STOP_PATIENCE = 0
# Early stopping: the least change of BEST_METRIC that counts as an improvement (absolute, in the metric's units)
_C.TRAIN.EARLY_STOP_MIN_DELTA = 0.0
# Wall-clock budget of this job, in seconds or H:MM:SS ("" = none): the run saves and exits 75 early enough to
# finish before it (predicted from the measured step, evaluation and save times); the same command continues.
# For a queue with a hard limit and no warning signal (SLURM's --signal=USR1@120 is handled as a preemption)
_C.TRAIN.TIME_LIMIT = ""

# ---------------------------------------------------------------------------------------------------------
# Knowledge distillation (DeiT-style soft distillation from a frozen teacher)
# ---------------------------------------------------------------------------------------------------------
_C.DISTILL = CN()
# Teacher: a timm model name ("" = no distillation). It runs in eval mode, without gradients, under the same
# autocast as the student, and is never saved in the run's checkpoints
_C.DISTILL.TEACHER = ""
# The teacher's weights: a local file (a runner checkpoint or a state_dict; never a download). "~" expanded
_C.DISTILL.CHECKPOINT = ""
# Weight of the distillation term: loss = (1 - ALPHA) * training loss + ALPHA * T^2 * KL(teacher || student)
# (timm's LogitDistillationTask)
_C.DISTILL.ALPHA = 0.5
# Softmax temperature of both models' logits in the distillation term
_C.DISTILL.TEMPERATURE = 1.0

# ---------------------------------------------------------------------------------------------------------
# Mixed precision
# ---------------------------------------------------------------------------------------------------------
_C.AMP = CN()
# Run forward and loss under autocast
_C.AMP.ENABLED = False
# Autocast dtype: bfloat16 | float16 (float16 adds a gradient scaler)
_C.AMP.DTYPE = "bfloat16"
# float16 on CUDA: the gradient scaler's first loss scale (torch's default 2**16; fairseq and Megatron expose the
# same knob). It halves on every step whose gradients overflow, which is then skipped, and grows back later
_C.AMP.INIT_SCALE = 65536.0

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
# Seconds a collective may wait before the process group gives up (at most 7 days: see schema.py)
_C.DIST.TIMEOUT_S = 600
# How the model is spread over the processes: ddp (every process holds the whole model, gradients averaged) | fsdp
# (FSDP2 fully_shard: parameters, gradients and optimizer state split across the processes, each timm block and the
# root sharded, runner/fsdp.py; checkpoints written with torch.distributed.checkpoint as a folder beside each
# step_N.pth, in the background with CHECKPOINT.ASYNC, resharded when a run resumes on another number of processes)
_C.DIST.STRATEGY = "ddp"
# fsdp: free each block's gathered parameters after its forward (less memory, one more all-gather in backward)
_C.DIST.FSDP_RESHARD_AFTER_FORWARD = True
# fsdp: keep the sharded parameters, gradients and optimizer state in host memory (CUDA devices only)
_C.DIST.FSDP_CPU_OFFLOAD = False
# DDP: search for parameters that got no gradient (slower; for models with unused branches)
_C.DIST.FIND_UNUSED_PARAMETERS = False
# DDP: broadcast buffers (e.g. BatchNorm statistics) from rank 0 every forward
_C.DIST.BROADCAST_BUFFERS = True
# DDP: gradient bucket size in MiB
_C.DIST.BUCKET_CAP_MB = 25
# Hang watchdog: when no optimizer step completes for this many seconds, every live rank writes its threads'
# stacks to OUTPUT_DIR/hang/rank<r>.txt, run.json says hung, and the job exits 76. -1 = auto (the larger of
# 300 s and 20 x the measured step time); 0 = off. At least 600 s before the first step; evaluation and
# checkpoint saves pause it, except for a rank whose heartbeat stops during them (a frozen process)
_C.DIST.HANG_TIMEOUT_S = -1.0

# ---------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------
_C.EVAL = CN()
# Evaluate every this many epochs (and always at the end)
_C.EVAL.PERIOD = 1
# Evaluate also every this many optimizer steps of the whole run (step % PERIOD_STEPS == 0; timm#1991: long epochs),
# in addition to EVAL.PERIOD's epoch ends (set EVAL.PERIOD above TRAIN.EPOCHS for steps only: the end is always
# evaluated). Its rows in metrics.jsonl carry their step and the epoch in progress; each is followed by a checkpoint,
# and drives best.pth and early stopping like any evaluation. 0 = off
_C.EVAL.PERIOD_STEPS = 0
# Side of the evaluation images, in pixels; 0 = DATA.IMG_SIZE. Testing larger than training is the "FixRes"
# effect (RSB A3 trains at 160 px and tests at 224); ViT-style models then resample their position embeddings
_C.EVAL.IMG_SIZE = 0
# Center crop fraction at evaluation (image-folder data; in-memory data is resized whole); 0 = AUG.CROP_PCT;
# auto = the pretrained weights' crop_pct with MODEL.PRETRAINED, else 0. RSB A3 tests with 0.95
_C.EVAL.CROP_PCT = "auto"

# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------
_C.CHECKPOINT = CN()
# Save every this many optimizer steps; 0 = only at epoch ends
_C.CHECKPOINT.PERIOD = 0
# Number of step checkpoints kept (last.pth and best.pth are kept as well)
_C.CHECKPOINT.KEEP = 3
# Write checkpoints off the training step: the step waits only for a copy of the state in host memory (so RAM holds
# one more copy of the weights and optimizer state while it is written), and one background thread writes it
# (temporary file, fsync, rename, read-back, last.pth/best.pth, pruning), one write at a time. A stop (preemption,
# TRAIN.TIME_LIMIT, a pause) and the run's end wait for the write before run.json says so. False: the step itself
# writes each checkpoint, as before
_C.CHECKPOINT.ASYNC = True
# The metric that decides best.pth and results.json's best/* (and early stopping): any scalar the run logs at
# evaluation: val/top1 | val/top5 | val/loss | val_ema/top1 | val_ema/top5 (val_ema/* with TRAIN.EMA)
_C.CHECKPOINT.BEST_METRIC = "val/top1"
# Whether BEST_METRIC is better higher or lower: max | min | auto (min for a loss, max otherwise, as timm's train.py)
_C.CHECKPOINT.BEST_MODE = "auto"
# auto (continue from OUTPUT_DIR when it has a checkpoint) | none (start fresh) | <path to a checkpoint>
# ("~" expanded; relative to the current folder)
_C.CHECKPOINT.RESUME = "auto"

# ---------------------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------------------
_C.LOG = CN()
# Log training scalars every this many optimizer steps
_C.LOG.PERIOD = 20
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


def _add_declared(key: keys.Key, after: str) -> None:
    """Put a declared key into the defaults: after the key `after`, at its section's start when `after` is the
    section itself, at its end for ''; a key that follows one not yet declared waits for it."""
    if after and after != key.name.rsplit(".", 1)[0] and _lookup(after) is None:
        _WAITING.setdefault(after, []).append(key)
        return
    *sections, leaf = key.name.split(".")
    node = _C
    for part in sections:
        if part not in node:
            node[part] = CN()
        node = node[part]
    if leaf in node:
        raise ValueError(f"config key {key.name} is in runner/config/defaults.py already: declare it in one place")
    items = list(node.items())
    at = len(items) if not after else 0 if after == ".".join(sections) else \
        next(i + 1 for i, (name, _) in enumerate(items) if name == after.rsplit(".", 1)[-1])
    items.insert(at, (leaf, CN(key.default) if isinstance(key.default, dict) else key.default))
    node.clear()
    node.update(items)
    for waiting in _WAITING.pop(key.name, []):
        _add_declared(waiting, key.name)


def _lookup(name: str) -> object:
    """The default of a dotted key, or None."""
    node = _C
    for part in name.split("."):
        if not isinstance(node, CN) or part not in node:
            return None
        node = node[part]
    return node


def refuse_unplaced() -> None:
    """Refuse a declared key still waiting for the key its `after=` names once its modules are imported: no module
    declared that key, so the knob would silently be missing from the defaults."""
    for after, waiting in _WAITING.items():
        key = waiting[0]
        raise UserError(f"config key {key.name} ({keys.OWNERS[key.name]}) is declared after={after}, a key that "
                        "neither defaults.py nor any imported module declares: name a key of its section, or "
                        "leave after= out (the section's end)")


_WAITING: dict[str, list[keys.Key]] = {}  # a key not yet declared -> the keys declared to follow it
keys.on_declare(_add_declared)
keys.load_built_in()
refuse_unplaced()
