"""What the run is standing on: Python, library builds, CPUs, GPUs and backends.

Importing this module stays cheap (torch is imported inside the functions), so tools can use it to
report a broken torch install instead of crashing on import.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

from runner.process import malloc
from runner.process.threads import affinity_cpus

NOT_INSTALLED = "not installed"
_PACKAGES = ("torch", "timm", "yacs", "tensorboard", "numpy")
_MB = 1024**2
_NO_TORCH = "n/a (torch not importable)"


def collect_env(free_mem_devices: Iterable[int] | None = None) -> dict[str, Any]:
    """A JSON-ready report of the software and hardware this process sees.

    Free GPU memory needs a CUDA context on the device, which costs a few hundred MB there for the life
    of the process. `None` queries every visible GPU (right for a standalone tool); a training process
    passes its own device index so that rank 0 does not claim memory on the other ranks' GPUs.
    """
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "packages": {name: _package_version(name) for name in _PACKAGES},
        "cpu": _cpu_info(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "malloc": malloc.describe(),
    }
    info.update(_torch_info(free_mem_devices))
    if info.get("torch_version"):  # the runtime string carries the build tag (+cu132) the wheel name lacks
        info["packages"]["torch"] = info.pop("torch_version")
    return info


def format_env(info: dict[str, Any]) -> str:
    """The report from collect_env as aligned plain text, one fact per line."""
    pkgs = info.get("packages", {})
    cpu = info.get("cpu", {})
    build = info.get("torch_build", {})
    rows: list[tuple[str, Any]] = [
        ("Python", f"{info.get('python')} ({info.get('python_executable')})"),
        ("Platform", info.get("platform")),
        *[(name, pkgs.get(name, NOT_INSTALLED)) for name in _PACKAGES],
        ("torch CUDA build", build.get("cuda") or ("none (CPU-only build)" if build else _NO_TORCH)),
    ]
    if build.get("hip"):
        rows.append(("torch ROCm build", build["hip"]))
    rows += [
        ("cuDNN", build.get("cudnn") or ("not available" if build else _NO_TORCH)),
        ("NCCL", build.get("nccl") or ("not available" if build else _NO_TORCH)),
        ("NVIDIA driver", info.get("nvidia_driver") or "not found"),
        ("CPU model", cpu.get("model") or "unknown"),
        ("CPUs", f"{cpu.get('usable')} usable of {cpu.get('count')}"),
        ("torch threads", cpu.get("torch_threads") or _NO_TORCH),
        ("malloc", info.get("malloc") or "unknown"),
        ("CUDA_VISIBLE_DEVICES", info.get("cuda_visible_devices") or "unset"),
        ("CUDA available", _yes_no(info.get("cuda_available"))),
        ("bf16 (all GPUs)", _yes_no(info.get("bf16"))),
        ("TF32 supported", _yes_no(info.get("tf32_supported"))),
        ("TF32 matmul / cuDNN", f"{_on_off(info.get('tf32_matmul'))} / {_on_off(info.get('tf32_cudnn'))}"),
        ("torch.distributed", _yes_no(info.get("distributed"))),
        ("NCCL backend", _yes_no(info.get("nccl_available"))),
        ("gloo backend", _yes_no(info.get("gloo_available"))),
    ]
    if "torch_error" in info:
        rows.append(("torch import error", info["torch_error"]))
    width = max(len(key) for key, _ in rows)
    lines = [f"{key:<{width}}  {value}" for key, value in rows]
    lines += _format_gpus(info)
    return "\n".join(lines) + "\n"


def _package_version(name: str) -> str:
    """Installed version of a distribution, or NOT_INSTALLED."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def cpu_model() -> str:
    """The processor's name (results on the CPU depend on its kernels): /proc/cpuinfo, macOS's sysctl, or platform."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            # x86 says "model name"; some ARM kernels only "Hardware" or "Processor"
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() or platform.processor()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _cpu_info() -> dict[str, Any]:
    """Logical CPUs on the machine and those this process may run on (cgroups/taskset narrow it)."""
    info: dict[str, Any] = {"count": os.cpu_count(), "usable": affinity_cpus(), "torch_threads": None,
                            "model": cpu_model()}
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
    except Exception:  # a broken torch is reported by _torch_info
        pass
    return info


def _torch_info(free_mem_devices: Iterable[int] | None) -> dict[str, Any]:
    """torch build versions, backend availability and the visible GPUs."""
    empty = {"cuda_available": False, "gpus": [], "torch_build": {}}
    try:
        import torch
        import torch.distributed as dist
    except ModuleNotFoundError:
        return empty  # the package list already says "not installed"
    except Exception as e:  # a broken install failing while loading its native libraries
        return {**empty, "torch_error": f"{type(e).__name__}: {e}"}
    cuda_ok = torch.cuda.is_available()
    gpus = _gpus(torch, free_mem_devices) if cuda_ok else []
    ampere = bool(gpus) and all(gpu["major"] >= 8 for gpu in gpus)
    return {
        "torch_version": torch.__version__,
        "torch_build": {"cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
                        "cudnn": _cudnn_version(torch), "nccl": _nccl_version(torch)},
        "nvidia_driver": _nvidia_driver(),
        "cuda_available": cuda_ok,
        "gpus": gpus,
        # bf16 and TF32 run natively from compute capability 8.0 (Ampere) on; ROCm builds support bf16
        "bf16": bool(gpus) and (ampere or bool(getattr(torch.version, "hip", None))),
        "tf32_supported": ampere,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "distributed": dist.is_available(),
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
        "gloo_available": dist.is_available() and dist.is_gloo_available(),
    }


def _gpus(torch: Any, free_mem_devices: Iterable[int] | None) -> list[dict[str, Any]]:
    """One record per visible GPU; free memory only where the caller allows a context."""
    count = torch.cuda.device_count()
    query = set(range(count)) if free_mem_devices is None else set(free_mem_devices)
    gpus = []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        free_mb = None
        if index in query:
            free_bytes, _ = torch.cuda.mem_get_info(index)
            free_mb = round(free_bytes / _MB)
        gpus.append({"index": index, "name": props.name, "capability": f"{props.major}.{props.minor}",
                     "major": props.major,
                     "total_mb": round(props.total_memory / _MB), "free_mb": free_mb,
                     "multiprocessors": props.multi_processor_count})
    return gpus


def _cudnn_version(torch: Any) -> str | None:
    """cuDNN version as a dotted string (the integer encoding changed at cuDNN 9)."""
    try:
        if not torch.backends.cudnn.is_available():
            return None
        v = torch.backends.cudnn.version()
    except Exception:  # a CUDA build whose cuDNN library cannot be loaded
        return None
    if v is None:
        return None
    major, rest = (v // 10000, v % 10000) if v >= 90000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _nccl_version(torch: Any) -> str | None:
    """NCCL version torch was built with, or None on builds without it."""
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # CPU-only and ROCm builds without NCCL raise here
        return None
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def _nvidia_driver() -> str | None:
    """Kernel driver version from /proc (Linux), without needing NVML bindings."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for \w+)?\s+([\d.]+)", text)
    return match.group(1) if match else None


