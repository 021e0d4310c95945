#!/usr/bin/env python
"""Peak resident memory per process of a few AdamW steps of a ViT, DIST.STRATEGY ddp against fsdp, on N processes.

    python benchmarks/fsdp_memory.py [--model vit_base_patch16_224] [--procs 2 4] [--steps 3] [--md]

Each row is one real tools/train.py job under torchrun (gloo on the CPU; the digits at 32 px, batch 8 per process,
a checkpoint at the end, written synchronously). Every worker is started through this script (`--worker`), which
runs tools/train.py as its child and reports the child's peak RSS (getrusage's ru_maxrss): the whole process's
high-water mark, torch and timm included, not only the model's state. The model's state, for comparison: DDP holds
parameters, gradients and AdamW's two moments in float32 (16 bytes a parameter) in every process; FSDP 1/N of it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "configs" / "digits" / "test_resnet.yaml")


def worker(argv: list[str]) -> int:
    """Under torchrun: tools/train.py with this process's environment; then a line with the child's peak RSS."""
    code = subprocess.run([sys.executable, *argv], cwd=ROOT).returncode
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"PEAK_RSS rank={os.environ.get('RANK', '0')} kib={peak_kib}", flush=True)
    return code


def job(model: str, strategy: str, procs: int, steps: int, out: Path) -> list[int]:
    """One torchrun job; every rank's peak RSS in KiB, by rank."""
    train = ["tools/train.py", "--cfg", DIGITS, "MODEL.NAME", model, "DATA.IMG_SIZE", "32", "DATA.BATCH_SIZE", "8",
             "MODEL.CHANNELS_LAST", "false", "TRAIN.MAX_STEPS", str(steps), "DATA.NUM_WORKERS", "0",
             "LOG.PROGRESS", "plain", "CHECKPOINT.ASYNC", "false", "DIST.STRATEGY", strategy, "OUTPUT_DIR", str(out)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
           str(Path(__file__).resolve()), "--worker", *train]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{strategy} on {procs} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    found = dict(re.findall(r"PEAK_RSS rank=(\d+) kib=(\d+)", proc.stdout))
    return [int(found[str(r)]) for r in range(procs)]


def parameters(model: str) -> int:
    """The model's number of parameters as these jobs build it."""
    import timm

    return sum(p.numel() for p in timm.create_model(model, img_size=32, num_classes=10).parameters())


def main() -> None:
    """Run every (processes, strategy) pair and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="vit_base_patch16_224")
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--md", action="store_true", help="a Markdown table")
    args = ap.parse_args()
    n = parameters(args.model)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for procs in args.procs:
            for strategy in ("ddp", "fsdp"):
                peaks = job(args.model, strategy, procs, args.steps, Path(tmp) / f"{strategy}{procs}")
                state = 16 * n / (procs if strategy == "fsdp" else 1)
                rows.append({"procs": procs, "strategy": strategy, "peak_rss_mib": [p // 1024 for p in peaks],
                             "state_mib": round(state / 2**20)})
    print(f"{args.model}: {n / 1e6:.1f} M parameters")
    if args.md:
        print("| processes | strategy | peak RSS per process (MiB, by rank) | max | params+grads+AdamW (MiB) |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['procs']} | {r['strategy']} | {', '.join(map(str, r['peak_rss_mib']))} | "
                  f"{max(r['peak_rss_mib'])} | {r['state_mib']} |")
    else:
        for r in rows:
            print(json.dumps(r))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker(sys.argv[2:]))
    main()
