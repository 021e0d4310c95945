"""Configs side by side: each dotted key with its value, where two configs differ, what differs from the defaults."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from yacs.config import CfgNode as CN

from runner.config.defaults import _C

MISSING = "<missing>"  # stands for a key one config has and the other lacks, in diff_configs


def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every dotted leaf key (MODEL.NAME) of a config or nested mapping with its value, in definition order."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping):  # a CfgNode section, or a section of YAML read as plain dicts
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def same_value(a: Any, b: Any) -> bool:
    """Equal config values: lists and tuples alike, true is not 1."""
    a, b = (list(v) if isinstance(v, tuple) else v for v in (a, b))
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def diff_configs(a: CN, b: CN) -> list[tuple[str, Any, Any]]:
    """(key, value in a, value in b) for every flattened key that differs; MISSING where a key is absent."""
    fa, fb = flatten(a), flatten(b)
    keys = list(fa) + [k for k in fb if k not in fa]
    return [(k, fa.get(k, MISSING), fb.get(k, MISSING)) for k in keys
            if k not in fa or k not in fb or not same_value(fa[k], fb[k])]


def changed_from_defaults(cfg: CN, keep_output_dir: bool = False) -> dict[str, Any]:
    """Flattened keys whose value differs from the default (OUTPUT_DIR left out unless asked for)."""
    return {k: new for k, _, new in diff_configs(_C, cfg)
            if new is not MISSING and (keep_output_dir or k != "OUTPUT_DIR")}
