#!/usr/bin/env python
"""The search's numbers (issue 37, section 3): ASHA against the same configs trained to the end, against random
search with ASHA's compute, and the cost of a pause and a resume. A benchmark, not a test: it prints one JSON line.

    python benchmarks/search.py [--trials 27] [--epochs 9] [--eta 3] [--seed 0] [--repeats 5] [--out DIR]
                                [--sampler random|tpe] [--scheduler asha|hyperband] [--cold]
                                [--asha-only | --overhead-only [--first-step-only]] [--loader-workers N]
                                [--cfg configs/digits/test_resnet.yaml] [KEY VALUE ...]

1. ASHA: a sweep file (written to OUT/search.yaml) over TRAIN.LR log [1e-5, 1] and TRAIN.WEIGHT_DECAY log [1e-6, 0.1]
   on the digits, `sampler: random` (--sampler) with `seed`, `asha: {eta, min_epochs: 1}` (rungs 1, 3, 9 for 9
   epochs; --scheduler asha or hyperband), run by one worker:
   `python -m runner.sweep search --no-table OUT/search.yaml KEY VALUE ...`. Its compute is the epochs its trials
   trained (each trial folder's last epoch in metrics.jsonl), its best the best COMPLETE trial's
   val/top1 at the last epoch (the study's value).
2. Full training: each of the study's N sampled configs (its trials' params, the same tools/train.py arguments)
   trained straight to TRAIN.EPOCHS in OUT/full/trial_N; compute N x EPOCHS, best the highest final val/top1.
3. Random search with ASHA's compute: N' = round(ASHA epochs / EPOCHS) full-length trials. The random sampler's
   draw of trial i depends on seed + i only, so the first N' configs of step 2 are exactly what random search with
   that seed would train: its best is read off step 2 (no training). Also given: the expected best of N' configs
   drawn at random (without replacement) from the N, a less lucky-or-unlucky figure than one draw.
4. Overhead of a promotion: `repeats` times, alternated, one config (--overhead-lr and --overhead-wd, by default
   the digits config's own 0.004 and 0.05) trained straight to epoch eta x min_epochs in one process, and paused
   after min_epochs (`--pause-after-epoch`) then resumed to the same epoch in a second process; the difference of
   the medians is the cost of one pause and resume (the second process's start-up, imports, checkpoint load, and
   the pause's exit). Whole processes, timed from launch to exit. Then the same pairs forked from one warm server
   (runner/sweep/warm.py), as a worker starts its segments, and the time from asking for a promotion (epoch
   first to the next rung, resumed from the checkpoint) to its first step's row in metrics.jsonl (LOG.PERIOD 1),
   warm against a new process. --loader-workers N: every run reads the digits as an image folder (DATA.NAME
   folder, written once to OUT/digits at DATA.IMG_SIZE) through N loader workers (DATA.NUM_WORKERS N), so each
   segment starts its loader workers' fork server too (the warm server then preloads the folder source, as a
   worker's does).

The worker forks its segments from its warm server; --cold: each a new process (the earlier way), for a
before/after; --asha-only: step 1 alone; --overhead-only: step 4 alone (--first-step-only: its
time to the first step alone). Goal (issue 47): the wall-time saving
at least 0.8 of the epoch saving.
Everything runs one process after another (one worker): on a shared machine set OMP_NUM_THREADS=1 to keep other
people's load from making the threads wait on each other (docs/PERFORMANCE.md, "CPU threads on a loaded machine").
Goals (issue 37): ASHA's epochs at most 1/3 of full training's; ASHA's best within 0.3 points of full training's.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from digits_seeds import cpu_model, load  # benchmarks/ is on sys.path: it is this script's own folder

ROOT = Path(__file__).resolve().parents[1]

SET = {"DATA.IMG_SIZE": 16, "DATA.NUM_WORKERS": 0, "MODEL.NAME": "test_resnet"}
SPACE = {"TRAIN.LR": {"log": [1.0e-5, 1.0]}, "TRAIN.WEIGHT_DECAY": {"log": [1.0e-6, 0.1]}}
METRIC = "val/top1"
COMPUTE_GOAL = 1 / 3
QUALITY_GOAL = 0.3
WALL_GOAL = 0.8  # issue 47: the wall-time saving at least 0.8 of the epoch saving


def sweep_file(out: Path, args: argparse.Namespace) -> Path:
    """OUT/search.yaml: the digits over LR and weight decay, random sampler, ASHA from epoch 1."""
    body = {"cfg": str((ROOT / args.cfg).resolve()), "root": str(out / "asha"),
            "set": {**SET, "TRAIN.EPOCHS": args.epochs},
            "search": {"metric": METRIC, "mode": "max", "trials": args.trials, "sampler": args.sampler,
                       "scheduler": args.scheduler, "seed": args.seed, "asha": {"eta": args.eta, "min_epochs": 1},
                       "space": SPACE}}
    path = out / "search.yaml"
    path.write_text(json.dumps(body, indent=1) + "\n")  # JSON is YAML
    return path


def folder_overrides(workers: int, out: Path) -> list[str]:
    """KEY VALUE pairs that read the digits as an image folder (OUT/digits, written once) through `workers`
    loader workers; none for 0."""
    if not workers:
        return []
    from runner.data.memory import export_digits_jpegs

    data = out / "digits"
    if not (data / "val").is_dir():
        export_digits_jpegs(data, size=SET["DATA.IMG_SIZE"])
    return ["DATA.NAME", "folder", "DATA.ROOT", str(data), "DATA.NUM_WORKERS", str(workers)]


def timed(cmd: list[str], log: Path | None = None) -> float:
    """Run `cmd` from the repository root (output to `log`, appended); its wall seconds; exit on failure."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    t0 = time.perf_counter()
    try:
        code = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
    finally:
        if log:
            out.close()
    if code != 0:
        sys.exit(f"failed (exit {code}): {' '.join(cmd)}" + (f"; see {log}" if log else ""))
    return time.perf_counter() - t0


