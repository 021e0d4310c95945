"""The model: timm's factory, pretrained weights (runner.weights.hub) or a file (runner.weights.files),
channels_last, SyncBN, DDP and torch.compile."""
from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from functools import partial

import torch
import torch.nn as nn

from runner.distributed import Dist
from runner.errors import UserError
from runner.weights.files import load_weights

log = logging.getLogger("runner")


def _create(cfg, name: str | None = None, **extra) -> nn.Module:
    """timm.create_model(name or MODEL.NAME) with the config's arguments; drop-path only when asked (not every
    model takes it)."""
    import timm

    kwargs = dict(num_classes=cfg.MODEL.NUM_CLASSES, in_chans=cfg.MODEL.IN_CHANS, drop_rate=cfg.MODEL.DROP_RATE)
    if cfg.MODEL.DROP_PATH_RATE > 0:
        kwargs["drop_path_rate"] = cfg.MODEL.DROP_PATH_RATE
    return timm.create_model(name or cfg.MODEL.NAME, **kwargs, **extra)


def _unknown_model(name: str, key: str = "MODEL.NAME") -> UserError:
    """An error naming the closest timm model names."""
    import timm

    close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models() for the names"
    return UserError(f"{key} '{name}' is not a timm model{hint}")


def create_sized(cfg, name: str | None = None, key: str = "MODEL.NAME", **extra) -> nn.Module:
    """Create the model `name` (default MODEL.NAME, set by `key`), passing img_size to the models that take one
    (ViT-style position embeddings)."""
    import timm

    name = name or cfg.MODEL.NAME
    if not timm.is_model(name) and not name.startswith("hf-hub:"):  # an hf-hub: repo names its architecture
        raise _unknown_model(name, key)
    tries = [dict(img_size=cfg.DATA.IMG_SIZE)]
    if (cfg.EVAL.IMG_SIZE or cfg.DATA.IMG_SIZE) != cfg.DATA.IMG_SIZE:
        # a model built for one img_size refuses another unless asked to resample its position embeddings
        # per input (timm's ViT family); asked only then, so runs evaluating at the training size are unchanged
        tries.insert(0, dict(img_size=cfg.DATA.IMG_SIZE, dynamic_img_size=True))
    for sized in tries:
        try:
            return _create(cfg, name, **sized, **extra)
        except TypeError as e:
            if "img_size" not in str(e):
                raise
    return _create(cfg, name, **extra)


def build_model(cfg, allow_new_head: bool = True) -> nn.Module:
    """A timm model from cfg.MODEL, with timm's pretrained weights (MODEL.PRETRAINED: from the Hub, or the cache
    when fetched already) or the weights of MODEL.CHECKPOINT.

    `allow_new_head` (training): a classifier of another size in MODEL.CHECKPOINT is skipped, with a log line;
    evaluation and prediction pass False, so weights that do not fit exactly are refused.
    """
    check_model_name(cfg)
    if cfg.MODEL.PRETRAINED and not cfg.MODEL.CHECKPOINT:
        model = _pretrained(cfg)
    else:
        model = create_sized(cfg)
    probe_input(model, cfg)
    if cfg.MODEL.CHECKPOINT:
        load_weights(model, cfg.MODEL.CHECKPOINT, allow_new_head=allow_new_head)
    if cfg.MODEL.GRAD_CHECKPOINTING:
        set_grad_checkpointing(model, cfg.MODEL.NAME)
    return model


def set_grad_checkpointing(model: nn.Module, name: str) -> None:
    """timm's activation recomputation in backward; a model without it is refused in one line."""
    try:
        model.set_grad_checkpointing(True)
    except (AttributeError, AssertionError, NotImplementedError):  # timm asserts 'not supported' in ~20 families
        raise UserError(f"MODEL.GRAD_CHECKPOINTING true: timm's {name} does not support gradient checkpointing; "
                        "set it false, or choose a model that does (resnet, convnext, vit, swin, efficientnet, "
                        "...)") from None


def check_model_name(cfg) -> None:
    """Refuse a pretrained tag (resnet18.a1_in1k) that timm does not know, or one that would load nothing.

    A tag only chooses which pretrained weights MODEL.PRETRAINED loads; the architecture is the same. With
    neither MODEL.PRETRAINED nor MODEL.CHECKPOINT the run would train from random weights under a name that
    promises pretrained ones, so that is refused rather than silently ignored.
    """
    import timm

    name = cfg.MODEL.NAME
    arch, tag = timm.models.split_model_name_tag(name)
    if "." not in name or not timm.is_model(arch):
        return
    tags = [t.split(".", 1)[1] for t in timm.list_pretrained(f"{arch}.*") if "." in t]
    if tag not in tags:
        known = f"its tags: {', '.join(tags[:8])}{', ...' if len(tags) > 8 else ''}" if tags else "it has none"
        raise UserError(f"MODEL.NAME '{name}': timm has no pretrained tag '{tag}' for {arch} ({known}); "
                        f"write MODEL.NAME {arch} for the architecture alone")
    if not cfg.MODEL.PRETRAINED and not cfg.MODEL.CHECKPOINT:
        raise UserError(f"MODEL.NAME '{name}' names pretrained weights ('.{tag}') but MODEL.PRETRAINED is false "
                        f"and no MODEL.CHECKPOINT is set, so the weights would be random: write MODEL.NAME {arch} "
                        "to train from scratch, or set MODEL.PRETRAINED true (downloaded from the Hub, or read from "
                        "its cache)")


