#!/usr/bin/env python
"""Classify image files with saved weights: the top-5 class names with probabilities for each image.

    python tools/predict.py --cfg output/run/config.yaml MODEL.CHECKPOINT output/run/checkpoints/best.pth a.jpg b.png

Any image file PIL reads (any size; grayscale, RGBA and palette images are converted) goes through the
config's eval transform. Class names come from the checkpoint's "class_names", else the class_map.json of
the checkpoint's run (OUTPUT_DIR/class_map.json beside OUTPUT_DIR/checkpoints/), else the class folders
of DATA.ROOT/train, else the class indices. An image that cannot be read is one `error:` line on stderr and
exit code 2; every other image is still predicted.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

# isort: off
from runner.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

import torch
# isort: on

from runner.config import build_parser, flatten, get_default_config
from runner.data.sources import source
from runner.errors import EXIT_USER, UserError, cli
from runner.preflight import config_command
from runner.rundir.layout import CLASS_MAP

log = logging.getLogger("runner")


def split_images(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """Separate the image paths from the options and KEY VALUE overrides."""
    keys = flatten(get_default_config())  # every KEY as written on the command line (MODEL.CHECKPOINT, ...)
    rest, images, i = [], [], 0
    while i < len(argv):
        tok = argv[i]
        action = parser._option_string_actions.get(tok.split("=")[0]) if tok.startswith("-") else None
        takes_value = action is not None and action.nargs != 0 and "=" not in tok
        if tok in keys or takes_value:
            rest += argv[i:i + 2]
            i += 2
        elif tok.startswith("-"):
            rest.append(tok)  # a flag, or an unknown option load_config reports
            i += 1
        else:
            images.append(tok)
            i += 1
    return rest, images


def class_names(meta: dict, cfg, checkpoint: str, n: int) -> list[str]:
    """Names for the n outputs: checkpoint, then the run's class_map.json, then DATA.ROOT/train, then indices."""
    from runner.data import read_class_map
    from runner.data.folder import class_dirs

    names = meta.get("class_names") or []
    ckpt = Path(checkpoint).resolve()
    for candidate in (ckpt.parent.parent / CLASS_MAP, ckpt.parent / CLASS_MAP):
        if len(names) != n and candidate.is_file():
            names = read_class_map(candidate)
    train_dir = Path(cfg.DATA.ROOT).expanduser() / "train"
    if len(names) != n and source(cfg.DATA.NAME).files == "folder" and train_dir.is_dir():
        names = [d.name for d in class_dirs(train_dir)]
    if len(names) != n:  # more outputs than the data's classes (a warned-about setting): the extra get indices
        known = list(meta.get("class_names") or [])
        names = known[:n] + [str(i) for i in range(len(known[:n]), n)]
    return [str(x) for x in names]


def load_input(path: str, transform) -> torch.Tensor:
    """One image file through the eval transform; UserError naming the file when it cannot be read."""
    from runner.data.folder import DECODE_ERRORS, open_image

    p = Path(path)
    if p.is_dir():
        raise UserError(f"image {path} is a folder; give image files, e.g. {p / '*.jpg'}")
    if p.is_symlink() and not p.exists():
        raise UserError(f"image {path} is a broken symbolic link (to {os.readlink(p)}, which does not exist)")
    if not p.is_file():
        raise UserError(f"image {path} does not exist")
    try:
        return transform(open_image(path))
    except DECODE_ERRORS as e:
        raise UserError(f"image {path} cannot be read as an image ({type(e).__name__}: {e})") from None


@cli
def main(argv: list[str] | None = None) -> int:
    """Load the model and weights, classify each image, print the top-5 (or JSON with --json)."""
    parser = build_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                          usage="%(prog)s --cfg FILE MODEL.CHECKPOINT PATH [KEY VALUE ...] IMAGE [IMAGE ...]")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--topk", type=int, default=5, help="classes shown per image (default 5)")
    rest, images = split_images(sys.argv[1:] if argv is None else list(argv), parser)
    loaded = config_command(rest, parser)
    if loaded is None:
        return 0
    cfg, info = loaded
    if not cfg.MODEL.CHECKPOINT:
        raise UserError("tools/predict.py needs weights: add MODEL.CHECKPOINT path/to/checkpoint.pth")
    if info.args.topk < 1:
        raise UserError(f"--topk {info.args.topk}: give a number of classes >= 1")
    if not images:
        raise UserError("no image given: add one or more image paths after the config arguments")
    from runner.data.folder import build_transform
    from runner.model import build_model, load_weights

    bare = cfg.clone()
    bare.defrost()
    bare.MODEL.CHECKPOINT = ""  # loaded below, once, keeping the checkpoint's metadata
    bare.freeze()
    model = build_model(bare)
    meta = load_weights(model, cfg.MODEL.CHECKPOINT, allow_new_head=False)  # a new head would predict noise
    use_cuda = cfg.DEVICE == "cuda" or (cfg.DEVICE == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    model.to(device).eval()
    inputs, good, errors = load_inputs(images, build_transform(cfg, is_training=False))
    results = predict(model, torch.stack(inputs).to(device), good, info.args.topk,
                      lambda n: class_names(meta, cfg, cfg.MODEL.CHECKPOINT, n)) if inputs else []
    if info.args.json:
        print(json.dumps({"checkpoint": cfg.MODEL.CHECKPOINT, "predictions": results,
                          "errors": [{"image": path, "error": line} for path, line in errors]}))
    else:
        print_table(results)
    return EXIT_USER if errors else 0


def load_inputs(images: list[str], transform) -> tuple[list[torch.Tensor], list[str], list[tuple[str, str]]]:
    """(tensors, their paths, (path, line) of each image that cannot be read); each bad one is one stderr line."""
    inputs, good, errors = [], [], []
    for path in images:
        try:
            inputs.append(load_input(path, transform))
            good.append(path)
        except UserError as e:  # the others are still predicted; the exit code says that one was not
            errors.append((path, str(e)))
            print(f"error: {e}", file=sys.stderr, flush=True)
    return inputs, good, errors


def predict(model, batch: torch.Tensor, paths: list[str], topk: int, names_for) -> list[dict]:
    """The top-k classes with probabilities of each image of `batch`."""
    with torch.inference_mode():
        probs = model(batch).float().softmax(dim=1).cpu()
    names = names_for(probs.shape[1])
    top_p, top_i = probs.topk(min(topk, probs.shape[1]), dim=1)
    return [{"image": path, "top": [{"class": names[i], "index": int(i), "prob": round(float(p), 6)}
                                    for p, i in zip(ps.tolist(), idx.tolist(), strict=True)]}
            for path, ps, idx in zip(paths, top_p, top_i, strict=True)]


def print_table(results: list[dict]) -> None:
    """Each image and its top classes, one per line."""
    width = max((len(t["class"]) for r in results for t in r["top"]), default=0)
    for r in results:
        print(r["image"])
        for rank, t in enumerate(r["top"], 1):
            print(f"  {rank}. {t['class']:<{width}}  {100 * t['prob']:6.2f}%")


if __name__ == "__main__":
    main()
