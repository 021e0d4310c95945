"""build_trainer(cfg): the one place that reads the config to wire a run.

    dist = distributed.setup(cfg)         torchrun environment -> process group and device
    claim OUTPUT_DIR                      rank 0 checks and locks the folder and marks it as this run's
    data = build_data(cfg, dist)          loaders that resume at (epoch, position)
    stepper = build_step(...)             model, EMA, optimizer, schedule, precision, loss, clipping
    trainer = Trainer(stepper, ...)       the loop, with the run's fixed list of hooks (run_hooks)
    resume                                the newest valid checkpoint, or the one named
    write config.yaml, env.txt, ...       once every check has passed

`train(cfg)` is the library's entry point. Benchmarks and tests pass `hooks=[]` (or their own hooks): then
nothing is claimed, resumed or written.
"""
from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from runner import distributed, fsdp
from runner.compat import import_torchvision
from runner.config.derived import parse_time_limit
from runner.data import build_data
from runner.data.loaders import epoch_seed
from runner.distill import distillation_loss
from runner.distributed import Dist
from runner.engine.best import Best, EarlyStopping
from runner.engine.claim import AlreadyDone, claim_output_dir, resume, write_run_files
from runner.engine.evaluation import Evaluator
from runner.engine.hooks import Checkpointer, Hook, MetricLogger, Profiler
from runner.engine.loop import Trainer
from runner.engine.signals import DutiesStart, Pause, Preemption, StopFlag, TimeLimit, process_started
from runner.engine.splits import SplitResults
from runner.engine.status import RunStatus
from runner.engine.step import CanonicalNormStats, TrainStep
from runner.engine.watchdog import Watchdog, job_board, relay_failure
from runner.errors import UserError
from runner.model import build_model, compiler, prepare_model
from runner.optim import build_optimizer, build_scheduler
from runner.process import threads
from runner.profiler import build_profiler
from runner.rundir.layout import CONFIG
from runner.rundir.lock import RunLock
from runner.rundir.marker import is_our_run
from runner.rundir.rules import done_line
from runner.sinks import MetricWriter, check_sinks, run_hparams, setup_logging
from runner.weights import hub
from runner.weights.preprocess import resolve as resolve_preprocessing
from runner.weights.preprocess import stored_values

