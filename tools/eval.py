#!/usr/bin/env python
"""Evaluate saved weights on a split of the config's data (top-1/top-5, per-class accuracy, the confusion matrix),
in one process or under torchrun.

    python tools/eval.py --cfg configs/digits/test_resnet.yaml \
        MODEL.CHECKPOINT output/digits/test_resnet/checkpoints/best.pth
    python tools/eval.py --cfg output/run/config.yaml MODEL.CHECKPOINT output/run/checkpoints/best.pth --split test

--split val (the default) is the run's validation split; another name is a held-out split of a folder or of
shards (DATA.ROOT/test/...), as DATA.TEST_SPLIT names one. Prints a line per metric and, last, one JSON object:
<split>/top1, <split>/top5, <split>/loss, <split>/count, and per_class ({class name: top-1 %}), confusion (rows:
true class, columns: predicted) and classes, as results.json's splits hold them.
"""
from __future__ import annotations

import argparse
import json

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

from runner.config import build_parser
from runner.errors import UserError, cli
from runner.preflight import config_command


def split_loader(cfg, data, dist, split: str):
    """The evaluation loader of `split`: val, DATA.TEST_SPLIT's (built already) or another split of the source."""
    from runner.data.sources import source

    if split == "val":
        return data.val
    if split == cfg.DATA.TEST_SPLIT and data.test is not None:
        return data.test
    return source(cfg.DATA.NAME).build_split(cfg, dist, split)


def report(res: dict, split: str, names: list[str], cfg, world: int) -> dict:
    """The printed JSON object: the split's metrics under <split>/, and its per-class results."""
    from runner.engine.splits import split_entry

    entry = split_entry(res, names)
    return {f"{split}/top1": res["top1"], f"{split}/top5": res["top5"], f"{split}/loss": res["loss"],
            f"{split}/count": res["count"], "checkpoint": cfg.MODEL.CHECKPOINT, "world_size": world,
            "split": split, "classes": names, "per_class": entry["per_class"], "confusion": entry["confusion"]}


@cli
def main(argv: list[str] | None = None) -> int:
    """Build the model and the split's loader exactly as training does, load the weights, evaluate."""
    parser = build_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="val", help="the split to evaluate: val (default) or a held-out one, "
                                                       "e.g. test (DATA.ROOT/test/)")
    loaded = config_command(argv, parser)
    if loaded is None:
        return 0
    cfg, info = loaded
    if not cfg.MODEL.CHECKPOINT:
        raise UserError("tools/eval.py needs weights: add MODEL.CHECKPOINT path/to/checkpoint.pth")
    from runner import distributed
    from runner.data import build_data
    from runner.engine import autocast_for, configure_backends, evaluate
    from runner.engine.splits import class_names
    from runner.model import build_model, compiler
    from runner.sinks import setup_logging

    dist = distributed.setup(cfg)
    setup_logging(None, dist.rank)
    configure_backends(cfg, dist.device)
    data = build_data(cfg, dist)
    loader = split_loader(cfg, data, dist, info.args.split)
    model = build_model(cfg, allow_new_head=False).to(dist.device)  # a new head would score noise
    if cfg.MODEL.CHANNELS_LAST:  # the loader hands channels_last batches, as in training
        import torch

        model = model.to(memory_format=torch.channels_last)
    names = class_names(data.class_names, int(model.num_classes))
    res = evaluate(compiler(cfg)(model), loader, dist.device, autocast_for(cfg, dist.device),
                   num_classes=len(names))
    out = report(res, info.args.split, names, cfg, dist.world_size)
    if dist.is_main:
        for k in ("top1", "top5", "loss"):
            print(f"{info.args.split + '/' + k:10s} {out[info.args.split + '/' + k]:.4f}")
        print(f"{info.args.split + '/count':10s} {res['count']}")
        print(json.dumps(out), flush=True)
    distributed.teardown()
    return 0


if __name__ == "__main__":
    main()
