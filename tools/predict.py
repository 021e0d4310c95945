#!/usr/bin/env python
"""Classify image files with saved weights: the top-5 class names with probabilities for each image.

    python tools/predict.py --cfg output/run/config.yaml MODEL.CHECKPOINT output/run/checkpoints/best.pth a.jpg b.png
    python tools/predict.py --cfg output/run/config.yaml MODEL.CHECKPOINT output/run/checkpoints/best.pth \
        photos/ --output preds.csv [--topk 3] [--tta flip] [--force]

Each argument is an image file or a folder, whose image files (.jpg .jpeg .png .bmp .webp, in sub-folders too,
hidden ones skipped) are classified in name order. Any image file PIL reads (any size; grayscale, RGBA and palette
images are converted) goes through the config's eval transform, in batches of DATA.EVAL_BATCH_SIZE (0: twice
DATA.BATCH_SIZE) read by DATA.NUM_WORKERS loader workers, with a progress bar on a terminal (LOG.PROGRESS).
--tta flip averages the probabilities of each image and its mirror image. Class names come from the checkpoint's
"class_names", else the class_map.json of the checkpoint's run (OUTPUT_DIR/class_map.json beside
OUTPUT_DIR/checkpoints/), else the class folders of DATA.ROOT/train, else the class indices.

Without --output: a table (or one JSON object with --json) on stdout. --output FILE.csv writes a header and one
row per image (image, class_1, prob_1, ..., class_k, prob_k); FILE.jsonl one JSON object per image ({"image",
"top": [{"class", "index", "prob"}, ...]}). In the CSV, an image or class name that a spreadsheet would read as a
formula (starting with = + - @, a tab or a carriage return) starts with a ' (OWASP's rule); JSONL keeps names as
they are. The extension's case does not matter (preds.CSV). An existing file is refused unless --force; a folder,
or a file in a folder that does not exist, is refused before any image is classified.
An image that cannot be read is one `error:` line on stderr, left out of the output, and exit code 2; every
other image is still predicted.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

# isort: off
from runner.process.startup import prepare

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


OUTPUT_FORMATS = (".csv", ".jsonl")


def add_options(parser: argparse.ArgumentParser) -> None:
    """The tool's own options, beside the config arguments."""
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--topk", type=int, default=5, help="classes shown per image (default 5)")
    parser.add_argument("--output", metavar="FILE", default="",
                        help="write the predictions to FILE.csv or FILE.jsonl (one row per image) instead of stdout")
    parser.add_argument("--force", action="store_true", help="with --output: replace an existing file")
    parser.add_argument("--tta", choices=("none", "flip"), default="none",
                        help="test-time augmentation: flip averages each image's and its mirror image's softmax")


def check_args(args: argparse.Namespace, images: list[str]) -> None:
    """The tool's own mistakes, each one line, before the model is loaded."""
    if args.topk < 1:
        raise UserError(f"--topk {args.topk}: give a number of classes >= 1")
    if not images:
        raise UserError("no image given: add one or more image files or folders after the config arguments")
    if not args.output:
        return
    if args.json:
        raise UserError("--json prints to stdout and --output writes a file: give one of them")
    check_output(args.output, args.force)


def output_format(path: str) -> str:
    """The format its extension names, whatever its case (preds.CSV is a CSV file); '' for any other."""
    return next((f for f in OUTPUT_FORMATS if path.lower().endswith(f)), "")


def check_output(path: str, force: bool) -> None:
    """--output's mistakes, said before any image is classified rather than after all of them."""
    if not output_format(path):
        raise UserError(f"--output {path}: the file's extension says its format; use {' or '.join(OUTPUT_FORMATS)}")
    if os.path.isdir(path):  # --force cannot help: a folder is never replaced by a file
        raise UserError(f"--output {path} is a folder: give a file name (e.g. {os.path.join(path, 'preds.csv')})")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        what = "is not a folder" if os.path.lexists(parent) else "does not exist"
        raise UserError(f"--output {path}: the folder {parent} {what}; create it first or choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--output {path}: the folder {parent} is not writable by this user")
    if os.path.lexists(path) and not force:
        raise UserError(f"--output {path} exists: add --force to replace it, or choose another name")


@cli
def main(argv: list[str] | None = None) -> int:
    """Load the model and weights, classify each image, print the top-k or write them to --output."""
    parser = build_parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                          usage="%(prog)s --cfg FILE MODEL.CHECKPOINT PATH [KEY VALUE ...] [--output FILE] "
                                "IMAGE_OR_FOLDER [...]")
    add_options(parser)
    rest, images = split_images(sys.argv[1:] if argv is None else list(argv), parser)
    # no data is read: a run's config.yaml with a DATA.ROOT relative to where it trained works from anywhere
    loaded = config_command(rest, parser, check_paths=False)
    if loaded is None:
        return 0
    cfg, info = loaded
    if not cfg.MODEL.CHECKPOINT:
        raise UserError("tools/predict.py needs weights: add MODEL.CHECKPOINT path/to/checkpoint.pth")
    if not os.path.isfile(cfg.MODEL.CHECKPOINT):  # the one path predict reads, checked as load_config would
        raise UserError(f"MODEL.CHECKPOINT {cfg.MODEL.CHECKPOINT!r} is not a file")
    args = info.args
    check_args(args, images)
    from runner.data.folder import IMG_EXTENSIONS, expand_images

    files = expand_images(images)
    if not files:
        raise UserError(f"no image file ({'/'.join(IMG_EXTENSIONS)}) in {', '.join(images)}")
    model, meta, device = load_model(cfg)
    results, errors = classify(cfg, model, device, files, args,
                               lambda n: class_names(meta, cfg, cfg.MODEL.CHECKPOINT, n))
    if args.output:
        write_output(args.output, results, errors)
    elif args.json:
        print(json.dumps({"checkpoint": cfg.MODEL.CHECKPOINT, "predictions": results,
                          "errors": [{"image": path, "error": line} for path, line in errors]}))
    else:
        print_table(results)
    return EXIT_USER if errors else 0


