"""The model: timm's factory, local weights only, channels_last, SyncBN, DDP and torch.compile."""
from __future__ import annotations

import difflib
import logging
import os

import torch
import torch.nn as nn

from runner.distributed import Dist
from runner.errors import UserError

log = logging.getLogger("runner")


def _create(cfg, **extra) -> nn.Module:
    """timm.create_model with the config's arguments; drop-path only when asked (not every model takes it)."""
    import timm

    kwargs = dict(num_classes=cfg.MODEL.NUM_CLASSES, in_chans=cfg.MODEL.IN_CHANS, drop_rate=cfg.MODEL.DROP_RATE)
    if cfg.MODEL.DROP_PATH_RATE > 0:
        kwargs["drop_path_rate"] = cfg.MODEL.DROP_PATH_RATE
    return timm.create_model(cfg.MODEL.NAME, **kwargs, **extra)


def _unknown_model(name: str) -> UserError:
    """An error naming the closest timm model names."""
    import timm

    close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_models() for the names"
    return UserError(f"MODEL.NAME '{name}' is not a timm model{hint}")


def _create_sized(cfg, **extra) -> nn.Module:
    """Create the model, passing img_size to the models that take one (ViT-style position embeddings)."""
    import timm

    if not timm.is_model(cfg.MODEL.NAME):
        raise _unknown_model(cfg.MODEL.NAME)
    try:
        return _create(cfg, img_size=cfg.DATA.IMG_SIZE, **extra)
    except TypeError as e:
        if "img_size" not in str(e):
            raise
    return _create(cfg, **extra)


def build_model(cfg) -> nn.Module:
    """A timm model from cfg.MODEL, with weights from MODEL.CHECKPOINT; never from the network."""
    if cfg.MODEL.PRETRAINED and not cfg.MODEL.CHECKPOINT:
        model = _pretrained_offline(cfg)
    else:
        model = _create_sized(cfg)
    if cfg.MODEL.CHECKPOINT:
        from runner.checkpoint import load_weights

        load_weights(model, cfg.MODEL.CHECKPOINT)
    return model


def _pretrained_offline(cfg) -> nn.Module:
    """timm's pretrained weights only if already in the local cache; otherwise a clear error."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # we never download: this makes the hub client fail fast instead
    try:
        return _create_sized(cfg, pretrained=True)
    except UserError:
        raise
    except Exception as e:  # the hub client raises many types for "not cached"
        raise UserError(
            f"MODEL.PRETRAINED true but no pretrained weights for '{cfg.MODEL.NAME}' are on disk "
            f"({type(e).__name__}); weights are never downloaded: fetch them once elsewhere and set "
            "MODEL.CHECKPOINT /path/to/weights.pth (a state_dict or a runner checkpoint)"
        ) from None


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
    bare = model
    if dist.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(
            model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None,
            gradient_as_bucket_view=True, static_graph=False,
            find_unused_parameters=cfg.DIST.FIND_UNUSED_PARAMETERS,
            broadcast_buffers=cfg.DIST.BROADCAST_BUFFERS, bucket_cap_mb=cfg.DIST.BUCKET_CAP_MB,
        )
    if cfg.MODEL.COMPILE:
        model = torch.compile(model, mode=None if cfg.MODEL.COMPILE_MODE == "default" else cfg.MODEL.COMPILE_MODE)
    return model, bare