log = logging.getLogger("runner")

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def set_seeds(seed: int) -> None:
    """Seed python, numpy and torch (every device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_micro_step(seed: int, dist: Dist, step: int, micro: int) -> None:
    """Seed every generator for one micro-step from (SEED, step, chunk): the chunk (micro x world + rank) is the
    part of the global batch it trains on in every layout, so dropout and mixup draw alike on 2 processes or on 1
    accumulating 2, ranks draw differently, and a resumed run draws as one left alone."""
    s = epoch_seed(seed, step, 1 + micro * dist.world_size + dist.rank)
    random.seed(s)
    np.random.seed(s % 2**32)
    # the generators themselves: torch.manual_seed visits every device type's hooks (0.11 ms against 2 us here)
    torch.default_generator.manual_seed(s)
    if dist.device.type == "cuda":
        torch.cuda.default_generators[dist.device.index or 0].manual_seed(s)


def configure_backends(cfg, device: torch.device) -> None:
    """cuDNN, TF32 and determinism switches, set once for the process."""
    deterministic = cfg.CUDNN.DETERMINISTIC
    torch.backends.cudnn.benchmark = cfg.CUDNN.BENCHMARK and not deterministic
    torch.backends.cudnn.deterministic = deterministic
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
        torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.CUDNN.TF32
        torch.backends.cudnn.allow_tf32 = cfg.CUDNN.TF32


def autocast_for(cfg, device: torch.device):
    """A zero-argument context factory: autocast when AMP is on, nullcontext otherwise."""
    if not cfg.AMP.ENABLED:
        return nullcontext
    return partial(torch.autocast, device.type, dtype=_DTYPES[cfg.AMP.DTYPE])


# ---- the step ------------------------------------------------------------------------------------------------
def build_step(cfg, dist: Dist, steps_per_epoch: int) -> TrainStep:
    """Model, EMA, optimizer, schedule, precision, loss and clipping: every choice from the config, once."""
    dev = dist.device
    model, bare = prepare_model(build_model(cfg), cfg, dist)
    ema = None
    if cfg.TRAIN.EMA:
        from timm.utils import ModelEmaV3

        make = fsdp.ShardedEma if cfg.DIST.STRATEGY == "fsdp" else ModelEmaV3
        ema = make(bare, decay=cfg.TRAIN.EMA_DECAY, device=dev)
    fp16_scaling = cfg.AMP.ENABLED and cfg.AMP.DTYPE == "float16" and dev.type == "cuda"
    optimizer = build_optimizer(cfg, bare, dev, dist.world_size, grad_scaler=fp16_scaling)
    scheduler = build_scheduler(cfg, optimizer, steps_per_epoch)
    autocast = autocast_for(cfg, dev)
    scaler = torch.amp.GradScaler(dev.type, init_scale=cfg.AMP.INIT_SCALE, enabled=fp16_scaling)
    mixup, criterion = build_loss(cfg)
    accum = cfg.TRAIN.ACCUM_STEPS
    sharded = cfg.DIST.STRATEGY == "fsdp"
    # DDP (or FSDP) must not reduce gradients on accumulation micro-steps
    no_sync = nullcontext
    if dist.distributed and accum > 1:
        no_sync = partial(fsdp.no_sync, model) if sharded else model.no_sync
    shards = fsdp.Shards(bare, optimizer, ema.module if ema is not None else None) if sharded else None
    return TrainStep(model, optimizer, bare=bare, scheduler=scheduler, accum=accum, criterion=criterion,
                     mixup=mixup, autocast=autocast, scaler=scaler, clip=build_clip(cfg, bare), no_sync=no_sync,
                     ema=ema, loss_fn=distillation_loss(cfg, model, criterion, dev),
                     reseed=partial(seed_micro_step, cfg.SEED, dist),
                     norm_stats=CanonicalNormStats(bare, dist.rank) if dist.world_size * accum > 1 else None,
                     shards=shards)


def build_loss(cfg):
    """(Mixup/CutMix or None, the training loss) from AUG.MIXUP/CUTMIX and TRAIN.LOSS, as timm's train.py pairs them.

    With mixup the mixed soft targets carry the label smoothing, so the loss adds none; without it cross-entropy
    or BCE smooths the hard labels itself. One difference: timm's train.py falls back to cross-entropy for
    --bce-loss without mixup and smoothing; TRAIN.LOSS bce always means BCE.
    """
    mixup = None
    if cfg.AUG.MIXUP > 0 or cfg.AUG.CUTMIX > 0:
        from timm.data import Mixup

        mixup = Mixup(mixup_alpha=cfg.AUG.MIXUP, cutmix_alpha=cfg.AUG.CUTMIX, prob=cfg.AUG.MIXUP_PROB,
                      switch_prob=cfg.AUG.MIXUP_SWITCH_PROB, label_smoothing=cfg.TRAIN.LABEL_SMOOTHING,
                      num_classes=cfg.MODEL.NUM_CLASSES)
    if cfg.TRAIN.LOSS == "bce":
        from timm.loss import BinaryCrossEntropy

        return mixup, BinaryCrossEntropy(smoothing=0.0 if mixup else cfg.TRAIN.LABEL_SMOOTHING,
                                         target_threshold=cfg.TRAIN.BCE_TARGET_THRESH or None)
    if mixup is not None:
        from timm.loss import SoftTargetCrossEntropy

        return mixup, SoftTargetCrossEntropy()
    return None, nn.CrossEntropyLoss(label_smoothing=cfg.TRAIN.LABEL_SMOOTHING)


def build_clip(cfg, bare: nn.Module):
    """Gradient clipping through timm's dispatcher, or None."""
    if cfg.TRAIN.CLIP_GRAD <= 0:
        return None
    from timm.utils import dispatch_clip_grad

    params = [p for p in bare.parameters() if p.requires_grad]
    return partial(dispatch_clip_grad, params, cfg.TRAIN.CLIP_GRAD, mode=cfg.TRAIN.CLIP_MODE)


