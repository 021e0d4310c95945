#!/usr/bin/env python
"""Time what tools/train.py builds for a config: training steps, inference batches, memory, FLOPs, MFU.

    python tools/benchmark.py --cfg configs/x.yaml [KEY VALUE ...] [--steps 20] [--warmup 5]
        [--infer-batches 20] [--models resnet18,resnet50] [--batch-sizes 32,64]

Nothing is written (no output folder, no lock, no resume). The training steps go through the run's own loop
and step with no hooks, data fetch included; warm-up steps are not timed (the first one, which holds
torch.compile's work, is reported alone as compile_s). Under torchrun the process group is set up once for
every combination. Prints a table, then as its LAST line one JSON object; with several models or
batch sizes, one JSON line per combination as each finishes, a summary table, and a last line holding the
JSON list of all of them. The keys are described in docs/PERFORMANCE.md.
"""
from __future__ import annotations

import json

from runner.config import build_parser, config_command
from runner.errors import UserError, cli


def _names(text: str, option: str) -> list[str]:
    """A comma-separated list; empty items are a mistake."""
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise UserError(f"{option} '{text}' has an empty item; give a comma-separated list like a,b")
    return items


def _sizes(text: str) -> list[int]:
    """Comma-separated positive integers for --batch-sizes."""
    out = []
    for t in _names(text, "--batch-sizes"):
        if not t.isdigit() or int(t) < 1:
            raise UserError(f"--batch-sizes: '{t}' is not a positive integer; give e.g. --batch-sizes 32,64")
        out.append(int(t))
    return out


def _positive(name: str, value: int, least: int) -> int:
    """Refuse counts below `least` with one line."""
    if value < least:
        raise UserError(f"{name} {value} is too small; give at least {least}")
    return value


def _variant(cfg, model: str | None, batch: int | None):
    """A copy of the frozen config with another model and/or batch size, validated again."""
    from runner.config import validate

    c = cfg.clone()
    c.defrost()
    if model is not None:
        c.MODEL.NAME = model
    if batch is not None:
        c.DATA.BATCH_SIZE = batch
    validate(c)
    c.freeze()
    return c


@cli
def main(argv: list[str] | None = None) -> int:
    """Load the config, benchmark each model x batch-size combination, print the table and JSON."""
    parser = build_parser(description="Training and inference throughput of a config, as tools/train.py builds it.")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps (default 20)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed optimizer steps before them, at least 1 (default 5)")
    parser.add_argument("--infer-batches", type=int, default=20, help="timed inference batches (default 20)")
    parser.add_argument("--models", default="", help="comma-separated timm model names replacing MODEL.NAME")
    parser.add_argument("--batch-sizes", default="", help="comma-separated values replacing DATA.BATCH_SIZE")
    loaded = config_command(argv, parser)
    if loaded is None:
        return 0
    cfg, info = loaded
    args = info.args
    steps = _positive("--steps", args.steps, 1)
    warmup = _positive("--warmup", args.warmup, 1)
    infer = _positive("--infer-batches", args.infer_batches, 1)
    models = _names(args.models, "--models") if args.models else [None]
    sizes = _sizes(args.batch_sizes) if args.batch_sizes else [None]

    from runner import distributed
    from runner.bench import benchmark, format_table

    results = []
    several = len(models) * len(sizes) > 1
    dist = distributed.setup(cfg)  # once for every variant: a group per variant could read stale rendezvous keys
    try:
        for model in models:
            for batch in sizes:
                c = _variant(cfg, model, batch) if several or model or batch else cfg
                results.append(benchmark(c, steps, warmup, infer, dist=dist))
                if several and dist.is_main:  # under torchrun every rank times, rank 0 reports
                    print(json.dumps(results[-1]), flush=True)
    finally:
        distributed.teardown()
    if not dist.is_main:
        return 0
    print(format_table(results))
    print(json.dumps(results if several else results[0]), flush=True)
    return 0


if __name__ == "__main__":
    main()
