#!/usr/bin/env python
"""Train and evaluate a timm model as a YAML config says.

    python tools/train.py --cfg configs/digits/test_resnet.yaml [KEY VALUE ...]
    python tools/train.py --cfg ... --pause-after-epoch E   (stop after epoch E, status paused; rerun to go on)
    torchrun --standalone --nproc_per_node=N tools/train.py --cfg ... [KEY VALUE ...]

Exit codes: 0 done (also: the run was already done), 2 a mistake in the config or arguments (on any rank),
3 the loss became non-finite, 75 preempted by SIGTERM/SIGUSR1/a first Ctrl-C or TRAIN.TIME_LIMIT (state saved:
rerun the same command), 76 hung (no step for DIST.HANG_TIMEOUT_S; stacks in OUTPUT_DIR/hang/; rerun the same
command to resume, as after 75), 130 Ctrl-C twice (stopped at once: rerun to continue from the last checkpoint).
"""
from __future__ import annotations

import argparse
import os

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

from runner.config import build_parser
from runner.errors import DataUnavailable, UserError, cli, run_script
from runner.preflight import config_command


@cli
def main(argv: list[str] | None = None) -> int:
    """Load the config; skip a finished run before importing anything heavy; train."""
    try:
        loaded = config_command(argv, _parser(), resolve_auto=False)  # build_trainer resolves "auto" (or resumes it)
    except (UserError, DataUnavailable) as e:  # DataUnavailable: DATA.ROOT's server, down for DATA.RETRY_S
        e.relayed = True  # under torchrun every rank reads the same arguments: rank 0's line is the one shown
        raise
    if loaded is None:
        return 0
    cfg, info = loaded
    from runner import preflight
    from runner.rundir import rules

    try:
        preflight.check_before_claim(cfg, preflight.world_size())  # before the claim: nothing written or locked
    except (UserError, DataUnavailable) as e:
        e.relayed = True  # every rank meets the same mistake or outage: rank 0's line is the one shown
        raise
    if os.environ.get("RANK", "0") == "0":  # other ranks learn rank 0's verdict (they may start after it locked)
        rules.check_output_dir(cfg)  # before anything heavy: a folder that is not ours is refused at once
    if os.environ.get("WORLD_SIZE", "1") == "1":  # under torchrun, rank 0 decides under the run lock
        done = rules.finished_run(cfg)
        if done is not None:
            print(rules.done_line(cfg, *done), flush=True)
            return 0
    from runner.data.workerstart import start_early

    start_early(cfg)  # the loader workers' fork server imports torch beside this process's imports, not after
    from runner.engine import train

    train(cfg, hparam_keys=[key for key, _ in info.overrides], pause_after_epoch=info.args.pause_after_epoch)
    return 0


def _parser() -> argparse.ArgumentParser:
    """The config's arguments and --pause-after-epoch (a run-time option: not part of the run's config)."""
    parser = build_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pause-after-epoch", type=_epoch, default=0, metavar="E",
                        help="stop cleanly once epoch E is evaluated and saved (run.json: paused; exit 0); the same "
                             "command with a later E, or without it, resumes exactly (a search trains by rungs)")
    return parser


def _epoch(text: str) -> int:
    """A whole number of epochs, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of epochs (at least 1) is needed, got {text!r}")
    return int(text)


if __name__ == "__main__":
    run_script(main)  # a fast, quiet exit: see run_script
