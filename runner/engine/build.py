"""The training run: setup, the step, the loop, evaluation, checkpoints and resume.

Every choice (device, precision, single process or DDP, accumulation, clipping) is made once in
`Trainer.__init__`; the step only computes. The step never reads a value back to the host: losses are
summed on the device and read every LOG.PERIOD steps.
"""
from __future__ import annotations

import logging
import math
import os
import random
import signal
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from runner import checkpoint as ckpt
from runner import distributed, runstate
from runner.data import build_data
from runner.errors import NonFiniteLoss, Preempted, UserError, one_line
from runner.fsutil import atomic_write, remove_stale_temps
from runner.logging import MetricWriter, log_to_file, run_hparams, setup_logging
from runner.model import build_model, prepare_model
from runner.optim import build_optimizer, build_scheduler

log = logging.getLogger("runner")

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def set_seeds(seed: int) -> None:
    """Seed python, numpy and torch (every device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, autocast=nullcontext) -> dict[str, float]:
    """Top-1/top-5 (percent) and mean loss over the whole split, summed across ranks (no padding)."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=device)
    loader.set_epoch(0, 0)
    for x, y in loader:
        with autocast():
            out = model(x)
        out = out.float()
        k = min(5, out.shape[1])
        hit = out.topk(k, dim=1).indices.eq(y[:, None])
        totals[0] += hit[:, 0].sum()
        totals[1] += hit.any(1).sum()
        totals[2] += len(y)
        totals[3] += F.cross_entropy(out, y, reduction="sum")
    distributed.all_reduce_(totals)
    c1, c5, n, loss = totals.tolist()
    model.train(was_training)
    n = max(n, 1)
    return {"top1": 100.0 * c1 / n, "top5": 100.0 * c5 / n, "loss": loss / n, "count": int(n)}


class _ProfileOnly(Exception):
    """PROFILE.ONLY: the profiled window is recorded; end the run cleanly (exit 0)."""


class StopFlag:
    """Preemption signals, agreed on by every rank at the same step without touching the GPU."""

    def __init__(self, group):
        """`group`: the run's CPU control group (DIST.TIMEOUT_S applies), or None in a single process."""
        self.local = False
        self.group = group
        self.buf = torch.zeros(1)
        self.work = None
        self.old = {}
        self.stopping = False

    def install(self) -> None:
        """SIGTERM, SIGUSR1 and a first Ctrl-C ask the run to finish its step, save and exit."""
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            self.old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.local = True
        again = ""
        if signum == signal.SIGINT:  # a second Ctrl-C stops at once (KeyboardInterrupt), without saving
            signal.signal(signal.SIGINT, signal.default_int_handler)
            again = " (Ctrl-C again to stop at once, without saving)"
        log.warning("received %s: finishing the current step, then saving and exiting%s",
                    signal.Signals(signum).name, again)

    def poll(self) -> bool:
        """True once stopping is agreed; distributed runs reduce the flag one step late, asynchronously."""
        if self.group is None:
            self.stopping = self.local
            return self.stopping
        if self.work is not None:
            self.work.wait()
            self.stopping = bool(self.buf.item())
        self.buf.fill_(float(self.local))
        self.work = torch.distributed.all_reduce(self.buf, op=torch.distributed.ReduceOp.MAX,
                                                 group=self.group, async_op=True)
        return self.stopping

    def close(self) -> None:
        """Finish the pending reduce; restore the previous handlers, or ignore the signals when stopping on one."""
        if self.work is not None:
            self.work.wait()
            self.work = None
        for sig, old in self.old.items():
            # saved and exiting: torchrun SIGTERMs the ranks still exiting once one has gone; let them exit 75
            # (SIG_IGN, unlike a Python handler, also holds while the interpreter shuts down)
            signal.signal(sig, signal.SIG_IGN if self.stopping else old)
        self.old.clear()


