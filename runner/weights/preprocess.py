"""Preprocessing that follows the weights: DATA.MEAN, DATA.STD, AUG.INTERPOLATION and EVAL.CROP_PCT "auto".

With MODEL.PRETRAINED, "auto" takes the value of the weights' timm pretrained_cfg (what timm's
resolve_data_config gives: CLIP and SigLIP weights want their own statistics, most ViTs bicubic resizing);
without, the value runner.config.AUTO_KEYS names (today's ImageNet defaults). A run resolves once, before its
folder is claimed: config.yaml stores the values, and a resume takes the stored ones, never resolving again.
"""
from __future__ import annotations

import logging
from typing import Any

from yacs.config import CfgNode as CN

from runner.config.keypath import get_value, inline_yaml, set_value
from runner.config.schema import AUTO_KEYS, coerce_value, is_auto

log = logging.getLogger("runner")

_INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


def resolve(cfg: CN, stored: dict[str, Any] | None = None, warn: bool = False) -> CN:
    """`cfg` with every "auto" replaced (a new frozen config; `cfg` itself when nothing is auto).

    `stored`: the values a run's config.yaml holds (a resume takes them). `warn`: say once, for each key set
    explicitly, that it differs from the pretrained weights' value.
    """
    autos = [k for k in AUTO_KEYS if is_auto(k, get_value(cfg, k))]
    weights = weights_values(cfg) if cfg.MODEL.PRETRAINED and (autos or warn) else None
    if warn and weights:
        _warn_differences(cfg, weights)
    if not autos:
        return cfg
    out = cfg.clone()
    out.defrost()
    for key in autos:
        if stored and key in stored and not is_auto(key, stored[key]):
            value = stored[key]
        else:
            value = weights[key] if weights else AUTO_KEYS[key]
        set_value(out, key, coerce_value(key, value, AUTO_KEYS[key], where="auto"))
    out.freeze()
    return out


def weights_values(cfg: CN) -> dict[str, Any]:
    """The four keys' values from MODEL.NAME's pretrained_cfg, fitted to MODEL.IN_CHANS."""
    pc = pretrained_cfg(cfg.MODEL.NAME)
    chans = cfg.MODEL.IN_CHANS
    mean, std = tuple(pc.get("mean") or AUTO_KEYS["DATA.MEAN"]), tuple(pc.get("std") or AUTO_KEYS["DATA.STD"])
    if len(mean) != chans:  # e.g. grey images on RGB weights: timm's input conv sums the channels
        mean, std = (sum(mean) / len(mean),) * chans, (sum(std) / len(std),) * chans
    interpolation = pc.get("interpolation") or AUTO_KEYS["AUG.INTERPOLATION"]
    if interpolation not in _INTERPOLATIONS:  # e.g. lanczos, which timm's transforms also read as bicubic
        interpolation = "bicubic"
    return {"DATA.MEAN": tuple(float(v) for v in mean), "DATA.STD": tuple(float(v) for v in std),
            "AUG.INTERPOLATION": interpolation, "EVAL.CROP_PCT": float(pc.get("crop_pct") or 0.0)}


def pretrained_cfg(name: str) -> dict[str, Any]:
    """timm's pretrained_cfg of `name` as a dict: the registry's, or an hf-hub: repo's config.json (fetched into
    the cache first, read from there)."""
    from timm.models import get_pretrained_cfg

    if name.startswith("hf-hub:"):
        from timm.models._hub import load_model_config_from_hf

        from runner.weights import hub

        hub.fetch(name)
        with hub.offline():
            return dict(load_model_config_from_hf(name[len("hf-hub:"):])[0])
    try:
        found = get_pretrained_cfg(name)
    except RuntimeError:
        found = None
    return found.to_dict() if found is not None else {}


def is_weights_value(cfg: CN, key: str) -> bool:
    """True when `key` holds the pretrained weights' own value (what auto gives with MODEL.PRETRAINED)."""
    return bool(cfg.MODEL.PRETRAINED) and _same(get_value(cfg, key), weights_values(cfg)[key])


def _warn_differences(cfg: CN, weights: dict[str, Any]) -> None:
    """One warning naming each explicit value that differs from the weights' (they train worse, silently)."""
    differ = [f"{k} {inline_yaml(get_value(cfg, k))} (the weights': {inline_yaml(weights[k])})" for k in AUTO_KEYS
              if not is_auto(k, get_value(cfg, k)) and not _same(get_value(cfg, k), weights[k])]
    if differ:
        log.warning("preprocessing differs from what %s's pretrained weights were trained with: %s; set those keys "
                    "to auto to follow the weights", cfg.MODEL.NAME, "; ".join(differ))


def _same(a: Any, b: Any) -> bool:
    """Equal values, numbers compared to 4 decimals (timm's tables round them so)."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) < 5e-5
    return a == b


def stored_values(config_text: str) -> dict[str, Any]:
    """The four keys' values in a stored config.yaml (plain YAML; keys it lacks are left out)."""
    import yaml

    try:
        tree = yaml.safe_load(config_text) or {}
    except yaml.YAMLError:
        return {}
    out = {}
    for key in AUTO_KEYS:
        node: Any = tree
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            out[key] = tuple(node) if isinstance(node, list) else node
    return out
