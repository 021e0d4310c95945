#!/usr/bin/env python
"""DATA.NAME shards against DATA.NAME folder on the same images: loader img/s per CPU second, peak memory against
the shuffle window, and the accuracy of class-ordered shards (the worst case for a streaming shuffle).

    python -m benchmarks.shards [--work DIR] [--epochs 3] [--size 64] [--copies 8]

Writes the digits as JPEGs (--size px, each image --copies times under other names), packs them with
tools/make_shards.py (class by class: --class-order), then in fresh processes: (1) one epoch of each train
loader, workers 0, CPU seconds of the process; (2) peak RSS of a shards epoch at two SHARD_WINDOW values;
(3) tools/train.py on each source, same config. Prints a markdown table; figures go to docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner.data.memory import export_digits_jpegs
from runner.rundir.layout import RESULTS

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--cfg", str(ROOT / "configs" / "digits" / "resnet18.yaml"), "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "32",
        "DATA.BATCH_SIZE", "32", "DATA.NUM_WORKERS", "0", "LOG.PROGRESS", "plain"]


def make_data(work: Path, size: int, copies: int) -> tuple[Path, Path]:
    """The JPEG folder (train images repeated `copies` times) and its class-ordered shards."""
    jpegs = export_digits_jpegs(work / "jpegs", size=size)
    for path in sorted((jpegs / "train").glob("*/*.jpg")):
        for c in range(1, copies):
            os.link(path, path.with_name(f"{path.stem}_c{c}.jpg"))
    shards = work / "shards"
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_shards.py"), str(jpegs), str(shards),
                    "--shard-size", "500", "--class-order"], check=True, stdout=subprocess.DEVNULL)
    return jpegs, shards


def loader_epoch(argv: list[str]) -> dict:
    """In this process: one epoch of the train loader; CPU seconds, images, peak RSS (MiB)."""
    from runner import distributed
    from runner.config import load_config
    from runner.data import build_data

    cfg, _ = load_config(argv)
    loader = build_data(cfg, distributed.setup(cfg)).train
    loader.set_epoch(0, 0)
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    for x, _ in loader:
        n += len(x)
    cpu = time.process_time() - c0
    return {"images": n, "cpu_s": round(cpu, 2), "wall_s": round(time.perf_counter() - t0, 2),
            "img_per_cpu_s": round(n / cpu, 1),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def in_child(argv: list[str]) -> dict:
    """loader_epoch in a fresh process (its own peak RSS)."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.shards", "--child", json.dumps(argv)], cwd=ROOT,
                         capture_output=True, text=True, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(out.stdout.strip().splitlines()[-1])


def train(argv: list[str], out: Path) -> float:
    """tools/train.py; the final val/top1."""
    subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), *argv, "OUTPUT_DIR", str(out)], cwd=ROOT,
                   check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads((out / RESULTS).read_text())["val/top1"]


def main() -> None:
    """Build the data, measure, print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="", help="scratch folder (default: a temporary one, removed)")
    p.add_argument("--epochs", type=int, default=3, help="training epochs of the accuracy runs (0: none)")
    p.add_argument("--size", type=int, default=64, help="side of the stored JPEGs")
    p.add_argument("--copies", type=int, default=8, help="times each train image is stored")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(loader_epoch(json.loads(args.child))))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="shards_bench_"))
    try:
        jpegs, shards = make_data(work, args.size, args.copies)
        folder = [*BASE, "DATA.NAME", "folder", "DATA.ROOT", str(jpegs), "DATA.CHECK", "false"]
        sharded = [*BASE, "DATA.NAME", "shards", "DATA.ROOT", str(shards)]
        n_bytes = sum(f.stat().st_size for f in (shards / "train").glob("*.tar"))
        print(f"load: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} CPUs; train {n_bytes / 2**20:.1f} MiB "
              f"of shards, {args.size} px JPEGs x {args.copies}\n")
        print("| measure | folder | shards |\n|---|---|---|")
        f, s = in_child(folder), in_child(sharded)
        print(f"| loader img / CPU s (1 epoch, workers 0) | {f['img_per_cpu_s']} | {s['img_per_cpu_s']} |")
        print(f"| peak RSS MiB (1 epoch) | {f['peak_rss_mib']} | {s['peak_rss_mib']} (window 1000) |")
        for window in (64, 4000):
            r = in_child([*sharded, "DATA.SHARD_WINDOW", str(window)])
            print(f"| peak RSS MiB, SHARD_WINDOW {window} | | {r['peak_rss_mib']} |")
        if not args.epochs:
            return
        small = ["TRAIN.EPOCHS", str(args.epochs), "DATA.IMG_SIZE", "16"]
        top1 = [train([*cfg, *small], work / name) for name, cfg in (("f", folder), ("s", sharded))]
        print(f"| val/top1 after {args.epochs} epochs (class-ordered shards) | {top1[0]:.2f} | {top1[1]:.2f} |")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
