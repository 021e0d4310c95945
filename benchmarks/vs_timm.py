#!/usr/bin/env python
"""The runner against timm's own train.py on the same job: whole-process wall time, CPU time and final top-1.

    python benchmarks/vs_timm.py --timm-train PATH/TO/timm/train.py [--runs 3] [--epochs 10] [--work DIR]
        [--model resnet18] [--size 32] [--workers 2] [--tree CHECKOUT]

timm's train.py is not part of this project: fetch timm's repository (or take train.py from a checkout of the
timm release that is installed) to a scratch folder and name the file. The job is the issue's: scikit-learn's
digits exported once as a 32 px JPEG folder (1,437 train / 360 val, the same split as DATA.NAME digits),
resnet18, batch 64, SGD 0.1 momentum 0.9, weight decay 5e-5, cosine with 1 warm-up epoch, label smoothing 0.1,
no augmentation (timm's --no-aug; ours: whole-image crops, no flip, no jitter), 2 loader workers, mean/std 0.5,
crop 1.0, on the CPU, no channels_last. Each round runs both as separate processes, in alternating order (ours
first in even rounds), so a drift in the machine's load favours neither. CPU time is the finished child's user +
system time, its loader workers included. Prints a table and, last, one JSON line.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner.rundir.layout import RESULTS

ROOT = Path(__file__).resolve().parents[1]


def _ours(data: Path, out: Path, a: argparse.Namespace) -> list[str]:
    """tools/train.py with the job's settings."""
    keys = {"DATA.NAME": "folder", "DATA.ROOT": str(data), "MODEL.NAME": a.model, "MODEL.NUM_CLASSES": "10",
            "DATA.IMG_SIZE": str(a.size), "DATA.BATCH_SIZE": "64", "TRAIN.EPOCHS": str(a.epochs),
            "TRAIN.OPTIMIZER": "sgd", "TRAIN.LR": "0.1", "TRAIN.MOMENTUM": "0.9", "TRAIN.WEIGHT_DECAY": "5e-5",
            "TRAIN.WARMUP_EPOCHS": "1", "TRAIN.LABEL_SMOOTHING": "0.1", "AUG.SCALE": "[1.0, 1.0]",
            "AUG.RATIO": "[1.0, 1.0]", "AUG.HFLIP": "0", "AUG.COLOR_JITTER": "0", "AUG.CROP_PCT": "1.0",
            "DATA.NUM_WORKERS": str(a.workers), "DATA.MEAN": "[0.5, 0.5, 0.5]", "DATA.STD": "[0.5, 0.5, 0.5]",
            "MODEL.CHANNELS_LAST": "false", "SEED": "0", "OUTPUT_DIR": str(out)}
    return [sys.executable, str(a.tree / "tools" / "train.py"), *[x for kv in keys.items() for x in kv]]


def _timm(data: Path, out: Path, a: argparse.Namespace) -> list[str]:
    """timm's train.py with the same settings."""
    return [sys.executable, str(a.timm_train), "--data-dir", str(data), "--train-split", "train", "--val-split",
            "val", "--model", a.model, "--num-classes", "10", "--img-size", str(a.size), "-b", "64",
            "--epochs", str(a.epochs), "--opt", "sgd", "--lr", "0.1", "--momentum", "0.9", "--weight-decay", "5e-5",
            "--sched", "cosine", "--warmup-epochs", "1", "--warmup-lr", "1e-5", "--min-lr", "0",
            "--smoothing", "0.1", "--no-aug", "-j", str(a.workers), "--mean", "0.5", "0.5", "0.5", "--std", "0.5",
            "0.5", "0.5", "--crop-pct", "1.0", "--interpolation", "bilinear", "--device", "cpu", "--no-prefetcher",
            "--seed", "0", "--checkpoint-hist", "1", "--output", str(out.parent), "--experiment", out.name]


def _top1(which: str, out: Path) -> float:
    """The final val/top1 each tool recorded."""
    if which == "ours":
        return float(json.loads((out / RESULTS).read_text())["val/top1"])
    with open(out / "summary.csv") as f:
        return float(list(csv.DictReader(f))[-1]["eval_top1"])


def _user_env() -> dict[str, str]:
    """This shell's environment without what importing runner put into it (its CPU thread choice): both tools
    start as a user would start them, and ours makes its own choice again."""
    from runner.process import threads

    ours = [item.split("=", 1)[0] for item in os.environ.get(threads.MARKER, "").split()]
    return {k: v for k, v in os.environ.items() if k not in ours and k != threads.MARKER}


def _run(which: str, cmd: list[str], out: Path, tree: Path = ROOT) -> dict:
    """One whole-process run: wall seconds, CPU seconds (its workers included) and top-1; ours imports the runner
    of `tree` (another checkout goes first on PYTHONPATH)."""
    env = _user_env()
    if which == "ours" and tree.resolve() != ROOT:
        env["PYTHONPATH"] = os.pathsep.join([str(tree.resolve()), *filter(None, [env.get("PYTHONPATH")])])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent, env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"error: {which} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "top1": _top1(which, out),
            "load": os.getloadavg()[0]}


def _table(rows: dict[str, list[dict]]) -> dict:
    """Medians per tool and the ours/timm ratios, printed as a table; returned for the JSON line."""
    med = {w: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "top1")} for w, rs in rows.items()}
    print("| tool | wall s (median) | CPU s (median) | val/top1 (median) | runs (wall / CPU / top1) |")
    print("|---|---:|---:|---:|---|")
    for w, rs in rows.items():
        each = ", ".join(f"{r['wall_s']:.1f}/{r['cpu_s']:.1f}/{r['top1']:.2f}" for r in rs)
        print(f"| {w} | {med[w]['wall_s']:.1f} | {med[w]['cpu_s']:.1f} | {med[w]['top1']:.2f} | {each} |")
    ratio = {k: round(med["ours"][k] / med["timm"][k], 3) for k in ("wall_s", "cpu_s")}
    print(f"ours / timm: wall {ratio['wall_s']:.3f}, CPU {ratio['cpu_s']:.3f}")
    return {"median": med, "ratio": ratio, "runs": rows}


def main() -> None:
    """Export the folder once, then the paired rounds."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timm-train", type=Path, required=True, help="timm's train.py (outside this project)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    p.add_argument("--tree", type=Path, default=ROOT,
                   help="the runner checkout to time (default: this one; e.g. a `git worktree` of an older commit)")
    a = p.parse_args()
    if not a.timm_train.is_file():
        p.error(f"--timm-train {a.timm_train} is not a file")
    from runner.data.memory import export_digits_jpegs

    work = a.work or Path(tempfile.mkdtemp(prefix="vs_timm."))
    data = work / "digits"
    if not (data / "train").is_dir():
        export_digits_jpegs(data, size=a.size)
    rows: dict[str, list[dict]] = {"ours": [], "timm": []}
    for i in range(a.runs):
        for which in (("ours", "timm") if i % 2 == 0 else ("timm", "ours")):
            out = work / f"{which}-{i}-{time.time_ns()}"
            out.parent.mkdir(parents=True, exist_ok=True)
            cmd = (_ours if which == "ours" else _timm)(data, out, a)
            rows[which].append(_run(which, cmd, out, a.tree))
            print(f"round {i} {which}: {rows[which][-1]}", flush=True)
    result = _table(rows)
    print(json.dumps({"job": vars(a) | {"timm_train": str(a.timm_train), "work": str(work)}, **result}, default=str))


if __name__ == "__main__":
    main()