def load_model(cfg) -> tuple[torch.nn.Module, dict, torch.device]:
    """The model with MODEL.CHECKPOINT's weights, in eval mode on its device, and the checkpoint's other fields."""
    from runner.model import build_model
    from runner.weights.files import load_weights

    bare = cfg.clone()
    bare.defrost()
    bare.MODEL.CHECKPOINT = ""  # loaded below, once, keeping the checkpoint's metadata
    bare.freeze()
    model = build_model(bare)
    meta = load_weights(model, cfg.MODEL.CHECKPOINT, allow_new_head=False)  # a new head would predict noise
    use_cuda = cfg.DEVICE == "cuda" or (cfg.DEVICE == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    return model.to(device).eval(), meta, device


def image_loader(cfg, files: list[str]) -> torch.utils.data.DataLoader:
    """Batches of the files in order, decoded by DATA.NUM_WORKERS workers (as training's loaders start them)."""
    from runner.data.build import eval_batch_size
    from runner.data.folder import ImageFiles, build_transform, collate_files
    from runner.data.loaders import default_workers, worker_options

    dataset = ImageFiles(files, build_transform(cfg, is_training=False))
    workers = default_workers(cfg, None)
    return torch.utils.data.DataLoader(dataset, batch_size=eval_batch_size(cfg), num_workers=workers,
                                       collate_fn=collate_files, **(worker_options(cfg, dataset) if workers else {}))


def classify(cfg, model, device: torch.device, files: list[str], args: argparse.Namespace,
             names_for) -> tuple[list[dict], list[tuple[str, str]]]:
    """(the top-k of each readable file, in order; (path, line) of each unreadable one, said on stderr as met)."""
    from tqdm import tqdm

    shown = cfg.LOG.PROGRESS == "bar" or (cfg.LOG.PROGRESS == "auto" and sys.stdout.isatty())
    results, errors = [], []
    with tqdm(total=len(files), unit="img", dynamic_ncols=True, disable=not shown) as bar:
        for indices, batch, bad in image_loader(cfg, files):
            for i, line in bad:  # the others are still predicted; the exit code says that one was not
                errors.append((files[i], line))
                bar.write(f"error: {line}", file=sys.stderr)
            if batch is not None:
                results += predict(model, batch.to(device), [files[i] for i in indices], args.topk, names_for,
                                   flip=args.tta == "flip")
            bar.update(len(indices) + len(bad))
    sys.stderr.flush()
    return results, errors


def predict(model, batch: torch.Tensor, paths: list[str], topk: int, names_for, flip: bool = False) -> list[dict]:
    """The top-k classes with probabilities of each image of `batch`; with `flip`, the mean softmax of the image
    and its horizontal mirror."""
    with torch.inference_mode():
        probs = model(batch).float().softmax(dim=1)
        if flip:
            probs = (probs + model(batch.flip(-1)).float().softmax(dim=1)) / 2
    probs = probs.cpu()
    names = names_for(probs.shape[1])
    top_p, top_i = probs.topk(min(topk, probs.shape[1]), dim=1)
    return [{"image": path, "top": [{"class": names[i], "index": int(i), "prob": round(float(p), 6)}
                                    for p, i in zip(ps.tolist(), idx.tolist(), strict=True)]}
            for path, ps, idx in zip(paths, top_p, top_i, strict=True)]


def write_output(path: str, results: list[dict], errors: list[tuple[str, str]]) -> None:
    """The predictions as CSV or JSONL, written whole or not at all; one line on stdout says where."""
    from runner.fsutil import atomic_write

    atomic_write(path, csv_text(results) if output_format(path) == ".csv" else "".join(
        json.dumps(r) + "\n" for r in results))
    skipped = f"; {len(errors)} unreadable image{'s' if len(errors) != 1 else ''} skipped" if errors else ""
    print(f"wrote {len(results)} predictions to {path}{skipped}", flush=True)


def csv_text(results: list[dict]) -> str:
    """A header and one row per image: image, then class_r and prob_r for each rank r of its top-k.

    Spreadsheet-safe: an image or class name that a spreadsheet would read as a formula starts with a '.
    """
    from runner import csvsafe

    k = max((len(r["top"]) for r in results), default=0)
    header = ["image"] + [f"{c}_{r}" for r in range(1, k + 1) for c in ("class", "prob")]
    return csvsafe.csv_text([header] + [[r["image"]] + [v for t in r["top"] for v in (t["class"], t["prob"])]
                                        for r in results])


def print_table(results: list[dict]) -> None:
    """Each image and its top classes, one per line."""
    width = max((len(t["class"]) for r in results for t in r["top"]), default=0)
    for r in results:
        print(r["image"])
        for rank, t in enumerate(r["top"], 1):
            print(f"  {rank}. {t['class']:<{width}}  {100 * t['prob']:6.2f}%")


if __name__ == "__main__":
    main()
