#!/usr/bin/env python
"""Time what tools/train.py builds for a config: training steps, inference batches, memory, FLOPs, MFU.

    python tools/benchmark.py --cfg configs/x.yaml [KEY VALUE ...] [--steps 20] [--warmup 5]
        [--infer-batches 20] [--models resnet18,resnet50] [--batch-sizes 32,64]
        [--loader] [--loader-workers 0,1,2,4] [--loader-batches 20] [--loader-warmup 2]

Nothing is written (no output folder, no lock, no resume). The training steps go through the run's own loop
and step with no hooks, data fetch included; warm-up steps are not timed (the first one, which holds
torch.compile's work, is reported alone as compile_s). Under torchrun the process group is set up once for
every combination. Prints a table, then as its LAST line one JSON object; with several models or
batch sizes, one JSON line per combination as each finishes, a summary table, and a last line holding the
JSON list of all of them. The keys are described in docs/PERFORMANCE.md.

Data-bound or not (`--loader`, or `--loader-workers` with its own counts): after the step, the run's own train
loader alone (built as training builds it, DATA.NUM_WORKERS set per row, no model) is timed at 0, 1, 2, 4, ...
workers up to the cores this rank has (and at the config's own DATA.NUM_WORKERS, -1 resolved as training
resolves it); a table of img/s and img/s per worker, then one verdict line: the img/s the step needs, about
how many workers that takes, and whether the config's worker count leaves the step waiting on data. The JSON
gains the `loader*` keys. One config only (no several --models or --batch-sizes).
"""
from __future__ import annotations

import json

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

from runner.config import build_parser
from runner.errors import UserError, cli
from runner.preflight import config_command


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


def _counts(text: str) -> list[int]:
    """Comma-separated worker counts (0 or more) for --loader-workers, in the order given, without repeats."""
    out = []
    for t in _names(text, "--loader-workers"):
        if not t.isdigit():
            raise UserError(f"--loader-workers: '{t}' is not a worker count (0 or more); give e.g. 0,1,2,4")
        out.append(int(t))
    return list(dict.fromkeys(out))


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


def _loader(cfg, dist, counts: list[int] | None, batches: int, warmup: int, record: dict) -> str:
    """Time the train loader at each count (every rank: they share the machine as in training), add the verdict's
    figures to `record`; the text to print."""
    from runner.bench import loader as lbench

    cores, _ = lbench.rank_cores()
    counts = list(counts) if counts is not None else lbench.default_counts(cores)
    own = lbench.configured_workers(cfg, dist)
    if own not in counts:  # the verdict's own row is measured, never extrapolated
        counts.append(own)
    rows = lbench.measure(cfg, dist, counts, batches, warmup)
    record.update(lbench.verdict(cfg, dist, rows, record))
    head = (f"train loader alone (DATA.NAME {cfg.DATA.NAME}, batch {cfg.DATA.BATCH_SIZE}, {batches} timed batches "
            f"per row), this rank: {cores} core{'s' if cores != 1 else ''}")
    return "\n".join([head, lbench.format_rows(rows), lbench.verdict_line(cfg, record)])


def _parser():
    """The tool's options beside the config's."""
    parser = build_parser(description="Training and inference throughput of a config, as tools/train.py builds it.")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps (default 20)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed optimizer steps before them, at least 1 (default 5)")
    parser.add_argument("--infer-batches", type=int, default=20, help="timed inference batches (default 20)")
    parser.add_argument("--models", default="", help="comma-separated timm model names replacing MODEL.NAME")
    parser.add_argument("--batch-sizes", default="", help="comma-separated values replacing DATA.BATCH_SIZE")
    parser.add_argument("--loader", action="store_true",
                        help="data-bound or not: also time the train loader alone (no model) at 0, 1, 2, 4, ... "
                             "workers up to this rank's cores and at the config's DATA.NUM_WORKERS; print img/s "
                             "per worker, the workers the measured step needs, and a verdict line")
    parser.add_argument("--loader-workers", default="", metavar="W1,W2,...",
                        help="the worker counts for --loader (implies it); the config's own count is added")
    parser.add_argument("--loader-batches", type=int, default=20, help="timed loader batches per count (default 20)")
    parser.add_argument("--loader-warmup", type=int, default=2,
                        help="untimed loader batches first, plus one per worker (default 2)")
    return parser


@cli
def main(argv: list[str] | None = None) -> int:
    """Load the config, benchmark each model x batch-size combination, print the table and JSON."""
    parser = _parser()
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
    counts = _counts(args.loader_workers) if args.loader_workers else None
    loader = args.loader or counts is not None
    lb = _positive("--loader-batches", args.loader_batches, 1)
    lw = _positive("--loader-warmup", args.loader_warmup, 0)
    several = len(models) * len(sizes) > 1
    if loader and several:
        raise UserError("--loader measures one config: give at most one --models and one --batch-sizes value")

    from runner import distributed
    from runner.bench.step import benchmark, format_table

    results = []
    dist = distributed.setup(cfg)  # once for every variant: a group per variant could read stale rendezvous keys
    try:
        for model in models:
            for batch in sizes:
                c = _variant(cfg, model, batch) if several or model or batch else cfg
                results.append(benchmark(c, steps, warmup, infer, dist=dist))
                if several and dist.is_main:  # under torchrun every rank times, rank 0 reports
                    print(json.dumps(results[-1]), flush=True)
        if loader:
            lines = _loader(c, dist, counts, lb, lw, results[0])
    finally:
        distributed.teardown()
    if not dist.is_main:
        return 0
    print(format_table(results))
    if loader:
        print(lines)
    print(json.dumps(results if several else results[0]), flush=True)
    return 0


if __name__ == "__main__":
    main()