def build_loop(cfg, dist: Dist, t_start: float) -> Trainer:
    """Data, step and loop (no hooks yet); the run's length from the data and TRAIN.*."""
    data = build_data(cfg, dist)
    batches, accum = len(data.train), cfg.TRAIN.ACCUM_STEPS
    steps_per_epoch = batches // accum
    if steps_per_epoch < 1:
        raise UserError(f"the training split gives {batches} batches per process, fewer than TRAIN.ACCUM_STEPS "
                        f"{accum}; lower DATA.BATCH_SIZE or TRAIN.ACCUM_STEPS")
    total_steps = cfg.TRAIN.EPOCHS * steps_per_epoch
    if cfg.TRAIN.MAX_STEPS > 0:
        total_steps = min(total_steps, cfg.TRAIN.MAX_STEPS)
    stepper = build_step(cfg, dist, steps_per_epoch)
    trainer = Trainer(stepper, data.train, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
                      t_start=t_start, samples_per_batch=cfg.DATA.BATCH_SIZE * dist.world_size)
    trainer.data = data
    return trainer


# ---- the run's hooks -----------------------------------------------------------------------------------------
def run_hooks(cfg, trainer: Trainer, dist: Dist, status: RunStatus, control,
              watchdog: Watchdog | None = None, pause_after_epoch: int = 0) -> list[Hook]:
    """The fixed, ordered list of a run's side duties (runner.engine.hooks says why this order). They share the
    trainer's run state (engine.hooks.RunState: results, the watchdog's clock, the pending write), so each place
    in the list has one reason, given beside it."""
    # the config's run-time values first (evaluation's compiler, the time limit), then the hooks
    compile_fn = compiler(cfg) if cfg.MODEL.COMPILE else None
    seconds = parse_time_limit(cfg.TRAIN.TIME_LIMIT)
    profiler = Profiler(partial(build_profiler, cfg, Path(cfg.OUTPUT_DIR), dist.device, rank=dist.rank,
                                log=log.info if dist.is_main else None))
    flag = StopFlag(control)  # one stop request, agreed by every rank: asked by TimeLimit, honoured by Preemption
    stamp = DutiesStart() if seconds else None
    checkpointer = build_checkpointer(cfg, trainer, dist, control)
    hooks = [
        profiler,  # first: it marks the step's end, so the duties below belong to the next step's range
        build_metric_logger(cfg, trainer, dist, status),  # the step's window, written before anything saves it
        build_split_results(cfg, trainer, dist),  # the run's end: before the watchdog stops watching (a stuck
        # test loader is a hang too), before RunStatus writes what it found
        watchdog,  # after the metric window (its loss read waits for the device); paused from here to its resumer
        stamp,  # TRAIN.TIME_LIMIT: the step's duties begin here (TimeLimit times them)
        build_evaluator(cfg, trainer, dist, compile_fn),  # before the checkpointer: the save that follows holds it
        checkpointer,  # after the evaluation it saves (best.pth), before the stops that wait for its write
        watchdog.resumer if watchdog is not None else None,  # the duties are done: the watchdog's clock restarts
        _time_limit(seconds, flag, stamp, dist),  # after the duties it times, before Preemption honours its stop
        Preemption(flag, checkpointer, profiler, cfg.PROFILE.ONLY),  # a stop saves after the step's duties
        status,  # run.json and results.json: after every duty that can end the run, with what they left
        Pause(pause_after_epoch) if pause_after_epoch else None,  # last: the epoch is evaluated, saved, recorded
    ]
    return [hook for hook in hooks if hook is not None]


def build_metric_logger(cfg, trainer: Trainer, dist: Dist, status: RunStatus) -> MetricLogger:
    """LOG.PERIOD's windows into the sinks (opened at the loop's start), and the banner saying what trains."""
    out, world = Path(cfg.OUTPUT_DIR), dist.world_size
    banner = (f"training {cfg.MODEL.NAME} on {dist.device} ({world} process{'es' if world > 1 else ''}): "
              f"{cfg.TRAIN.EPOCHS} epochs x {trainer.steps_per_epoch} steps, batch {cfg.DATA.BATCH_SIZE} per process")
    return MetricLogger(cfg.LOG.PERIOD, dist, banner=banner, open_writer=lambda step: (
        MetricWriter(str(out), cfg, step, dist.is_main, trainer.total_steps, status.hparams, t_start=trainer.t_start)))


def build_checkpointer(cfg, trainer: Trainer, dist: Dist, control) -> Checkpointer:
    """CHECKPOINT.PERIOD, KEEP and ASYNC; each checkpoint also holds the config's text and the class names."""
    from runner.config import dump_config

    stored = {"config": dump_config(cfg), "class_names": list(trainer.data.class_names)}
    return Checkpointer(Path(cfg.OUTPUT_DIR), cfg.CHECKPOINT.PERIOD, cfg.CHECKPOINT.KEEP, dist, stored,
                        group=control, background=cfg.CHECKPOINT.ASYNC)


