"""A torchrun worker for tests/test_checkpoint.py: each rank's RNG state saved through rank 0, then restored.

`python -m torch.distributed.run --nproc_per_node 2 -m tests.rng_worker OUT` writes OUT/rank<r>.json.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as tdist

from runner import checkpoint
from runner.distributed import Dist


def draws() -> list:
    """One draw from each generator a run uses."""
    return [torch.rand(3).tolist(), random.random(), float(np.random.rand())]


def seed(value: int) -> None:
    """Seed python, numpy and torch alike."""
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value)


def main(out: Path) -> None:
    """Seed each rank differently, save, draw; reseed alike, restore from the file, draw again."""
    tdist.init_process_group("gloo")
    rank = tdist.get_rank()
    dist = Dist(rank, tdist.get_world_size(), rank, torch.device("cpu"))
    seed(100 + rank)
    saved = checkpoint.capture_rng(dist, tdist.group.WORLD)
    if dist.is_main:
        checkpoint.atomic_save({"rng": saved}, out / "rng.pth")
    first = draws()
    seed(0)  # every rank alike, as a fresh start of the job is
    tdist.barrier()
    checkpoint.restore_rng(checkpoint.load_file(out / "rng.pth")["rng"], dist)
    result = {"first": first, "again": draws(), "gathered": None if saved is None else len(saved)}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    tdist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
