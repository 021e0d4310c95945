#!/usr/bin/env python
"""Train img/s of the digits run with no tracker, W&B (offline) and MLflow (sqlite), median of N runs each.

    python benchmarks/trackers_cost.py [--repeats 3] [--] [KEY VALUE ...]

Each run is `tools/train.py --cfg configs/digits/test_resnet.yaml` into a fresh temp folder (W&B offline with
no API key, MLflow into a sqlite file there), the three settings interleaved so a change of machine load
hits all of them alike, after one uncounted warm-up run. A run's img/s is the median of its
`train/img_per_s` rows in metrics.jsonl (the training steps only, as the console shows it); its CPU seconds
are the child's user + system time, which includes the trackers' own threads and W&B's service process.
Prints the machine load before and after.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from runner.rundir import reader

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "off": [],
    "wandb": ["LOG.WANDB", "true", "LOG.WANDB_MODE", "offline"],
    "mlflow": ["LOG.MLFLOW_URI", "sqlite:///{tmp}/mlflow.db"],
}


def one_run(name: str, extra: list[str]) -> tuple[float, float]:
    """(median train img/s, CPU seconds) of one digits run with the tracker setting `name`."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [a.replace("{tmp}", tmp) for a in SETTINGS[name]]
        env = dict(os.environ, HOME=tmp, WANDB_MODE="offline")
        env.pop("WANDB_API_KEY", None)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), "--cfg", "configs/digits/test_resnet.yaml",
                        *args, *extra, "OUTPUT_DIR", f"{tmp}/run"], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows = reader.metrics_rows(Path(tmp, "run"))
        speed = statistics.median(r["train/img_per_s"] for r in rows if "train/img_per_s" in r)
    return speed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    """Run every setting `--repeats` times, interleaved, and print one markdown row per setting."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("extra", nargs="*", help="config overrides for every run")
    opts = parser.parse_args()
    print(f"load before: {Path('/proc/loadavg').read_text().split()[:3]} on {os.cpu_count()} cores", flush=True)
    one_run("off", opts.extra)  # not counted: the first run after a while pays for cold file caches
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in SETTINGS}
    for _ in range(opts.repeats):
        for name in SETTINGS:
            got[name].append(one_run(name, opts.extra))
    print(f"load after: {Path('/proc/loadavg').read_text().split()[:3]}")
    print("| trackers | train img/s (median) | each run | CPU s (median) |\n|---|---|---|---|")
    for name, runs in got.items():
        speeds = ", ".join(f"{s:.0f}" for s, _ in runs)
        print(f"| {name} | {statistics.median(s for s, _ in runs):.0f} | {speeds} | "
              f"{statistics.median(c for _, c in runs):.1f} |")


if __name__ == "__main__":
    main()
