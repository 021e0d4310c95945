"""Two optimizer steps of a tiny timm ViT sharded with the runner's fsdp against the same model whole (what ddp
computes), for each optimizer named; run under torchrun (tests/test_fsdp_compose.py).

    torchrun --nproc_per_node=2 tests/fsdp_optimizers.py OUT.jsonl NAME[:LAYER_DECAY] ...

Each name: the runner's build_optimizer on both models with the same config; each process trains the sharded model
on its half of a fixed global batch and the whole model on all of it. Rank 0 writes one JSON line per name:
{"name", "fsdp": [3 global losses], "whole": [3 losses]} or {"name", "error": the first line of the failure}.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as tdist
import torch.nn.functional as F

BATCH = 8  # the global batch; each of the 2 processes takes half


def config(name: str, decay: float):
    """The runner's config for `name` under fsdp (TRAIN.LR small enough that sign-based optimizers stay close)."""
    from runner.config.loader import load_config

    cfg, _ = load_config(["MODEL.NAME", "test_vit", "DATA.IMG_SIZE", "16", "MODEL.NUM_CLASSES", "10",
                          "MODEL.CHANNELS_LAST", "false", "DIST.STRATEGY", "fsdp", "TRAIN.OPTIMIZER", name,
                          "TRAIN.LR", "0.001", "TRAIN.WEIGHT_DECAY", "0.01", "TRAIN.LAYER_DECAY", str(decay),
                          "OUTPUT_DIR", "unused"], check_paths=False)
    return cfg


def losses(model, optimizer, x, y, world: int) -> list[float]:
    """The global loss of 3 forwards with an optimizer step after the first two (averaged over the processes)."""
    from runner.optim import ConstantLR

    ConstantLR(optimizer)  # the layer decay's lr_scale, as the schedules apply it
    out = []
    for i in range(3):
        loss = F.cross_entropy(model(x), y)
        seen = loss.detach().clone()
        if world > 1:
            tdist.all_reduce(seen)
        out.append(seen.item() / world)
        if i < 2:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return out


def one(name: str, decay: float, rank: int, world: int) -> dict:
    """Both runs of one optimizer."""
    import timm

    from runner.distributed import Dist
    from runner.fsdp import shard
    from runner.optim import build_optimizer

    cfg = config(name, decay)
    make = partial(timm.create_model, "test_vit", img_size=16, num_classes=10)
    torch.manual_seed(0)
    whole = make()
    sharded = shard(copy.deepcopy(whole), cfg, Dist(rank, world, rank, torch.device("cpu")), make, announce=False)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, 3, 16, 16, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    half = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    cpu = torch.device("cpu")
    got = losses(sharded, build_optimizer(cfg, sharded, cpu, world), x[half], y[half], world)
    want = losses(whole, build_optimizer(cfg, whole, cpu, 1), x, y, 1)
    return {"name": name, "decay": decay, "fsdp": got, "whole": want}


def run(spec: str, rank: int, world: int) -> dict:
    """One NAME[:LAYER_DECAY]: its result or its error."""
    name, _, decay = spec.partition(":")
    try:
        return one(name, float(decay or 0), rank, world)
    except Exception as e:  # noqa: BLE001 - the refusal the test expects is decided from this line
        return {"name": name, "decay": float(decay or 0),
                "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


def main() -> None:
    """Every name in argv, rank 0 writing the results."""
    from runner.process import startup

    startup.prepare()
    tdist.init_process_group("gloo", timeout=timedelta(seconds=int(os.environ.get("FSDP_OPTIM_TIMEOUT_S", "60"))))
    rank, world = tdist.get_rank(), tdist.get_world_size()
    torch.set_num_threads(1)
    with open(sys.argv[1], "w") if rank == 0 else contextlib.nullcontext() as f:
        for spec in sys.argv[2:]:
            line = run(spec, rank, world)
            tdist.barrier()
            if f is not None:  # as it goes: a name that hangs is the one after the last line
                f.write(json.dumps(line) + "\n")
                f.flush()
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
