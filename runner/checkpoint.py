"""Checkpoints: atomic writes, finding the newest valid one, safe loading, RNG state capture."""
from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import signal
import threading
from pathlib import Path

import numpy as np
import torch

from runner.errors import UserError
from runner.fsutil import atomic_write, fsync_dir, remove_stale_temps, temp_name

log = logging.getLogger("runner")

STEP_RE = re.compile(r"^step_(\d+)\.pth$")


def ckpt_dir(output_dir: str | os.PathLike) -> Path:
    """OUTPUT_DIR/checkpoints."""
    return Path(output_dir) / "checkpoints"


def atomic_save(obj: dict, path: str | os.PathLike, intact: str = "") -> None:
    """torch.save through the one atomic writer (temporary file, fsync, rename; a full disk is one line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: torch.save(obj, f), intact)


def atomic_link(src: Path, dst: Path) -> None:
    """Point `dst` at the file `src` atomically (hard link, or a streamed copy where links are unsupported)."""
    tmp = temp_name(dst)
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        with open(src, "rb") as f:
            atomic_write(dst, lambda out: shutil.copyfileobj(f, out))
        return
    try:
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(dst.parent)


def step_files(directory: Path) -> list[tuple[int, Path]]:
    """The step checkpoints in `directory`, newest (highest step) first; ordered by name, never mtime."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := STEP_RE.match(p.name))]
    return sorted(found, reverse=True)


@contextlib.contextmanager
def held_sigint():
    """Hold Ctrl-C until the block ends: a KeyboardInterrupt inside torch.save surfaces as a RuntimeError."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if got and callable(old):
            old(signal.SIGINT, None)  # the handler it would have reached: save-and-stop, or KeyboardInterrupt


def save_checkpoint(state: dict, output_dir: str | os.PathLike, step: int, keep: int, best: bool) -> Path:
    """Write step_N.pth, point last.pth (and best.pth) at it, and prune to the newest `keep` step files."""
    d = ckpt_dir(output_dir)
    path = d / f"step_{step:08d}.pth"
    previous = step_files(d)
    intact = (f"the previous checkpoint ({d / 'last.pth'}, step {previous[0][0]})" if previous
              else "no earlier checkpoint exists; nothing was lost")
    with held_sigint():
        atomic_save(state, path, intact)
        if not _looks_whole(path):  # never let pruning leave a damaged file as the only checkpoint
            raise RuntimeError(f"checkpoint {path} was written but does not read back as a torch file")
        atomic_link(path, d / "last.pth")
        if best:
            atomic_link(path, d / "best.pth")
        prune(d, step, keep)
        remove_stale_temps(d)
    return path


def _looks_whole(path: Path) -> bool:
    """A cheap read-back: torch's zip archive opens and lists its entries (no tensor is loaded)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            return any(name.endswith("data.pkl") for name in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def prune(directory: Path, step: int, keep: int) -> None:
    """Remove the oldest step files beyond `keep`, counting only those up to `step` (never a newer file)."""
    ours = [(s, p) for s, p in step_files(directory) if s <= step]
    for _, old in ours[max(keep, 1):]:
        old.unlink(missing_ok=True)


def load_file(path: str | os.PathLike) -> dict:
    """torch.load with weights_only=True (no pickled code runs); raises on a bad file."""
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a dict, found {type(obj).__name__}")
    return obj


def _describe(e: Exception) -> str:
    """A short reason for a failed load."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:200]


def find_resumable(output_dir: str | os.PathLike) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, warning about (and skipping) any newer one that does not."""
    d = ckpt_dir(output_dir)
    candidates = [d / "last.pth"] if (d / "last.pth").exists() else []
    candidates += [p for _, p in step_files(d)]
    for path in candidates:
        try:
            state = load_file(path)
            if "model" not in state or "step" not in state:
                raise ValueError("not a runner checkpoint (no 'model' or 'step')")
            return path, state
        except Exception as e:  # a truncated, empty or foreign file: fall back to an older one
            log.warning("checkpoint %s is unusable (%s); trying the previous one", path, _describe(e))
    return None


def load_explicit(path: str) -> dict:
    """A checkpoint the user named: one clear error line if it cannot be used."""
    if not Path(path).is_file():
        raise UserError(f"checkpoint '{path}' does not exist")
    try:
        state = load_file(path)
    except Exception as e:
        raise UserError(f"checkpoint '{path}' cannot be loaded ({_describe(e)})") from None
    if "model" not in state or "step" not in state:
        raise UserError(f"checkpoint '{path}' is not a runner checkpoint (no 'model'/'step'); "
                        "to start from plain weights use MODEL.CHECKPOINT")
    return state


def rng_state() -> dict:
    """Every RNG the run draws from, as tensors and plain lists (loadable with weights_only)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what rng_state() captured."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
