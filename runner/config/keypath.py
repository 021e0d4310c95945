"""Dotted config keys (`TRAIN.LR`): a key's default or section, a value read and set on a config, and a value as
one line of YAML for messages."""
from __future__ import annotations

from typing import Any

import yaml
from yacs.config import CfgNode as CN

from runner.config.defaults import _C


class _Absent:
    """Marker for 'no such key' / 'does not convert' (None is a legitimate value)."""


ABSENT = _Absent()


def lookup(key: str, node: CN = _C) -> Any:
    """The default for a dotted key, a CfgNode for a section, or ABSENT."""
    for part in key.split("."):
        if not isinstance(node, CN) or part not in node:
            return ABSENT
        node = node[part]
    return node


def get_value(cfg: CN, key: str) -> Any:
    """The value of a dotted key."""
    return lookup(key, cfg)


def set_value(cfg: CN, key: str, value: Any) -> None:
    """Set a dotted key on an unfrozen config."""
    *sections, leaf = key.split(".")
    node = cfg
    for part in sections:
        node = node[part]
    node[leaf] = value


def inline_yaml(value: Any) -> str:
    """A value written as YAML would write it inline (true, 0.05, [1, 2], '')."""
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text[:-3].strip() if text.endswith("\n...") or text.endswith("...") else text
