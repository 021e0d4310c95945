"""torch's companion packages: a torchvision built for another torch is one line (exit 2), not two tracebacks."""
from __future__ import annotations

import importlib.util
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

REINSTALL = ("reinstall both from the same index: pip install --force-reinstall torch torchvision (with the "
             "--index-url torch came from, e.g. https://download.pytorch.org/whl/cpu)")


def import_torchvision() -> str | None:
    """Import torchvision (timm imports it) before a run claims its folder: None, or the one line saying that it
    is built for another torch (the caller raises it as a user mistake)."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError as e:
        line = torchvision_mismatch(e)
        if line is None:
            raise
        return line
    return None


def torchvision_mismatch(error: BaseException) -> str | None:
    """The one line for torchvision's 'operator torchvision::nms does not exist', else None.

    torchvision registers its C++ operators with torch as it is imported; a torchvision built against another
    torch release (or for another device: CPU against CUDA wheels) fails there with only this message.
    """
    text = str(error).strip()
    if not isinstance(error, RuntimeError) or "torchvision::" not in text or "does not exist" not in text:
        return None
    first = text.splitlines()[0][:120]
    return (f"torch {_version('torch')} and torchvision {_version('torchvision')} do not match "
            f"(importing torchvision failed: {first}); {REINSTALL}")


def _version(package: str) -> str:
    """`package`'s version with its build label (2.6.0+cpu: what tells two builds of one release apart).

    Read from its version.py without importing the package (torchvision cannot be); the metadata's version, which
    may lack the label, when there is no such file.
    """
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", (Path(folder) / "version.py").read_text())
        except OSError:
            continue
        if found:
            return found.group(1)
    try:
        return version(package)
    except PackageNotFoundError:
        return "(not installed)"