def build_evaluator(cfg, trainer: Trainer, dist: Dist, compile_fn: Callable | None = None) -> Evaluator:
    """The val split's evaluator: EVAL.PERIOD (epochs) and PERIOD_STEPS, the best by CHECKPOINT.BEST_METRIC and
    BEST_MODE, early stopping by TRAIN.EARLY_STOP_*; `compile_fn`: MODEL.COMPILE's (model.compiler)."""
    metric, mode = cfg.CHECKPOINT.BEST_METRIC, cfg.CHECKPOINT.BEST_MODE
    early = EarlyStopping(metric, mode, cfg.TRAIN.EARLY_STOP_PATIENCE, cfg.TRAIN.EARLY_STOP_MIN_DELTA)
    return Evaluator(trainer.data.val, cfg.EVAL.PERIOD, dist, trainer.stepper.autocast, compile_fn=compile_fn,
                     period_steps=cfg.EVAL.PERIOD_STEPS, best=Best(metric, mode), early=early)


def build_split_results(cfg, trainer: Trainer, dist: Dist) -> SplitResults:
    """best.pth on the val split and DATA.TEST_SPLIT at the run's end (per-class results, confusion matrices)."""
    data = trainer.data
    loaders = {"val": data.val, **({cfg.DATA.TEST_SPLIT: data.test} if data.test is not None else {})}
    return SplitResults(Path(cfg.OUTPUT_DIR), dist, loaders, data.class_names, trainer.stepper.autocast)


def _time_limit(seconds: float | None, flag: StopFlag, stamp: DutiesStart | None, dist: Dist) -> TimeLimit | None:
    """TRAIN.TIME_LIMIT's hook (`seconds`, timing from `stamp`), counted from this process's start; None without
    a limit."""
    if not seconds:
        return None
    return TimeLimit(seconds, flag, stamp, started=process_started(), lag=1 if dist.distributed else 0)


# ---- putting it together ---------------------------------------------------------------------------------------
def build_trainer(cfg, hparam_keys: list[str] | None = None, *, hooks: list[Hook] | None = None,
                  dist: Dist | None = None, pause_after_epoch: int = 0) -> Trainer:
    """The loop for `cfg`, ready to train; raises AlreadyDone when OUTPUT_DIR's finished run covers it.

    `hooks=None`: the run's own hooks; OUTPUT_DIR is claimed, the run resumed and its files written.
    A list (`[]` for benchmarks, or a test's): exactly those hooks, and nothing is claimed, resumed or written.
    `dist`: a process group set up by the caller (kept at close); by default one is set up and torn down.
    `hparam_keys`: the keys set on the command line (a sweep's swept keys), for TensorBoard's HParams tab.
    `pause_after_epoch` E > 0: stop cleanly (status paused) once epoch E is evaluated and saved (engine.signals.Pause).
    """
    t_start = time.time()
    mismatch = import_torchvision()  # timm imports it while the run is built: refused before the claim
    if mismatch is not None:
        raise UserError(mismatch)
    closers = []
    if dist is None:
        dist = distributed.setup(cfg)
        closers.append(distributed.teardown)
    try:
        if hooks is None:
            trainer = _build_run(cfg, dist, hparam_keys, t_start, pause_after_epoch)
        else:
            trainer = _build_with(cfg, dist, hooks, t_start)
    except AlreadyDone:
        while closers:
            closers.pop()()
        raise
    trainer.on_close[:0] = closers
    return trainer


def prepare_weights(cfg, dist: Dist, claims: bool = True) -> tuple:
    """(cfg with "auto" preprocessing resolved, the pretrained weights' record or None), before the claim.

    MODEL.PRETRAINED's file is fetched into the cache by one process per node (a missing one offline is one line,
    nothing made); the "auto" keys take the weights' values, or OUTPUT_DIR's stored ones when a run resumes there.
    """
    pretrained = None
    if cfg.MODEL.PRETRAINED and not cfg.MODEL.CHECKPOINT:
        pretrained = hub.fetch_for_run(cfg.MODEL.NAME, dist.local_rank, distributed.job_store(), cfg.DIST.TIMEOUT_S)
    stored = None
    config_file = Path(cfg.OUTPUT_DIR) / CONFIG
    if claims and config_file.is_file() and is_our_run(Path(cfg.OUTPUT_DIR)):
        stored = stored_values(config_file.read_text())
    return resolve_preprocessing(cfg, stored, warn=claims and dist.is_main), pretrained


