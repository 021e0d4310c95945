#!/usr/bin/env python
"""The training loader alone: images/s that build_data's train loader delivers onto the device, no model.

    python benchmarks/loader_speed.py --cfg x.yaml [KEY VALUE ...] [--batches 20] [--warmup 2]

The same loader tools/train.py builds (DATA.NUM_WORKERS, pinned memory, prefetch, the copy to DEVICE). The
first --warmup batches (worker start-up, first decodes) are not timed; the device is synchronised at the ends.
Prints one JSON line: workers, batch size, img/s.
"""
from __future__ import annotations

import json
import time

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

import torch

from runner.config import build_parser, config_command
from runner.errors import UserError, cli


@cli
def main(argv: list[str] | None = None) -> int:
    """Build the run's data, draw batches, print the JSON line."""
    parser = build_parser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=20, help="timed batches")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches first")
    loaded = config_command(argv, parser)
    if loaded is None:
        return 0
    cfg, info = loaded
    from runner import distributed
    from runner.data import build_data
    from runner.data.loaders import default_workers

    dist = distributed.setup(cfg)
    loader = build_data(cfg, dist).train
    need = info.args.batches + info.args.warmup
    if len(loader) < need:
        raise UserError(f"the training split gives {len(loader)} batches; --batches + --warmup need {need}")
    loader.set_epoch(0, 0)
    batches = iter(loader)
    for _ in range(info.args.warmup):
        next(batches)
    sync = torch.cuda.synchronize if dist.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    images = sum(len(next(batches)[1]) for _ in range(info.args.batches))
    sync()
    seconds = time.perf_counter() - t0
    workers = cfg.DATA.NUM_WORKERS if cfg.DATA.NUM_WORKERS >= 0 else default_workers(cfg, dist)
    print(json.dumps({"data": cfg.DATA.NAME, "workers": workers, "batch_size": cfg.DATA.BATCH_SIZE,
                      "img_size": cfg.DATA.IMG_SIZE, "images": images, "seconds": seconds,
                      "loader_img_per_s": images / seconds}), flush=True)
    return 0


if __name__ == "__main__":
    main()
