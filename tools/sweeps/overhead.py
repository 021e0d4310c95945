#!/usr/bin/env python
"""What one sweep point pays before its first training step: process start, imports, build, first step.

    python tools/sweeps/overhead.py --cfg configs/digits/resnet18.yaml [KEY VALUE ...] [--repeat 3]

Every round runs in a fresh Python process, as a sweep point does; the figures are medians over the rounds.
Nothing is written to OUTPUT_DIR.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
REPO = Path(__file__).resolve().parents[2]

from runner.errors import UserError, argument_error, cli


def child(argv: list[str]) -> dict[str, float]:
    """The phases of one point, timed from this process's first line of Python."""
    times: dict[str, float] = {}
    t = T0

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        times[name] = now - t
        t = now

    import torch

    lap("import torch")
    import timm  # noqa: F401

    lap("import timm")
    from runner import distributed
    from runner.config import load_config
    from runner.data import build_data
    from runner.model import build_model, prepare_model
    from runner.optim import build_optimizer

    cfg, _ = load_config(argv)
    dist = distributed.setup(cfg)
    lap("runner imports + config + device")
    data = build_data(cfg, dist)
    lap("data load")
    model, bare = prepare_model(build_model(cfg), cfg, dist)
    optimizer = build_optimizer(cfg, bare, dist.device, dist.world_size)
    lap("model + optimizer build")
    batches = iter(data.train)
    for name in ("first step", "second step"):
        x, y = next(batches)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        lap(name)
    return times


def wall_s(args: list[str]) -> tuple[float, str]:
    """Wall seconds and stdout of `python args` in a fresh interpreter; its one-line mistake becomes ours."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO)
    elapsed = time.perf_counter() - t0
    if proc.returncode == 2:  # a mistake the child found (e.g. a model name timm does not have)
        lines = proc.stderr.strip().splitlines() or ["exit code 2"]
        raise UserError(lines[-1].removeprefix("error: "))
    if proc.returncode != 0:
        raise RuntimeError(f"the timed child failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def measure(argv: list[str]) -> dict[str, float]:
    """One round: bare interpreter start, the light path (no torch), then a full point in a child."""
    times = {"python start": wall_s(["-c", "pass"])[0],
             "light imports (train.py's done check, summarize)": wall_s(
                 ["-c", "import runner.config, runner.rundir.rules, runner.sweep.summary"])[0]}
    total, out = wall_s([__file__, "--child", *argv])
    times.update(json.loads(out.strip().splitlines()[-1]))
    times["total to the second step (process wall)"] = total
    return times


@cli
def main() -> int:
    """Print the median of each phase over the rounds (or, with --child, one round's phases as JSON)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.error = argument_error  # one line, like every other tool
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        print(json.dumps(child(rest)))
        return 0
    if args.repeat < 1:
        raise UserError(f"--repeat {args.repeat}: give the number of rounds, at least 1 (default 3)")
    from runner.config import load_config

    load_config(rest)  # a mistake in the config is one line here, before any child starts
    rounds = [measure(rest) for _ in range(args.repeat)]
    for name in rounds[0]:
        print(f"{name:50s} {statistics.median(r[name] for r in rounds):7.2f} s")
    return 0


if __name__ == "__main__":
    main()