def last_epoch(run: Path) -> int:
    """The last epoch a run folder trained (its metrics.jsonl; 0 when there is none)."""
    from runner.rundir import reader

    return max((int(r.get("epoch", 0)) for r in reader.metrics_rows(run)), default=0)


def final_value(run: Path, epoch: int) -> float | None:
    """The metric of the evaluation at the end of `epoch` in a run folder (None when absent)."""
    from runner.rundir import reader

    rows = [r for r in reader.metrics_rows(run) if r.get("epoch") == epoch and METRIC in r]
    return float(rows[-1][METRIC]) if rows else None


def run_asha(path: Path, extra: list[str], out: Path, cold: bool = False) -> dict:
    """One worker over the study (its segments warm, or `cold`: each a new process); its epochs, promotions,
    best trial and wall time."""
    from optuna.trial import TrialState

    from runner.sweep import asha
    from runner.sweep.search import load_search
    from runner.sweep.study import open_study

    cmd = [sys.executable, "-m", "runner.sweep", "search", "--no-table", *(["--cold"] if cold else []), str(path),
           *extra]
    wall = timed(cmd, out / "asha.log")
    search = load_search(str(path), extra)
    trials = open_study(search, create=False).get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    best = max(done, key=lambda t: t.value)
    reached = [asha.reached(t, search.rungs) for t in trials]
    return {"search": search, "trials": trials, "done": done, "wall_s": wall,
            "epochs": sum(last_epoch(Path(search.trial_dir(t.number))) for t in trials),
            "segments": sum(len(t.intermediate_values) for t in trials),
            "promotions": sum(len(t.intermediate_values) - 1 for t in trials if t.intermediate_values),
            "reached": {str(r): reached.count(r) for r in search.rungs},
            "failed": sum(t.state == TrialState.FAIL for t in trials),
            "complete": len(done), "best": best.value, "best_trial": best.number}


