#!/usr/bin/env python
"""The runner against the raw loop on the CPU, alternating the two, with the ratio's median and spread.

    python benchmarks/cpu_ratio.py [--mode inprocess|process] [--rounds 9] [--steps 10] [--warmup 3]
        [--threads 0] [--cases a,b]

Cases (float32, synthetic data on the CPU, no channels_last, no compile):
    a: resnet18 at 64 px, batch 64        b: resnet10t at 32 px, batch 32
    c: test_resnet at 8 px, batch 2: almost no compute, so the ratio shows the step's fixed cost (the per-step
       Python and tensor-op overhead the runner adds: loss tracking, seeding, BatchNorm handling, the schedule),
       which on case b is a few percent; the summary gives it in microseconds per step
--clock cpu times each block by the process's CPU time instead of the wall clock: with --threads 1 it is the
work done, whatever else runs on a shared machine (a busy neighbour stretches the wall clock of both sides, but
not evenly).
--mode inprocess (default): one process builds both, the runner exactly as tools/benchmark.py does (its
loop and step with no hooks, its loader included) and the loop of benchmarks/raw_loop.py, warms both up, then
times them in alternating blocks of --steps steps; neighbouring blocks see the same machine load, which matters on
a shared machine. --mode process: each round runs tools/benchmark.py and benchmarks/raw_loop.py as separate
processes. Either way both use the same thread count (torch's default unless --threads) and the same
warm-up and timed steps, and the order flips every round (A B, B A, ...) so a drift in load favours neither.
The ratio is the runner's training img/s over the raw loop's, round by round; the machine's load average
is printed with each round. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {"a": ("resnet18", 64, 64), "b": ("resnet10t", 32, 32), "c": ("test_resnet", 8, 2)}
# The runner's default TRAIN.OPTIMIZER sgd is timm's Nesterov SGD; the loop must do the same arithmetic.
RAW_ARGS = ["--device", "cpu", "--nesterov"]


def commands(model: str, size: int, batch: int, steps: int, warmup: int) -> dict[str, list[str]]:
    """The two command lines for one case, identical in model, data, batch, steps and warm-up."""
    common = ["--steps", str(steps), "--warmup", str(warmup), "--infer-batches", "2"]
    runner = [sys.executable, str(ROOT / "tools" / "benchmark.py"), "DEVICE", "cpu", "DATA.NAME", "synthetic",
              "MODEL.NAME", model, "DATA.IMG_SIZE", str(size), "DATA.BATCH_SIZE", str(batch), *common]
    raw = [sys.executable, str(ROOT / "benchmarks" / "raw_loop.py"), *RAW_ARGS, "--model", model,
           "--img-size", str(size), "--batch-size", str(batch), *common]
    return {"runner": runner, "raw": raw}


def run_one(cmd: list[str], env: dict[str, str]) -> dict:
    """Run a benchmark process and return its last line, parsed."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def process_runners(name: str, args: argparse.Namespace, env: dict[str, str]) -> dict:
    """Callables that each run one whole benchmark process and return its training img/s."""
    model, size, batch = CASES[name]
    cmds = commands(model, size, batch, args.steps, args.warmup)
    return {which: (lambda c=cmd: run_one(c, env)["train_img_per_s"]) for which, cmd in cmds.items()}


def inprocess_runners(name: str, args: argparse.Namespace) -> dict:
    """Build both in this process, warm both up; callables that time one block of steps each."""
    from runner.process.startup import prepare

    prepare()  # the runner's CPU-thread choice for both, before raw_loop imports torch
    import raw_loop  # benchmarks/ is on sys.path: it is this script's own folder
    import torch

    from runner.bench.step import train_steps
    from runner.config import load_config
    from runner.engine import build_trainer

    model, size, batch = CASES[name]
    cfg, _ = load_config(["DEVICE", "cpu", "DATA.NAME", "synthetic", "MODEL.NAME", model,
                          "DATA.IMG_SIZE", str(size), "DATA.BATCH_SIZE", str(batch)])
    trainer = build_trainer(cfg, hooks=[])
    raw = raw_loop.RawLoop(raw_loop.parse_args([*RAW_ARGS, "--model", model, "--img-size", str(size),
                                                 "--batch-size", str(batch)]), torch.device("cpu"))
    train_steps(trainer, args.warmup)
    raw.train(args.warmup)

    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def block(step) -> float:
        t0 = clock()
        step(args.steps)
        return args.steps * batch / (clock() - t0)

    return {"runner": lambda: block(lambda n: train_steps(trainer, n)), "raw": lambda: block(raw.train)}