def probe_input(model: nn.Module, cfg) -> None:
    """Run one blank image of DATA.IMG_SIZE through the model (eval mode, no grad) to refuse a size it cannot take.

    Costs one forward pass of one image on the CPU, measured on one busy thread (first call, then warm): resnet18
    at 32 px 21/8 ms, resnet50 at 224 px 0.34/0.15 s, vit_base_patch16_224 at 224 px 0.48/0.6 s, below the time
    timm takes to create those models. BatchNorm statistics are untouched (eval mode); train/eval mode is restored.
    """
    probe_size(model, cfg, "DATA.IMG_SIZE", cfg.DATA.IMG_SIZE)
    if cfg.EVAL.IMG_SIZE and cfg.EVAL.IMG_SIZE != cfg.DATA.IMG_SIZE:
        probe_size(model, cfg, "EVAL.IMG_SIZE", cfg.EVAL.IMG_SIZE)


def probe_size(model: nn.Module, cfg, key: str, size: int) -> None:
    """Refuse `size` (the value of `key`) when the model drops part of such images or cannot take them."""
    name = cfg.MODEL.NAME
    patch = _patch_size(model)
    if patch and (size % patch[0] or size % patch[1]):
        lower = max(size // patch[0] * patch[0], patch[0])
        raise UserError(f"MODEL.NAME {name} cuts images into {patch[0]}x{patch[1]} patches, and {key} "
                        f"{size} is not a multiple of {patch[0]} (the rest of each image would be dropped): "
                        f"use {key} {lower} or {lower + patch[0]}")
    was_training = model.training
    x = torch.zeros(1, cfg.MODEL.IN_CHANS, size, size)
    try:
        model.eval()
        with torch.no_grad():
            model(x)
    except (RuntimeError, ValueError, AssertionError, IndexError) as e:
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"MODEL.NAME {name} cannot take {key} {size} images ({reason}); "
                        f"use a larger {key} (e.g. 32 or 224)") from None
    finally:
        model.train(was_training)


def _patch_size(model: nn.Module) -> tuple[int, int] | None:
    """The patch size of a ViT-style patch embedding that would silently drop a remainder, else None."""
    from timm.layers import PatchEmbed

    embed = getattr(model, "patch_embed", None)
    if not isinstance(embed, PatchEmbed) or embed.dynamic_img_pad:  # others pad or take any size
        return None
    patch = embed.patch_size
    return (patch, patch) if isinstance(patch, int) else tuple(patch)


def _pretrained(cfg) -> nn.Module:
    """MODEL.NAME with timm's pretrained weights: fetched into the cache (once per process), then built from it.

    timm loads the file as it always does (its filters for the model, a new classifier for another
    MODEL.NUM_CLASSES, the input conv adapted to MODEL.IN_CHANS); only the download is ours.
    """
    from runner.weights import hub

    found = hub.fetch(cfg.MODEL.NAME)
    model = hub.create(partial(create_sized, cfg))
    log.info("pretrained weights of %s: %s%s (sha256 %s...)", cfg.MODEL.NAME, found.repo,
             f"@{found.revision[:12]}" if found.revision else "", found.sha256[:16])
    return model


def prepare_model(model: nn.Module, cfg, dist: Dist) -> tuple[nn.Module, nn.Module]:
    """Move, convert and wrap the model once at setup; returns (train_model, bare_model)."""
    model.to(dist.device)
    if cfg.MODEL.CHANNELS_LAST:
        model.to(memory_format=torch.channels_last)
    if cfg.MODEL.SYNC_BN and dist.distributed:
        if dist.device.type != "cuda":  # else DDP fails with a traceback: torch's SyncBatchNorm is GPU-only
            raise UserError("MODEL.SYNC_BN needs CUDA devices (torch's SyncBatchNorm does not run on CPU); "
                            "set MODEL.SYNC_BN false, or use a model without BatchNorm")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg.DIST.STRATEGY == "fsdp":  # sharded in place: what runs is what is saved; MODEL.COMPILE is refused
        from runner import fsdp

        model = fsdp.shard(model, cfg, dist, partial(create_sized, cfg))
        return model, model
    bare = model
    if dist.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(
            model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None,
            gradient_as_bucket_view=True, static_graph=False,
            find_unused_parameters=cfg.DIST.FIND_UNUSED_PARAMETERS, bucket_cap_mb=cfg.DIST.BUCKET_CAP_MB,
            **{_buffer_sync_argument(DDP): cfg.DIST.BROADCAST_BUFFERS},
        )
    return compiler(cfg)(model), bare


def _buffer_sync_argument(ddp: type) -> str:
    """DDP's name for "sync buffers from rank 0 every forward": forward_sync_buffers where torch has it (it
    deprecates broadcast_buffers with a FutureWarning per process), broadcast_buffers on older torch."""
    import inspect

    new = "forward_sync_buffers"
    return new if new in inspect.signature(ddp).parameters else "broadcast_buffers"


def compiler(cfg) -> Callable[[nn.Module], nn.Module]:
    """torch.compile with MODEL.COMPILE_MODE when MODEL.COMPILE, else the module as it is."""
    if not cfg.MODEL.COMPILE:
        return lambda module: module
    return partial(torch.compile, mode=None if cfg.MODEL.COMPILE_MODE == "default" else cfg.MODEL.COMPILE_MODE)
