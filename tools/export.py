#!/usr/bin/env python
"""Export a run's weights for the tools people load them with, verified against the checkpoint first.

    python tools/export.py output/digits/test_resnet --format hf --output export/digits-hf
    python tools/export.py output/run/checkpoints/step_00000500.pth --format onnx --output export/run-onnx

RUN_DIR_OR_CHECKPOINT: a run folder (its checkpoints/best.pth, else last.pth) or a checkpoint file; the config is
the run's own. The run's EMA weights are exported when it kept them (TRAIN.EMA), the raw weights with --no-ema.

    hf            model.safetensors + config.json: timm.create_model("local-dir:OUTPUT", pretrained=True)
    safetensors   model.safetensors: timm.create_model(NAME, ...) + load_state_dict (the line is printed)
    onnx          model.onnx (dynamic batch axis) + config.json: onnxruntime (pip install -e ".[export]")
    torch-export  model.pt2 + config.json: torch.export.load(...).module()

Before the export is put at --output, it is loaded back by its own consumer and run on --images validation images
of the run's config beside the checkpoint's model; the largest logit difference and the top-1 agreement are
printed. An export that disagrees is removed (exit 1); --output must not exist or be an empty folder.
"""
from __future__ import annotations

import argparse
import sys

from runner.process.startup import prepare

prepare()  # before torch loads: the CPU-thread choice is read by libgomp as torch loads

from runner.errors import argument_error, cli


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    from runner.export import FORMATS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", metavar="RUN_DIR_OR_CHECKPOINT", help="a run folder or a checkpoint .pth file")
    parser.add_argument("--format", required=True, choices=FORMATS, help="what to write (see above)")
    parser.add_argument("--output", required=True, metavar="DIR", help="the folder to create (never overwritten)")
    parser.add_argument("--images", type=int, default=256,
                        help="validation images the export is checked on (default 256)")
    parser.add_argument("--no-ema", dest="ema", action="store_false",
                        help="export the raw weights of a run that kept EMA weights (default: the EMA's)")
    parser.error = argument_error  # one line, like every other tool
    return parser.parse_args(argv)


@cli
def main(argv: list[str] | None = None) -> int:
    """Export, verify, and print where the export is and how it compared with the checkpoint."""
    args = parse_args(argv)
    from runner.export import ExportFailed, export, report
    from runner.sinks import setup_logging

    setup_logging(None, 0)
    try:
        result = export(args.run, args.format, args.output, images=args.images, use_ema=args.ema)
    except ExportFailed as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    print("\n".join(report(result, args.format)), flush=True)
    return 0


if __name__ == "__main__":
    main()
