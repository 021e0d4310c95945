"""Timing the runner: training steps through the run's own loop and step, inference, memory, FLOPs and MFU.

The timed regions synchronise the device only at their two ends. A training step is one optimizer step
(ACCUM_STEPS micro-batches), its data fetch included: `data_wait_frac` is the time spent in the loader's
`next()` over the whole timed region.
"""
from __future__ import annotations

import time
from typing import Any

import torch

# Dense (no sparsity) peak TFLOP/s by device-name fragment, from NVIDIA's datasheets. Checked in order, so a
# longer name comes before any name it contains ("H100 NVL" before "H100", "A100" before "A10").
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 NVL", {"bf16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("H100 PCIe", {"bf16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H200 NVL", {"bf16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("H100", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM
    ("H200", {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM; also matches GH200 (same GPU peaks)
    ("A100", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("A10", {"bf16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("L40S", {"bf16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("L40", {"bf16": 181.0, "tf32": 90.5, "fp32": 90.5}),
    ("L4", {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("RTX 4090", {"bf16": 165.2, "tf32": 82.6, "fp32": 82.6}),  # GeForce: bf16 with fp32 accumulation
    ("RTX 3090", {"bf16": 71.0, "tf32": 35.6, "fp32": 35.6}),
]


def precision_name(cfg, device: torch.device) -> str:
    """The math the matmuls and convolutions run in: bf16 (or fp16 on the same units), tf32 or fp32."""
    if cfg.AMP.ENABLED:
        return "bf16" if cfg.AMP.DTYPE == "bfloat16" else "fp16"
    return "tf32" if device.type == "cuda" and cfg.CUDNN.TF32 else "fp32"


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The device's dense peak TFLOP/s for that precision (fp16 counts as bf16), or None when unknown."""
    key = "bf16" if precision == "fp16" else precision
    for fragment, peaks in PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            return peaks.get(key)
    return None


def device_name(device: torch.device) -> str:
    """'NVIDIA H100 80GB HBM3' on CUDA; the CPU's model name (or 'cpu') otherwise."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (only at the ends of timed regions)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window (CUDA only: a process's max RSS cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """(MB, what it is): CUDA max_memory_allocated, or on CPU the process's max resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"  # ru_maxrss is in KiB


# torch.compile modes that capture CUDA graphs: a shape's graph is recorded on a later call than its first
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def train_steps(trainer, steps: int) -> tuple[int, float]:
    """`steps` optimizer steps through the run's own loop and step (with the trainer's hooks: none here), epoch
    after epoch; returns (images, seconds spent waiting in the loader's next())."""
    images, wait = trainer.images, trainer.data_wait
    trainer.run_until(trainer.step + steps)
    return trainer.images - images, trainer.data_wait - wait


def time_training(trainer, device: torch.device, steps: int, warmup: int) -> dict[str, float]:
    """Warm up (the first step timed alone: it holds compilation), then time `steps` optimizer steps."""
    t0 = time.perf_counter()
    train_steps(trainer, 1)
    sync(device)
    first = time.perf_counter() - t0
    train_steps(trainer, max(warmup - 1, 0))
    sync(device)
    reset_peak_memory(device)
    t0 = time.perf_counter()
    images, wait = train_steps(trainer, steps)
    sync(device)
    elapsed = time.perf_counter() - t0
    return {"first_step_s": first, "images": images, "seconds": elapsed, "wait_s": wait}


def inference_warmup_rounds(cfg) -> int:
    """Untimed passes over each held batch: one (cudnn.benchmark's choice, a compiled shape), or three where
    torch.compile records CUDA graphs (the first call compiles, a later one records, then they replay)."""
    return 3 if cfg.MODEL.COMPILE and cfg.MODEL.COMPILE_MODE in CUDA_GRAPH_MODES else 1


@torch.no_grad()
def time_inference(model: torch.nn.Module, loader, device: torch.device, autocast, batches: int,
                   warmup: int = 2, rounds: int = 1) -> dict[str, float]:
    """Forward passes in eval mode over (at most two) validation batches fetched beforehand.

    Untimed first: `rounds` passes over each held batch, then more batches up to `warmup` in all."""
    held = []
    loader.set_epoch(0, 0)
    for x, _ in loader:
        held.append(x)
        if len(held) == 2:
            break
    was_training = model.training
    model.eval()

    def run(n: int) -> int:
        images = 0
        for i in range(n):
            x = held[i % len(held)]
            with autocast():
                model(x)
            images += x.shape[0]
        return images

    t0 = time.perf_counter()
    run(rounds * len(held))  # each distinct shape: compiled models specialise (and recompile) per shape and mode
    run(max(warmup - rounds * len(held), 0))
    sync(device)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    images = run(batches)
    sync(device)
    elapsed = time.perf_counter() - t0
    model.train(was_training)
    return {"first_s": first, "images": images, "seconds": elapsed}


def benchmark(cfg, steps: int, warmup: int, infer_batches: int, dist=None) -> dict[str, Any]:
    """Build what tools/train.py builds for `cfg` with no hooks (nothing written), time it, return one record.

    `dist`: a process group the caller set up once for several configs; by default one is set up and torn down.
    """
    from runner import distributed
    from runner.bench.flops import model_stats
    from runner.engine import build_trainer

    own = dist is None
    dist = distributed.setup(cfg) if own else dist
    try:
        trainer = build_trainer(cfg, hooks=[], dist=dist)
        try:
            dev, stepper = dist.device, trainer.stepper
            train = time_training(trainer, dev, steps, warmup)
            mem_mb, mem_kind = peak_memory_mb(dev)
            infer = time_inference(stepper.model, trainer.data.val, dev, stepper.autocast, infer_batches,
                                   rounds=inference_warmup_rounds(cfg))
            stats = model_stats(stepper.bare, cfg.DATA.IMG_SIZE, cfg.MODEL.IN_CHANS, dev)
        finally:
            trainer.close()
    finally:
        if own:
            distributed.teardown()
    return summarize(cfg, dev, dist.world_size, steps, warmup, train, infer, stats, mem_mb, mem_kind)


def mfu(achieved_tflops: float, peak_tflops_per_device: float | None, world: int) -> float | None:
    """Model FLOPs utilisation: the job's achieved TFLOP/s over the peak of all its devices (one per rank)."""
    return achieved_tflops / (peak_tflops_per_device * world) if peak_tflops_per_device else None


def summarize(cfg, dev: torch.device, world: int, steps: int, warmup: int, train: dict, infer: dict,
              stats: dict, mem_mb: float, mem_kind: str) -> dict[str, Any]:
    """The result record (the JSON keys documented in docs/PERFORMANCE.md)."""
    name = device_name(dev)
    precision = precision_name(cfg, dev)
    peak = peak_tflops(name, precision) if dev.type == "cuda" else None
    train_ips = world * train["images"] / max(train["seconds"], 1e-9)
    infer_ips = world * infer["images"] / max(infer["seconds"], 1e-9)
    achieved = train_ips * stats["train_gflops_per_img"] / 1e3  # TFLOP/s of the whole job (every rank)
    return {
        "model": cfg.MODEL.NAME, "img_size": cfg.DATA.IMG_SIZE, "batch_size": cfg.DATA.BATCH_SIZE,
        "accum_steps": cfg.TRAIN.ACCUM_STEPS, "world_size": world, "device": dev.type, "device_name": name,
        "threads": torch.get_num_threads(), "precision": precision, "channels_last": cfg.MODEL.CHANNELS_LAST,
        "compile": cfg.MODEL.COMPILE, "data": cfg.DATA.NAME, "steps": steps, "warmup": warmup,
        "train_img_per_s": train_ips,
        "infer_img_per_s": infer_ips,
        "step_ms": 1e3 * train["seconds"] / max(steps, 1),
        "data_wait_frac": train["wait_s"] / max(train["seconds"], 1e-9),
        "first_step_s": train["first_step_s"],
        "compile_s": train["first_step_s"] if cfg.MODEL.COMPILE else None,
        "infer_warmup_s": infer["first_s"],
        "peak_mem_mb": mem_mb, "peak_mem_kind": mem_kind,
        "params_m": stats["params"] / 1e6,
        "gflops_per_img": stats["gflops_per_img"],
        "train_gflops_per_img": stats["train_gflops_per_img"],
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "mfu": mfu(achieved, peak, world),
    }


COLUMNS = [("model", "model", "{}"), ("px", "img_size", "{}"), ("batch", "batch_size", "{}"),
           ("prec", "precision", "{}"), ("cl", "channels_last", "{:d}"), ("compile", "compile", "{:d}"),
           ("train img/s", "train_img_per_s", "{:.1f}"), ("step ms", "step_ms", "{:.1f}"),
           ("wait", "data_wait_frac", "{:.3f}"), ("infer img/s", "infer_img_per_s", "{:.1f}"),
           ("mem MB", "peak_mem_mb", "{:.0f}"), ("GFLOP/img", "gflops_per_img", "{:.3g}"),
           ("TFLOP/s", "achieved_tflops", "{:.3g}"), ("mfu", "mfu", "{:.3f}"), ("compile s", "compile_s", "{:.1f}")]


def format_table(results: list[dict[str, Any]]) -> str:
    """A fixed-width table, one row per result."""
    head = [c[0] for c in COLUMNS]
    rows = [[("-" if r.get(key) is None else fmt.format(r[key])) for _, key, fmt in COLUMNS] for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(lines)