def run_full(search, trials, out: Path) -> dict:
    """Each sampled config trained straight to the end; the finals by trial number, compute and wall time."""
    epochs = search.rungs[-1]
    finals, wall = {}, 0.0
    for t in trials:
        run = out / "full" / f"trial_{t.number}"
        wall += timed(train_cmd(search, t.params, run), out / "full.log")
        finals[t.number] = final_value(run, epochs)
        print(f"full: trial {t.number}: {finals[t.number]}", file=sys.stderr, flush=True)
    return {"finals": finals, "epochs": sum(last_epoch(out / "full" / f"trial_{n}") for n in finals), "wall_s": wall}


def expected_best(values: list[float], k: int) -> float:
    """The expected best of k values drawn without replacement from `values`."""
    ranked, n = sorted(values), len(values)
    return sum(v * math.comb(i, k - 1) for i, v in enumerate(ranked)) / math.comb(n, k)


def random_same_compute(finals: dict[int, float], asha_epochs: int, epochs: int) -> dict:
    """Random search with ASHA's epochs: the first N' configs' best, and the expected best of N' of the N."""
    k = max(1, min(len(finals), round(asha_epochs / epochs)))
    first = [finals[n] for n in sorted(finals)[:k]]
    return {"trials": k, "epochs": k * epochs, "best_first": max(first),
            "best_expected": expected_best(list(finals.values()), k)}


def overhead(search, args: argparse.Namespace, out: Path) -> dict:
    """Straight to the second rung against paused at the first and resumed, `repeats` times alternated."""
    first, to = search.rungs[0], search.rungs[min(1, len(search.rungs) - 1)]
    params = {"TRAIN.LR": args.overhead_lr, "TRAIN.WEIGHT_DECAY": args.overhead_wd}
    log = out / "overhead.log"
    straight, split = zip(*(_pair(lambda cmd: timed(cmd, log), search, params, out / "overhead", i, first, to)
                            for i in range(args.repeats)), strict=True)
    straight, split = list(straight), list(split)
    return {"config": params, "from_epoch": first, "to_epoch": to, "straight_s": straight,
            "paused_resumed_s": split, "per_promotion_s": statistics.median(split) - statistics.median(straight)}


def warm_overhead(search, args: argparse.Namespace, out: Path) -> dict:
    """Per promotion with warm segments (forked from one warm server, as a worker does), and the time from a
    promotion's request to its first step (its first metrics.jsonl row at LOG.PERIOD 1), warm and cold
    (--first-step-only: that time alone)."""
    from runner.sweep.warm import WarmServer, preload_for

    first, to = search.rungs[0], search.rungs[min(1, len(search.rungs) - 1)]
    params = {"TRAIN.LR": args.overhead_lr, "TRAIN.WEIGHT_DECAY": args.overhead_wd}
    server, log = WarmServer(preload_for("folder" if args.loader_workers else None)), out / "overhead_warm.log"
    server.start()
    (out / "noop.py").write_text("")
    server.segment([str(out / "noop.py")], log).wait()  # the server's imports done before anything is timed
    straight, split, warm_first, cold_first = [], [], [], []
    try:
        for i in range(args.repeats):
            if not args.first_step_only:
                pair = _pair(lambda cmd: _segment_s(server, cmd, log), search, params, out / "warm", i, first, to)
                straight.append(pair[0])
                split.append(pair[1])
            for runs, via in ((warm_first, server), (cold_first, None)):
                run = out / ("warm" if via else "cold") / f"first_{i}"
                cmd = [*train_cmd(search, params, run), "LOG.PERIOD", "1"]
                timed([*cmd, "--pause-after-epoch", str(first)], log)
                runs.append(_first_step_s(via, [*cmd, "--pause-after-epoch", str(to)], run, log))
    finally:
        server.close()
    pairs = {"warm_straight_s": straight, "warm_paused_resumed_s": split,
             "warm_per_promotion_s": statistics.median(split) - statistics.median(straight)} if straight else {}
    return pairs | {"promotion_to_first_step_warm_s": warm_first, "promotion_to_first_step_cold_s": cold_first,
                    "promotion_to_first_step_warm_median_s": statistics.median(warm_first),
                    "promotion_to_first_step_cold_median_s": statistics.median(cold_first)}


