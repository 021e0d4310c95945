#!/usr/bin/env python
"""The search's samplers and schedulers on a synthetic job (issue 47, item 4): the real workers, journal, samplers
and schedulers, with each segment's training replaced by a stand-in trainer whose metric is a known function of the
hyperparameters plus noise that shrinks as a trial trains (early rungs rank partly noise, as early epochs of a long
cosine schedule do). It measures the search's decisions, not training, and says so. Prints one JSON line per
(sampler, scheduler) with the mean and standard deviation over seeds of the true quality of the best trial found
and of the epochs trained, then a markdown table.

    python benchmarks/search_synthetic.py [--trials 27] [--epochs 9] [--eta 3] [--seeds 5] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TRAINER = r'''
import hashlib, json, math, os, sys
from pathlib import Path
argv = sys.argv[1:]
pause = None
if "--pause-after-epoch" in argv:
    i = argv.index("--pause-after-epoch"); pause = int(argv[i + 1]); argv = argv[:i] + argv[i + 2:]
pairs = [a for a in argv if not a.startswith("--cfg")]
keys = dict(zip(pairs[::2], pairs[1::2]))
out = Path(keys["OUTPUT_DIR"]); out.mkdir(parents=True, exist_ok=True)
lr, wd, epochs = float(keys["TRAIN.LR"]), float(keys["TRAIN.WEIGHT_DECAY"]), int(keys["TRAIN.EPOCHS"])
metrics = out / "metrics.jsonl"
rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
done = rows[-1]["epoch"] if rows else 0
end = min(pause or epochs, epochs)
def quality():
    return 99.0 - 3.0 * (math.log10(lr) + 2.5) ** 2 - 1.0 * (math.log10(wd) + 3.5) ** 2
def noise(epoch):
    h = hashlib.sha256(f"{lr!r} {wd!r} {epoch}".encode()).digest()
    u1, u2 = (int.from_bytes(h[:8], "big") + 1) / 2**64, int.from_bytes(h[8:16], "big") / 2**64
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
with open(metrics, "a") as f:
    for e in range(done + 1, end + 1):
        left = 1 - e / epochs
        value = quality() - 8.0 * left + (4.0 * left + 0.05) * noise(e)
        f.write(json.dumps({"step": e, "epoch": e, "val/top1": value, "true": quality()}) + "\n")
(out / "run.json").write_text(json.dumps({"status": "done" if end >= epochs else "paused", "epoch": end}))
'''


def sweep(out: Path, args: argparse.Namespace, sampler: str, scheduler: str, seed: int) -> Path:
    """A search file over TRAIN.LR and TRAIN.WEIGHT_DECAY on the digits config (never trained: the stand-in)."""
    body = {"cfg": str(ROOT / "configs/digits/test_resnet.yaml"), "root": str(out / f"{sampler}_{scheduler}_{seed}"),
            "set": {"TRAIN.EPOCHS": args.epochs},
            "search": {"trials": args.trials, "sampler": sampler, "scheduler": scheduler, "seed": seed,
                       "asha": {"eta": args.eta, "min_epochs": 1},
                       "space": {"TRAIN.LR": {"log": [1.0e-5, 1.0]}, "TRAIN.WEIGHT_DECAY": {"log": [1.0e-6, 0.1]}}}}
    path = out / f"{sampler}_{scheduler}_{seed}.yaml"
    path.write_text(json.dumps(body) + "\n")
    return path


def run(path: Path, trainer: Path) -> dict:
    """One worker to the study's end; the best trial's true quality and the epochs trained."""
    code = ("import sys; from pathlib import Path; from runner.sweep import worker; "
            "from runner.sweep.search import load_search; "
            f"worker.TRAIN_PY = Path({str(trainer)!r}); "
            "sys.exit(worker.run_worker(load_search(sys.argv[1]), poll_s=0.05, log=lambda s: None))")
    subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, check=True)
    root = Path(json.loads(path.read_text())["root"])
    finals, spent = [], 0
    for trial in root.glob("trial_*"):
        rows = [json.loads(x) for x in (trial / "metrics.jsonl").read_text().splitlines()]
        spent += rows[-1]["epoch"]
        if rows[-1]["epoch"] == json.loads(path.read_text())["set"]["TRAIN.EPOCHS"]:
            finals.append((rows[-1]["val/top1"], rows[-1]["true"]))
    best = max(finals)[1] if finals else math.nan  # the trial the search calls best, by its own metric
    return {"best_true": best, "epochs": spent}


def main() -> None:
    """Every (sampler, scheduler) over --seeds seeds."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=27)
    p.add_argument("--epochs", type=int, default=9)
    p.add_argument("--eta", type=int, default=3)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="search-synthetic-"))
    out.mkdir(parents=True, exist_ok=True)
    trainer = out / "stand_in_train.py"
    trainer.write_text(TRAINER)
    table = ["| sampler | scheduler | best's true quality, mean ± sd | epochs, mean |", "|---|---|---|---|"]
    for sampler in ("random", "tpe"):
        for scheduler in ("asha", "hyperband"):
            got = [run(sweep(out, args, sampler, scheduler, seed), trainer) for seed in range(args.seeds)]
            best, spent = [g["best_true"] for g in got], [g["epochs"] for g in got]
            line = {"sampler": sampler, "scheduler": scheduler, "best_true": best, "epochs": spent,
                    "mean": statistics.mean(best), "sd": statistics.stdev(best) if len(best) > 1 else 0.0}
            print(json.dumps(line), flush=True)
            table.append(f"| {sampler} | {scheduler} | {line['mean']:.2f} ± {line['sd']:.2f} | "
                         f"{statistics.mean(spent):.0f} |")
    print("\n".join(table))


if __name__ == "__main__":
    main()
