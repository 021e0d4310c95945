#!/usr/bin/env python
"""Time from `python tools/train.py` to the first training step, against `python -c "import torch, timm"`.

    python benchmarks/startup.py [--cfg configs/digits/resnet18.yaml] [--runs 3] [KEY VALUE ...]

It runs the real tools/train.py (in a child process, into a temporary OUTPUT_DIR) with light timers wrapped
around the runner's set-up functions; the child stops the moment the training loop calls its first
`train_batch`. The bare import is timed on the same clock (process launch to the end of the import), and
also as a whole process (launch to exit, interpreter shutdown included). A further run under
`python -X importtime` splits the import time by top-level package. Medians over --runs; the last line is
one JSON object. Nothing in the runner is changed by this script.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0_ENV = "STARTUP_T0"
FIRST_STEP_TAG = "STARTUP_PHASES "

# The runner's set-up functions timed in the child: (module, attribute, label). Functions the engine
# imported by name are wrapped where the engine looks them up.
_HOOKS = [
    ("runner.config", "load_config", "load config"),
    ("runner.rundir.rules", "finished_run", "check finished run"),
    ("runner.engine.build.distributed", "setup", "distributed setup"),
    ("runner.engine.build", "setup_logging", "logging setup"),
    ("runner.rundir.lock.RunLock", "acquire", "run lock"),
    ("runner.engine.build", "build_data", "build data"),
    ("runner.engine.build", "build_model", "build model"),
    ("runner.engine.build", "prepare_model", "prepare model"),
    ("runner.engine.build", "build_optimizer", "build optimizer"),
    ("runner.engine.build", "build_scheduler", "build scheduler"),
    ("runner.engine.build", "resume", "resume check"),
    ("runner.engine.build", "write_run_files", "write run files (config, env.txt)"),
    ("runner.engine.build", "MetricWriter", "metric writers (jsonl, TensorBoard)"),
    ("runner.engine.build", "build_profiler", "prepare loop (profiler)"),
]


def _resolve(path: str):
    """The object at a dotted path whose head is an importable module."""
    import importlib

    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def child(argv: list[str]) -> None:
    """In the child: time imports and set-up phases, run tools/train.py, stop at the first train_batch."""
    t0 = float(os.environ[T0_ENV])
    phases: dict[str, float] = defaultdict(float)
    phases["python start-up"] = time.time() - t0
    for mod in ("torch", "timm", "runner.engine"):
        s = time.time()
        __import__(mod)
        phases[f"import {mod}"] = time.time() - s
    import runpy

    from runner.engine import TrainStep

    def timed(fn, label):
        def wrapper(*a, **k):
            s = time.time()
            try:
                return fn(*a, **k)
            finally:
                phases[label] += time.time() - s
        return wrapper

    for where, attr, label in _HOOKS:
        owner = _resolve(where)
        setattr(owner, attr, timed(getattr(owner, attr), label))

    def first_batch(self, *batch):
        total = time.time() - t0
        print(FIRST_STEP_TAG + json.dumps({"first_step_s": total, "phases": phases}), flush=True)
        os._exit(0)  # the measurement ends here; nothing after the first step matters

    TrainStep.train_batch = first_batch
    sys.argv = [str(ROOT / "tools" / "train.py"), *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")
    sys.exit("the training loop never started (was the run already done?)")


def _launch(cmd: list[str], extra_env: dict[str, str] | None = None) -> tuple[float, str, str]:
    """Wall seconds from launch to exit, stdout and stderr."""
    env = dict(os.environ, **(extra_env or {}))
    env[T0_ENV] = repr(time.time())
    s = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - s
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return wall, proc.stdout, proc.stderr


def train_once(argv: list[str], python_flags: list[str]) -> tuple[dict, str]:
    """One child run into a fresh temporary OUTPUT_DIR; its phases and stderr."""
    with tempfile.TemporaryDirectory(prefix="startup-") as out:
        cmd = [sys.executable, *python_flags, str(Path(__file__).resolve()), "--child", *argv, "OUTPUT_DIR", out]
        _, stdout, stderr = _launch(cmd)
    line = next(ln for ln in stdout.splitlines() if ln.startswith(FIRST_STEP_TAG))
    return json.loads(line[len(FIRST_STEP_TAG):]), stderr


def import_breakdown(stderr: str) -> dict[str, float]:
    """Seconds of top-level imports by root package, from `python -X importtime` output."""
    out: dict[str, float] = defaultdict(float)
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if m and not m.group(2):
            out[m.group(3).split(".")[0]] += int(m.group(1)) / 1e6
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main() -> None:
    """Time the bare import and the runner's start-up, print the breakdown and one JSON line."""
    if "--child" in sys.argv:
        child([a for a in sys.argv[1:] if a != "--child"])
        return
    p = argparse.ArgumentParser(description="Start-up time of tools/train.py against import torch, timm.")
    p.add_argument("--cfg", default=str(ROOT / "configs" / "digits" / "resnet18.yaml"))
    p.add_argument("--runs", type=int, default=3)
    args, overrides = p.parse_known_args()
    argv = ["--cfg", args.cfg, *overrides]

    bare, bare_proc, runs = [], [], []
    stamp = f"import os, time, torch, timm; print(time.time() - float(os.environ['{T0_ENV}']))"
    for _ in range(args.runs):  # alternate, so a change in machine load hits all alike
        wall, out, _ = _launch([sys.executable, "-c", stamp])
        bare.append(float(out.strip()))
        bare_proc.append(_launch([sys.executable, "-c", "import torch, timm"])[0])
        runs.append(train_once(argv, [])[0])
    _, imp_err = train_once(argv, ["-X", "importtime"])
    imports = import_breakdown(imp_err)

    first = [r["first_step_s"] for r in runs]
    labels = list(runs[0]["phases"])
    phases = {k: statistics.median(r["phases"].get(k, 0.0) for r in runs) for k in labels}
    med_first, med_bare, med_proc = statistics.median(first), statistics.median(bare), statistics.median(bare_proc)
    phases["other (unwrapped code)"] = med_first - sum(phases.values())
    print(f"load average {os.getloadavg()[0]:.2f}; {args.runs} runs each; medians (min..max)")
    print(f"python -c 'import torch, timm'      {med_proc:6.2f} s  ({min(bare_proc):.2f}..{max(bare_proc):.2f})"
          "  whole process, exit included")
    print(f"  launch to end of that import        {med_bare:6.2f} s  ({min(bare):.2f}..{max(bare):.2f})"
          "  the same clock as below")
    print(f"tools/train.py to first train step  {med_first:6.2f} s  ({min(first):.2f}..{max(first):.2f})")
    print(f"difference (first step - import)    {med_first - med_bare:6.2f} s")
    print("\nphases of the start-up (median s):")
    for k, v in phases.items():
        print(f"  {k:<40} {v:6.3f}")
    print("\ntop-level imports by package (s, one run under -X importtime, which slows imports a little):")
    for k, v in list(imports.items())[:12]:
        print(f"  {k:<40} {v:6.3f}")
    print(json.dumps({"bare_import_s": med_bare, "bare_import_runs": bare, "bare_process_s": med_proc,
                      "bare_process_runs": bare_proc, "first_step_s": med_first,
                      "first_step_runs": first, "excess_s": med_first - med_bare, "phases": phases,
                      "imports": imports, "load1": os.getloadavg()[0], "cfg": args.cfg,
                      "overrides": overrides}))


if __name__ == "__main__":
    main()
