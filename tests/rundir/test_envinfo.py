"""The environment report: library API and tools/env_info.py (in a subprocess, and through its main in this
process)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from runner.rundir.envinfo import NOT_INSTALLED, collect_env, format_env

ROOT = Path(__file__).resolve().parents[2]


def _tool(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run tools/env_info.py with this interpreter."""
    return subprocess.run([sys.executable, str(ROOT / "tools" / "env_info.py"), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_text_report_names_versions_and_says_no_gpu():
    result = _tool()
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert torch.__version__ in out
    for name in ("timm", "yacs", "tensorboard", "numpy", "cuDNN", "NCCL", "CUDA_VISIBLE_DEVICES", "gloo"):
        assert name in out
    assert "GPUs: none visible (CUDA not available)" in out


def test_json_report_parses_and_has_torch_version(in_process):
    result = in_process("env_info.py", ["--json"])
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["packages"]["torch"] == torch.__version__
    assert info["cuda_available"] is False and info["gpus"] == []
    assert info["gloo_available"] is True
    assert info["cpu"]["usable"] >= 1
    # the processor by name (CPU results depend on its kernels): on Linux the one /proc/cpuinfo names
    names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
    assert info["cpu"]["model"] == (names[0] if names else info["cpu"]["model"]) and info["cpu"]["model"] != ""
    text = in_process("env_info.py", []).stdout
    assert re.search(rf"^CPU model +{re.escape(info['cpu']['model'])}$", text, re.MULTILINE)


def test_only_cuda_visible_devices_is_reported(monkeypatch):
    # secrets live in the environment; the report must carry this one variable and nothing else
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    monkeypatch.setenv("MY_API_TOKEN", "s3cr3t-value")
    info = collect_env()
    text = format_env(info) + json.dumps(info)
    assert info["cuda_visible_devices"] == "3,1"
    assert "s3cr3t-value" not in text and "MY_API_TOKEN" not in text


def test_report_without_any_installed_package():
    # -S drops site-packages: torch, timm, yacs... are all missing, as on a half-built machine (where the
    # runner itself is found through PYTHONPATH, as on a bare GPU box)
    result = subprocess.run([sys.executable, "-S", str(ROOT / "tools" / "env_info.py")],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    rows = [line.split("  ", 1) for line in result.stdout.splitlines() if "  " in line]
    lines = {key.strip(): value.strip() for key, value in rows if key.strip() in {"torch", "timm"}}
    assert lines == {"torch": NOT_INSTALLED, "timm": NOT_INSTALLED}
    assert "n/a (torch not importable)" in result.stdout and "GPUs: none visible" in result.stdout


def test_columns_are_aligned():
    lines = format_env(collect_env()).splitlines()
    table = [line for line in lines if not line.startswith(("GPUs", " "))]
    starts = {len(line) - len(line.split("  ", 1)[1].lstrip()) for line in table}
    assert len(starts) == 1


def test_unknown_argument_is_one_line():
    from tests.utils import assert_user_error, run_tool

    assert_user_error(run_tool("env_info.py", ["--bogus"]), "unrecognized arguments: --bogus")  # was usage + error