class Trainer:
    """Owns the run's runtime state; the config stays frozen and is only read."""

    def __init__(self, cfg, write_files: bool = True, hparam_keys: list[str] | None = None):
        """Set up everything; with write_files False (benchmarks) nothing is locked, resumed or written.

        `hparam_keys`: the keys set on the command line (a sweep's swept keys), for TensorBoard's HParams tab.
        """
        self.cfg = cfg
        self.hparam_keys = list(hparam_keys or [])
        self.t_start = time.time()
        self.dist = distributed.setup(cfg)
        self.out = Path(cfg.OUTPUT_DIR)
        self.main = self.dist.is_main
        self.control = distributed.control_group()  # one CPU group for verdicts and stop flags, made once
        self.lock = runstate.RunLock(str(self.out))
        self.claimed = False  # True once rank 0 holds the lock and has marked the folder as this run's
        self.found: tuple[str, dict] | None = None  # the checkpoint rank 0 will resume from
        setup_logging(None, self.dist.rank)  # the console only, until the folder is known to be ours
        self.done = self._claim_output_dir() if write_files else None  # a finished run's (results, why)
        if self.done is not None:
            return
        setup_logging(str(self.out) if self.main and write_files else None, self.dist.rank)
        try:
            configure_backends(cfg, self.dist.device)
            set_seeds(cfg.SEED)
            self._build()
            if write_files:
                self._resume()
                if self.done is None:
                    self._write_run_files()
        except BaseException as e:
            self._record_failure(e, "during setup")
            raise

    def _claim_output_dir(self) -> tuple[dict, str] | None:
        """Rank 0 checks OUTPUT_DIR, locks it and marks it as this run's; every rank learns the verdict."""
        verdict: tuple = ("go", None)
        failure = None
        if self.main:
            try:
                runstate.check_output_dir(self.cfg)  # again: the folder may have changed since tools/train.py
                self.lock.acquire()
                done = runstate.finished_run(self.cfg)  # under the lock: no other job is writing results now
                remove_stale_temps(self.out)
                if done is None:
                    self.found = self._find_checkpoint()  # a run-changing config is refused before any write
                    runstate.write_status(str(self.out), runstate.RUNNING)
                    self.claimed = True
                verdict = ("go", None) if done is None else ("done", done)
            except UserError as e:
                verdict = ("error", str(e))
            except Exception as e:  # the other ranks must not wait for a verdict that never comes
                verdict, failure = ("failed", f"{type(e).__name__}: {e}"), e
        kind, payload = distributed.broadcast_object(verdict, self.control)
        if failure is not None:
            raise failure
        if kind == "error":
            raise UserError(payload)
        if kind == "failed":
            raise RuntimeError(f"rank 0 could not take OUTPUT_DIR {self.out}: {payload}")
        return payload

    def _record_failure(self, e: BaseException, when: str) -> None:
        """run.json and log.txt say why the run stopped (rank 0, once the folder is ours)."""
        if isinstance(e, KeyboardInterrupt):
            self._status(runstate.INTERRUPTED)
            return
        self._status(runstate.FAILED, error=f"{type(e).__name__}: {one_line(str(e))}"[:500])
        if isinstance(e, UserError):
            log_to_file(f"error {when}: {one_line(str(e))}")
        else:
            log.exception("rank %d failed %s", self.dist.rank, when)

    # ---- setup -------------------------------------------------------------------------------------------
    def _build(self) -> None:
        """Data, model, optimizer, schedule, precision: every component from the config, once."""
        cfg, dev = self.cfg, self.dist.device
        self.data = build_data(cfg, self.dist)
        self.batches_per_epoch = len(self.data.train)
        self.accum = cfg.TRAIN.ACCUM_STEPS
        self.steps_per_epoch = self.batches_per_epoch // self.accum
        if self.steps_per_epoch < 1:
            raise UserError(
                f"the training split gives {self.batches_per_epoch} batches per process, fewer than "
                f"TRAIN.ACCUM_STEPS {self.accum}; lower DATA.BATCH_SIZE or TRAIN.ACCUM_STEPS"
            )
        self.total_steps = cfg.TRAIN.EPOCHS * self.steps_per_epoch
        if cfg.TRAIN.MAX_STEPS > 0:
            self.total_steps = min(self.total_steps, cfg.TRAIN.MAX_STEPS)
        bare = build_model(cfg)
        self.model, self.bare = prepare_model(bare, cfg, self.dist)
        self.ema = None
        if cfg.TRAIN.EMA:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.bare, decay=cfg.TRAIN.EMA_DECAY, device=dev)
        self.optimizer = build_optimizer(cfg, self.bare, dev, self.dist.world_size)
        self.scheduler = build_scheduler(cfg, self.optimizer, self.steps_per_epoch)
        self.autocast = autocast_for(cfg, dev)
        fp16_scaling = cfg.AMP.ENABLED and cfg.AMP.DTYPE == "float16" and dev.type == "cuda"
        self.scaler = torch.amp.GradScaler(dev.type, enabled=fp16_scaling)
        self.mixup, self.criterion = self._build_loss()
        self.clip = self._build_clip()
        # DDP must not all-reduce gradients on accumulation micro-steps
        self.no_sync = self.model.no_sync if self.dist.distributed and self.accum > 1 else nullcontext
        self.stop = StopFlag(self.control)
        self.epoch, self.batch_in_epoch, self.step = 0, 0, 0
        self.best = {"val/top1": -1.0, "val/top5": -1.0, "epoch": -1}
        self.last_val: dict[str, float] = {}
        self.wall_before = 0.0
        self.throughput = [0, 0.0]  # images and seconds over every logged window

    def _build_loss(self):
        """Mixup/CutMix with the soft-target loss when enabled; cross-entropy with label smoothing otherwise."""
        cfg = self.cfg
        if cfg.AUG.MIXUP > 0 or cfg.AUG.CUTMIX > 0:
            from timm.data import Mixup
            from timm.loss import SoftTargetCrossEntropy

            mixup = Mixup(mixup_alpha=cfg.AUG.MIXUP, cutmix_alpha=cfg.AUG.CUTMIX, prob=cfg.AUG.MIXUP_PROB,
                          switch_prob=cfg.AUG.MIXUP_SWITCH_PROB, label_smoothing=cfg.TRAIN.LABEL_SMOOTHING,
                          num_classes=cfg.MODEL.NUM_CLASSES)
            return mixup, SoftTargetCrossEntropy()
        return None, nn.CrossEntropyLoss(label_smoothing=cfg.TRAIN.LABEL_SMOOTHING)

    def _build_clip(self):
        """Gradient clipping through timm's dispatcher, or None."""
        if self.cfg.TRAIN.CLIP_GRAD <= 0:
            return None
        from timm.utils import dispatch_clip_grad

        params = [p for p in self.bare.parameters() if p.requires_grad]
        return partial(dispatch_clip_grad, params, self.cfg.TRAIN.CLIP_GRAD, mode=self.cfg.TRAIN.CLIP_MODE)

    # ---- resume ------------------------------------------------------------------------------------------
    def _find_checkpoint(self) -> tuple[str, dict] | None:
        """The checkpoint to resume (auto: the newest valid one; or the named one), refused if the run differs."""
        how = self.cfg.CHECKPOINT.RESUME
        if how == "none":
            return None
        found = ckpt.find_resumable(self.out) if how == "auto" else (how, ckpt.load_explicit(how))
        if found is not None:
            runstate.refuse_changed(self.cfg, found[1]["config"], f"stored in checkpoint {found[0]}")
        return found

    def _resume(self) -> None:
        """Restore the checkpoint rank 0 found while claiming the folder (the other ranks load it themselves)."""
        found = self.found if self.main else self._find_checkpoint()
        self.found = None  # the state is loaded below; do not keep a second copy of it for the whole run
        if found is None:
            return
        path, state = found
        self._load_state(state)
        results = runstate.read_json(self.out / "results.json")
        if self.step >= self.total_steps and results and results.get("status") == runstate.DONE:
            self.done = (results, f"it ran {self.step} steps, as many as this config asks for")
            self._status(runstate.DONE)  # claiming marked it running; results.json and config.yaml stay as they were
            return
        log.info("resumed from %s: epoch %d, batch %d of the epoch, step %d", path, self.epoch + 1,
                 self.batch_in_epoch, self.step)

    def _state(self) -> dict:
        """Everything needed to continue this run exactly."""
        from runner.config import dump_config

        return {
            "model": self.bare.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "step": self.step,
            "best": dict(self.best), "last_val": dict(self.last_val),
            "wall_s": self.wall_before + time.time() - self.t_start,
            "throughput": list(self.throughput),
            "rng": ckpt.rng_state(),
            "config": dump_config(self.cfg),
            "class_names": list(self.data.class_names),
        }

    def _load_state(self, state: dict) -> None:
        """Put a checkpoint's state back into every component."""
        self.bare.load_state_dict(state["model"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        # no scheduler.load_state_dict: the LR is a function of the config and the step (set below), and timm's
        # saved state would bring back the old length, freezing a run extended with TRAIN.EPOCHS at its final LR
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.batch_in_epoch, self.step = state["epoch"], state["batch_in_epoch"], state["step"]
        self.best, self.last_val = state["best"], state.get("last_val", {})
        self.wall_before = state.get("wall_s", 0.0)
        self.throughput = list(state.get("throughput", [0, 0.0]))
        ckpt.set_rng_state(state["rng"])
        self.scheduler.step_update(self.step)

    def _write_run_files(self) -> None:
        """config.yaml, env.txt, class_map.json and the status file (rank 0), after resume checks passed."""
        if not self.main:
            return
        from runner.config import dump_config
        from runner.envinfo import collect_env, format_env

        atomic_write(self.out / "config.yaml", dump_config(self.cfg))
        dev = self.dist.device
        # asking every GPU for free memory would create a CUDA context on each of them for the whole run
        env_text = format_env(collect_env(free_mem_devices=[dev.index or 0] if dev.type == "cuda" else []))
        atomic_write(self.out / "env.txt", env_text)
        for line in env_text.splitlines()[:4]:
            log.info("env: %s", line)
        if self.cfg.DATA.NAME == "folder":
            from runner.folder import write_class_map

            write_class_map(self.out, self.data.class_names)
        runstate.write_status(str(self.out), runstate.RUNNING)

    # ---- the loop ----------------------------------------------------------------------------------------
    def _micro_step(self, x: torch.Tensor, y: torch.Tensor, sync: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached loss share."""
        if self.mixup is not None:
            x, y = self.mixup(x, y)
        with nullcontext() if sync else self.no_sync():
            with self.autocast():
                loss = self.criterion(self.model(x), y) / self.accum
            self.scaler.scale(loss).backward()
        return loss.detach()

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

    def train(self) -> dict:
        """Run to the end (or to a stop signal) and return the results."""
        cfg, dev = self.cfg, self.dist.device
        if self.step >= self.total_steps:
            return self._finish()  # the final checkpoint is written after the final evaluation
        self.stop.install()
        log.info("training %s on %s (%d process%s): %d epochs x %d steps, batch %d per process",
                 cfg.MODEL.NAME, dev, self.dist.world_size, "es" if self.dist.world_size > 1 else "",
                 cfg.TRAIN.EPOCHS, self.steps_per_epoch, cfg.DATA.BATCH_SIZE)
        self.writer = MetricWriter(str(self.out), cfg, self.step, self.main, self.total_steps)
        self.prepare_loop()
        try:
            while self.epoch < cfg.TRAIN.EPOCHS and self.step < self.total_steps:
                self._train_epoch()
            return self._finish()
        except _ProfileOnly:
            self._status(runstate.PROFILED)
            log.info("PROFILE.ONLY: stopped after the profiled steps (checkpoint saved; rerun without it to go on)")
            return {"status": runstate.PROFILED, "step": self.step}
        except NonFiniteLoss:
            self._status(runstate.NONFINITE)
            raise
        except Preempted:
            self._status(runstate.PREEMPTED)
            raise
        except KeyboardInterrupt:
            self._status(runstate.INTERRUPTED)
            log.warning("stopped at once after step %d; rerun the same command to continue from the last "
                        "checkpoint", self.step)
            raise
        except BaseException as e:
            self._record_failure(e, f"at step {self.step}")
            raise
        finally:
            self.stop.close()
            self.profiler.close()
            self.writer.close()

    def prepare_loop(self) -> None:
        """The loop's device-side accumulators and the profiler (also used by tools/benchmark.py)."""
        dev = self.dist.device
        self.loss_sum = torch.zeros((), device=dev)
        self.dev_step = torch.full((), self.step, dtype=torch.long, device=dev)
        self.first_bad = torch.full((), -1, dtype=torch.long, device=dev)
        self.start_step = self.step
        self.step_loss = None
        self._window_reset()
        self.model.train()
        from runner.profiler import build_profiler

        self.profiler = build_profiler(self.cfg, self.out, dev, rank=self.dist.rank,
                                       log=log.info if self.main else None)

    def _train_epoch(self) -> None:
        """One epoch from the resume position; evaluates and saves at its end."""
        loader = self.data.train
        loader.set_epoch(self.epoch, self.batch_in_epoch)
        self._window_reset()
        it = iter(loader)
        end_batch = self.steps_per_epoch * self.accum
        while self.batch_in_epoch < end_batch:
            t0 = time.perf_counter()
            x, y = next(it)
            self.win_wait += time.perf_counter() - t0
            if self.train_batch(x, y) and self._after_step():
                break
        else:
            self._end_epoch()

    def train_batch(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """One micro-batch, and the optimizer step when it completes an accumulation; True if it stepped."""
        last = (self.batch_in_epoch + 1) % self.accum == 0
        loss = self._micro_step(x, y, sync=last)
        self.step_loss = loss if self.step_loss is None else self.step_loss + loss
        self.batch_in_epoch += 1
        self.win_images += x.shape[0]
        if not last:
            return False
        self._optimizer_step()
        self._track_loss(self.step_loss)
        self.step_loss = None
        self.profiler.step()
        return True

    def _track_loss(self, step_loss: torch.Tensor) -> None:
        """Accumulate the loss on the device and remember the first non-finite step, without a sync."""
        self.dev_step += 1
        bad = ~torch.isfinite(step_loss)
        self.first_bad = torch.where(bad & (self.first_bad < 0), self.dev_step, self.first_bad)
        self.loss_sum += torch.nan_to_num(step_loss, nan=0.0, posinf=0.0, neginf=0.0)
        self.win_steps += 1

    def _after_step(self) -> bool:
        """Periodic work after an optimizer step; True when the epoch loop must stop early."""
        cfg = self.cfg
        mid_epoch = self.batch_in_epoch < self.steps_per_epoch * self.accum
        if self.step % cfg.LOG.PERIOD == 0:
            self._log_train()
        if cfg.CHECKPOINT.PERIOD and self.step % cfg.CHECKPOINT.PERIOD == 0 and self.step < self.total_steps \
                and mid_epoch:
            self._save()
        if self.profiler.done and cfg.PROFILE.ONLY:
            self._save()
            raise _ProfileOnly
        if self.stop.poll():
            self._save()
            distributed.barrier()  # no rank exits before rank 0's checkpoint is on disk
            raise Preempted(f"preempted at step {self.step}: checkpoint saved in {self.out / 'checkpoints'}; "
                            "rerun the same command to continue")
        if self.step >= self.total_steps and mid_epoch:
            self._end_epoch(partial=True)
            return True
        return False

    def _check_finite(self) -> None:
        """Stop (exit 3) if any rank saw a non-finite loss since the start; one host read."""
        bad = torch.where(self.first_bad >= 0, 2**40 - self.first_bad, torch.zeros_like(self.first_bad))
        distributed.all_reduce_(bad, "max")
        b = int(bad.item())
        if b:
            raise NonFiniteLoss(f"the loss became non-finite at step {2**40 - b} (epoch {self.epoch + 1}); "
                                "nothing from that step on was saved; lower TRAIN.LR or enable TRAIN.CLIP_GRAD")

    def _window_reset(self) -> None:
        """Start a new throughput window."""
        self.win_t0 = time.perf_counter()
        self.win_images, self.win_steps, self.win_wait = 0, 0, 0.0
        self.loss_sum.zero_()

    def _log_train(self) -> None:
        """Read the window's loss (the one host sync), reduce across ranks, write scalars."""
        self._check_finite()
        loss = self.loss_sum.clone()
        distributed.all_reduce_(loss)
        mean_loss = loss.item() / max(self.win_steps, 1) / self.dist.world_size
        dt = time.perf_counter() - self.win_t0
        img_s = self.win_images * self.dist.world_size / max(dt, 1e-9)
        self.throughput[0] += self.win_images * self.dist.world_size
        self.throughput[1] += dt
        scalars = {"train/loss": mean_loss, "train/lr": self.optimizer.param_groups[0]["lr"],
                   "train/img_per_s": img_s, "train/data_wait_frac": self.win_wait / max(dt, 1e-9)}
        if self.dist.device.type == "cuda":
            scalars["train/mem_alloc_mb"] = torch.cuda.max_memory_allocated() / 2**20
            scalars["train/mem_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
        self.writer.write(self.step, self.epoch + 1, scalars)
        eta = self.writer.eta(self.step, self.start_step, time.time() - self.t_start)
        self.writer.console(
            f"epoch {self.epoch + 1}/{self.cfg.TRAIN.EPOCHS} step {self.step}/{self.total_steps} "
            f"loss {mean_loss:.4f} lr {scalars['train/lr']:.3g} img/s {img_s:.0f} eta {eta}",
            step=self.step, postfix=f"loss {mean_loss:.4f} lr {scalars['train/lr']:.3g} img/s {img_s:.0f}")
        self._window_reset()

    def _end_epoch(self, partial: bool = False) -> None:
        """Evaluate when due, advance the position, save."""
        cfg = self.cfg
        final = self.step >= self.total_steps
        if self.win_steps and final:
            self._log_train()
        if not partial:
            self.epoch += 1
            self.batch_in_epoch = 0
        if final or (not partial and self.epoch % cfg.EVAL.PERIOD == 0):
            self._validate()
        self._save()
        self._window_reset()
        if self.stop.poll():
            distributed.barrier()
            raise Preempted(f"preempted after epoch {self.epoch}: checkpoint saved; rerun the same command")

    def _validate(self) -> None:
        """Evaluate the model (and its EMA) on the whole val split and log the result."""
        self._sync_buffers()
        res = evaluate(self.bare, self.data.val, self.dist.device, self.autocast)
        scalars = {"val/top1": res["top1"], "val/top5": res["top5"], "val/loss": res["loss"],
                   "val/count": res["count"]}
        if self.ema is not None:
            ema = evaluate(self.ema.module, self.data.val, self.dist.device, self.autocast)
            scalars.update({"val_ema/top1": ema["top1"], "val_ema/top5": ema["top5"]})
        self.last_val = scalars
        self.is_best = res["top1"] > self.best["val/top1"]
        if self.is_best:
            self.best = {"val/top1": res["top1"], "val/top5": res["top5"], "epoch": self.epoch}
        self.writer.write(self.step, self.epoch, scalars)
        log.info("eval epoch %d step %d: val/top1 %.2f val/top5 %.2f (%d images)%s", self.epoch, self.step,
                 res["top1"], res["top5"], res["count"], " best" if self.is_best else "")

    def _sync_buffers(self) -> None:
        """Give every rank rank 0's buffers (BatchNorm statistics, the EMA's too) before evaluating."""
        # the other ranks' running statistics follow their own batches and are never saved: without this the
        # metrics would not be those of rank 0's checkpoint, and would change when a run resumes from it
        if not self.dist.distributed:
            return
        for module in [self.bare] + ([self.ema.module] if self.ema is not None else []):
            for buf in module.buffers():
                torch.distributed.broadcast(buf, src=0)

    def _save(self) -> None:
        """Atomic checkpoint on rank 0, after making sure nothing non-finite gets in."""
        self._check_finite()
        best = getattr(self, "is_best", False)
        self.is_best = False
        if self.main:
            self.writer.flush()  # a kill after the save must not lose scalars of the steps it covers
            ckpt.save_checkpoint(self._state(), self.out, self.step, self.cfg.CHECKPOINT.KEEP, best)

    def _status(self, status: str, **extra) -> None:
        """Update run.json on rank 0, once the folder is this run's."""
        if self.main and self.claimed:
            runstate.write_status(str(self.out), status, step=getattr(self, "step", 0), **extra)

    def _finish(self) -> dict:
        """results.json, TensorBoard hparams, status done."""
        imgs, secs = self.throughput
        results = {
            "status": runstate.DONE,
            "val/top1": self.last_val.get("val/top1"), "val/top5": self.last_val.get("val/top5"),
            "best/val/top1": self.best["val/top1"], "best/val/top5": self.best["val/top5"],
            "best/epoch": self.best["epoch"],
            "epoch": self.epoch, "step": self.step, "epochs": self.cfg.TRAIN.EPOCHS,
            "max_steps": self.cfg.TRAIN.MAX_STEPS,
            "wall_s": round(self.wall_before + time.time() - self.t_start, 3),
            "train/img_per_s": imgs / secs if secs else None,
            "world_size": self.dist.world_size,
        }
        for k in ("val_ema/top1", "val_ema/top5"):
            if k in self.last_val:
                results[k] = self.last_val[k]
        if self.dist.device.type == "cuda":
            results["mem_alloc_mb"] = torch.cuda.max_memory_allocated() / 2**20
            results["mem_reserved_mb"] = torch.cuda.max_memory_reserved() / 2**20
        if self.main:
            metrics = {k: v for k, v in results.items() if k.startswith(("val", "best/val")) and v is not None}
            if getattr(self, "writer", None) is not None:
                self.writer.hparams(run_hparams(self.cfg, self.hparam_keys), metrics)
            runstate.write_json_atomic(self.out / "results.json", results)
            self._status(runstate.DONE)
        log.info("done: val/top1 %s val/top5 %s (best %.2f at epoch %d), %d steps, %.1fs",
                 _fmt(results["val/top1"]), _fmt(results["val/top5"]), self.best["val/top1"], self.best["epoch"],
                 self.step, results["wall_s"])
        return results

    def close(self) -> None:
        """Release the lock and the process group."""
        self.lock.release()
        distributed.teardown()


def _fmt(v) -> str:
    """A metric for the log: 2 decimals or '-'."""
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def train(cfg, hparam_keys: list[str] | None = None) -> dict:
    """Train and evaluate as `cfg` says; the library's entry point (hparam_keys: see Trainer)."""
    trainer = Trainer(cfg, hparam_keys=hparam_keys)
    try:
        if trainer.done is not None:  # finished already: say so, write nothing
            if trainer.main:
                print(runstate.done_line(cfg, *trainer.done), flush=True)
            return trainer.done[0]
        return trainer.train()
    finally:
        trainer.close()
