"""DIST.STRATEGY fsdp: FSDP2 (`fully_shard`) on each repeated block of a timm model and on its root, and the
sharded state written and read with torch.distributed.checkpoint (DCP), which reshards on load.

Which modules are sharded (`blocks_of`): ViT/DeiT/EVA `blocks`' children; Swin/ConvNeXt/... `stages`' blocks (a
stage without `blocks` as a whole); ResNet's `layer1..layer4`; any other model: the direct children holding at least
a tenth of its parameters each, a Sequential or ModuleList among them split into its own children. Everything else
(stem, norms, head) belongs to the root's group.

Evaluation: each process evaluates its own share of the val split, and the shares may differ by one batch, while a
sharded forward is a collective. So in eval mode every sharded module keeps its parameters gathered after the first
forward (`_EvalGather`): later forwards run without a collective, and the first training forward after an
evaluation frees them again.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from runner.errors import UserError
from runner.process import malloc

if TYPE_CHECKING:
    from runner.distributed import Dist

log = logging.getLogger("runner")

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
MIN_SHARE = 0.1  # the generic rule: a direct child holding at least this share of the parameters is sharded


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The modules sharded apart from the root, in the order their forwards run."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.Sequential, nn.ModuleList)):
        return list(blocks)
    stages = getattr(model, "stages", None)
    if isinstance(stages, (nn.Sequential, nn.ModuleList)):
        return [b for stage in stages for b in _stage_blocks(stage)]
    layers = [getattr(model, f"layer{i}", None) for i in range(1, 5)]
    if all(isinstance(m, nn.Module) for m in layers):
        return layers
    return _largest_children(model)


def _stage_blocks(stage: nn.Module) -> list[nn.Module]:
    """A stage's blocks (Swin, ConvNeXt, EfficientFormer...), or the stage itself when it has none."""
    blocks = getattr(stage, "blocks", None)
    if isinstance(blocks, (nn.Sequential, nn.ModuleList)) and len(blocks):
        return list(blocks)
    return [stage]


def _largest_children(model: nn.Module) -> list[nn.Module]:
    """The direct children with at least MIN_SHARE of the parameters; containers among them split into children."""
    total = sum(p.numel() for p in model.parameters()) or 1
    found = []
    for child in model.children():
        if sum(p.numel() for p in child.parameters()) < MIN_SHARE * total:
            continue
        parts = list(child) if isinstance(child, (nn.Sequential, nn.ModuleList)) else []
        found += [p for p in parts if any(True for _ in p.parameters())] or [child]
    return found


