#!/usr/bin/env python
"""benchmarks/gpu.sh's report: OUT/runs/*.json into OUT/gpu_bench.json (every figure) and OUT/gpu_bench.md.

    python benchmarks/gpu_report.py OUT [--peak 989.4] [--commit SHA]

Model rows: medians over the alternated runs of the runner (tools/benchmark.py) and the raw loop, with MFU
against --peak (the device's dense bf16 TFLOP/s) and runner/raw ratios. Data rows: loader-only and end-to-end
img/s per DataLoader worker count against synthetic data on the device. Prints the markdown.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
from pathlib import Path

import torch

FIGURES = ("train_img_per_s", "step_ms", "infer_img_per_s", "achieved_tflops", "peak_mem_mb", "compile_s",
           "data_wait_frac")
TARGETS = {("resnet50", False): 5000.0, ("resnet50", True): 7000.0}  # issue 18's img/s goals on one H100
RUN = re.compile(r"^model-(?P<model>.+)-(?P<compile>[01])-(?P<who>runner|raw)-(?P<round>\d+)$")


def environment(commit: str, peak: float) -> dict:
    """Device, versions, commit and date of this report."""
    cuda = torch.cuda.is_available()
    return {"device_name": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if cuda else None,
            "cpus": os.cpu_count(), "python": platform.python_version(), "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "peak_bf16_tflops": peak or None}


def median(runs: list[dict], key: str) -> float | None:
    """The median of one figure over runs, None when no run has it."""
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def model_rows(runs: dict[str, dict], peak: float) -> list[dict]:
    """One row per (model, compile, runner|raw): medians, MFU, the runner/raw ratio and the target check."""
    groups: dict[tuple, list[dict]] = {}
    for name, r in runs.items():
        if m := RUN.match(name):
            groups.setdefault((m["model"], m["compile"] == "1", m["who"]), []).append(r)
    rows = []
    for (model, compiled, who), rs in sorted(groups.items()):
        row = {"model": model, "compile": compiled, "who": who, "rounds": len(rs), "img_size": rs[0]["img_size"],
               "batch_size": rs[0]["batch_size"], "precision": rs[0]["precision"],
               "train_gflops_per_img": rs[0]["train_gflops_per_img"]}
        row.update({k: median(rs, k) for k in FIGURES})
        row["mfu"] = row["achieved_tflops"] / peak if peak else None
        raw = groups.get((model, compiled, "raw"))
        row["vs_raw"] = row["train_img_per_s"] / median(raw, "train_img_per_s") if raw else None
        target = TARGETS.get((model, compiled))
        row["target_img_per_s"] = target if who == "runner" else None
        row["meets_target"] = (row["train_img_per_s"] >= target and (row["vs_raw"] or 0) >= 0.97
                               if target and who == "runner" else None)
        rows.append(row)
    return rows


def data_rows(runs: dict[str, dict]) -> list[dict]:
    """One row per worker count: loader-only and end-to-end img/s, and the share of synthetic-data speed."""
    synthetic = runs.get("e2e-synthetic", {}).get("train_img_per_s")
    rows = []
    for name in sorted((n for n in runs if n.startswith("loader-")), key=lambda n: int(n.split("-")[1])):
        w = int(name.split("-")[1])
        e2e = runs.get(f"e2e-folder-{w}", {})
        ips = e2e.get("train_img_per_s")
        rows.append({"workers": w, "loader_img_per_s": runs[name]["loader_img_per_s"], "e2e_img_per_s": ips,
                     "data_wait_frac": e2e.get("data_wait_frac"), "synthetic_img_per_s": synthetic,
                     "vs_synthetic": ips / synthetic if ips and synthetic else None})
    return rows


def fmt(v, spec: str) -> str:
    """A cell: '-' for None."""
    return "-" if v is None else format(v, spec)


MODEL_COLS = [("train img/s", "train_img_per_s", ".0f"), ("step ms", "step_ms", ".1f"),
              ("infer img/s", "infer_img_per_s", ".0f"), ("TFLOP/s", "achieved_tflops", ".1f"), ("MFU", "mfu", ".3f"),
              ("peak mem MB", "peak_mem_mb", ".0f"), ("compile s", "compile_s", ".1f"), ("vs raw", "vs_raw", ".3f")]
DATA_COLS = [("workers", "workers", "d"), ("loader img/s", "loader_img_per_s", ".0f"),
             ("end-to-end img/s", "e2e_img_per_s", ".0f"), ("data wait", "data_wait_frac", ".2f"),
             ("synthetic img/s", "synthetic_img_per_s", ".0f"), ("vs synthetic", "vs_synthetic", ".2f")]


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def markdown(report: dict) -> str:
    """The two tables and the line that says what they were measured on."""
    e = report["environment"]
    lines = [f"{e['device_name']}, torch {e['torch']}, CUDA {e['cuda']}, cuDNN {e['cudnn']}, "
             f"commit {e['commit'][:12]}, {e['date']}; dense bf16 peak {e['peak_bf16_tflops'] or 'unknown'} TFLOP/s"]
    if report["models"]:
        rows = [[f"{r['model']} {r['img_size']}px b{r['batch_size']} {r['precision']}",
                 "compiled" if r["compile"] else "eager", r["who"]] + [fmt(r[k], f) for _, k, f in MODEL_COLS]
                for r in report["models"]]
        lines += [""] + table(["model", "mode", "who"] + [h for h, _, _ in MODEL_COLS], rows)
    if report["data"]:
        rows = [[fmt(r[k], f) for _, k, f in DATA_COLS] for r in report["data"]]
        lines += [""] + table([h for h, _, _ in DATA_COLS], rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    """Read the runs, write gpu_bench.json and gpu_bench.md, print the markdown."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--peak", type=float, default=0.0)
    p.add_argument("--commit", default="unknown")
    args = p.parse_args(argv)
    out = Path(args.out)
    runs = {f.stem: json.loads(f.read_text()) for f in sorted((out / "runs").glob("*.json"))}
    report = {"environment": environment(args.commit, args.peak), "models": model_rows(runs, args.peak),
              "data": data_rows(runs), "jpegs": runs.get("jpegs"), "runs": runs}
    (out / "gpu_bench.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (out / "gpu_bench.md").write_text(text)
    print(text, end="")
    return report


if __name__ == "__main__":
    main()