def _pair(run, search, params: dict, folder: Path, i: int, first: int, to: int) -> tuple[float, float]:
    """One config trained straight to epoch `to`, then paused after `first` and resumed to `to`, each segment's
    seconds from `run(cmd)`: (straight, paused and resumed)."""
    one = train_cmd(search, params, folder / f"straight_{i}")
    straight = run([*one, "--pause-after-epoch", str(to)])
    two = train_cmd(search, params, folder / f"split_{i}")
    return straight, run([*two, "--pause-after-epoch", str(first)]) + run([*two, "--pause-after-epoch", str(to)])


def _segment_s(server, cmd: list[str], log: Path) -> float:
    """One segment forked from `server` (cmd without its interpreter); its wall seconds; exit on failure."""
    t0 = time.perf_counter()
    code = server.segment(cmd[1:], log).wait()
    if code != 0:
        sys.exit(f"failed (exit {code}): {' '.join(cmd)}; see {log}")
    return time.perf_counter() - t0


def _first_step_s(server, cmd: list[str], run: Path, log: Path) -> float:
    """Seconds from asking for a resumed segment (forked from `server`, or a new process when None) to its first
    step's row in run/metrics.jsonl; the segment is then waited for."""
    rows = run / "metrics.jsonl"
    before = rows.stat().st_size
    t0 = time.perf_counter()
    if server is None:
        with open(log, "ab") as f:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    else:
        proc = server.segment(cmd[1:], log)
    while b"train/loss" not in rows.read_bytes()[before:]:
        if proc.poll() is not None:
            sys.exit(f"ended before its first step (exit {proc.poll()}): {' '.join(cmd)}; see {log}")
        time.sleep(0.002)
    seconds = time.perf_counter() - t0
    if proc.wait() != 0:
        sys.exit(f"failed: {' '.join(cmd)}; see {log}")
    return seconds


def train_cmd(search, params: dict, run: Path) -> list[str]:
    """tools/train.py with the search's config, `params` for the space, into `run`."""
    return [sys.executable, str(ROOT / "tools" / "train.py"), *search.argv(params, str(run))]


def report(args, asha_run: dict, full: dict, rnd: dict, cost: dict, before: str) -> dict:
    """The one JSON object: settings, the four measurements, the goals."""
    import torch

    full_best = max(full["finals"].values())
    ratio = asha_run["epochs"] / full["epochs"]
    gap = full_best - asha_run["best"]
    wall_share = (1 - asha_run["wall_s"] / full["wall_s"]) / (1 - ratio)
    best_cfg = asha_run["trials"][asha_run["best_trial"]].params
    return {
        "benchmark": "search", "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "cpu": cpu_model(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "load_before": before, "load_after": load(),
        "cfg": args.cfg, "set": {**SET, "TRAIN.EPOCHS": args.epochs}, "extra": args.overrides, "space": SPACE,
        "trials": args.trials, "eta": args.eta, "seed": args.seed, "rungs": list(asha_run["search"].rungs),
        "sampler": args.sampler, "scheduler": args.scheduler,
        "asha": {k: asha_run[k] for k in ("epochs", "segments", "promotions", "reached", "complete", "failed",
                                          "best", "best_trial", "wall_s")} | {"best_params": best_cfg},
        "full": {"epochs": full["epochs"], "best": full_best, "best_trial": max(full["finals"],
                 key=full["finals"].get), "wall_s": full["wall_s"],
                 "finals": {str(n): v for n, v in sorted(full["finals"].items())},
                 "asha_best_rank": 1 + sum(v > full["finals"][asha_run["best_trial"]] for v in full["finals"].values()),
                 "asha_complete_equal": all(full["finals"][t.number] == t.value for t in asha_run["done"])},
        "random": rnd if args.sampler == "random" else "n/a: the first N' configs are the sampler's, not random's",
        "overhead": cost,
        "worker": "cold" if args.cold else "warm",
        "goals": {"compute_ratio": ratio, "compute_met": ratio <= COMPUTE_GOAL, "gap_points": gap,
                  "quality_met": gap <= QUALITY_GOAL, "wall_saving_over_epoch_saving": wall_share,
                  "wall_met": wall_share >= WALL_GOAL},
    }


