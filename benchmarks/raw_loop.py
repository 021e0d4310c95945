#!/usr/bin/env python
"""The baseline: a minimal hand-written PyTorch training loop for a timm model on synthetic data.

    python benchmarks/raw_loop.py --model resnet18 --img-size 64 --batch-size 64 [--amp] [--channels-last]
        [--compile] [--steps 20] [--warmup 5] [--infer-batches 20] [--peak-tflops 989.4]

What a user would write without the runner: timm.create_model, random images and labels held on the device,
a fresh random order each epoch, SGD with momentum (fused kernels, on CUDA and on the CPU, as the
runner picks them), cross-entropy, optional bf16 autocast, channels_last and torch.compile.
It imports nothing from the runner. Timing is the same as tools/benchmark.py's: warm-up steps untimed
(the first alone, reported as compile_s when compiling), then the timed steps with their data fetch, the
device synchronised only at the ends. Prints a table, then as its last line one JSON object with the same
throughput keys as tools/benchmark.py (mfu only when --peak-tflops is given).
"""
from __future__ import annotations

import argparse
import json
import resource
import time

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The loop's knobs; defaults match the runner's config defaults."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--img-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--eval-batch-size", type=int, default=0, help="0 = 2 x batch size")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--in-chans", type=int, default=3)
    p.add_argument("--dataset-size", type=int, default=1024, help="synthetic training images on the device")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="untimed steps, at least 1")
    p.add_argument("--infer-batches", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--nesterov", action="store_true",
                   help="Nesterov momentum, what the runner's TRAIN.OPTIMIZER sgd means (timm's naming)")
    p.add_argument("--amp", action="store_true", help="bf16 autocast")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--peak-tflops", type=float, default=0.0, help="the device's dense peak, for mfu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.steps, args.warmup, args.infer_batches, args.batch_size) < 1:
        p.error("--steps, --warmup, --infer-batches and --batch-size must be at least 1")
    if args.dataset_size < args.batch_size:
        p.error("--dataset-size must hold at least one batch")
    return args


def sync(device: torch.device) -> None:
    """Wait for queued device work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_flops(model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> tuple[float, float]:
    """(forward, forward + backward) GFLOPs per image, counted on a batch of two in training mode."""
    x = torch.randn(2, args.in_chans, args.img_size, args.img_size, device=device)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with FlopCounterMode(display=False) as fwd, torch.no_grad():
        model(x)
    with FlopCounterMode(display=False) as both:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(state)  # BatchNorm running stats back as they were
    return fwd.get_total_flops() / 2e9, both.get_total_flops() / 2e9


class RawLoop:
    """The model, optimizer and on-device data of the hand-written loop."""

    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.args, self.dev = args, device
        torch.manual_seed(args.seed)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        self.fmt = torch.channels_last if args.channels_last else torch.contiguous_format
        self.model = timm.create_model(args.model, num_classes=args.num_classes, in_chans=args.in_chans)
        self.model.to(device, memory_format=self.fmt)
        self.gflops, self.train_gflops = count_flops(self.model, args, device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-5,
                                   nesterov=args.nesterov,
                                   fused=True)
        self.net = torch.compile(self.model) if args.compile else self.model
        self.amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)
        n, s = args.dataset_size, args.img_size
        self.images = torch.randn(n, args.in_chans, s, s, device=device)
        self.labels = torch.randint(0, args.num_classes, (n,), device=device)
        self.data = self.batches()
        self.model.train()

    def batches(self):
        """Batches in a fresh random order every epoch, the partial last batch dropped."""
        n, bs = self.args.dataset_size, self.args.batch_size
        while True:
            order = torch.randperm(n, device=self.dev)
            for b in range(n // bs):
                idx = order[b * bs:(b + 1) * bs]
                yield self.images[idx].contiguous(memory_format=self.fmt), self.labels[idx]

    def train(self, steps: int) -> float:
        """`steps` training steps; returns the seconds spent fetching batches."""
        wait = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            x, y = next(self.data)
            wait += time.perf_counter() - t0
            with self.amp:
                loss = F.cross_entropy(self.net(x), y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return wait


def pick_device(name: str) -> torch.device:
    """cuda when asked or (auto) when available, else cpu."""
    return torch.device("cuda" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu")


def main(argv: list[str] | None = None) -> None:
    """Build, warm up, time training and inference, print the summary line and the JSON line."""
    args = parse_args(argv)
    dev = pick_device(args.device)
    loop = RawLoop(args, dev)
    s, bs = args.img_size, args.batch_size

    t0 = time.perf_counter()
    loop.train(1)
    sync(dev)
    first = time.perf_counter() - t0
    loop.train(args.warmup - 1)
    sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    wait = loop.train(args.steps)
    sync(dev)
    train_s = time.perf_counter() - t0
    if dev.type == "cuda":
        mem, mem_kind = torch.cuda.max_memory_allocated(dev) / 2**20, "cuda_max_allocated"
    else:
        mem, mem_kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"

    ebs = args.eval_batch_size or 2 * bs
    held = [torch.randn(ebs, args.in_chans, s, s, device=dev).contiguous(memory_format=loop.fmt) for _ in range(2)]
    loop.net.eval()
    with torch.no_grad(), loop.amp:
        t0 = time.perf_counter()
        for x in held:
            loop.net(x)
        sync(dev)
        infer_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(args.infer_batches):
            loop.net(held[i % 2])
        sync(dev)
        infer_s = time.perf_counter() - t0

    train_ips = args.steps * bs / train_s
    achieved = train_ips * loop.train_gflops / 1e3
    precision = "bf16" if args.amp else ("tf32" if dev.type == "cuda" else "fp32")
    result = {
        "model": args.model, "img_size": s, "batch_size": bs, "device": dev.type,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(), "precision": precision, "channels_last": args.channels_last,
        "compile": args.compile, "steps": args.steps, "warmup": args.warmup,
        "train_img_per_s": train_ips,
        "infer_img_per_s": args.infer_batches * ebs / infer_s,
        "step_ms": 1e3 * train_s / args.steps,
        "data_wait_frac": wait / train_s,
        "first_step_s": first, "compile_s": first if args.compile else None, "infer_warmup_s": infer_first,
        "peak_mem_mb": mem, "peak_mem_kind": mem_kind,
        "gflops_per_img": loop.gflops, "train_gflops_per_img": loop.train_gflops, "achieved_tflops": achieved,
        "peak_tflops": args.peak_tflops or None,
        "mfu": achieved / args.peak_tflops if args.peak_tflops else None,
    }
    print(f"raw loop  {args.model} {s}px batch {bs} {precision} on {result['device_name']}: "
          f"train {train_ips:.1f} img/s ({result['step_ms']:.1f} ms/step, data wait {result['data_wait_frac']:.3f}), "
          f"infer {result['infer_img_per_s']:.1f} img/s, peak mem {mem:.0f} MB")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