def run_case(name: str, args: argparse.Namespace, env: dict[str, str]) -> dict:
    """Alternate the two for `args.rounds` rounds; per-round figures and the summary."""
    model, size, batch = CASES[name]
    runs = inprocess_runners(name, args) if args.mode == "inprocess" else process_runners(name, args, env)
    rounds = []
    for r in range(args.rounds):
        order = ["runner", "raw"] if r % 2 == 0 else ["raw", "runner"]
        load = os.getloadavg()[0]
        got = {which: runs[which]() for which in order}
        ratio = got["runner"] / got["raw"]
        rounds.append({"runner": got["runner"], "raw": got["raw"], "ratio": ratio, "load1": load,
                       "first": order[0]})
        print(f"case {name} round {r + 1}/{args.rounds} ({order[0]} first, load {load:.2f}): runner "
              f"{got['runner']:.2f} img/s, raw {got['raw']:.2f} img/s, ratio {ratio:.3f}", flush=True)
    return {
        "case": name, "model": model, "img_size": size, "batch_size": batch, "rounds": rounds,
        "ratio": spread([r["ratio"] for r in rounds]),
        "runner_img_per_s": spread([r["runner"] for r in rounds]),
        "raw_img_per_s": spread([r["raw"] for r in rounds]),
        "load1": spread([r["load1"] for r in rounds]),
        # the runner's extra time per step, from each round's pair (negative: the runner was faster)
        "overhead_us": spread([batch * (1 / r["runner"] - 1 / r["raw"]) * 1e6 for r in rounds]),
    }


def main() -> None:
    """Run the cases and print the summary."""
    p = argparse.ArgumentParser(description="Runner vs raw loop training throughput on the CPU.")
    p.add_argument("--mode", default="inprocess", choices=("inprocess", "process"))
    p.add_argument("--rounds", type=int, default=9, help="alternations per case (default 9)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per block or process (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before (default 3)")
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for both; 0 = torch's default")
    p.add_argument("--cases", default="a,b", help="which cases, comma-separated: a, b, c (default a,b)")
    p.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                   help="wall clock, or the process's CPU time (inprocess only; use with --threads 1)")
    args = p.parse_args()
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
        # inprocess: before torch loads (runner.process.startup keeps it)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    results = [run_case(name.strip(), args, env) for name in args.cases.split(",")]
    print(f"\nstarted {started}, mode {args.mode}, clock {args.clock}, {os.cpu_count()} CPUs, threads "
          f"{args.threads or 'torch default'}, {args.steps} timed steps per block, {args.warmup} warm-up steps")
    for res in results:
        r, a, b = res["ratio"], res["runner_img_per_s"], res["raw_img_per_s"]
        print(f"case {res['case']} {res['model']} {res['img_size']}px batch {res['batch_size']}: ratio median "
              f"{r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f}) over {len(res['rounds'])} rounds; "
              f"runner {a['median']:.2f} img/s, raw {b['median']:.2f} img/s; the runner's extra time per step "
              f"{res['overhead_us']['median']:.0f} us (median); load {res['load1']['median']:.2f}")
    print(json.dumps({"mode": args.mode, "clock": args.clock, "threads": args.threads or None, "steps": args.steps,
                      "warmup": args.warmup, "cases": results}))


if __name__ == "__main__":
    main()
