#!/usr/bin/env python
"""Train the README's first run for SEED 0, 1 and 2 and print a markdown table of what each ended at.

    python benchmarks/digits_seeds.py [--cfg configs/digits/resnet18.yaml] [--seeds 0 1 2] [--floor 99.0]
                                      [--] [KEY VALUE ...]

(`--` ends the seed list: `--seeds 0 -- MODEL.CHANNELS_LAST false`.)

Each seed is the whole command `python tools/train.py --cfg <cfg> SEED <s> OUTPUT_DIR <fresh temp folder>`,
timed from launch to exit (imports included), one after the other. The table gives the final and best
val/top1 from the run's results.json, the wall time and the CPU time (user + sys) of the process; below it
come the median wall time and whether every final val/top1 reached --floor. The lines above it name the CPU
(lscpu), the torch threads, the date and the load average before and after: wall time means little on a
busy machine, where the CPU time of a run with 2 threads also grows (threads spin while they wait for each
other), so compare candidates back to back.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner.rundir.layout import RESULTS

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name as lscpu gives it (or platform's guess when lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return names[0] if names else "unknown CPU"


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def children_cpu_s() -> float:
    """CPU seconds (user + sys) used so far by this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train_once(cfg: str, seed: int, extra: list[str]) -> dict:
    """One whole training process into a fresh temporary OUTPUT_DIR: its results, wall and CPU time."""
    with tempfile.TemporaryDirectory(prefix=f"digits-seed{seed}-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, str(ROOT / "tools" / "train.py"), "--cfg", cfg, "SEED", str(seed),
               "OUTPUT_DIR", str(out), *extra]
        cpu0, t0 = children_cpu_s(), time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, children_cpu_s() - cpu0
        if proc.returncode != 0:
            sys.exit(f"SEED {seed} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        res = json.loads((out / RESULTS).read_text())
    return {"seed": seed, "final": res["val/top1"], "best": res["best/val/top1"], "wall": wall, "cpu": cpu}


def table(rows: list[dict], floor: float) -> str:
    """The markdown table of the runs, the median wall time and whether every final val/top1 reached `floor`."""
    lines = ["| SEED | final val/top1 | best val/top1 | wall time s | CPU time s (user+sys) |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seed']} | {r['final']:.2f} | {r['best']:.2f} | {r['wall']:.1f} | {r['cpu']:.1f} |"
              for r in rows]
    worst = min(r["final"] for r in rows)
    lines += ["", f"- median wall time: {statistics.median(r['wall'] for r in rows):.1f} s "
              f"(min {min(r['wall'] for r in rows):.1f}, max {max(r['wall'] for r in rows):.1f})",
              f"- every final val/top1 >= {floor:.1f}: {'yes' if worst >= floor else 'NO'} (lowest {worst:.2f})"]
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments, train each seed, print the header lines and the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cfg", default="configs/digits/resnet18.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--floor", type=float, default=99.0, help="the final val/top1 each seed must reach")
    p.add_argument("overrides", nargs="*", help="KEY VALUE pairs passed on to tools/train.py")
    args = p.parse_args()
    import torch

    before = load()
    rows = [train_once(args.cfg, s, args.overrides) for s in args.seeds]
    cmd = " ".join(["python tools/train.py --cfg", args.cfg, *args.overrides, "SEED <s>"])
    print(f"- command: `{cmd}`")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"- CPU: {cpu_model()} (lscpu), {os.cpu_count()} logical CPUs, torch {torch.__version__} "
          f"with {torch.get_num_threads()} threads")
    print(f"- load average (1/5/15 min): before {before}, after {load()}")
    print()
    print(table(rows, args.floor))


if __name__ == "__main__":
    main()