def main() -> None:
    """Parse the arguments, run the four parts one after another, print the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cfg", default="configs/digits/test_resnet.yaml")
    p.add_argument("--trials", type=int, default=27)
    p.add_argument("--epochs", type=int, default=9)
    p.add_argument("--eta", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sampler", default="random", choices=("random", "tpe"),
                   help="the search's sampler (step 3's random-search figure holds for random only)")
    p.add_argument("--scheduler", default="asha", choices=("asha", "hyperband"), help="the search's scheduler")
    p.add_argument("--repeats", type=int, default=5, help="pairs of runs timed for the overhead")
    p.add_argument("--overhead-lr", type=float, default=0.004, help="the config timed for the overhead: TRAIN.LR")
    p.add_argument("--overhead-wd", type=float, default=0.05, help="... and TRAIN.WEIGHT_DECAY")
    p.add_argument("--cold", action="store_true", help="the worker starts each segment as a new process")
    p.add_argument("--asha-only", action="store_true", help="the search alone: no full training, no overhead")
    p.add_argument("--overhead-only", action="store_true", help="step 4 alone (cold and warm)")
    p.add_argument("--first-step-only", action="store_true",
                   help="with --overhead-only: a promotion's request to its first step alone, warm and cold")
    p.add_argument("--loader-workers", type=int, default=0, metavar="N",
                   help="the digits as an image folder read by N loader workers (default 0: in memory)")
    p.add_argument("--out", default=None, help="work folder (default: a new one under /tmp, kept)")
    p.add_argument("overrides", nargs="*", help="KEY VALUE pairs for every run")
    args = p.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-search-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.overrides = [*folder_overrides(args.loader_workers, out), *args.overrides]
    before = load()
    if args.overhead_only:
        from runner.sweep.search import load_search

        search = load_search(str(sweep_file(out, args)), args.overrides)
        cost = ({} if args.first_step_only else overhead(search, args, out)) | warm_overhead(search, args, out)
        print(json.dumps({"benchmark": "search overhead", "cpu": cpu_model(), "load_before": before,
                          "load_after": load(), "loader_workers": args.loader_workers, "out": str(out),
                          "overhead": cost}), flush=True)
        return
    asha_run = run_asha(sweep_file(out, args), args.overrides, out, args.cold)
    print(f"asha: {asha_run['epochs']} epochs, best {asha_run['best']:.2f}, {asha_run['wall_s']:.1f} s",
          file=sys.stderr, flush=True)
    if args.asha_only:
        print(json.dumps({"benchmark": "search", "worker": "cold" if args.cold else "warm", "cpu": cpu_model(),
                          "load_before": before, "load_after": load(), "out": str(out),
                          "asha": {k: asha_run[k] for k in ("epochs", "segments", "promotions", "complete", "best",
                                                            "best_trial", "wall_s")}}), flush=True)
        return
    full = run_full(asha_run["search"], asha_run["trials"], out)
    rnd = random_same_compute(full["finals"], asha_run["epochs"], args.epochs)
    cost = overhead(asha_run["search"], args, out) | warm_overhead(asha_run["search"], args, out)
    result = report(args, asha_run, full, rnd, cost, before)
    result["out"] = str(out)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
