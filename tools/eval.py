#!/usr/bin/env python
"""Evaluate saved weights on the config's validation split (top-1/top-5), in one process or under torchrun.

    python tools/eval.py --cfg configs/digits/test_resnet.yaml \
        MODEL.CHECKPOINT output/digits/test_resnet/checkpoints/best.pth

Prints a line per metric and, last, one JSON object.
"""
from __future__ import annotations

import json

from runner.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

from runner.errors import UserError, cli
from runner.preflight import config_command


@cli
def main(argv: list[str] | None = None) -> int:
    """Build the model and val loader exactly as training does, load the weights, evaluate."""
    loaded = config_command(argv, __doc__)
    if loaded is None:
        return 0
    cfg, _ = loaded
    if not cfg.MODEL.CHECKPOINT:
        raise UserError("tools/eval.py needs weights: add MODEL.CHECKPOINT path/to/checkpoint.pth")
    from runner import distributed
    from runner.data import build_data
    from runner.engine import autocast_for, configure_backends, evaluate
    from runner.model import build_model, compiler
    from runner.sinks import setup_logging

    dist = distributed.setup(cfg)
    setup_logging(None, dist.rank)
    configure_backends(cfg, dist.device)
    data = build_data(cfg, dist)
    model = build_model(cfg, allow_new_head=False).to(dist.device)  # a new head would score noise
    if cfg.MODEL.CHANNELS_LAST:  # the loader hands channels_last batches, as in training
        import torch

        model = model.to(memory_format=torch.channels_last)
    res = evaluate(compiler(cfg)(model), data.val, dist.device, autocast_for(cfg, dist.device))
    res = {"val/top1": res["top1"], "val/top5": res["top5"], "val/loss": res["loss"], "val/count": res["count"],
           "checkpoint": cfg.MODEL.CHECKPOINT, "world_size": dist.world_size}
    if dist.is_main:
        for k in ("val/top1", "val/top5", "val/loss"):
            print(f"{k:10s} {res[k]:.4f}")
        print(f"{'val/count':10s} {res['val/count']}")
        print(json.dumps(res), flush=True)
    distributed.teardown()
    return 0


if __name__ == "__main__":
    main()
