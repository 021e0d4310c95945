"""Parameters, FLOPs and activation memory of a model, measured by running it once.

FLOPs are what torch.utils.flop_counter.FlopCounterMode counts: 2 x multiply-accumulates of matmuls,
convolutions and attention (elementwise ops, norms and pooling are not counted).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

STATS_BATCH = 2  # two images, so BatchNorm in training mode has more than one value per channel everywhere


def forward_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward pass on batch x."""
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    return counter.get_total_flops()


def train_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward and backward pass on batch x (the loss is the sum of the outputs)."""
    counter = FlopCounterMode(display=False)
    with counter:
        _sum_outputs(model(x)).backward()
    return counter.get_total_flops()


def saved_activation_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for backward after a forward pass on x, parameters excluded.

    Each storage is counted once, however many saved views point into it.
    """
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_ptrs:
            storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    del out  # frees the graph; the hooks have already seen every saved tensor
    return sum(storages.values())


def model_stats(model: nn.Module, img_size: int, in_chans: int,
                device: torch.device | str = "cpu") -> dict[str, Any]:
    """Parameter counts, forward and training GFLOPs per image and activation MB per image.

    Measured in training mode on a random batch of STATS_BATCH images; the model's weights, buffers
    (BatchNorm running stats), gradients and train/eval mode are left as they were.
    """
    device = torch.device(device)
    x = torch.randn(STATS_BATCH, in_chans, img_size, img_size, device=device)
    with _untouched(model):
        model.train()
        fwd = forward_flops(model, x)
        train = train_flops(model, x)
        act = saved_activation_bytes(model, x)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "img_size": img_size,
        "in_chans": in_chans,
        "gflops_per_img": fwd / STATS_BATCH / 1e9,
        "train_gflops_per_img": train / STATS_BATCH / 1e9,
        "act_mb_per_img": act / STATS_BATCH / 1024**2,
    }


@contextlib.contextmanager
def _untouched(model: nn.Module) -> Iterator[None]:
    """Restore the model's mode, buffers and gradients after measuring it."""
    mode = model.training
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    grads = {p: p.grad for p in model.parameters()}
    try:
        for p in grads:
            p.grad = None
        yield
    finally:
        model.train(mode)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
        for p, grad in grads.items():
            p.grad = grad


def _sum_outputs(out: Any) -> torch.Tensor:
    """A scalar to backpropagate from a tensor or a (nested) tuple/list/dict holding tensors."""
    tensors = [t for t in _flatten(out) if t.requires_grad]
    if not tensors:
        raise ValueError("the model returned no tensor that requires grad; cannot count backward FLOPs")
    return torch.stack([t.float().sum() for t in tensors]).sum()


def _flatten(out: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a nested output."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for value in out.values():
            yield from _flatten(value)
    elif isinstance(out, (list, tuple)):
        for value in out:
            yield from _flatten(value)
