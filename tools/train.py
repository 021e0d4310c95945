#!/usr/bin/env python
"""Train and evaluate a timm model as a YAML config says.

    python tools/train.py --cfg configs/digits/resnet18.yaml [KEY VALUE ...]
    torchrun --standalone --nproc_per_node=N tools/train.py --cfg ... [KEY VALUE ...]

Exit codes: 0 done (also: the run was already done), 2 a mistake in the config or arguments,
3 the loss became non-finite, 75 preempted by SIGTERM/SIGUSR1/a first Ctrl-C (state saved: rerun the same
command), 130 Ctrl-C twice (stopped at once: rerun to continue from the last checkpoint).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.config import build_parser, handle_info_flags, load_config
from runner.errors import cli


@cli
def main(argv: list[str] | None = None) -> int:
    """Load the config; skip a finished run before importing anything heavy; train."""
    parser = build_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cfg, info = load_config(argv, parser)
    if handle_info_flags(cfg, info):
        return 0
    from runner.runstate import finished_run

    done = finished_run(cfg)
    if done is not None:
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank gets here; one says so
            print(f"{cfg.OUTPUT_DIR}: already done (val/top1 {done.get('val/top1')}, step {done.get('step')}); "
                  "nothing to train", flush=True)
        return 0
    from runner.engine import train

    train(cfg, hparam_keys=[key for key, _ in info.overrides])
    return 0


if __name__ == "__main__":
    main()