def _policies(cfg, device: torch.device) -> dict:
    """fully_shard's keyword arguments from AMP.* and DIST.FSDP_*: parameters in the AMP dtype, reductions in
    float32; optionally the sharded state in host memory."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs = {}
    if cfg.AMP.ENABLED:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=_DTYPES[cfg.AMP.DTYPE], reduce_dtype=torch.float32)
    if cfg.DIST.FSDP_CPU_OFFLOAD:
        if device.type != "cuda":
            raise UserError("DIST.FSDP_CPU_OFFLOAD true needs CUDA devices (the state already lives in host memory "
                            "on a CPU run): set DIST.FSDP_CPU_OFFLOAD false")
        kwargs["offload_policy"] = CPUOffloadPolicy()
    return kwargs


def shard(model: nn.Module, cfg, dist: Dist, make: Callable[[], nn.Module], announce: bool = True) -> nn.Module:
    """`model` (on its device) with each block and the root sharded over the process group; alone, as it is.
    `make()`: a new module of the same architecture, for copies (the EMA's); `announce`: say so in the log."""
    if not dist.distributed:  # one process without torchrun: nothing to shard, the checkpoints are DCP's all the same
        return model
    from torch.distributed.fsdp import fully_shard

    if dist.device.type == "cpu":
        malloc.for_sharded_training()
    kwargs = _policies(cfg, dist.device)
    after = cfg.DIST.FSDP_RESHARD_AFTER_FORWARD
    blocks = blocks_of(model)
    for block in blocks:
        fully_shard(block, reshard_after_forward=after, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)  # the root's are needed again at once by backward
    model.register_forward_pre_hook(_EvalGather({**{id(b): after for b in blocks}, id(model): False}), prepend=True)
    model.__dict__["__deepcopy__"] = lambda memo: sharded_copy(model, make, cfg, dist)
    if dist.is_main and announce:
        log.info("fsdp: %d blocks and the root of %s sharded over %d processes", len(blocks), cfg.MODEL.NAME,
                 dist.world_size)
    return model


def sharded_copy(model: nn.Module, make: Callable[[], nn.Module], cfg, dist: Dist) -> nn.Module:
    """A copy of a sharded `model` (FSDP refuses copy.deepcopy), sharded alike: built on the meta device, so no
    process ever holds the whole model, then given the shards of `model`'s parameters and buffers."""
    reshard(model)
    with torch.device("meta"):
        new = make()
    shard(new, cfg, dist, make, announce=False)
    new.to_empty(device=dist.device)
    with torch.no_grad():
        for (name, dst), src in zip(_tensors(new), (t for _, t in _tensors(model)), strict=True):
            if dst.shape != src.shape:
                raise RuntimeError(f"sharded copy: {name} {list(src.shape)} -> {list(dst.shape)}")
            dst.copy_(src)
    new.train(model.training)
    return new


def _tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters then buffers (non-persistent ones too), by name."""
    yield from model.named_parameters()
    yield from model.named_buffers()


def sharded_modules(model: nn.Module) -> list[nn.Module]:
    """The sharded modules in `model` (none when it was not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def reshard(model: nn.Module) -> None:
    """Free the gathered parameters an evaluation kept (a local operation): the module holds its shards again."""
    gather = _eval_gather(model)
    if gather is not None:
        gather.leave(model)


class _EvalGather:
    """The root's forward pre-hook: in eval mode keep every module's parameters gathered after its first forward
    (no collective per batch: the processes' val shares may differ by a batch); back in train mode, free them."""

    def __init__(self, after: dict[int, bool]) -> None:
        """`after`: each sharded module's reshard_after_forward in training (by id)."""
        self.after = after
        self.gathered = False  # in eval mode since the last training forward

    def __call__(self, module: nn.Module, args) -> None:
        """Switch on a change of mode."""
        if not module.training and not self.gathered:
            for m in sharded_modules(module):
                m.set_reshard_after_forward(False, recurse=False)
            self.gathered = True
        elif module.training:
            self.leave(module)

    def leave(self, module: nn.Module) -> None:
        """Free the gathered parameters and restore each module's reshard_after_forward."""
        if not self.gathered:
            return
        for m in sharded_modules(module):
            m.reshard()
            m.set_reshard_after_forward(self.after.get(id(m), True), recurse=False)
        self.gathered = False


def _eval_gather(model: nn.Module) -> _EvalGather | None:
    """The root's _EvalGather hook, if shard() installed one."""
    return next((h for h in model._forward_pre_hooks.values() if isinstance(h, _EvalGather)), None)


def ShardedEma(model: nn.Module, **kwargs) -> nn.Module:  # noqa: N802 - stands where timm's class stands
    """timm's ModelEmaV3 of a sharded model: its copy is sharded alike (sharded_copy), and each update first frees
    what the EMA's last evaluation gathered, so that it averages shard with shard."""
    from timm.utils import ModelEmaV3

    class _Sharded(ModelEmaV3):
        def update(self, model: nn.Module, step: int | None = None) -> None:
            """ModelEmaV3.update on the shards."""
            reshard(self.module)
            super().update(model, step)

    return _Sharded(model, **kwargs)


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """No gradient reduction on accumulation micro-steps (FSDP2's set_requires_gradient_sync)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


# ---------------------------------------------------------------------------------------------------------
# The sharded state through torch.distributed.checkpoint
# ---------------------------------------------------------------------------------------------------------
class Shards:
    """The parts of a run's state that are sharded (model, optimizer, EMA): saved by every process into one folder
    and loaded from one on any number of processes."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, ema: nn.Module | None = None) -> None:
        """`ema`: the EMA's module (a sharded copy of the model), when there is one."""
        self.model, self.optimizer, self.ema = model, optimizer, ema
        self._group = None  # the background writes' process group, made by the first one

    def _state(self) -> dict:
        """The state dict DCP writes or fills: {model, optimizer[, ema]}, tensors sharded as the modules are."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        for module in (self.model, self.ema):
            if module is not None:
                reshard(module)
        model, optim = get_state_dict(self.model, self.optimizer)
        state = {"model": model, "optimizer": optim}
        if self.ema is not None:
            state["ema"] = get_model_state_dict(self.ema)
        return state

    def save(self, folder: Path) -> None:
        """Every process writes its shards into `folder` (a collective; rank 0 writes the metadata last)."""
        import torch.distributed.checkpoint as dcp

        with _quiet():
            dcp.save(self._state(), checkpoint_id=str(folder))

    def save_async(self, folder: Path):
        """Every process: its shards copied to host memory now (DCP's staging: the next steps change the live ones),
        then written into `folder` by DCP's thread. Returns the write's future (a collective over write_group())."""
        import torch.distributed as tdist
        import torch.distributed.checkpoint as dcp

        alone = not (tdist.is_available() and tdist.is_initialized())
        if alone:  # DCP's thread warns that one process writes alone, which is meant; _quiet() covers this one only
            warnings.filterwarnings("ignore", message=".*assuming the intent is to.*")
        with _quiet():
            return dcp.async_save(self._state(), checkpoint_id=str(folder), process_group=self.write_group(),
                                  no_dist=alone)

    def write_group(self):
        """The background writes' process group (None in one process without one): gloo, and apart from the
        training's, so that a write's collectives never interleave with a step's. Made on first use (a
        collective: every process's first save)."""
        import torch.distributed as tdist

        if self._group is None and tdist.is_available() and tdist.is_initialized():
            self._group = tdist.new_group(backend="gloo")
        return self._group

    def load(self, folder: str | Path) -> None:
        """Every process reads its part of `folder`, whatever number of processes wrote it (a collective)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        state = self._state()
        with _quiet():
            dcp.load(state, checkpoint_id=str(folder))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        if self.ema is not None:
            set_model_state_dict(self.ema, state["ema"])


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without DCP's warning that a process without a process group saves or loads alone (it is meant)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*assuming the intent is to.*")
        yield


def read_model(folder: str | Path, part: str = "model") -> dict[str, torch.Tensor]:
    """The whole tensors of `part` (model or ema) of a sharded checkpoint, in this process (no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    prefix = f"{part}."
    state = {k[len(prefix):]: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
             if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
    with _quiet():
        dcp.load({part: state}, checkpoint_id=str(folder), no_dist=True)
    return state


def has_part(folder: str | Path, part: str) -> bool:
    """True when the sharded checkpoint in `folder` holds `part` (model, optimizer, ema)."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return any(k.startswith(f"{part}.") for k in meta)


def load_whole(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Whole tensors (every process holds them all) into a sharded model: each process keeps its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    reshard(model)
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