def _build_with(cfg, dist: Dist, hooks: list[Hook], t_start: float) -> Trainer:
    """The loop with the given hooks, writing nothing (the console only)."""
    setup_logging(None, dist.rank)
    cfg, _ = prepare_weights(cfg, dist, claims=False)
    configure_backends(cfg, dist.device)
    set_seeds(cfg.SEED)
    trainer = build_loop(cfg, dist, t_start)
    trainer.hooks = list(hooks)
    return trainer


def _build_run(cfg, dist: Dist, hparam_keys: list[str] | None, t_start: float, pause_after_epoch: int = 0) -> Trainer:
    """A run: claim OUTPUT_DIR, build, resume, write the run's files; a setup failure is recorded."""
    out = Path(cfg.OUTPUT_DIR)
    control = distributed.control_group()  # one CPU group for verdicts and stop flags, made once
    lock = RunLock(str(out))
    status = RunStatus(out, dist, t_start, epochs=cfg.TRAIN.EPOCHS, max_steps=cfg.TRAIN.MAX_STEPS,
                       hparams=run_hparams(cfg, list(hparam_keys or [])))
    setup_logging(None, dist.rank)  # the console only, until the folder is known to be ours
    cfg, pretrained = prepare_weights(cfg, dist)  # before the claim: weights missing offline make no folder
    status.pretrained = pretrained
    check_sinks(cfg, dist, control)  # a tracker's store that cannot be opened is refused before the claim
    done, found, attempt = claim_output_dir(cfg, dist, control, lock, status)
    if done is not None:
        lock.release()
        raise AlreadyDone(*done, dist.is_main)
    setup_logging(str(out) if dist.is_main else None, dist.rank)
    log.info("OUTPUT_DIR %s (log.txt, metrics.jsonl, checkpoints/, results.json)", out.resolve())
    log.info("%s", threads.describe())
    if attempt:
        log.info("OUTPUT_DIR %s holds %s of this same config but no checkpoint: starting over (metrics.jsonl "
                 "and TensorBoard restart at step 1; log.txt keeps the earlier lines above this one)", out, attempt)
    watchdog = Watchdog(cfg.DIST.HANG_TIMEOUT_S, out, dist, job_board(dist), status, compiled_eval=cfg.MODEL.COMPILE)
    status.silent_ranks = watchdog.silent_ranks if dist.is_main and dist.distributed else None
    watchdog.start()  # set-up and the first batch are watched too (with a longer allowance)
    trainer = None
    try:
        configure_backends(cfg, dist.device)
        set_seeds(cfg.SEED)
        trainer = build_loop(cfg, dist, t_start)
        trainer.hooks = run_hooks(cfg, trainer, dist, status, control, watchdog, pause_after_epoch)
        resume(cfg, trainer, found, status)
        write_run_files(cfg, dist, trainer.data.class_names, pretrained)
    except AlreadyDone:
        watchdog.stop()
        lock.release()
        raise
    except BaseException as e:
        watchdog.on_exception(trainer, e)  # a collective that timed out in set-up: the hang's one line, exit 76
        status.record_failure(e, "during setup", trainer.step if trainer is not None else 0)
        if not dist.distributed:  # a library caller lives on (under torchrun the rank relays the failure, then exits)
            watchdog.stop()
            lock.release()
        raise
    trainer.on_close += [lock.release, watchdog.stop]
    return trainer


def train(cfg, hparam_keys: list[str] | None = None, pause_after_epoch: int = 0) -> dict:
    """Train and evaluate as `cfg` says; the library's entry point (the options: see build_trainer)."""
    try:
        trainer = build_trainer(cfg, hparam_keys, pause_after_epoch=pause_after_epoch)
    except AlreadyDone as done:  # finished already: say so, write nothing
        if done.main:
            print(done_line(cfg, done.results, done.why), flush=True)
        return done.results
    except BaseException as e:  # another rank's collective waits for this one: tell rank 0, which ends the job
        relay_failure(e)
        raise
    try:
        return trainer.train()
    except BaseException as e:
        relay_failure(e)
        raise
    finally:
        trainer.close()
