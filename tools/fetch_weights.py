#!/usr/bin/env python
"""Download pretrained weights into the cache, on a machine with internet, for runs on machines without it.

    python tools/fetch_weights.py vit_small_patch16_224.augreg_in21k resnet50.a1_in1k hf-hub:timm/convnext_tiny.fb_in1k
    python tools/fetch_weights.py configs/finetune.yaml sweeps/models.yaml

Each argument is a timm model name (with its pretrained tag, or hf-hub:ORG/NAME[@REVISION]), a config file (the
weights its MODEL.NAME loads when MODEL.PRETRAINED is true) or a sweep file (those of every point). The files go
where the runs read them: the Hugging Face cache (HF_HOME or HF_HUB_CACHE; HF_ENDPOINT and HF_TOKEN as usual) or,
for the few weights timm takes from a URL, torch hub's cache. On a cluster, fetch on a login node into an HF_HOME
the compute nodes share, and run there with HF_HUB_OFFLINE=1. Prints one line per file (repo, revision, size,
path) and the cache folder; a name with no weights, or a download that fails, is one line and exit 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runner.process.startup import prepare

prepare()

from runner.errors import UserError, argument_error, cli


def models_of(arg: str) -> list[str]:
    """The pretrained model names an argument stands for: itself, a config's MODEL.NAME or a sweep's."""
    path = Path(arg).expanduser()
    if arg.endswith((".yaml", ".yml")) or path.is_file():
        if not path.is_file():
            raise UserError(f"{arg}: no such file (give a timm model name, a config file or a sweep file)")
        return _sweep_models(str(path)) if _is_sweep(path) else _config_models(["--cfg", str(path)])
    return [arg]


def _is_sweep(path: Path) -> bool:
    """True for a sweep file (cfg/set/grid/points/search sections) rather than a config."""
    import yaml

    from runner.sweep.spec import SECTIONS

    try:
        top = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return False
    return isinstance(top, dict) and any(k in SECTIONS for k in top)


def _config_models(argv: list[str]) -> list[str]:
    """MODEL.NAME of the config `argv` builds, when it loads pretrained weights."""
    from runner.config import load_config

    cfg, _ = load_config(argv, check_paths=False)
    return [cfg.MODEL.NAME] if cfg.MODEL.PRETRAINED and not cfg.MODEL.CHECKPOINT else []


def _sweep_models(path: str) -> list[str]:
    """Every point's pretrained model of a sweep file."""
    from runner.sweep.points import load_points

    _, points = load_points(path, check_paths=False)
    return [name for point in points for name in _config_models(list(point.argv))]


@cli
def main(argv: list[str] | None = None) -> int:
    """Fetch every model's weights; print where they are."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", metavar="MODEL_OR_CONFIG",
                        help="timm model names (with a pretrained tag, or hf-hub:ORG/NAME), config or sweep files")
    parser.error = argument_error  # one line, like every other tool
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(name for arg in args.models for name in models_of(arg)))
    if not names:
        raise UserError(f"{' '.join(args.models)}: no model there loads pretrained weights (MODEL.PRETRAINED is "
                        "false, or MODEL.CHECKPOINT names a file): nothing to fetch")
    from runner.weights import hub

    if hub.is_offline():
        raise UserError("HF_HUB_OFFLINE is set: fetch_weights downloads, so run it where the Hub can be reached, "
                        "without HF_HUB_OFFLINE")
    total = 0
    for name in names:
        found = hub.fetch(name)
        total += found.size
        at = f"@{found.revision[:12]}" if found.revision else ""
        print(f"{name}: {found.repo}{at} {Path(found.file).name} {found.size / 2**20:.1f} MiB -> {found.file}",
              flush=True)
    print(f"{len(names)} model(s), {total / 2**20:.1f} MiB, in {hub.hub_cache()}; runs read them there, "
          "also with HF_HUB_OFFLINE=1", flush=True)
    return 0


if __name__ == "__main__":
    main(sys.argv[1:])