def _format_gpus(info: dict[str, Any]) -> list[str]:
    """Lines for the GPU section of format_env."""
    gpus = info.get("gpus") or []
    if not gpus:
        reason = "CUDA not available" if not info.get("cuda_available") else "device count is 0"
        return [f"GPUs: none visible ({reason})"]
    lines = [f"GPUs: {len(gpus)} visible"]
    for gpu in gpus:
        free = "not queried" if gpu["free_mb"] is None else f"{gpu['free_mb']} MB"
        lines.append(f"  [{gpu['index']}] {gpu['name']}  capability {gpu['capability']}  "
                     f"memory {gpu['total_mb']} MB total, {free} free  SMs {gpu['multiprocessors']}")
    return lines


def _yes_no(value: Any) -> str:
    """'yes'/'no' for a flag."""
    return "yes" if value else "no"


def _on_off(value: Any) -> str:
    """'on'/'off' for a setting."""
    return "on" if value else "off"


IMPORTS_HEADER = "IMPORTS (file, sha256):"


def format_imports(records: list[tuple[str, str, str]]) -> str:
    """env.txt's lines for the user's imported code: each IMPORTS entry, the file it ran and that file's sha256."""
    if not records:
        return ""
    lines = [IMPORTS_HEADER] + [f"  {entry}  {path or '(no file)'}  {digest or '-'}" for entry, path, digest in records]
    return "\n".join(lines) + "\n"


def _imports_in(env_text: str) -> dict[str, str]:
    """entry -> sha256 from the IMPORTS lines of an env.txt's text."""
    found, inside = {}, False
    for line in env_text.splitlines():
        if line == IMPORTS_HEADER:
            inside = True
        elif inside and line.startswith("  "):
            parts = line.split()
            if len(parts) >= 3:
                found[parts[0]] = parts[-1]
        else:
            inside = False
    return found


def changed_imports(old_env_text: str, records: list[tuple[str, str, str]]) -> list[str]:
    """The entries whose file changed since an earlier env.txt (a resume runs the edited code: said, not refused)."""
    before = _imports_in(old_env_text)
    return [f"{entry}{'' if path == os.path.abspath(os.path.expanduser(entry)) else f' ({path})'}: sha256 "
            f"{before[entry][:12]} -> {digest[:12]}" for entry, path, digest in records
            if entry in before and before[entry] != digest]
