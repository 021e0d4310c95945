#!/usr/bin/env python
"""What a checkpoint costs the training thread, written on the step (CHECKPOINT.ASYNC False) or in the background.

    python -m benchmarks.checkpoint_stall [--jobs digits,resnet50] [--modes sync,async] [-- KEY VALUE ...]

Each (job, mode) is one real `tools/train.py` run in a child process into a fresh temporary folder, in which
Checkpointer.save and Checkpointer.wait are timed as they return: the stall per save (what the step waited for:
with ASYNC the host copy, plus the previous write when it had not ended), and every wait that found a write still
pending (the run's last save, stops, and those inside a save, which its stall counts as well). The jobs:
`digits` (configs/digits/resnet18.yaml, the README's run, 4 epochs: a checkpoint at each epoch's end) and
`resnet50` (224 px synthetic images, batch 2, 8 steps, CHECKPOINT.PERIOD 2: a 180 MB checkpoint every other
step). Prints one row per run (checkpoint size, saves, stall per save median, max and total, write waits, the
run's wall time and the child process's) and the machine's load before and after; the last line is all the rows
as JSON. The runs go one after another: a machine busy with other work shows in the load lines.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "digits": ["--cfg", "configs/digits/resnet18.yaml", "TRAIN.EPOCHS", "4"],
    "resnet50": ["MODEL.NAME", "resnet50", "DATA.NAME", "synthetic", "DATA.IMG_SIZE", "224", "DATA.BATCH_SIZE", "2",
                 "DATA.SYNTHETIC_SIZE", "40", "MODEL.NUM_CLASSES", "10", "TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "8",
                 "CHECKPOINT.PERIOD", "2", "DATA.EVAL_BATCH_SIZE", "8", "LOG.PERIOD", "1"],
}
MODES = {"sync": "False", "async": "True"}


def child(record: str, train_args: list[str]) -> None:
    """In the child: time every Checkpointer.save and wait into `record` (a JSON line each), then run train.py."""
    from runner.engine import hooks

    def timed(name: str, method):
        def call(self, *args):
            pending = self.writer is not None and self.writer.pending
            t0 = time.perf_counter()
            try:
                return method(self, *args)
            finally:  # a line per call, written at once: the process ends with os._exit
                if name == "save" or pending:
                    with open(record, "a") as f:
                        f.write(json.dumps({"call": name, "s": time.perf_counter() - t0}) + "\n")
        return call

    hooks.Checkpointer.save = timed("save", hooks.Checkpointer.save)
    hooks.Checkpointer.wait = timed("wait", hooks.Checkpointer.wait)
    sys.argv = [str(ROOT / "tools" / "train.py"), *train_args]
    runpy.run_path(sys.argv[0], run_name="__main__")


def one_run(job: str, mode: str, extra: list[str]) -> dict:
    """Train `job` with CHECKPOINT.ASYNC as `mode` says; its row."""
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp, "calls.jsonl")
        args = [*JOBS[job], "CHECKPOINT.ASYNC", MODES[mode], "LOG.TENSORBOARD", "False", *extra,
                "OUTPUT_DIR", f"{tmp}/run"]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "benchmarks.checkpoint_stall", "--child", str(record), "--", *args],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        whole = time.perf_counter() - t0
        calls = [json.loads(line) for line in record.read_text().splitlines()]
        size = max(p.stat().st_size for p in Path(tmp, "run", "checkpoints").glob("step_*.pth")) / 2**20
        wall = json.loads(Path(tmp, "run", "results.json").read_text())["wall_s"]
    saves = [c["s"] for c in calls if c["call"] == "save"]
    waits = [c["s"] for c in calls if c["call"] == "wait"]
    return {"job": job, "mode": mode, "ckpt_mb": round(size, 1), "saves": len(saves),
            "stall_median_s": round(statistics.median(saves), 3), "stall_max_s": round(max(saves), 3),
            "stall_total_s": round(sum(saves), 3), "waits_s": round(sum(waits), 3), "run_wall_s": round(wall, 1),
            "process_s": round(whole, 1)}


def load() -> str:
    """The 1, 5 and 15-minute load averages and the core count."""
    return f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])} on {os.cpu_count()} cores"


def main() -> None:
    """Every job in every mode, one after the other; a table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help="config overrides for every run")
    opts = parser.parse_args()
    if opts.child:
        child(opts.child, opts.extra)
        return
    print(f"load before: {load()}", flush=True)
    rows = []
    print("| job | mode | checkpoint MB | saves | stall/save median s | max s | stall total s | write waits s | "
          "run wall s | process s |\n|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for job in opts.jobs.split(","):
        for mode in opts.modes.split(","):
            r = one_run(job, mode, opts.extra)
            rows.append(r)
            print(f"| {job} | {mode} | {r['ckpt_mb']} | {r['saves']} | {r['stall_median_s']} | {r['stall_max_s']} | "
                  f"{r['stall_total_s']} | {r['waits_s']} | {r['run_wall_s']} | {r['process_s']} |", flush=True)
    print(f"load after: {load()}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
