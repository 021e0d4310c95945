#!/usr/bin/env python
"""What a sharded checkpoint costs the training step: on the step (CHECKPOINT.ASYNC false, write_shards) against
DCP's staging only (true, start_shards), and when the background write is whole. A timm ViT's blocks and root
sharded with AdamW state after one step, on N gloo processes (CPU):

    torchrun --standalone --nproc_per_node=2 benchmarks/fsdp_async_save.py [--model vit_small_patch16_224]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import timm  # noqa: E402
import torch  # noqa: E402
import torch.distributed as tdist  # noqa: E402

from runner import checkpoint as ckpt  # noqa: E402
from runner.fsdp import Shards  # noqa: E402


def sharded(name: str) -> Shards:
    """The model's blocks and root sharded, one AdamW step taken."""
    from torch.distributed.fsdp import fully_shard

    model = timm.create_model(name, num_classes=10)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, 224, 224)).sum().backward()
    opt.step()
    return Shards(model, opt)


def main() -> None:
    """Three rounds of each save; rank 0 prints the seconds."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="vit_small_patch16_224")
    args = ap.parse_args()
    tdist.init_process_group("gloo")
    shards, out = sharded(args.model), tempfile.mkdtemp(prefix="fsdp_async_save.")
    for i in range(3):
        t0 = time.monotonic()
        ckpt.write_shards(shards.save, out, 10 + i)
        sync = time.monotonic() - t0
        t0 = time.monotonic()
        _, finish = ckpt.start_shards(shards.save_async, out, 20 + i, None, shards.write_group())
        staged = time.monotonic() - t0
        finish()
        if tdist.get_rank() == 0:
            print(f"{args.model}: on the step {sync:.2f} s; async: {staged:.2f} s on the step, "
                  f"whole after {time.monotonic() - t0:.2f} s", flush=True)
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
