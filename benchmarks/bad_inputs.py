#!/usr/bin/env python
"""Try bad inputs as a new user would type them and print one table row each: exit code, stderr lines, traceback.

    python benchmarks/bad_inputs.py [--only SUBSTRING] [--md]

Each probe runs tools/train.py (or another tool) in a fresh process in a scratch folder, with the digits config at
tiny settings. The contract being checked: a user mistake is exit 2 and one stderr line with no traceback.
This is an audit, not a test: tests/ holds the tests of the rules it found broken.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
TINY = ["MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "2",
        "DATA.NUM_WORKERS", "0", "LOG.PROGRESS", "plain"]


def probes(tmp: Path) -> list[tuple[str, list[str]]]:
    """(what, tools/train.py arguments) for every bad input tried; {tmp} files are made by `prepare`."""
    base = ["--cfg", DIGITS, *TINY]
    return [
        ("DATA.IMG_SIZE 100000", [*base, "DATA.IMG_SIZE", "100000"]),
        ("EVAL.IMG_SIZE 100000", [*base, "EVAL.IMG_SIZE", "100000"]),
        ("DATA.BATCH_SIZE 0", [*base, "DATA.BATCH_SIZE", "0"]),
        ("DATA.BATCH_SIZE 100000 (more than the split)", [*base, "DATA.BATCH_SIZE", "100000"]),
        ("TRAIN.ACCUM_STEPS 0", [*base, "TRAIN.ACCUM_STEPS", "0"]),
        ("TRAIN.EMA_DECAY 1.5", [*base, "TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "1.5"]),
        ("TRAIN.LABEL_SMOOTHING 1.0", [*base, "TRAIN.LABEL_SMOOTHING", "1.0"]),
        ("TRAIN.LABEL_SMOOTHING -0.1", [*base, "TRAIN.LABEL_SMOOTHING", "-0.1"]),
        ("AUG.SCALE [1.0, 0.5] (reversed)", [*base, "AUG.SCALE", "[1.0, 0.5]"]),
        ("AUG.RATIO [0, 1]", [*base, "AUG.RATIO", "[0, 1]"]),
        ("AUG.MIXUP -1", [*base, "AUG.MIXUP", "-1"]),
        ("TRAIN.WARMUP_EPOCHS -1", [*base, "TRAIN.WARMUP_EPOCHS", "-1"]),
        ("TRAIN.EPOCHS 0", [*base, "TRAIN.EPOCHS", "0"]),
        ("LOG.PERIOD 0", [*base, "LOG.PERIOD", "0"]),
        ("CHECKPOINT.KEEP -2", [*base, "CHECKPOINT.KEEP", "-2"]),
        ("MODEL.NAME '' (empty)", [*base, "MODEL.NAME", "''"]),
        ("MODEL.NAME resnet_typo", [*base, "MODEL.NAME", "resnet_typo"]),
        ("MODEL.NUM_CLASSES 0", [*base, "MODEL.NUM_CLASSES", "0"]),
        ("MODEL.NUM_CLASSES 5 (digits has 10)", [*base, "MODEL.NUM_CLASSES", "5"]),
        ("MODEL.IN_CHANS 0", [*base, "MODEL.IN_CHANS", "0"]),
        ("DIST.BACKEND mpi", [*base, "DIST.BACKEND", "mpi"]),
        ("AMP.DTYPE float8", [*base, "AMP.DTYPE", "float8"]),
        ("SEED -1", [*base, "SEED", "-1"]),
        ("SEED 2**70", [*base, "SEED", str(2**70)]),
        ("OUTPUT_DIR '' (empty)", [*base, "OUTPUT_DIR", "''"]),
        ("--cfg a YAML list", ["--cfg", str(tmp / "list.yaml"), *TINY]),
        ("--cfg an empty file", ["--cfg", str(tmp / "empty.yaml"), *TINY]),
        ("--cfg a binary file", ["--cfg", str(tmp / "binary.yaml"), *TINY]),
        ("lower-case key train.lr", [*base, "train.lr", "0.1"]),
        ("TRAIN.LR fast", [*base, "TRAIN.LR", "fast"]),
        ("TRAIN.LR 0", [*base, "TRAIN.LR", "0"]),
        ("CHECKPOINT.RESUME a missing file", [*base, "CHECKPOINT.RESUME", str(tmp / "missing.pth")]),
        ("CHECKPOINT.RESUME a text file", [*base, "CHECKPOINT.RESUME", str(tmp / "text.pth")]),
        ("MODEL.CHECKPOINT a directory", [*base, "MODEL.CHECKPOINT", str(tmp)]),
        ("MODEL.CHECKPOINT a text file", [*base, "MODEL.CHECKPOINT", str(tmp / "text.pth")]),
        ("DATA.NAME folder, DATA.ROOT an empty folder", [*base, "DATA.NAME", "folder", "DATA.ROOT", str(tmp / "void")]),
        ("DATA.NAME folder, train/ only", [*base, "DATA.NAME", "folder", "DATA.ROOT", str(tmp / "trainonly")]),
        ("EVAL.CROP_PCT 0", [*base, "EVAL.CROP_PCT", "0"]),
        ("EVAL.CROP_PCT 1.5", [*base, "EVAL.CROP_PCT", "1.5"]),
        ("TRAIN.CLIP_MODE bogus", [*base, "TRAIN.CLIP_GRAD", "1", "TRAIN.CLIP_MODE", "bogus"]),
        ("DATA.MEAN of 2 values for 3 channels", [*base, "MODEL.IN_CHANS", "3", "DATA.MEAN", "[0.5, 0.5]"]),
        ("TRAIN.TIME_LIMIT 1:99:00", [*base, "TRAIN.TIME_LIMIT", "1:99:00"]),
        ("AUG.SHIFT -3", [*base, "AUG.SHIFT", "-3"]),
        ("DATA.REPEATED_AUG 0", [*base, "DATA.REPEATED_AUG", "0"]),
        ("TRAIN.LAYER_DECAY 2", [*base, "TRAIN.LAYER_DECAY", "2"]),
        ("DISTILL.ALPHA 2", [*base, "DISTILL.ALPHA", "2"]),
        ("a key with no value", [*base, "TRAIN.LR"]),
        ("a value for a section (TRAIN 1)", [*base, "TRAIN", "1"]),
        ("EVAL.PERIOD 0", [*base, "EVAL.PERIOD", "0"]),
        ("DATA.PREFETCH_FACTOR 0", [*base, "DATA.PREFETCH_FACTOR", "0"]),
    ]


def prepare(tmp: Path) -> None:
    """The scratch files some probes name."""
    (tmp / "list.yaml").write_text("- MODEL\n- DATA\n")
    (tmp / "empty.yaml").write_text("")
    (tmp / "binary.yaml").write_bytes(bytes(range(256)))
    (tmp / "text.pth").write_text("not a checkpoint\n")
    (tmp / "void").mkdir()
    (tmp / "trainonly" / "train" / "a").mkdir(parents=True)


def run_probe(args: list[str], tmp: Path, n: int) -> tuple[int, int, bool, str]:
    """(exit code, stderr lines, traceback seen, last stderr line) of one probe in its own OUTPUT_DIR."""
    if "OUTPUT_DIR" not in args:
        args = [*args, "OUTPUT_DIR", str(tmp / f"out{n}")]
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), *args], capture_output=True, text=True,
                          cwd=tmp, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return proc.returncode, len(lines), "Traceback" in proc.stderr + proc.stdout, lines[-1] if lines else ""


def main() -> None:
    """Run the probes and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the probes whose name contains this")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        prepare(tmp)
        print("| bad input | exit | stderr lines | traceback | the line |")
        print("|---|---|---|---|---|")
        for n, (what, argv) in enumerate(probes(tmp)):
            if args.only and args.only not in what:
                continue
            rc, count, tb, line = run_probe(argv, tmp, n)
            flag = "" if rc == 2 and count == 1 and not tb else " **(!)**"
            print(f"| {what} | {rc} | {count} | {'yes' if tb else 'no'} | {line[:150]}{flag} |", flush=True)


if __name__ == "__main__":
    main()
