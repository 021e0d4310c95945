"""A config as YAML text that loads back to the same config."""
from __future__ import annotations

from typing import Any

import yaml
from yacs.config import CfgNode as CN

from runner.config.interp import escape


def _to_dict(cfg: CN) -> dict[str, Any]:
    """Nested plain dicts with tuples as lists, ready for yaml.safe_dump; a literal ${ as $${ (read back as ${)."""
    return {k: _to_dict(v) if isinstance(v, CN) else escape(list(v) if isinstance(v, tuple) else v)
            for k, v in cfg.items()}


class _Dumper(yaml.SafeDumper):
    """Sections as blocks, lists inline ([0.485, 0.456, 0.406]), as a person would write the file."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def dump_config(cfg: CN) -> str:
    """The config as YAML text that gives back an identical config when loaded with --cfg."""
    return yaml.dump(_to_dict(cfg), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=10**6)
