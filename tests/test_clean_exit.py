"""A finished run prints nothing on stderr but its own lines, on the torch a fresh install resolves to."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from tests.utils import ROOT, env, run_tool


def readme_first_command() -> list[str]:
    """The README's first training command (its "Set up and train" block), as argv after `python`."""
    text = (ROOT / "README.md").read_text()
    found = re.search(r"^python (tools/train\.py --cfg configs/\S+\.yaml)$", text, re.MULTILINE)
    assert found, "the README's set-up block names no `python tools/train.py --cfg configs/...yaml` line"
    return shlex.split(found.group(1))


@pytest.mark.slow
def test_readme_run_and_its_eval_leave_stderr_empty(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, *readme_first_command(), "OUTPUT_DIR", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]  # the log goes to stdout: nothing else may reach stderr
    assert "done: val/top1" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "done" and results["val/top1"] > 95
    # the fast exit still leaves every file whole: the last metrics line is the final evaluation
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == results["step"] and "val/top1" in last
    assert "done:" in (out / "log.txt").read_text().splitlines()[-1]
    evaluated = run_tool("eval.py", ["--cfg", str(out / "config.yaml"),
                                     "MODEL.CHECKPOINT", str(out / "checkpoints" / "last.pth")])
    assert evaluated.returncode == 0 and evaluated.stderr == "", evaluated.stderr[-3000:]
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=120)
    assert again.returncode == 0 and again.stderr == "" and "already done" in again.stdout, again.stderr
